//! Review objects answered on the spot: TokenReview (is this bearer token valid, and whose is
//! it), SubjectAccessReview (may this user do that), and the self variants kubectl uses for
//! `auth can-i` and `auth whoami`.
//!
//! relaylet authenticates and authorizes kubelet callers with exactly these two reviews, like
//! the real kubelet, so they are evaluated against the same token table and [`Policy`] the
//! server itself enforces.

use serde_json::{Value, json};

use super::auth::{Attributes, Policy, UserInfo, token_user};
use super::failure::Failure;
use super::kinds::Kind;

/// Answers a review `body` of `kind` created by `caller`.
pub fn answer(
    kind: &Kind,
    body: Value,
    caller: &UserInfo,
    policy: &Policy,
    tokens: &[(String, UserInfo)],
) -> Result<Value, Failure> {
    if !body.is_object() {
        return Err(Failure::bad_request("the review must be a JSON object"));
    }
    let mut out = body;
    out["apiVersion"] = json!(kind.api_version());
    out["kind"] = json!(kind.kind);
    if !out["metadata"].is_object() {
        out["metadata"] = json!({});
    }
    out["metadata"]["creationTimestamp"] = Value::Null;
    let spec = out["spec"].clone();
    let status = match kind.kind {
        "TokenReview" => token_review(&spec, tokens),
        "SelfSubjectReview" => json!({ "userInfo": user_json(caller) }),
        "SubjectAccessReview" => {
            let user = UserInfo {
                name: str_of(&spec["user"]),
                uid: str_of(&spec["uid"]),
                groups: strings(&spec["groups"]),
            };
            access_review(&spec, user, policy)?
        }
        "SelfSubjectAccessReview" => access_review(&spec, caller.clone(), policy)?,
        other => return Err(Failure::bad_request(format!("{other} cannot be created"))),
    };
    out["status"] = status;
    Ok(out)
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn user_json(user: &UserInfo) -> Value {
    let mut u = json!({ "username": user.name, "groups": user.groups });
    if !user.uid.is_empty() {
        u["uid"] = json!(user.uid);
    }
    u
}

fn token_review(spec: &Value, tokens: &[(String, UserInfo)]) -> Value {
    let token = spec["token"].as_str().unwrap_or_default();
    let audiences = spec["audiences"].clone();
    match token_user(token, tokens) {
        Some(user) => {
            let mut status = json!({ "authenticated": true, "user": user_json(&user) });
            if audiences.is_array() {
                status["audiences"] = audiences;
            }
            status
        }
        None => json!({ "user": {}, "error": "invalid bearer token" }),
    }
}

fn access_review(spec: &Value, user: UserInfo, policy: &Policy) -> Result<Value, Failure> {
    let attributes = if let Some(r) = spec.get("resourceAttributes").filter(|r| r.is_object()) {
        Attributes {
            user,
            verb: str_of(&r["verb"]),
            resource_request: true,
            path: String::new(),
            api_group: str_of(&r["group"]),
            resource: str_of(&r["resource"]),
            subresource: str_of(&r["subresource"]),
            namespace: str_of(&r["namespace"]),
            name: str_of(&r["name"]),
        }
    } else if let Some(n) = spec.get("nonResourceAttributes").filter(|n| n.is_object()) {
        Attributes {
            user,
            verb: str_of(&n["verb"]),
            resource_request: false,
            path: str_of(&n["path"]),
            ..Attributes::default()
        }
    } else {
        return Err(Failure::new(
            http::StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "SubjectAccessReview is invalid: spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    };
    let (allowed, reason) = policy.decide(&attributes);
    let mut status = json!({ "allowed": allowed });
    if !reason.is_empty() {
        status["reason"] = json!(reason);
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::auth::Rule;
    use crate::apiserver::kinds;

    #[test]
    fn subject_access_review_uses_the_policy() {
        let policy = Policy::new(vec![
            Rule::user("kubelet-api")
                .verbs(&["create"])
                .api_groups(&[""])
                .resources(&["nodes/proxy"]),
        ]);
        let kind = kinds::by_resource("authorization.k8s.io", "subjectaccessreviews").unwrap();
        let caller = UserInfo::new("relaylet", &[]);
        let review = |user: &str, sub: &str| {
            let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user, "resourceAttributes": {"verb": "create", "resource": "nodes", "subresource": sub, "name": "n1"}}});
            answer(kind, body, &caller, &policy, &[]).unwrap()["status"]["allowed"].clone()
        };
        assert_eq!(review("kubelet-api", "proxy"), json!(true));
        assert_eq!(review("kubelet-api", "log"), json!(false));
        assert_eq!(review("mallory", "proxy"), json!(false));
        let empty = json!({"spec": {"user": "x"}});
        assert_eq!(
            answer(kind, empty, &caller, &policy, &[]).unwrap_err().code,
            422
        );
    }

    #[test]
    fn token_review_answers_from_the_table() {
        let kind = kinds::by_resource("authentication.k8s.io", "tokenreviews").unwrap();
        let tokens = vec![("t0k".to_string(), UserInfo::new("alice", &["devs"]))];
        let caller = UserInfo::new("relaylet", &[]);
        let ok = answer(
            kind,
            json!({"spec": {"token": "t0k"}}),
            &caller,
            &Policy::default(),
            &tokens,
        )
        .unwrap();
        assert_eq!(ok["status"]["authenticated"], true);
        assert_eq!(ok["status"]["user"]["username"], "alice");
        assert_eq!(
            ok["status"]["user"]["groups"],
            json!(["devs", "system:authenticated"])
        );
        let bad = answer(
            kind,
            json!({"spec": {"token": "nope"}}),
            &caller,
            &Policy::default(),
            &tokens,
        )
        .unwrap();
        assert!(bad["status"]["authenticated"].is_null());
    }
}

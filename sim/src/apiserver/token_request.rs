//! `POST .../serviceaccounts/{name}/token`: a TokenRequest, answered as upstream's
//! `TokenREST` does for a token bound to a pod, and the tokens it issued, which authenticate as
//! the service account (with the pod in `extra`) only while their pod exists with the UID they
//! were bound to, as upstream's service-account token authenticator checks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

use super::auth::UserInfo;
use super::body::json_response;
use super::failure::Failure;
use super::kinds;
use super::route::ResourcePath;
use super::store::{Store, new_uid};

/// Upstream refuses a shorter expiry ("may not specify a duration less than 10 minutes").
const MIN_EXPIRATION: i64 = 600;

/// A pod a token is bound to.
#[derive(Clone)]
struct Bound {
    user: UserInfo,
    namespace: String,
    pod: String,
    pod_uid: String,
}

/// The tokens issued so far. Cheap to clone.
#[derive(Clone, Default)]
pub struct Issued(Arc<Mutex<HashMap<String, Bound>>>);

impl Issued {
    /// The user `token` stands for, if it was issued here and its pod still exists.
    pub fn user(&self, token: &str, store: &Store) -> Option<UserInfo> {
        let bound = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()?;
        let pods = kinds::lookup("", "v1", "pods")?;
        let pod = store.get(pods, &bound.namespace, &bound.pod).ok()?;
        (pod.pointer("/metadata/uid").and_then(Value::as_str) == Some(bound.pod_uid.as_str()))
            .then_some(bound.user)
    }
}

/// Issues a token of service account `target` bound to the pod the request names.
pub(super) fn issue(
    store: &Store,
    issued: &Issued,
    target: &ResourcePath,
    request: Value,
) -> Result<Response, Failure> {
    let namespace = &target.namespace;
    let account = &target.name;
    store.get(target.kind, namespace, account)?;
    let spec = &request["spec"];
    let expiration = spec["expirationSeconds"].as_i64().unwrap_or(3600);
    if expiration < MIN_EXPIRATION {
        return Err(Failure::invalid(
            target.kind,
            account,
            "spec.expirationSeconds",
            "may not specify a duration less than 10 minutes",
        ));
    }
    let bound = &spec["boundObjectRef"];
    if bound["kind"].as_str() != Some("Pod") {
        return Err(Failure::bad_request(
            "this stand-in binds tokens to pods only",
        ));
    }
    let pod_name = bound["name"].as_str().unwrap_or_default();
    let pods = kinds::lookup("", "v1", "pods").ok_or_else(Failure::no_route)?;
    let pod = store.get(pods, namespace, pod_name)?;
    let pod_uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if let Some(uid) = bound["uid"].as_str().filter(|u| !u.is_empty())
        && uid != pod_uid
    {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    let pod_account = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default");
    if pod_account != account {
        return Err(Failure::bad_request(format!(
            "cannot bind token for serviceaccount {account:?} to pod running with different serviceaccount name."
        )));
    }
    let token = format!("sim-sa-{}", new_uid());
    let user = UserInfo::new(
        &format!("system:serviceaccount:{namespace}:{account}"),
        &[
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{namespace}"),
        ],
    );
    issued.0.lock().unwrap_or_else(|e| e.into_inner()).insert(
        token.clone(),
        Bound {
            user,
            namespace: namespace.clone(),
            pod: pod_name.to_string(),
            pod_uid,
        },
    );
    let expires = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(expiration))
        .map_err(|e| Failure::bad_request(e.to_string()))?;
    let mut answer = request.clone();
    answer["kind"] = json!("TokenRequest");
    answer["apiVersion"] = json!("authentication.k8s.io/v1");
    answer["spec"]["expirationSeconds"] = json!(expiration);
    answer["status"] = json!({
        "token": token,
        "expirationTimestamp": super::clock::format(expires),
    });
    Ok(json_response(StatusCode::CREATED, &answer))
}

//! Who is calling (authentication) and what they may do (authorization), as kube-apiserver
//! decides it with x509 client certificates, bearer tokens and RBAC.
//!
//! Authentication: a client certificate the TLS layer verified against the cluster CA names
//! the user (CN) and groups (O); otherwise a bearer token from the configured table (in the
//! `Authorization` header, or for WebSockets in the `base64url.bearer.authorization.k8s.io.`
//! subprotocol, as upstream accepts). Anonymous requests are refused with 401, as with
//! `--anonymous-auth=false`. Every authenticated user is in `system:authenticated`.
//!
//! Authorization: a [`Policy`] is a list of RBAC-like rules; `system:masters` may do anything,
//! and every authenticated user may read discovery and create self-reviews (upstream's
//! bootstrap `system:discovery`, `system:public-info-viewer` and `system:basic-user` roles).

use base64::Engine;
use http::HeaderMap;

use super::failure::Failure;
use crate::serve::PeerCert;

/// An authenticated user.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// A user named `name` in `groups`.
    pub fn new(name: &str, groups: &[&str]) -> Self {
        Self {
            name: name.to_string(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    /// The same user with `system:authenticated` added, as upstream's authenticators do.
    pub fn authenticated(mut self) -> Self {
        if !self.groups.iter().any(|g| g == "system:authenticated") {
            self.groups.push("system:authenticated".to_string());
        }
        self
    }
}

/// Identifies the caller of a request, or answers 401.
pub fn authenticate(
    headers: &HeaderMap,
    peer: Option<&PeerCert>,
    tokens: &[(String, UserInfo)],
) -> Result<UserInfo, Failure> {
    if let Some(der) = peer.and_then(PeerCert::leaf)
        && let Ok(user) = crate::tls::cert_user(der)
    {
        return Ok(UserInfo {
            name: user.name,
            uid: String::new(),
            groups: user.groups,
        }
        .authenticated());
    }
    let token = bearer(headers).or_else(|| websocket_bearer(headers));
    if let Some(token) = token {
        return token_user(&token, tokens).ok_or_else(Failure::unauthorized);
    }
    Err(Failure::unauthorized())
}

/// The user a bearer token stands for, if it is one of `tokens`.
pub fn token_user(token: &str, tokens: &[(String, UserInfo)]) -> Option<UserInfo> {
    tokens
        .iter()
        .find(|(t, _)| t == token)
        .map(|(_, u)| u.clone().authenticated())
}

/// The bearer token of a request (a header, or a WebSocket protocol), if it has one.
pub fn bearer_token(headers: &HeaderMap) -> Option<String> {
    bearer(headers).or_else(|| websocket_bearer(headers))
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// A token carried in `Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.<b64>`.
fn websocket_bearer(headers: &HeaderMap) -> Option<String> {
    const PREFIX: &str = "base64url.bearer.authorization.k8s.io.";
    headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(PREFIX).map(str::to_string))
        .and_then(|b64| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(b64.trim_end_matches('='))
                .ok()
        })
        .and_then(|bytes| String::from_utf8(bytes).ok())
}

/// What a request wants to do, as the authorizer sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    pub user: UserInfo,
    pub verb: String,
    /// False for non-resource paths such as `/version`.
    pub resource_request: bool,
    pub path: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

/// One rule: these subjects may use these verbs on these resources.
///
/// Empty `names` or `namespaces` mean all (a `namespaces` list scopes the rule like a
/// RoleBinding; empty is a ClusterRoleBinding). `"*"` matches anything in every list;
/// resources are written like RBAC's (`pods`, `pods/exec`, `pods/*`, `*`). As in RBAC, a
/// resource rule must name its API groups (`""` is the core group) and verbs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub users: Vec<String>,
    pub groups: Vec<String>,
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub names: Vec<String>,
    pub namespaces: Vec<String>,
    /// Non-resource URL paths (`/healthz`, `/metrics`, `/logs/*`).
    pub non_resource_urls: Vec<String>,
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

impl Rule {
    /// A rule for user `name`.
    pub fn user(name: &str) -> Self {
        Self {
            users: vec![name.to_string()],
            ..Self::default()
        }
    }

    /// A rule for members of group `name`.
    pub fn group(name: &str) -> Self {
        Self {
            groups: vec![name.to_string()],
            ..Self::default()
        }
    }

    pub fn verbs(mut self, verbs: &[&str]) -> Self {
        self.verbs = strings(verbs);
        self
    }

    pub fn api_groups(mut self, groups: &[&str]) -> Self {
        self.api_groups = strings(groups);
        self
    }

    pub fn resources(mut self, resources: &[&str]) -> Self {
        self.resources = strings(resources);
        self
    }

    pub fn names(mut self, names: &[&str]) -> Self {
        self.names = strings(names);
        self
    }

    pub fn namespaces(mut self, namespaces: &[&str]) -> Self {
        self.namespaces = strings(namespaces);
        self
    }

    pub fn non_resource_urls(mut self, urls: &[&str]) -> Self {
        self.non_resource_urls = strings(urls);
        self
    }

    fn applies_to(&self, user: &UserInfo) -> bool {
        self.users.iter().any(|u| u == "*" || *u == user.name)
            || self
                .groups
                .iter()
                .any(|g| g == "*" || user.groups.contains(g))
    }

    fn allows(&self, a: &Attributes) -> bool {
        if !self.applies_to(&a.user) || !any(&self.verbs, &a.verb) {
            return false;
        }
        if !a.resource_request {
            return self.non_resource_urls.iter().any(|u| {
                u == "*"
                    || *u == a.path
                    || u.strip_suffix('*')
                        .is_some_and(|prefix| a.path.starts_with(prefix))
            });
        }
        let resource_ok = self.resources.iter().any(|r| {
            if r == "*" {
                return true;
            }
            match r.split_once('/') {
                None => a.subresource.is_empty() && *r == a.resource,
                Some((res, sub)) => {
                    (res == "*" || res == a.resource)
                        && (sub == "*" && !a.subresource.is_empty() || sub == a.subresource)
                }
            }
        });
        resource_ok
            && any(&self.api_groups, &a.api_group)
            && (self.names.is_empty() || any(&self.names, &a.name))
            && (self.namespaces.is_empty()
                || (!a.namespace.is_empty() && any(&self.namespaces, &a.namespace)))
    }
}

fn any(list: &[String], value: &str) -> bool {
    list.iter().any(|x| x == "*" || x == value)
}

/// The authorization policy of one simulated cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub rules: Vec<Rule>,
}

/// Discovery and health paths any authenticated user may read.
const PUBLIC_PATHS: &[&str] = &[
    "/api",
    "/api/",
    "/apis",
    "/apis/",
    "/version",
    "/version/",
    "/healthz",
    "/livez",
    "/readyz",
];

impl Policy {
    /// A policy with `rules`.
    pub fn new(rules: Vec<Rule>) -> Self {
        Self { rules }
    }

    /// Everyone authenticated may do everything.
    pub fn allow_all() -> Self {
        Self::new(vec![
            Rule::group("system:authenticated")
                .verbs(&["*"])
                .api_groups(&["*"])
                .resources(&["*"])
                .non_resource_urls(&["*"]),
        ])
    }

    /// Whether the request is allowed, and why (the reason SubjectAccessReview reports).
    pub fn decide(&self, a: &Attributes) -> (bool, String) {
        if a.user.groups.iter().any(|g| g == "system:masters") {
            return (true, "allowed: member of system:masters".to_string());
        }
        if bootstrap_allows(a) {
            return (
                true,
                "allowed by the bootstrap discovery and self-review rules".to_string(),
            );
        }
        match self.rules.iter().position(|r| r.allows(a)) {
            Some(i) => (true, format!("allowed by policy rule {i}")),
            None => (false, String::new()),
        }
    }

    /// Ok, or the 403 upstream returns.
    pub fn authorize(&self, a: &Attributes) -> Result<(), Failure> {
        if self.decide(a).0 {
            Ok(())
        } else {
            Err(forbidden(a))
        }
    }
}

fn bootstrap_allows(a: &Attributes) -> bool {
    let authenticated = a.user.groups.iter().any(|g| g == "system:authenticated");
    if !authenticated {
        return false;
    }
    if !a.resource_request {
        return a.verb == "get"
            && (PUBLIC_PATHS.contains(&a.path.as_str())
                || a.path.starts_with("/api/")
                || a.path.starts_with("/apis/")
                || a.path.starts_with("/openapi/"));
    }
    a.verb == "create"
        && a.subresource.is_empty()
        && matches!(
            (a.api_group.as_str(), a.resource.as_str()),
            ("authorization.k8s.io", "selfsubjectaccessreviews")
                | ("authorization.k8s.io", "selfsubjectrulesreviews")
                | ("authentication.k8s.io", "selfsubjectreviews")
        )
}

/// Upstream's 403: `pods "x" is forbidden: User "u" cannot get resource "pods" in API group ""
/// in the namespace "default"`.
pub fn forbidden(a: &Attributes) -> Failure {
    let user = &a.user.name;
    if !a.resource_request {
        return Failure::forbidden(format!(
            "forbidden: User {user:?} cannot {} path {:?}",
            a.verb, a.path
        ));
    }
    let mut resource = a.resource.clone();
    if !a.subresource.is_empty() {
        resource = format!("{resource}/{}", a.subresource);
    }
    let why = if a.namespace.is_empty() {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            a.verb, a.api_group
        )
    } else {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
            a.verb, a.api_group, a.namespace
        )
    };
    let qualified = if a.api_group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.api_group)
    };
    let message = if a.name.is_empty() {
        format!("{qualified} is forbidden: {why}")
    } else {
        format!("{qualified} {:?} is forbidden: {why}", a.name)
    };
    let mut failure = Failure::forbidden(message);
    let mut details = serde_json::json!({ "kind": a.resource });
    if !a.name.is_empty() {
        details["name"] = serde_json::json!(a.name);
    }
    if !a.api_group.is_empty() {
        details["group"] = serde_json::json!(a.api_group);
    }
    failure.details = Some(details);
    failure
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(
        user: &str,
        verb: &str,
        resource: &str,
        sub: &str,
        ns: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            user: UserInfo::new(user, &["system:authenticated"]),
            verb: verb.into(),
            resource_request: true,
            path: String::new(),
            api_group: String::new(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn rules_match_like_rbac() {
        let policy = Policy::new(vec![
            Rule::user("alice")
                .verbs(&["get", "list"])
                .api_groups(&[""])
                .resources(&["pods", "pods/log"])
                .namespaces(&["default"]),
            Rule::group("ops")
                .verbs(&["create"])
                .api_groups(&[""])
                .resources(&["pods/*"])
                .names(&["web"]),
        ]);
        assert!(
            policy
                .decide(&attrs("alice", "get", "pods", "", "default", "x"))
                .0
        );
        assert!(
            policy
                .decide(&attrs("alice", "get", "pods", "log", "default", "x"))
                .0
        );
        assert!(
            !policy
                .decide(&attrs("alice", "get", "pods", "exec", "default", "x"))
                .0
        );
        assert!(
            !policy
                .decide(&attrs("alice", "get", "pods", "", "other", "x"))
                .0
        );
        assert!(
            !policy
                .decide(&attrs("alice", "delete", "pods", "", "default", "x"))
                .0
        );
        let mut bob = attrs("bob", "create", "pods", "exec", "default", "web");
        assert!(!policy.decide(&bob).0);
        bob.user.groups.push("ops".into());
        assert!(policy.decide(&bob).0);
        bob.name = "db".into();
        assert!(!policy.decide(&bob).0);
        let mut root = attrs("root", "delete", "nodes", "", "", "n");
        root.user.groups.push("system:masters".into());
        assert!(policy.decide(&root).0);
    }

    #[test]
    fn forbidden_messages_match_upstream() {
        let f = forbidden(&attrs("u", "get", "pods", "", "default", "x"));
        assert_eq!(
            f.message,
            "pods \"x\" is forbidden: User \"u\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let f = forbidden(&attrs("u", "create", "pods", "exec", "default", "x"));
        assert!(f.message.contains("cannot create resource \"pods/exec\""));
        let mut a = attrs("u", "list", "nodes", "", "", "");
        a.api_group = String::new();
        assert_eq!(
            forbidden(&a).message,
            "nodes is forbidden: User \"u\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        );
    }

    #[test]
    fn bearer_tokens_and_websocket_tokens() {
        let tokens = vec![("s3cret".to_string(), UserInfo::new("bot", &["robots"]))];
        let mut headers = HeaderMap::new();
        assert_eq!(authenticate(&headers, None, &tokens).unwrap_err().code, 401);
        headers.insert("authorization", "Bearer s3cret".parse().unwrap());
        let user = authenticate(&headers, None, &tokens).unwrap();
        assert_eq!(user.name, "bot");
        assert_eq!(user.groups, vec!["robots", "system:authenticated"]);
        headers.insert("authorization", "Bearer wrong".parse().unwrap());
        assert!(authenticate(&headers, None, &tokens).is_err());
        let mut ws = HeaderMap::new();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("s3cret");
        ws.insert(
            "sec-websocket-protocol",
            format!("v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.{b64}")
                .parse()
                .unwrap(),
        );
        assert_eq!(authenticate(&ws, None, &tokens).unwrap().name, "bot");
    }
}

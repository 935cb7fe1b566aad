//! Who is calling the kubelet API, and may they?
//!
//! The kubelet port of a virtual node opens exec into every pod of a leaf cluster with
//! relaylet's leaf credentials, so it is at least as closed as a real kubelet's:
//! - `AUTH_MODE=webhook` (default): a client certificate that chains to the root cluster's client
//!   CA (checked in the TLS handshake; CN = user, O = groups, as kube-apiserver reads them), or a
//!   bearer token checked with a TokenReview; then every request is authorized with a
//!   SubjectAccessReview like the kubelet's (`nodes/proxy` on the pod's virtual node), except that
//!   exec, attach and portForward always need verb `create`: a WebSocket exec is a GET, and
//!   `get nodes/proxy` must not be enough to run commands.
//! - `AUTH_MODE=x509`: verified client certificates only, and only the users named in
//!   `X509_ALLOWED_USERS` (every real node's kubelet client certificate chains to the same CA,
//!   so the CA alone says nothing about who may run commands); no review calls.
//! - `AUTH_MODE=none`: anyone; for local sandboxes only, and said loudly.
//!
//! Decisions are cached like the kubelet's webhook caches (tokens 2 min, allowed 5 min, denied
//! 30 s), in caches shared by every port, each bounded and evicting its least recently used
//! entry (never cleared whole). Refused tokens are remembered 30 s in a cache of their own, so a
//! flood of made-up tokens churns only that one and never pushes a valid token out. Tokens not
//! in a cache cost a TokenReview each, so those are budgeted per source address (a burst, then
//! a rate) under a larger budget for all sources together: a flood of made-up tokens from one
//! address gets 429s, never a flood of reviews at the root apiserver, and never takes the
//! budget of another address's valid token (metrics-server's, Prometheus'). Tokens are never
//! logged and never kept: cache keys are their SHA-256. A certificate with more than one common name is refused (Go's x509 reads the
//! last, other parsers the first: two readers must never see two users).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use rustls::pki_types::CertificateDer;

use crate::caps::TokenBucket;
use crate::config::AuthMode;
use crate::model::kubelet_request::Kind;

/// The group every authenticated user belongs to.
const AUTHENTICATED_GROUP: &str = "system:authenticated";

const TOKEN_TTL: Duration = Duration::from_secs(120);
const REFUSED_TOKEN_TTL: Duration = Duration::from_secs(30);
const ALLOWED_TTL: Duration = Duration::from_secs(300);
const DENIED_TTL: Duration = Duration::from_secs(30);
/// TokenReviews of tokens not in a cache, from one source address: a burst of this many, then
/// this many a second.
const REVIEW_BURST: f64 = 50.0;
const REVIEWS_PER_SECOND: f64 = 20.0;
/// The same for all sources together: what the root apiserver is asked at most.
const ALL_REVIEW_BURST: f64 = 200.0;
const ALL_REVIEWS_PER_SECOND: f64 = 100.0;
/// Source addresses with a budget of their own; past it, full (idle) budgets are forgotten,
/// which only ever gives a source its whole burst back.
const SOURCES_LIMIT: usize = 4096;
/// Entries a cache holds; past it, the least recently used goes.
const CACHE_LIMIT: usize = 10_000;

/// A caller the node server has identified.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    pub user: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Caller {
    fn named(user: &str, groups: &[&str]) -> Caller {
        Caller {
            user: user.to_string(),
            uid: None,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: BTreeMap::new(),
        }
    }
}

/// Why a caller was turned away.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// 401.
    #[error("no credentials: present a client certificate signed by the root cluster's client CA{}", if *.0 { " or a bearer token" } else { "" })]
    NoCredentials(bool),
    /// 401.
    #[error("client certificate has no usable subject: {0}")]
    BadCertificate(String),
    /// 401.
    #[error("the bearer token was not accepted by the root cluster (TokenReview)")]
    BadToken,
    /// Answered with 403. The message names no node, so it is the same whether the pod asked
    /// about exists or not; the node is in the log line instead.
    #[error("user {user:?} cannot {verb} resource \"nodes/{subresource}\"")]
    Forbidden {
        user: String,
        verb: String,
        subresource: String,
        node: String,
    },
    /// 403 in `AUTH_MODE=x509`: a verified certificate of a user not allowed.
    #[error(
        "user {user:?} is not allowed: AUTH_MODE=x509 serves only the users in X509_ALLOWED_USERS"
    )]
    NotAllowed { user: String },
    /// 429: too many new tokens to review from one address.
    #[error(
        "too many new bearer tokens from {0} to review (more than {REVIEWS_PER_SECOND} a second); try again later"
    )]
    Throttled(IpAddr),
    /// 429: too many new tokens to review from all addresses together.
    #[error(
        "too many new bearer tokens to review (more than {ALL_REVIEWS_PER_SECOND} a second from all callers); try again later"
    )]
    ThrottledAll,
    /// 503: the root cluster could not answer a review.
    #[error("cannot check access with the root cluster: {0}")]
    Unavailable(String),
}

impl AuthError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> http::StatusCode {
        match self {
            AuthError::Forbidden { .. } | AuthError::NotAllowed { .. } => {
                http::StatusCode::FORBIDDEN
            }
            AuthError::Throttled(_) | AuthError::ThrottledAll => {
                http::StatusCode::TOO_MANY_REQUESTS
            }
            AuthError::Unavailable(_) => http::StatusCode::SERVICE_UNAVAILABLE,
            _ => http::StatusCode::UNAUTHORIZED,
        }
    }
}

/// What a caller asks to do, in kubelet authorization terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Access {
    pub verb: String,
    pub subresource: String,
    pub node: String,
    /// Whether `nodes/proxy` also grants it, when `subresource` is denied (the 1.36 kubelet's
    /// fine-grained paths that used to need `nodes/proxy`: `/pods`, `/healthz`, `/configz`).
    pub proxy_fallback: bool,
}

impl Access {
    /// The access a kubelet call needs: `nodes/proxy` on `node`; verb from the method like the
    /// kubelet, except that the streaming calls always need `create`.
    pub fn for_call(kind: Kind, method: &http::Method, node: &str) -> Access {
        let verb = if kind.is_streaming() {
            "create"
        } else {
            verb_of(method)
        };
        Access {
            verb: verb.to_string(),
            subresource: "proxy".to_string(),
            node: node.to_string(),
            proxy_fallback: false,
        }
    }

    /// The access a non-relay kubelet path needs, as a 1.36 kubelet (`KubeletFineGrainedAuthz`,
    /// GA) authorizes it: `/metrics*` `nodes/metrics`, `/stats*` `nodes/stats`, `/logs*`
    /// `nodes/log`, `/spec*` `nodes/spec`, `/checkpoint*` `nodes/checkpoint`; `/pods` and
    /// `/runningPods` `nodes/pods`, `/healthz` `nodes/healthz`, `/configz` `nodes/configz`, each
    /// with `nodes/proxy` as the fallback older RBAC relies on; anything else `nodes/proxy`. The
    /// verb follows the method.
    pub fn for_path(path: &str, method: &http::Method, node: &str) -> Access {
        let under = |prefix: &str| {
            path == prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        const FINE: [(&str, &str, bool); 9] = [
            ("/metrics", "metrics", false),
            ("/stats", "stats", false),
            ("/logs", "log", false),
            ("/spec", "spec", false),
            ("/checkpoint", "checkpoint", false),
            ("/pods", "pods", true),
            ("/runningPods", "pods", true),
            ("/healthz", "healthz", true),
            ("/configz", "configz", true),
        ];
        let (subresource, proxy_fallback) = FINE
            .iter()
            .find(|(prefix, _, _)| under(prefix))
            .map(|(_, sub, fallback)| (*sub, *fallback))
            .unwrap_or(("proxy", false));
        Access {
            verb: verb_of(method).to_string(),
            subresource: subresource.to_string(),
            node: node.to_string(),
            proxy_fallback,
        }
    }

    /// The same access through `nodes/proxy`.
    fn via_proxy(&self) -> Access {
        Access {
            subresource: "proxy".to_string(),
            proxy_fallback: false,
            ..self.clone()
        }
    }
}

/// The kubelet's method-to-verb rule for plain requests.
fn verb_of(method: &http::Method) -> &'static str {
    match *method {
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "get",
    }
}

/// Identifies and authorizes callers according to the configured mode. One is shared by every
/// port, so its caches and its review budget are too.
pub struct Authenticator {
    mode: AuthMode,
    root: Option<Client>,
    /// `AUTH_MODE=x509`: the users (certificate CNs) that may call.
    x509_allowed: BTreeSet<String>,
    tokens: Cache<[u8; 32], Caller>,
    refused: Cache<[u8; 32], ()>,
    decisions: Cache<(Caller, Access), bool>,
    reviews: Mutex<Budgets>,
}

/// The budgets of TokenReviews: one per source address, and one for all.
struct Budgets {
    all: TokenBucket,
    sources: HashMap<IpAddr, TokenBucket>,
}

impl Budgets {
    fn new() -> Budgets {
        Budgets {
            all: TokenBucket::full(ALL_REVIEW_BURST),
            sources: HashMap::new(),
        }
    }

    /// Takes one review from `source`'s budget and the shared one.
    fn take(&mut self, source: IpAddr) -> Result<(), AuthError> {
        if !self.sources.contains_key(&source) && self.sources.len() >= SOURCES_LIMIT {
            self.sources
                .retain(|_, bucket| !bucket.is_full(REVIEWS_PER_SECOND, REVIEW_BURST));
            if self.sources.len() >= SOURCES_LIMIT {
                // Every one spent its burst: forgetting them only gives bursts back, and the
                // shared budget still bounds what the root apiserver is asked.
                self.sources.clear();
            }
        }
        let own = self
            .sources
            .entry(source)
            .or_insert_with(|| TokenBucket::full(REVIEW_BURST));
        if !own.take(REVIEWS_PER_SECOND, REVIEW_BURST) {
            return Err(AuthError::Throttled(source));
        }
        if !self.all.take(ALL_REVIEWS_PER_SECOND, ALL_REVIEW_BURST) {
            return Err(AuthError::ThrottledAll);
        }
        Ok(())
    }
}

impl Authenticator {
    /// `root` is needed for `webhook` mode (reviews go to the root apiserver);
    /// `x509_allowed` for `x509` mode.
    pub fn new(
        mode: AuthMode,
        root: Option<Client>,
        x509_allowed: impl IntoIterator<Item = String>,
    ) -> Authenticator {
        Authenticator {
            mode,
            root,
            x509_allowed: x509_allowed.into_iter().collect(),
            tokens: Cache::default(),
            refused: Cache::default(),
            decisions: Cache::default(),
            reviews: Mutex::new(Budgets::new()),
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Identifies a caller from its verified client certificate or its bearer token; `source`
    /// is the address the request came from (whose budget a new token's review takes).
    pub async fn authenticate(
        &self,
        cert: Option<&CertificateDer<'_>>,
        headers: &http::HeaderMap,
        source: IpAddr,
    ) -> Result<Caller, AuthError> {
        if let Some(cert) = cert {
            return caller_from_cert(cert);
        }
        match self.mode {
            AuthMode::None => Ok(Caller::named(
                "system:anonymous",
                &["system:unauthenticated"],
            )),
            AuthMode::X509 => Err(AuthError::NoCredentials(false)),
            AuthMode::Webhook => match bearer_token(headers) {
                Some(token) => self.review_token(token, source).await,
                None => Err(AuthError::NoCredentials(true)),
            },
        }
    }

    /// Checks that `caller` may do `access` (or, where it has one, its `nodes/proxy` fallback).
    pub async fn authorize(&self, caller: &Caller, access: &Access) -> Result<(), AuthError> {
        match self.mode {
            AuthMode::None => return Ok(()),
            AuthMode::X509 if self.x509_allowed.contains(&caller.user) => return Ok(()),
            AuthMode::X509 => {
                return Err(AuthError::NotAllowed {
                    user: caller.user.clone(),
                });
            }
            AuthMode::Webhook => {}
        }
        if self.allowed(caller, access).await?
            || (access.proxy_fallback && self.allowed(caller, &access.via_proxy()).await?)
        {
            return Ok(());
        }
        let subresource = if access.proxy_fallback {
            format!("{}\" or \"nodes/proxy", access.subresource)
        } else {
            access.subresource.clone()
        };
        Err(AuthError::Forbidden {
            user: caller.user.clone(),
            verb: access.verb.clone(),
            subresource,
            node: access.node.clone(),
        })
    }

    /// One decision, cached.
    async fn allowed(&self, caller: &Caller, access: &Access) -> Result<bool, AuthError> {
        let key = (caller.clone(), access.clone());
        if let Some(allowed) = self.decisions.get(&key) {
            return Ok(allowed);
        }
        let allowed = self.review_access(caller, access).await?;
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        self.decisions.put(key, allowed, ttl);
        Ok(allowed)
    }

    fn root(&self) -> Result<Client, AuthError> {
        self.root
            .clone()
            .ok_or_else(|| AuthError::Unavailable("no root cluster client".to_string()))
    }

    async fn review_token(&self, token: &str, source: IpAddr) -> Result<Caller, AuthError> {
        let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .map_err(|_| AuthError::Unavailable("hashing the token".to_string()))?;
        if let Some(caller) = self.tokens.get(&key) {
            return Ok(caller);
        }
        if self.refused.get(&key).is_some() {
            return Err(AuthError::BadToken);
        }
        self.reviews
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(source)?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.root()?);
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Unavailable(format!("TokenReview: {e}")))?;
        let caller = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
            .and_then(|u| {
                Some(Caller {
                    user: u.username.filter(|n| !n.is_empty())?,
                    uid: u.uid,
                    groups: u.groups.unwrap_or_default(),
                    extra: u.extra.unwrap_or_default(),
                })
            });
        match caller {
            Some(caller) => {
                self.tokens.put(key, caller.clone(), TOKEN_TTL);
                Ok(caller)
            }
            None => {
                self.refused.put(key, (), REFUSED_TOKEN_TTL);
                Err(AuthError::BadToken)
            }
        }
    }

    async fn review_access(&self, caller: &Caller, access: &Access) -> Result<bool, AuthError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(caller.user.clone()),
                uid: caller.uid.clone(),
                groups: Some(caller.groups.clone()),
                extra: (!caller.extra.is_empty()).then(|| caller.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(access.verb.clone()),
                    version: Some("v1".to_string()),
                    resource: Some("nodes".to_string()),
                    subresource: Some(access.subresource.clone()),
                    name: Some(access.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.root()?);
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Unavailable(format!("SubjectAccessReview: {e}")))?;
        Ok(answer
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true)))
    }
}

fn bearer_token(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Reads user (CN) and groups (O) from a client certificate.
pub fn caller_from_cert(der: &CertificateDer<'_>) -> Result<Caller, AuthError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| AuthError::BadCertificate(e.to_string()))?;
    let subject = cert.subject();
    if subject.iter_common_name().count() > 1 {
        return Err(AuthError::BadCertificate(
            "more than one common name (CN): which one is the user is ambiguous".to_string(),
        ));
    }
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or_else(|| AuthError::BadCertificate("no common name".to_string()))?
        .to_string();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    // Like kube-apiserver and the kubelet: every authenticated user is in system:authenticated.
    if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        groups.push(AUTHENTICATED_GROUP.to_string());
    }
    Ok(Caller {
        user,
        uid: None,
        groups,
        extra: BTreeMap::new(),
    })
}

/// A small expiring map, bounded in size: past [`CACHE_LIMIT`] entries the least recently used
/// one goes (expired ones first).
struct Cache<K, V> {
    inner: Mutex<Lru<K, V>>,
}

struct Lru<K, V> {
    /// Each entry's value, expiry and place in `order`.
    entries: HashMap<K, (V, Instant, u64)>,
    /// Entries by last use, oldest first.
    order: BTreeMap<u64, K>,
    next: u64,
}

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Cache {
            inner: Mutex::new(Lru {
                entries: HashMap::new(),
                order: BTreeMap::new(),
                next: 0,
            }),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Cache<K, V> {
    fn get(&self, key: &K) -> Option<V> {
        let mut lru = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let stamp = lru.next;
        let (value, expires, used) = lru.entries.get_mut(key)?;
        if *expires <= Instant::now() {
            return None;
        }
        let (value, old) = (value.clone(), std::mem::replace(used, stamp));
        lru.next += 1;
        lru.order.remove(&old);
        lru.order.insert(stamp, key.clone());
        Some(value)
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        let mut lru = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let stamp = lru.next;
        lru.next += 1;
        if let Some((_, _, old)) = lru.entries.remove(&key) {
            lru.order.remove(&old);
        }
        if lru.entries.len() >= CACHE_LIMIT {
            let now = Instant::now();
            let expired: Vec<(K, u64)> = lru
                .entries
                .iter()
                .filter(|(_, (_, expires, _))| *expires <= now)
                .map(|(k, (_, _, used))| (k.clone(), *used))
                .collect();
            for (k, used) in expired {
                lru.entries.remove(&k);
                lru.order.remove(&used);
            }
            while lru.entries.len() >= CACHE_LIMIT {
                let Some((_, oldest)) = lru.order.pop_first() else {
                    break;
                };
                lru.entries.remove(&oldest);
            }
        }
        lru.order.insert(stamp, key.clone());
        lru.entries
            .insert(key, (value, Instant::now() + ttl, stamp));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn one_source_spending_its_reviews_leaves_the_others_theirs() {
        let mut budgets = Budgets::new();
        let (flood, other) = (LOOPBACK, IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 7)));
        let granted = (0..1000).filter(|_| budgets.take(flood).is_ok()).count();
        assert!(
            (50..60).contains(&granted),
            "{granted}: the burst, little more"
        );
        assert!(matches!(budgets.take(flood), Err(AuthError::Throttled(ip)) if ip == flood));
        for _ in 0..50 {
            assert!(
                budgets.take(other).is_ok(),
                "another source's burst is whole"
            );
        }
    }

    #[test]
    fn all_sources_together_are_bounded_too() {
        let mut budgets = Budgets::new();
        let granted = (0..1000u32)
            .filter(|i| {
                budgets
                    .take(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)))
                    .is_ok()
            })
            .count();
        assert!((200..220).contains(&granted), "{granted}");
    }

    #[test]
    fn streaming_calls_always_need_create() {
        for kind in [Kind::Exec, Kind::Attach, Kind::PortForward] {
            let access = Access::for_call(kind, &http::Method::GET, "relaylet-leaf-1");
            assert_eq!(access.verb, "create", "{kind}");
            assert_eq!(access.subresource, "proxy");
            assert_eq!(access.node, "relaylet-leaf-1");
        }
        assert_eq!(
            Access::for_call(Kind::ContainerLogs, &http::Method::GET, "n").verb,
            "get"
        );
    }

    #[test]
    fn other_paths_need_the_kubelet_subresource() {
        let get = &http::Method::GET;
        let cases = [
            ("/metrics", "metrics", false),
            ("/metrics/resource", "metrics", false),
            ("/metrics/cadvisor", "metrics", false),
            ("/metricsfoo", "proxy", false),
            ("/stats/summary", "stats", false),
            ("/stats", "stats", false),
            ("/logs/", "log", false),
            ("/spec/", "spec", false),
            ("/checkpoint/ns/pod/c", "checkpoint", false),
            ("/pods", "pods", true),
            ("/runningPods/", "pods", true),
            ("/healthz", "healthz", true),
            ("/configz", "configz", true),
            ("/debug/pprof", "proxy", false),
        ];
        for (path, subresource, fallback) in cases {
            let access = Access::for_path(path, get, "n");
            assert_eq!(access.subresource, subresource, "{path}");
            assert_eq!(access.proxy_fallback, fallback, "{path}");
            assert_eq!(access.verb, "get", "{path}");
        }
        assert_eq!(
            Access::for_path("/pods", &http::Method::POST, "n").verb,
            "create"
        );
    }

    #[test]
    fn bearer_tokens_are_read_case_insensitively() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::AUTHORIZATION,
            "bearer abc.def".parse().unwrap(),
        );
        assert_eq!(bearer_token(&headers), Some("abc.def"));
        headers.insert(
            http::header::AUTHORIZATION,
            "Basic Zm9vOmJhcg==".parse().unwrap(),
        );
        assert_eq!(bearer_token(&headers), None);
        headers.insert(http::header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer_token(&headers), None);
    }

    #[tokio::test]
    async fn modes_without_credentials() {
        let headers = http::HeaderMap::new();
        let none = Authenticator::new(AuthMode::None, None, []);
        assert_eq!(
            none.authenticate(None, &headers, LOOPBACK)
                .await
                .unwrap()
                .user,
            "system:anonymous"
        );
        let x509 = Authenticator::new(AuthMode::X509, None, []);
        assert_eq!(
            x509.authenticate(None, &headers, LOOPBACK).await,
            Err(AuthError::NoCredentials(false))
        );
        let webhook = Authenticator::new(AuthMode::Webhook, None, []);
        assert_eq!(
            webhook.authenticate(None, &headers, LOOPBACK).await,
            Err(AuthError::NoCredentials(true))
        );
    }

    #[test]
    fn certificate_callers_are_in_system_authenticated() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "eve");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "developers");
        let cert = params.self_signed(&key).unwrap();
        let caller = caller_from_cert(cert.der()).unwrap();
        assert_eq!(caller.user, "eve");
        assert_eq!(caller.groups, ["developers", "system:authenticated"]);
    }

    #[tokio::test]
    async fn x509_mode_serves_only_the_allowed_users() {
        let x509 = Authenticator::new(
            AuthMode::X509,
            None,
            ["kube-apiserver-kubelet-client".to_string()],
        );
        let access = Access::for_call(Kind::Exec, &http::Method::POST, "relaylet-leaf-1");
        let apiserver = Caller::named("kube-apiserver-kubelet-client", &["system:masters"]);
        assert_eq!(x509.authorize(&apiserver, &access).await, Ok(()));
        let kubelet = Caller::named("system:node:worker-1", &["system:nodes"]);
        assert_eq!(
            x509.authorize(&kubelet, &access).await,
            Err(AuthError::NotAllowed {
                user: "system:node:worker-1".into()
            })
        );
    }

    #[test]
    fn a_certificate_with_two_common_names_is_refused() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        // rcgen keeps one entry per type, so the second CN goes in as a raw attribute.
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:masters-member");
        params.distinguished_name.push(
            rcgen::DnType::CustomDnType(vec![2, 5, 4, 3]),
            "kube-apiserver-kubelet-client",
        );
        let cert = params.self_signed(&key).unwrap();
        let err = caller_from_cert(cert.der()).unwrap_err();
        assert!(
            matches!(&err, AuthError::BadCertificate(m) if m.contains("more than one common name")),
            "{err}"
        );
    }

    #[test]
    fn cache_expires_and_stays_bounded() {
        let cache: Cache<u32, bool> = Cache::default();
        cache.put(1, true, Duration::from_secs(60));
        cache.put(2, false, Duration::ZERO);
        assert_eq!(cache.get(&1), Some(true));
        assert_eq!(cache.get(&2), None);
        for i in 3..(CACHE_LIMIT as u32 + 500) {
            cache.put(i, true, Duration::from_secs(60));
            // Used all along: never the least recently used.
            assert_eq!(cache.get(&1), Some(true), "after {i}");
        }
        let lru = cache.inner.lock().unwrap();
        assert!(lru.entries.len() <= CACHE_LIMIT);
        assert_eq!(lru.entries.len(), lru.order.len());
        drop(lru);
        assert_eq!(cache.get(&3), None, "the least recently used went");
        assert_eq!(cache.get(&(CACHE_LIMIT as u32 + 499)), Some(true));
    }
}

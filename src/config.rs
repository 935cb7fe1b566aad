//! relaylet's settings, read from environment variables and validated once at start.
//!
//! Names follow Kosmos where Kosmos has one (`LEAF_NODE_IP`, `PREFERRED-ADDRESS-TYPE`,
//! `APISERVER_CERT_LOCATION`, ...), so an existing clustertree install can switch without
//! renaming. Every bad value is reported on one line naming the variable, and all of them are
//! reported at once so a user fixes a manifest in one go.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::model::counterpart::{LeafPodMatch, NamespaceMap};
use crate::model::dns::check_dns_label;

/// The label that marks a Secret as a leaf cluster's kubeconfig; its value is the leaf name.
pub const DEFAULT_LEAF_SECRET_LABEL: &str = "relaylet.io/leaf-cluster";

/// The second switch `AUTH_MODE=none` needs.
pub const INSECURE_NONE_SWITCH: &str = "INSECURE_ALLOW_UNAUTHENTICATED_EXEC";

/// The address types kube-apiserver understands in `--kubelet-preferred-address-types`.
pub const ADDRESS_TYPES: [&str; 5] = [
    "Hostname",
    "InternalDNS",
    "InternalIP",
    "ExternalDNS",
    "ExternalIP",
];

/// How callers of the kubelet API are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Client certificates from the root client CA, or bearer tokens via TokenReview; every
    /// request authorized with SubjectAccessReview.
    Webhook,
    /// Client certificates from the root client CA only.
    X509,
    /// Anyone may call. For local sandboxes only.
    None,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// One leaf cluster given directly by kubeconfig file (`LEAF_KUBECONFIG`), without a Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticLeaf {
    pub name: String,
    pub kubeconfig: PathBuf,
    /// `LEAF_NAMESPACE_MAP`: root namespace → leaf namespace (see `counterpart`).
    pub namespaces: NamespaceMap,
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServingCert {
    /// PEM files, re-read when they change.
    Files { cert: PathBuf, key: PathBuf },
    /// A self-signed certificate made at start for `LEAF_NODE_IP`.
    SelfSigned,
    /// A certificate from the root cluster's `kubernetes.io/kubelet-serving` signer, requested
    /// with a CertificateSigningRequest (`SERVING_CERT_MODE=csr`; see `serving_csr`).
    Csr(CsrSettings),
}

/// How the CSR-issued serving certificate is requested and renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsrSettings {
    /// The CSR's `expirationSeconds` (`SERVING_CERT_CSR_EXPIRATION`); the signer's own
    /// duration when unset. The CSR API's minimum is 10 minutes.
    pub expiration: Option<Duration>,
    /// Renew once less than this is left (`SERVING_CERT_RENEW_BEFORE`); by default once 80%
    /// of the certificate's validity has passed, as a kubelet does (70-90%).
    pub renew_before: Option<Duration>,
    /// Approve relaylet's own CSRs after checking them (`SERVING_CERT_CSR_APPROVER`).
    pub approver: bool,
}

/// The CSR API refuses a shorter `expirationSeconds`.
pub const MIN_CSR_EXPIRATION: Duration = Duration::from_secs(600);

/// `NODE_PORTS` unless set: the chart's `nodeServer.nodePorts` default too.
pub const DEFAULT_NODE_PORTS: u16 = 1000;

/// Every setting relaylet reads from its environment.
#[derive(Debug, Clone)]
pub struct Config {
    pub leaf_node_ip: IpAddr,
    pub preferred_address_type: String,
    pub serving_cert: ServingCert,
    pub client_ca: Option<PathBuf>,
    pub node_server_port: u16,
    /// How many ports above `node_server_port` the virtual nodes' own listeners may take
    /// (`NODE_PORTS`): one per virtual node a replica serves, so the most it serves at once.
    pub node_ports: u16,
    pub static_leaf: Option<StaticLeaf>,
    pub leaf_secret_namespace: Option<String>,
    pub leaf_secret_label: String,
    pub node_name_prefix: String,
    pub auth_mode: AuthMode,
    /// `AUTH_MODE=x509`: the client certificate CNs that may call (`X509_ALLOWED_USERS`).
    pub x509_allowed_users: Vec<String>,
    pub stream_idle_timeout: Duration,
    pub stream_creation_timeout: Duration,
    /// How old a virtual node's `/stats/summary`, `/metrics/resource` and `/pods` answer may be
    /// when it is served again (`NODE_STATS_CACHE_TTL`, default 5 s; metrics-server scrapes
    /// every 15 s). Concurrent callers share one read whatever this is.
    pub node_stats_cache_ttl: Duration,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    pub leader_elect: bool,
    /// `REPLICA_SELECTOR`: the labels every relaylet pod of this install carries (the chart
    /// sets the Deployment's selector). With leader election, a replica Lease counts only for
    /// a Running pod these labels select; `None`: this replica's own pod labels, read at start
    /// (see `replicas::live_pods`).
    pub replica_selector: Option<ReplicaSelector>,
    /// What proves a leaf pod is a root pod's counterpart (`LEAF_POD_MATCH`, `LEAF_POD_MARKER`).
    pub leaf_pod_match: LeafPodMatch,
    /// Keep one connection to each leaf in use dialed ahead of the next session
    /// (`LEAF_SPARE_CONNECTION`, default true; see `warm_connector`).
    pub leaf_spare_connection: bool,
    /// Declare `ExtendWebSocketsToKubelet` on virtual Nodes whose leaf apiserver takes the
    /// WebSocket calls unchanged (`EXTEND_WEBSOCKETS_TO_KUBELET`, default true; see
    /// `virtual_node::desired::declared_features`).
    pub extend_websockets_to_kubelet: bool,
    pub metrics_addr: SocketAddr,
    pub log_format: LogFormat,
    pub limits: Limits,
    /// How long open sessions may run on after SIGTERM before they are cut
    /// (`SHUTDOWN_GRACE_PERIOD`, default 30s; keep it below the pod's
    /// `terminationGracePeriodSeconds`).
    pub shutdown_grace_period: Duration,
    /// How many pods and nodes of one leaf relaylet keeps (`LEAF_MAX_PODS`, `LEAF_MAX_NODES`).
    pub leaf_bounds: LeafBounds,
}

/// How many objects of one leaf relaylet keeps. A leaf is not trusted: one that holds more
/// (or claims to) is not watched until it holds fewer, and its virtual Node says so; every
/// other leaf goes on as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeafBounds {
    /// Leaf pods kept per leaf (`LEAF_MAX_PODS`).
    pub max_pods: usize,
    /// Leaf nodes kept per leaf (`LEAF_MAX_NODES`).
    pub max_nodes: usize,
}

impl Default for LeafBounds {
    /// Kubernetes' own scalability limits for one cluster: 150,000 pods and 5,000 nodes. A leaf
    /// at both costs each replica about 50 MB (a leaf pod about 330 bytes, docs/performance.md;
    /// a stripped node about 1 KiB).
    fn default() -> Self {
        LeafBounds {
            max_pods: 150_000,
            max_nodes: 5_000,
        }
    }
}

/// Caps that keep one client (or a flood) from exhausting relaylet. Past a cap the caller gets
/// a 503 `metav1.Status` and relaylet stays up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open TCP connections in total (`MAX_CONNECTIONS`).
    pub connections: usize,
    /// Open TCP connections from one source address (`MAX_CONNECTIONS_PER_CLIENT`).
    pub connections_per_client: usize,
    /// Connections whose TLS handshake is not done yet (`MAX_PENDING_HANDSHAKES`); one address
    /// may hold an eighth of them.
    pub pending_handshakes: usize,
    /// Connections none of whose requests has been authorized yet, unless their client
    /// certificate's identity is proven (`MAX_UNAUTHENTICATED_CONNECTIONS`), from one address
    /// (`MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT`) and of one certificate user
    /// (`MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER`); see `ops::limits`.
    pub unauthenticated_connections: usize,
    pub unauthenticated_connections_per_client: usize,
    pub unauthenticated_connections_per_user: usize,
    /// Connections of proven callers that may send a large request head at once
    /// (`MAX_LARGE_HEAD_CONNECTIONS`); the others get the small head.
    pub large_head_connections: usize,
    /// Open exec/attach/port-forward streams in total (`MAX_SESSIONS`).
    pub sessions: usize,
    /// Open streams of one authenticated user (`MAX_SESSIONS_PER_USER`). All calls relayed by
    /// the root apiserver share its kubelet-client identity, so keep this generous.
    pub sessions_per_user: usize,
    /// Open streams on pods of one namespace (`MAX_SESSIONS_PER_NAMESPACE`, default a quarter
    /// of `MAX_SESSIONS`): the share one tenant may take behind the root apiserver.
    pub sessions_per_namespace: usize,
    /// Open log streams (`containerLogs`, followed or not) in total (`MAX_LOG_STREAMS`), of
    /// one authenticated user (`MAX_LOG_STREAMS_PER_USER`) and on pods of one namespace
    /// (`MAX_LOG_STREAMS_PER_NAMESPACE`, default a quarter of `MAX_LOG_STREAMS`).
    pub log_streams: usize,
    pub log_streams_per_user: usize,
    pub log_streams_per_namespace: usize,
}

/// The default share of a total cap one namespace may take.
pub fn namespace_share(total: usize) -> usize {
    (total / 4).max(1)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 16384,
            connections_per_client: 8192,
            pending_handshakes: 1024,
            unauthenticated_connections: 256,
            unauthenticated_connections_per_client: 32,
            unauthenticated_connections_per_user: 16,
            large_head_connections: 64,
            sessions: 16384,
            sessions_per_user: 8192,
            sessions_per_namespace: namespace_share(16384),
            log_streams: 1024,
            log_streams_per_user: 1024,
            log_streams_per_namespace: namespace_share(1024),
        }
    }
}

/// One bad environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarError {
    pub var: &'static str,
    pub message: String,
}

impl fmt::Display for VarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.var, self.message)
    }
}

/// All the bad variables found, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError(pub Vec<VarError>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, err) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "invalid configuration: {err}")?;
        }
        Ok(())
    }
}

impl Config {
    /// This replica's name: `POD_NAME`, or one made from its IP. Its leader-election identity
    /// and, in `SERVING_CERT_MODE=csr`, its certificate's `CN=system:node:<name>`.
    pub fn replica_name(&self) -> String {
        self.pod_name.clone().unwrap_or_else(|| {
            format!(
                "relaylet-{}",
                self.leaf_node_ip.to_string().replace(['.', ':'], "-")
            )
        })
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (the environment in production, a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut vars = Vars {
            lookup: &lookup,
            errors: Vec::new(),
        };

        let leaf_node_ip = leaf_node_ip(&mut vars);
        let preferred_address_type = preferred_address_type(&mut vars);
        let serving_cert = serving_cert(&mut vars);

        let node_server_port = match vars.get("NODE_SERVER_PORT") {
            None => 10250,
            // 0: any free port, which the Nodes then name (tests start replicas this way).
            Some(raw) => vars.parse("NODE_SERVER_PORT", &raw, 10250, |v| {
                v.parse::<u16>()
                    .map_err(|_| format!("{v:?} is not a port number 0-65535"))
            }),
        };

        let node_ports = node_ports(&mut vars, node_server_port);
        let static_leaf = static_leaf(&mut vars);
        let node_name_prefix = node_name_prefix(&mut vars);
        let auth_mode = auth_mode(&mut vars);
        let x509_allowed_users = x509_allowed_users(&mut vars, auth_mode);
        let stream_idle_timeout =
            vars.duration("STREAM_IDLE_TIMEOUT", Duration::from_secs(4 * 3600));
        let stream_creation_timeout =
            vars.duration("STREAM_CREATION_TIMEOUT", Duration::from_secs(30));
        let node_stats_cache_ttl = vars.duration("NODE_STATS_CACHE_TTL", Duration::from_secs(5));

        let shutdown_grace_period = vars.duration("SHUTDOWN_GRACE_PERIOD", Duration::from_secs(30));

        let leader_elect = vars.flag("LEADER_ELECT", true);
        let replica_selector = replica_selector(&mut vars, leader_elect);
        let leaf_pod_match = leaf_pod_match(&mut vars);
        let leaf_spare_connection = vars.flag("LEAF_SPARE_CONNECTION", true);
        let extend_websockets_to_kubelet = vars.flag("EXTEND_WEBSOCKETS_TO_KUBELET", true);

        let metrics_addr = metrics_addr(&mut vars);
        let log_format = log_format(&mut vars);
        let limits = limits(&mut vars);
        let leaf_bounds = leaf_bounds(&mut vars);
        let config = Config {
            leaf_node_ip,
            preferred_address_type,
            serving_cert,
            client_ca: vars.get("APISERVER_CA_CERT_LOCATION").map(PathBuf::from),
            node_server_port,
            node_ports,
            static_leaf,
            leaf_secret_namespace: vars.get("LEAF_SECRET_NAMESPACE"),
            leaf_secret_label: vars
                .get("LEAF_SECRET_LABEL")
                .unwrap_or_else(|| DEFAULT_LEAF_SECRET_LABEL.to_string()),
            node_name_prefix,
            auth_mode,
            x509_allowed_users,
            stream_idle_timeout,
            stream_creation_timeout,
            node_stats_cache_ttl,
            pod_name: vars.get("POD_NAME"),
            pod_namespace: vars.get("POD_NAMESPACE"),
            leader_elect,
            replica_selector,
            leaf_pod_match,
            leaf_spare_connection,
            extend_websockets_to_kubelet,
            metrics_addr,
            log_format,
            shutdown_grace_period,
            limits,
            leaf_bounds,
        };
        if vars.errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError(vars.errors))
        }
    }

    /// The virtual node name for a leaf: prefix + leaf name.
    pub fn node_name(&self, leaf: &str) -> String {
        format!("{}{}", self.node_name_prefix, leaf)
    }
}

/// Reads variables and collects what is wrong with them.
struct Vars<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<VarError>,
}

impl Vars<'_> {
    /// The variable's value; empty counts as unset, as Kubernetes manifests often leave it.
    fn get(&self, var: &str) -> Option<String> {
        (self.lookup)(var).filter(|v| !v.trim().is_empty())
    }

    fn error(&mut self, var: &'static str, message: &str) {
        self.errors.push(VarError {
            var,
            message: message.to_string(),
        });
    }

    /// Parses a value; on failure records the error and yields `fallback` so that checking can
    /// go on and report every bad variable at once.
    fn parse<T>(
        &mut self,
        var: &'static str,
        raw: &str,
        fallback: T,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> T {
        match parse(raw.trim()) {
            Ok(value) => value,
            Err(message) => {
                self.error(var, &message);
                fallback
            }
        }
    }

    /// A boolean: `true`/`1` or `false`/`0`.
    fn flag(&mut self, var: &'static str, default: bool) -> bool {
        match self.get(var) {
            None => default,
            Some(raw) => self.parse(var, &raw, default, |v| match v {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(format!("{v:?} is not true or false")),
            }),
        }
    }

    fn count(&mut self, var: &'static str, default: usize) -> usize {
        match self.get(var) {
            None => default,
            Some(raw) => self.parse(var, &raw, default, |v| match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{v:?} is not a whole number greater than zero")),
            }),
        }
    }

    fn duration(&mut self, var: &'static str, default: Duration) -> Duration {
        match self.get(var) {
            None => default,
            Some(raw) => self.parse(var, &raw, default, |v| {
                let d = parse_duration(v)?;
                if d.is_zero() {
                    Err("must be greater than zero".to_string())
                } else {
                    Ok(d)
                }
            }),
        }
    }
}

/// `LEAF_NODE_IP`: required, the pod IP.
fn leaf_node_ip(vars: &mut Vars<'_>) -> IpAddr {
    match vars.get("LEAF_NODE_IP") {
        None => {
            vars.error(
                "LEAF_NODE_IP",
                "required: set it to the pod IP (downward API status.podIP)",
            );
            IpAddr::from([0, 0, 0, 0])
        }
        Some(raw) => vars.parse("LEAF_NODE_IP", &raw, IpAddr::from([0, 0, 0, 0]), |v| {
            v.parse::<IpAddr>()
                .map_err(|_| format!("{v:?} is not an IP address"))
        }),
    }
}

/// `PREFERRED_ADDRESS_TYPE` (or Kosmos' `PREFERRED-ADDRESS-TYPE`).
fn preferred_address_type(vars: &mut Vars<'_>) -> String {
    // Kosmos spells it with dashes, which most shells cannot export; accept both.
    let (address_var, address_raw) = match vars.get("PREFERRED-ADDRESS-TYPE") {
        Some(v) => ("PREFERRED-ADDRESS-TYPE", Some(v)),
        None => ("PREFERRED_ADDRESS_TYPE", vars.get("PREFERRED_ADDRESS_TYPE")),
    };

    match address_raw {
        None => "InternalDNS".to_string(),
        Some(raw) => vars.parse(address_var, &raw, String::new(), |v| {
            ADDRESS_TYPES
                .iter()
                .find(|t| t.eq_ignore_ascii_case(v))
                .map(|t| t.to_string())
                .ok_or_else(|| format!("{v:?} is not one of {}", ADDRESS_TYPES.join(", ")))
        }),
    }
}

/// `LEAF_KUBECONFIG`, `LEAF_CLUSTER_NAME`, `LEAF_NAMESPACE_MAP`: one leaf without Secrets.
fn static_leaf(vars: &mut Vars<'_>) -> Option<StaticLeaf> {
    match (vars.get("LEAF_KUBECONFIG"), vars.get("LEAF_CLUSTER_NAME")) {
        (Some(path), name) => {
            let name = name.unwrap_or_else(|| "leaf".to_string());
            if let Err(message) = check_dns_label(&name) {
                vars.error("LEAF_CLUSTER_NAME", &message);
            }
            let namespaces = match vars.get("LEAF_NAMESPACE_MAP") {
                None => NamespaceMap::default(),
                Some(raw) => vars.parse(
                    "LEAF_NAMESPACE_MAP",
                    &raw,
                    NamespaceMap::default(),
                    NamespaceMap::parse,
                ),
            };
            Some(StaticLeaf {
                name,
                kubeconfig: path.into(),
                namespaces,
            })
        }
        (None, Some(_)) => {
            vars.error(
                "LEAF_CLUSTER_NAME",
                "set without LEAF_KUBECONFIG: name a kubeconfig file for the leaf, or drop it",
            );
            None
        }
        (None, None) => {
            if vars.get("LEAF_NAMESPACE_MAP").is_some() {
                vars.error(
                    "LEAF_NAMESPACE_MAP",
                    "set without LEAF_KUBECONFIG: a leaf Secret carries its map in its relaylet.io/namespace-map annotation",
                );
            }
            None
        }
    }
}

/// `NODE_NAME_PREFIX`.
fn node_name_prefix(vars: &mut Vars<'_>) -> String {
    let node_name_prefix = vars
        .get("NODE_NAME_PREFIX")
        .unwrap_or_else(|| "relaylet-".to_string());
    if !node_name_prefix.is_empty()
        && let Err(message) = check_dns_subdomain_prefix(&node_name_prefix)
    {
        vars.error("NODE_NAME_PREFIX", &message);
    }
    node_name_prefix
}

/// `AUTH_MODE`, and the second switch `none` needs.
fn auth_mode(vars: &mut Vars<'_>) -> AuthMode {
    let auth_mode = match vars.get("AUTH_MODE") {
        None => AuthMode::Webhook,
        Some(raw) => vars.parse("AUTH_MODE", &raw, AuthMode::Webhook, |v| match v {
            "webhook" => Ok(AuthMode::Webhook),
            "x509" => Ok(AuthMode::X509),
            "none" => Ok(AuthMode::None),
            _ => Err(format!("{v:?} is not one of webhook, x509, none")),
        }),
    };

    // AUTH_MODE=none opens exec into every leaf pod to whoever reaches the port: a setting
    // that must not be one typo away, so it needs a second, loudly named switch.
    let anonymous_ok = vars.flag(INSECURE_NONE_SWITCH, false);
    if auth_mode == AuthMode::None && !anonymous_ok {
        vars.error(
            "AUTH_MODE",
            &format!(
                "\"none\" lets anyone who reaches the kubelet port exec into every leaf pod; it is for local sandboxes only, and needs {INSECURE_NONE_SWITCH}=true as well"
            ),
        );
    }
    auth_mode
}

/// `X509_ALLOWED_USERS`: required, and only meaningful, with `AUTH_MODE=x509`. That mode asks
/// the root cluster nothing, so the root client CA is all it checks, and that CA signs every real
/// node's kubelet client certificate too: without a list, any of them could exec into every leaf
/// pod.
fn x509_allowed_users(vars: &mut Vars<'_>, mode: AuthMode) -> Vec<String> {
    let users: Vec<String> = vars
        .get("X509_ALLOWED_USERS")
        .map(|raw| {
            raw.split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    match (mode, users.is_empty()) {
        (AuthMode::X509, true) => vars.error(
            "AUTH_MODE",
            "\"x509\" authorizes nothing: every certificate of the root client CA (every node's kubelet client certificate among them) could exec into every leaf pod; list the certificate CNs that may call in X509_ALLOWED_USERS (the root apiserver's kubelet client, e.g. kube-apiserver-kubelet-client), or use webhook",
        ),
        (AuthMode::X509, false) | (_, true) => {}
        (_, false) => vars.error(
            "X509_ALLOWED_USERS",
            "means nothing unless AUTH_MODE=x509 (webhook mode authorizes each caller with a SubjectAccessReview)",
        ),
    }
    users
}

/// `LEAF_POD_MATCH` and `LEAF_POD_MARKER`.
fn leaf_pod_match(vars: &mut Vars<'_>) -> LeafPodMatch {
    let mode = vars.get("LEAF_POD_MATCH");
    let marker = vars.get("LEAF_POD_MARKER");
    match LeafPodMatch::parse(mode.as_deref(), marker.as_deref()) {
        Ok(rule) => rule,
        Err(message) => {
            let known = ["root-uid", "label", "name"];
            let var = match &mode {
                Some(m) if !known.contains(&m.as_str()) => "LEAF_POD_MATCH",
                _ => "LEAF_POD_MARKER",
            };
            vars.error(var, &message);
            LeafPodMatch::default()
        }
    }
}

// ---- REPLICA_SELECTOR (replica identity, issue 37 item 3) ----

/// Labels that select this install's relaylet pods: equality only, at least one, as a
/// Deployment's `matchLabels`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSelector(pub std::collections::BTreeMap<String, String>);

impl ReplicaSelector {
    /// Parses `key=value,key=value`; every key and value checked as the apiserver checks labels.
    pub fn parse(spec: &str) -> Result<ReplicaSelector, String> {
        let mut labels = std::collections::BTreeMap::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value"))?;
            // `k==v` is the same selector as `k=v` in kube's syntax; `!=` is not a Deployment's.
            let value = value.strip_prefix('=').unwrap_or(value);
            let (key, value) = (key.trim(), value.trim());
            check_label_key(key).map_err(|e| format!("label key {key:?}: {e}"))?;
            check_label_value(value).map_err(|e| format!("label value {value:?}: {e}"))?;
            if labels.insert(key.to_string(), value.to_string()).is_some() {
                return Err(format!("label key {key:?} is given twice"));
            }
        }
        if labels.is_empty() {
            return Err(
                "no labels: name at least one key=value (the Deployment's selector)".into(),
            );
        }
        Ok(ReplicaSelector(labels))
    }

    /// The selector as a `labelSelector` query value.
    pub fn query(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `REPLICA_SELECTOR`: optional; meaningless (and refused) with `LEADER_ELECT=false`, where
/// there are no other replicas to tell apart.
fn replica_selector(vars: &mut Vars<'_>, leader_elect: bool) -> Option<ReplicaSelector> {
    let raw = vars.get("REPLICA_SELECTOR")?;
    let selector = vars.parse("REPLICA_SELECTOR", &raw, None, |v| {
        ReplicaSelector::parse(v).map(Some)
    })?;
    if !leader_elect {
        vars.error(
            "REPLICA_SELECTOR",
            "means nothing with LEADER_ELECT=false (a single replica has no peers to check)",
        );
    }
    Some(selector)
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric.
fn check_label_key(key: &str) -> Result<(), String> {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            crate::model::dns::check_dns_subdomain(prefix)?;
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err("the name part is empty".into());
    }
    check_label_value(name)
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_` or `.`, starting and ending
/// alphanumeric.
fn check_label_value(value: &str) -> Result<(), String> {
    let ok_end = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    if value.len() > 63 {
        Err("longer than 63 characters".into())
    } else if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        Err("only letters, digits, '-', '_' and '.' are allowed".into())
    } else if !ok_end(value.chars().next()) || !ok_end(value.chars().last()) {
        Err("must start and end with a letter or digit".into())
    } else {
        Ok(())
    }
}

// ---- end REPLICA_SELECTOR ----

/// `METRICS_ADDR`.
fn metrics_addr(vars: &mut Vars<'_>) -> SocketAddr {
    match vars.get("METRICS_ADDR") {
        None => SocketAddr::from(([0, 0, 0, 0], 9090)),
        Some(raw) => vars.parse(
            "METRICS_ADDR",
            &raw,
            SocketAddr::from(([0, 0, 0, 0], 9090)),
            |v| {
                v.parse::<SocketAddr>()
                    .map_err(|_| format!("{v:?} is not an address like 0.0.0.0:9090"))
            },
        ),
    }
}

/// `LOG_FORMAT`.
fn log_format(vars: &mut Vars<'_>) -> LogFormat {
    match vars.get("LOG_FORMAT") {
        None => LogFormat::Text,
        Some(raw) => vars.parse("LOG_FORMAT", &raw, LogFormat::Text, |v| match v {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("{v:?} is not text or json")),
        }),
    }
}

/// The connection and session caps (`MAX_*`).
/// `NODE_PORTS`: every virtual node gets a listener of its own on the first free port above
/// `NODE_SERVER_PORT` (`node_server::node_ports`) on the replica that writes its Node, so this is
/// the most virtual nodes one replica serves at once. The chart's NetworkPolicy opens exactly
/// this range, from the same value.
fn node_ports(vars: &mut Vars<'_>, node_server_port: u16) -> u16 {
    let Some(raw) = vars.get("NODE_PORTS") else {
        return DEFAULT_NODE_PORTS;
    };
    vars.parse("NODE_PORTS", &raw, DEFAULT_NODE_PORTS, |v| {
        let n = v
            .parse::<u16>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{v:?} is not a whole number 1-65535"))?;
        // NODE_SERVER_PORT=0 picks its port at start; the search stops at 65535 then.
        if node_server_port != 0 && node_server_port.checked_add(n).is_none() {
            return Err(format!(
                "{n} ports above NODE_SERVER_PORT={node_server_port} go past 65535"
            ));
        }
        Ok(n)
    })
}

fn limits(vars: &mut Vars<'_>) -> Limits {
    let defaults = Limits::default();
    // The namespace shares default to a quarter of the totals as set.
    let sessions = vars.count("MAX_SESSIONS", defaults.sessions);
    let log_streams = vars.count("MAX_LOG_STREAMS", defaults.log_streams);

    Limits {
        connections: vars.count("MAX_CONNECTIONS", defaults.connections),
        connections_per_client: vars.count(
            "MAX_CONNECTIONS_PER_CLIENT",
            defaults.connections_per_client,
        ),
        pending_handshakes: vars.count("MAX_PENDING_HANDSHAKES", defaults.pending_handshakes),
        unauthenticated_connections: vars.count(
            "MAX_UNAUTHENTICATED_CONNECTIONS",
            defaults.unauthenticated_connections,
        ),
        unauthenticated_connections_per_client: vars.count(
            "MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT",
            defaults.unauthenticated_connections_per_client,
        ),
        unauthenticated_connections_per_user: vars.count(
            "MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER",
            defaults.unauthenticated_connections_per_user,
        ),
        large_head_connections: vars.count(
            "MAX_LARGE_HEAD_CONNECTIONS",
            defaults.large_head_connections,
        ),
        sessions,
        sessions_per_user: vars.count("MAX_SESSIONS_PER_USER", defaults.sessions_per_user),
        sessions_per_namespace: vars.count("MAX_SESSIONS_PER_NAMESPACE", namespace_share(sessions)),
        log_streams,
        log_streams_per_user: vars.count("MAX_LOG_STREAMS_PER_USER", defaults.log_streams_per_user),
        log_streams_per_namespace: vars.count(
            "MAX_LOG_STREAMS_PER_NAMESPACE",
            namespace_share(log_streams),
        ),
    }
}

/// `LEAF_MAX_PODS`, `LEAF_MAX_NODES`.
fn leaf_bounds(vars: &mut Vars<'_>) -> LeafBounds {
    let defaults = LeafBounds::default();
    LeafBounds {
        max_pods: vars.count("LEAF_MAX_PODS", defaults.max_pods),
        max_nodes: vars.count("LEAF_MAX_NODES", defaults.max_nodes),
    }
}

/// `SERVING_CERT_MODE` (`generate`, `files`, `csr`) and the variables of the chosen mode. Without
/// a mode, files when `APISERVER_CERT_LOCATION`/`APISERVER_KEY_LOCATION` are set, else generate.
fn serving_cert(vars: &mut Vars<'_>) -> ServingCert {
    let cert = vars.get("APISERVER_CERT_LOCATION");
    let key = vars.get("APISERVER_KEY_LOCATION");
    let mode = vars.get("SERVING_CERT_MODE");
    let files = |vars: &mut Vars<'_>| match (cert.clone(), key.clone()) {
        (Some(cert), Some(key)) => ServingCert::Files {
            cert: cert.into(),
            key: key.into(),
        },
        (Some(_), None) => {
            vars.error(
                "APISERVER_KEY_LOCATION",
                "required when APISERVER_CERT_LOCATION is set",
            );
            ServingCert::SelfSigned
        }
        (None, Some(_)) => {
            vars.error(
                "APISERVER_CERT_LOCATION",
                "required when APISERVER_KEY_LOCATION is set",
            );
            ServingCert::SelfSigned
        }
        (None, None) => {
            vars.error(
                "APISERVER_CERT_LOCATION",
                "required (with APISERVER_KEY_LOCATION) when SERVING_CERT_MODE=files",
            );
            ServingCert::SelfSigned
        }
    };
    match mode.as_deref().map(str::trim) {
        None if cert.is_none() && key.is_none() => ServingCert::SelfSigned,
        None | Some("files") => files(vars),
        Some("generate") | Some("csr") if cert.is_some() || key.is_some() => {
            vars.error(
                "SERVING_CERT_MODE",
                "APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION are set: use SERVING_CERT_MODE=files or unset them",
            );
            ServingCert::SelfSigned
        }
        Some("generate") => ServingCert::SelfSigned,
        Some("csr") => {
            let expiration = vars.get("SERVING_CERT_CSR_EXPIRATION").map(|raw| {
                vars.parse(
                    "SERVING_CERT_CSR_EXPIRATION",
                    &raw,
                    MIN_CSR_EXPIRATION,
                    |v| {
                        let d = parse_duration(v)?;
                        if d < MIN_CSR_EXPIRATION {
                            Err("must be at least 10m (the CSR API's minimum)".to_string())
                        } else {
                            Ok(d)
                        }
                    },
                )
            });
            let renew_before = vars.get("SERVING_CERT_RENEW_BEFORE").map(|raw| {
                vars.parse(
                    "SERVING_CERT_RENEW_BEFORE",
                    &raw,
                    Duration::ZERO,
                    parse_duration,
                )
            });
            let approver = vars.flag("SERVING_CERT_CSR_APPROVER", false);
            ServingCert::Csr(CsrSettings {
                expiration,
                renew_before,
                approver,
            })
        }
        Some(other) => {
            vars.error(
                "SERVING_CERT_MODE",
                &format!("{other:?} is not one of generate, files, csr"),
            );
            ServingCert::SelfSigned
        }
    }
}

/// Parses a Go-style duration (`4h`, `30s`, `1h30m`, `500ms`), the form Kubernetes users know
/// from kubelet flags.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let bad = || format!("{v:?} is not a duration like 30s, 4h or 1h30m");
    if v.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = v;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total = total
            .checked_add(Duration::try_from_secs_f64(number * seconds).map_err(|_| bad())?)
            .ok_or_else(bad)?;
    }
    Ok(total)
}

/// Writes a duration the way [`parse_duration`] reads it, shortest form: `4h`, `1h30m`, `2s`,
/// `1.5s`, `500ms` (for messages users compare with their settings).
pub fn format_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let total = d.as_secs();
    let (hours, minutes, seconds) = (total / 3600, total / 60 % 60, total % 60);
    let millis = d.subsec_millis();
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    if millis > 0 {
        let fraction = format!("{millis:03}");
        out.push_str(&format!("{seconds}.{}s", fraction.trim_end_matches('0')));
    } else if seconds > 0 {
        out.push_str(&format!("{seconds}s"));
    }
    out
}

fn check_dns_subdomain_prefix(prefix: &str) -> Result<(), String> {
    let ok = prefix.len() <= 200
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !prefix.starts_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{prefix:?} must be the start of a DNS subdomain: lowercase letters, digits, '-' and '.'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| map.get(name).cloned())
    }

    fn serving(vars: &[(&str, &str)]) -> Result<ServingCert, String> {
        let mut all = vec![("LEAF_NODE_IP", "10.0.0.1")];
        all.extend_from_slice(vars);
        config(&all)
            .map(|c| c.serving_cert)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn serving_cert_mode_csr_with_its_settings() {
        assert_eq!(
            serving(&[("SERVING_CERT_MODE", "csr")]),
            Ok(ServingCert::Csr(CsrSettings {
                expiration: None,
                renew_before: None,
                approver: false,
            }))
        );
        assert_eq!(
            serving(&[
                ("SERVING_CERT_MODE", "csr"),
                ("SERVING_CERT_CSR_APPROVER", "true"),
                ("SERVING_CERT_CSR_EXPIRATION", "24h"),
                ("SERVING_CERT_RENEW_BEFORE", "2h"),
            ]),
            Ok(ServingCert::Csr(CsrSettings {
                expiration: Some(Duration::from_secs(24 * 3600)),
                renew_before: Some(Duration::from_secs(2 * 3600)),
                approver: true,
            }))
        );
        let short = serving(&[
            ("SERVING_CERT_MODE", "csr"),
            ("SERVING_CERT_CSR_EXPIRATION", "5m"),
        ])
        .unwrap_err();
        assert!(
            short.contains("SERVING_CERT_CSR_EXPIRATION: must be at least 10m"),
            "{short}"
        );
    }

    #[test]
    fn serving_cert_mode_defaults_and_conflicts() {
        assert_eq!(serving(&[]), Ok(ServingCert::SelfSigned));
        assert_eq!(
            serving(&[("SERVING_CERT_MODE", "generate")]),
            Ok(ServingCert::SelfSigned)
        );
        let files = [
            ("APISERVER_CERT_LOCATION", "/tls/tls.crt"),
            ("APISERVER_KEY_LOCATION", "/tls/tls.key"),
        ];
        let expected = Ok(ServingCert::Files {
            cert: "/tls/tls.crt".into(),
            key: "/tls/tls.key".into(),
        });
        assert_eq!(serving(&files), expected);
        let mut with_mode = files.to_vec();
        with_mode.push(("SERVING_CERT_MODE", "files"));
        assert_eq!(serving(&with_mode), expected);
        let mut conflict = files.to_vec();
        conflict.push(("SERVING_CERT_MODE", "csr"));
        assert!(
            serving(&conflict).unwrap_err().contains(
                "SERVING_CERT_MODE: APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION are set"
            )
        );
        assert!(
            serving(&[("SERVING_CERT_MODE", "files")])
                .unwrap_err()
                .contains("APISERVER_CERT_LOCATION: required")
        );
        assert!(
            serving(&[("SERVING_CERT_MODE", "acme")])
                .unwrap_err()
                .contains("\"acme\" is not one of generate, files, csr")
        );
    }

    #[test]
    fn defaults_need_only_the_pod_ip() {
        let c = config(&[("LEAF_NODE_IP", "10.1.2.3")]).unwrap();
        assert_eq!(c.leaf_node_ip.to_string(), "10.1.2.3");
        assert_eq!(c.preferred_address_type, "InternalDNS");
        assert_eq!(c.node_server_port, 10250);
        assert_eq!(c.auth_mode, AuthMode::Webhook);
        assert_eq!(c.stream_idle_timeout, Duration::from_secs(4 * 3600));
        assert_eq!(c.stream_creation_timeout, Duration::from_secs(30));
        assert_eq!(c.serving_cert, ServingCert::SelfSigned);
        assert_eq!(c.leaf_secret_label, DEFAULT_LEAF_SECRET_LABEL);
        assert_eq!(c.node_name("leaf-1"), "relaylet-leaf-1");
        assert!(c.leader_elect);
        assert!(c.leaf_spare_connection);
        assert!(c.extend_websockets_to_kubelet);
        assert_eq!(c.limits, Limits::default());
    }

    #[test]
    fn flags_are_true_or_false() {
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_SPARE_CONNECTION", "false"),
            ("LEADER_ELECT", "0"),
            ("EXTEND_WEBSOCKETS_TO_KUBELET", "false"),
        ])
        .unwrap();
        assert!(!c.leaf_spare_connection && !c.leader_elect && !c.extend_websockets_to_kubelet);
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_SPARE_CONNECTION", "no"),
        ])
        .unwrap_err();
        assert_eq!(err.0[0].var, "LEAF_SPARE_CONNECTION");
        assert!(err.0[0].message.contains("\"no\" is not true or false"));
    }

    #[test]
    fn shutdown_grace_period_defaults_to_30s_and_is_a_duration() {
        let c = config(&[("LEAF_NODE_IP", "10.0.0.1")]).unwrap();
        assert_eq!(c.shutdown_grace_period, Duration::from_secs(30));
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("SHUTDOWN_GRACE_PERIOD", "1m30s"),
        ])
        .unwrap();
        assert_eq!(c.shutdown_grace_period, Duration::from_secs(90));
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("SHUTDOWN_GRACE_PERIOD", "soon"),
        ])
        .unwrap_err();
        assert_eq!(err.0[0].var, "SHUTDOWN_GRACE_PERIOD");
    }

    #[test]
    fn limits_are_positive_counts() {
        let c = config(&[("LEAF_NODE_IP", "10.0.0.1"), ("MAX_SESSIONS", "20000")]).unwrap();
        assert_eq!(c.limits.sessions, 20000);
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("MAX_CONNECTIONS", "0"),
            ("MAX_SESSIONS_PER_USER", "lots"),
        ])
        .unwrap_err();
        let vars: Vec<_> = err.0.iter().map(|e| e.var).collect();
        assert_eq!(vars, ["MAX_CONNECTIONS", "MAX_SESSIONS_PER_USER"]);
    }

    #[test]
    fn leaf_bounds_default_to_kubernetes_scalability_limits() {
        let c = config(&[("LEAF_NODE_IP", "10.0.0.1")]).unwrap();
        assert_eq!(
            c.leaf_bounds,
            LeafBounds {
                max_pods: 150_000,
                max_nodes: 5_000
            }
        );
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_MAX_PODS", "20000"),
            ("LEAF_MAX_NODES", "100"),
        ])
        .unwrap();
        assert_eq!(
            (c.leaf_bounds.max_pods, c.leaf_bounds.max_nodes),
            (20000, 100)
        );
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_MAX_PODS", "0"),
            ("LEAF_MAX_NODES", "many"),
        ])
        .unwrap_err();
        let vars: Vec<_> = err.0.iter().map(|e| e.var).collect();
        assert_eq!(vars, ["LEAF_MAX_PODS", "LEAF_MAX_NODES"]);
    }

    #[test]
    fn namespace_shares_default_to_a_quarter_of_the_totals_as_set() {
        let c = config(&[("LEAF_NODE_IP", "10.0.0.1")]).unwrap();
        assert_eq!(
            (
                c.limits.sessions_per_namespace,
                c.limits.log_streams_per_namespace
            ),
            (4096, 256)
        );
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("MAX_SESSIONS", "100"),
            ("MAX_LOG_STREAMS", "2"),
        ])
        .unwrap();
        assert_eq!(
            (
                c.limits.sessions_per_namespace,
                c.limits.log_streams_per_namespace
            ),
            (25, 1)
        );
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("MAX_SESSIONS_PER_NAMESPACE", "7"),
            ("MAX_LOG_STREAMS_PER_NAMESPACE", "3"),
            ("MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER", "4"),
            ("MAX_LARGE_HEAD_CONNECTIONS", "9"),
        ])
        .unwrap();
        assert_eq!(c.limits.sessions_per_namespace, 7);
        assert_eq!(c.limits.log_streams_per_namespace, 3);
        assert_eq!(c.limits.unauthenticated_connections_per_user, 4);
        assert_eq!(c.limits.large_head_connections, 9);
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("MAX_SESSIONS_PER_NAMESPACE", "0"),
        ])
        .unwrap_err();
        assert_eq!(err.0[0].var, "MAX_SESSIONS_PER_NAMESPACE");
    }

    #[test]
    fn missing_pod_ip_names_the_variable() {
        let err = config(&[]).unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert_eq!(err.0[0].var, "LEAF_NODE_IP");
        assert!(
            err.to_string()
                .starts_with("invalid configuration: LEAF_NODE_IP: required")
        );
    }

    #[test]
    fn every_bad_value_is_reported_on_its_own_line() {
        let err = config(&[
            ("LEAF_NODE_IP", "not-an-ip"),
            ("NODE_SERVER_PORT", "65536"),
            ("AUTH_MODE", "open"),
            ("STREAM_IDLE_TIMEOUT", "4 hours"),
            ("PREFERRED-ADDRESS-TYPE", "Banana"),
            ("APISERVER_CERT_LOCATION", "/tls/tls.crt"),
        ])
        .unwrap_err();
        let vars: Vec<_> = err.0.iter().map(|e| e.var).collect();
        assert_eq!(
            vars,
            [
                "LEAF_NODE_IP",
                "PREFERRED-ADDRESS-TYPE",
                "APISERVER_KEY_LOCATION",
                "NODE_SERVER_PORT",
                "AUTH_MODE",
                "STREAM_IDLE_TIMEOUT"
            ]
        );
        assert_eq!(err.to_string().lines().count(), 6);
        assert!(
            err.to_string()
                .contains("NODE_SERVER_PORT: \"65536\" is not a port number 0-65535")
        );
    }

    #[test]
    fn node_ports_bound_the_virtual_nodes_listeners() {
        let c = config(&[("LEAF_NODE_IP", "::1")]).unwrap();
        assert_eq!(c.node_ports, DEFAULT_NODE_PORTS);
        let c = config(&[("LEAF_NODE_IP", "::1"), ("NODE_PORTS", "3000")]).unwrap();
        assert_eq!(c.node_ports, 3000);
        for (bad, says) in [
            ("0", "\"0\" is not a whole number 1-65535"),
            ("many", "\"many\" is not a whole number 1-65535"),
            (
                "60000",
                "60000 ports above NODE_SERVER_PORT=10250 go past 65535",
            ),
        ] {
            let err = config(&[("LEAF_NODE_IP", "::1"), ("NODE_PORTS", bad)]).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid configuration: NODE_PORTS: {says}"),
                "{bad}"
            );
        }
        // With NODE_SERVER_PORT=0 the port is picked at start: the search ends at 65535.
        let c = config(&[
            ("LEAF_NODE_IP", "::1"),
            ("NODE_SERVER_PORT", "0"),
            ("NODE_PORTS", "60000"),
        ])
        .unwrap();
        assert_eq!(c.node_ports, 60000);
    }

    #[test]
    fn node_server_port_zero_takes_any_free_port() {
        let c = config(&[("LEAF_NODE_IP", "::1"), ("NODE_SERVER_PORT", "0")]).unwrap();
        assert_eq!(c.node_server_port, 0);
    }

    #[test]
    fn kosmos_and_shell_spellings_of_the_address_type() {
        let c = config(&[
            ("LEAF_NODE_IP", "::1"),
            ("PREFERRED-ADDRESS-TYPE", "internalip"),
        ])
        .unwrap();
        assert_eq!(c.preferred_address_type, "InternalIP");
        let c = config(&[
            ("LEAF_NODE_IP", "::1"),
            ("PREFERRED_ADDRESS_TYPE", "Hostname"),
        ])
        .unwrap();
        assert_eq!(c.preferred_address_type, "Hostname");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("4h").unwrap(), Duration::from_secs(14400));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        for bad in ["", "4", "h", "4x", "-1s", "1h-"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should fail");
        }
        for text in ["4h", "1h30m", "2s", "1.5s", "500ms", "1h0m", "90s", "1h1s"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d, "{text}");
        }
        assert_eq!(format_duration(Duration::from_secs(4 * 3600)), "4h");
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
    }

    #[test]
    fn auth_mode_none_needs_the_insecure_switch() {
        let err = config(&[("LEAF_NODE_IP", "10.0.0.1"), ("AUTH_MODE", "none")]).unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert_eq!(err.0[0].var, "AUTH_MODE");
        assert!(
            err.0[0]
                .message
                .contains("INSECURE_ALLOW_UNAUTHENTICATED_EXEC=true"),
            "{err}"
        );
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("AUTH_MODE", "none"),
            ("INSECURE_ALLOW_UNAUTHENTICATED_EXEC", "true"),
        ])
        .unwrap();
        assert_eq!(c.auth_mode, AuthMode::None);
    }

    #[test]
    fn x509_mode_needs_an_allow_list() {
        let err = config(&[("LEAF_NODE_IP", "10.0.0.1"), ("AUTH_MODE", "x509")]).unwrap_err();
        assert_eq!(err.0[0].var, "AUTH_MODE");
        assert!(err.0[0].message.contains("X509_ALLOWED_USERS"), "{err}");
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("AUTH_MODE", "x509"),
            ("X509_ALLOWED_USERS", "kube-apiserver-kubelet-client, admin"),
        ])
        .unwrap();
        assert_eq!(
            c.x509_allowed_users,
            ["kube-apiserver-kubelet-client", "admin"]
        );
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("X509_ALLOWED_USERS", "admin"),
        ])
        .unwrap_err();
        assert_eq!(err.0[0].var, "X509_ALLOWED_USERS");
    }

    #[test]
    fn leaf_pod_matching_settings() {
        let c = config(&[("LEAF_NODE_IP", "10.0.0.1")]).unwrap();
        assert_eq!(c.leaf_pod_match, LeafPodMatch::default());
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_POD_MATCH", "label"),
            ("LEAF_POD_MARKER", "sync.example/copy=yes"),
        ])
        .unwrap();
        assert_eq!(
            c.leaf_pod_match,
            LeafPodMatch::Label {
                key: "sync.example/copy".into(),
                value: "yes".into()
            }
        );
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_POD_MATCH", "annotations"),
        ])
        .unwrap_err();
        assert_eq!(err.0[0].var, "LEAF_POD_MATCH");
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_POD_MATCH", "label"),
            ("LEAF_POD_MARKER", "no-value"),
        ])
        .unwrap_err();
        assert_eq!(err.0[0].var, "LEAF_POD_MARKER");
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_KUBECONFIG", "/leaf/kubeconfig"),
            ("LEAF_NAMESPACE_MAP", "team-a=tenant-a"),
        ])
        .unwrap();
        assert_eq!(
            c.static_leaf.unwrap().namespaces.leaf_namespace("team-a"),
            Some("tenant-a")
        );
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_NAMESPACE_MAP", "team-a=tenant-a"),
        ])
        .unwrap_err();
        assert_eq!(err.0[0].var, "LEAF_NAMESPACE_MAP");
    }

    #[test]
    fn static_leaf_name_must_be_a_label() {
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_KUBECONFIG", "/leaf/kubeconfig"),
            ("LEAF_CLUSTER_NAME", "leaf-a"),
        ])
        .unwrap();
        assert_eq!(c.static_leaf.unwrap().name, "leaf-a");
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEAF_KUBECONFIG", "/leaf/kubeconfig"),
            ("LEAF_CLUSTER_NAME", "Leaf_A"),
        ])
        .unwrap_err();
        assert_eq!(err.0[0].var, "LEAF_CLUSTER_NAME");
    }

    #[test]
    fn replica_selector_is_a_deployments_match_labels() {
        let c = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            (
                "REPLICA_SELECTOR",
                "app.kubernetes.io/name=relaylet, app.kubernetes.io/instance==prod",
            ),
        ])
        .unwrap();
        let selector = c.replica_selector.unwrap();
        assert_eq!(
            selector.query(),
            "app.kubernetes.io/instance=prod,app.kubernetes.io/name=relaylet"
        );
        assert_eq!(
            config(&[("LEAF_NODE_IP", "10.0.0.1")])
                .unwrap()
                .replica_selector,
            None
        );
        for (bad, says) in [
            ("app", "is not key=value"),
            ("app!=relaylet", "label key \"app!\""),
            ("app=rel aylet", "only letters"),
            ("Bad_Prefix/app=x", "DNS subdomain"),
            ("app=-x", "start and end"),
            ("app=a,app=b", "given twice"),
            (",", "no labels"),
        ] {
            let err = config(&[("LEAF_NODE_IP", "10.0.0.1"), ("REPLICA_SELECTOR", bad)])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("REPLICA_SELECTOR: ") && err.contains(says),
                "{bad}: {err}"
            );
        }
        let err = config(&[
            ("LEAF_NODE_IP", "10.0.0.1"),
            ("LEADER_ELECT", "false"),
            ("REPLICA_SELECTOR", "app=relaylet"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("LEADER_ELECT=false"), "{err}");
    }
}

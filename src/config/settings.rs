//! [`Config`]: every setting relaylet reads from its environment, read and checked in one go.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::auth::{AuthMode, auth_mode, x509_allowed_users};
use super::leaves::{
    DEFAULT_LEAF_SECRET_LABEL, LeafBounds, PodApiserver, StaticLeaf, leaf_bounds,
    leaf_credential_renew_at, leaf_pod_match, leaf_pod_sync, pod_apiserver, static_leaf,
};
use super::limits::{Limits, limits};
use super::node::{leaf_node_ip, node_name_prefix, node_ports, preferred_address_type};
use super::observability::{LogFormat, log_format, metrics_addr};
use super::replicas::{ReplicaSelector, replica_selector};
use super::serving_cert::{ServingCert, serving_cert};
use super::vars::{ConfigError, Vars};
use crate::model::counterpart::LeafPodMatch;

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
    /// Run the pods bound to the virtual nodes in their leaves (`LEAF_POD_SYNC`, default
    /// true); off for installs where another syncer does.
    pub leaf_pod_sync: bool,
    /// Where the pods it runs reach the root apiserver, their tokens the root's
    /// (`LEAF_POD_ROOT_APISERVER`); `None`: they use the leaf's own service accounts.
    pub leaf_pod_root_apiserver: Option<PodApiserver>,
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
    /// When a leaf token is renewed, in percent of its life (`LEAF_CREDENTIAL_RENEW_AT`).
    pub leaf_credential_renew_at: u8,
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
        let leaf_pod_sync = leaf_pod_sync(&mut vars, &leaf_pod_match);
        let leaf_pod_root_apiserver = pod_apiserver(&mut vars, leaf_pod_sync);
        let leaf_spare_connection = vars.flag("LEAF_SPARE_CONNECTION", true);
        let extend_websockets_to_kubelet = vars.flag("EXTEND_WEBSOCKETS_TO_KUBELET", true);

        let metrics_addr = metrics_addr(&mut vars);
        let log_format = log_format(&mut vars);
        let limits = limits(&mut vars);
        let leaf_bounds = leaf_bounds(&mut vars);
        let leaf_credential_renew_at = leaf_credential_renew_at(&mut vars);
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
            leaf_pod_sync,
            leaf_pod_root_apiserver,
            leaf_spare_connection,
            extend_websockets_to_kubelet,
            metrics_addr,
            log_format,
            shutdown_grace_period,
            limits,
            leaf_bounds,
            leaf_credential_renew_at,
        };
        if vars.errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError(vars.errors))
        }
    }

    /// The virtual node name for a leaf: prefix + leaf name.
    pub fn node_name(&self, leaf: &str) -> String {
        crate::model::names::virtual_node_name(&self.node_name_prefix, leaf)
    }
}

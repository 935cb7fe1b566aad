//! The API server stand-in: an in-memory kube-apiserver that real kubectl and kube-rs accept.
//!
//! It serves HTTPS on loopback with a certificate from the cluster CA, authenticates client
//! certificates and bearer tokens, authorizes with an RBAC-like [`Policy`], and stores objects
//! of the kinds relaylet and kubectl touch with upstream's resourceVersion, watch, patch and
//! server-side apply semantics. Pod exec/attach/portforward/log and node proxy calls go to the
//! kubelet through the kubelet proxy, as kube-apiserver does.
//!
//! Files: [`api`] handles requests (with `read`, `write`, `body` and `query`); [`route`]
//! parses URLs; [`auth`] and [`reviews`] decide who
//! may do what, and `token_request` issues service-account tokens bound to pods; [`store`] keeps objects and history; [`watch`] streams changes; [`smp`],
//! [`managed`] and [`fieldset`] implement patching and apply; [`discovery`], [`openapi`],
//! [`render`] and [`table`] are what kubectl reads; [`protobuf`] decodes the protobuf bodies kubectl's typed
//! clients send; [`kinds`] and [`schema`] describe the served types; [`proxy`] reaches
//! kubelets; [`clock`] and [`failure`] are the shared timestamp and error conventions.
//!
//! Known simplifications: objects other than pods are deleted at once (no finalizer wait, no
//! garbage collection); `fieldValidation=Strict` is accepted without a schema to
//! check against; lists served in pages are not a consistent snapshot across pages; protobuf
//! bodies are decoded only for review kinds, ConfigMap, Secret and Namespace.

pub mod api;
pub mod auth;
mod body;
pub mod clock;
mod defaults;
pub mod discovery;
mod ephemeral;
pub mod failure;
pub mod fieldset;
pub mod kinds;
pub mod managed;
pub mod openapi;
pub mod protobuf;
pub mod proxy;
mod query;
mod read;
pub mod render;
pub mod reviews;
pub mod route;
pub mod schema;
pub mod selector;
pub mod smp;
pub mod store;
pub mod table;
mod token_request;
pub mod watch;
mod write;

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine;
use serde_json::json;

pub use auth::{Policy, Rule, UserInfo};

pub use discovery::KUBERNETES_VERSION;
pub use failure::Failure;
pub use store::Store;

use crate::serve::Served;
use crate::tls::{Ca, TlsError};

/// Errors starting an API server or minting its credentials.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("seeding the store: {0}")]
    Seed(Failure),
}

/// How to run one API server.
pub struct ApiServerConfig {
    /// Cluster name, used in kubeconfigs.
    pub name: String,
    /// Cluster CA: serving certificate for 127.0.0.1 and client certificates.
    pub ca: Arc<Ca>,
    /// Where to listen; port 0 picks one. A fixed port lets a stopped server restart on it.
    pub listen: SocketAddr,
    /// Authorization rules.
    pub policy: Policy,
    /// Bearer tokens and the users they stand for.
    pub tokens: Vec<(String, UserInfo)>,
    /// How to reach kubelets (None: kubelet calls answer 503).
    pub kubelet: Option<crate::kubelet_proxy::KubeletClient>,
    /// The most concurrent streams a client may open on one HTTP/2 connection
    /// (`--http2-max-streams-per-connection`).
    pub http2_max_streams_per_connection: u32,
    /// HTTP/1.1 only, h2 not offered by ALPN (kube-apiserver's `DisableHTTP2` serving option).
    pub disable_http2: bool,
    /// How often a watch that allows bookmarks gets one ([`watch::BOOKMARK_EVERY`], about a
    /// minute as upstream; a test of bookmarks themselves may shorten it).
    pub bookmark_every: std::time::Duration,
}

/// kube-apiserver's stream limit per HTTP/2 connection when `--http2-max-streams-per-connection`
/// is not set: k8s.io/apiserver v0.37.2, pkg/server/secure_serving.go sets
/// `MaxConcurrentStreams = 100` explicitly (Go's own default would be 250).
pub const HTTP2_MAX_STREAMS_PER_CONNECTION: u32 = 100;

impl ApiServerConfig {
    /// A server named `name` on a free loopback port, with no rules beyond upstream's
    /// bootstrap ones (`system:masters` may do anything) and no tokens.
    pub fn new(name: &str, ca: Arc<Ca>) -> Self {
        Self {
            name: name.to_string(),
            ca,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            policy: Policy::default(),
            tokens: Vec::new(),
            kubelet: None,
            http2_max_streams_per_connection: HTTP2_MAX_STREAMS_PER_CONNECTION,
            disable_http2: false,
            bookmark_every: watch::BOOKMARK_EVERY,
        }
    }
}

/// A running API server; stopped when dropped.
pub struct ApiServer {
    pub addr: SocketAddr,
    name: String,
    ca: Arc<Ca>,
    store: Store,
    served: Served,
    requests: api::Requests,
    open_watches: watch::OpenWatches,
    stall_lists: Arc<std::sync::atomic::AtomicBool>,
}

/// Namespaces kube-apiserver creates at start.
const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-system", "kube-node-lease", "kube-public"];

impl ApiServer {
    /// Starts a server with an empty store (plus what kube-apiserver creates at start).
    pub async fn start(cfg: ApiServerConfig) -> Result<ApiServer, ApiError> {
        Self::start_with_store(cfg, Store::new()).await
    }

    /// Starts a server on an existing store, so a stopped server can come back with its data
    /// (and its watchers must resume or relist, as after an apiserver restart).
    pub async fn start_with_store(
        cfg: ApiServerConfig,
        store: Store,
    ) -> Result<ApiServer, ApiError> {
        seed(&store, &cfg.ca).map_err(ApiError::Seed)?;
        let identity = cfg.ca.issue_server(&["127.0.0.1", "localhost"])?;
        let tls = cfg.ca.server_config_optional_clients(&identity)?;
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| ApiError::Bind {
                addr: cfg.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ApiError::Bind {
            addr: cfg.listen,
            source,
        })?;
        let requests = api::Requests::default();
        let open_watches = watch::OpenWatches::default();
        let stall_lists = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let app = Arc::new(api::App {
            store: store.clone(),
            policy: cfg.policy,
            tokens: cfg.tokens,
            issued: Default::default(),
            kubelet: cfg.kubelet,
            server_address: addr.to_string(),
            requests: requests.clone(),
            open_watches: open_watches.clone(),
            stall_lists: stall_lists.clone(),
            bookmark_every: cfg.bookmark_every,
        });
        let router = axum::Router::new().fallback(api::handle).with_state(app);
        // Like kube-apiserver: h2 by ALPN, HTTP/1.1 (and its upgrades) to clients that ask for it.
        let http = if cfg.disable_http2 {
            crate::serve::Http::Http1
        } else {
            crate::serve::Http::H2OrHttp1 {
                max_streams: cfg.http2_max_streams_per_connection,
            }
        };
        let served = crate::serve::serve_tls_with(listener, tls, router, http);
        tracing::info!(name = %cfg.name, %addr, "API server listening");
        Ok(ApiServer {
            addr,
            name: cfg.name,
            ca: cfg.ca,
            store,
            served,
            requests,
            open_watches,
            stall_lists,
        })
    }

    /// Requests this server was sent with `method` (`GET`, `POST`, ...) whose path starts with
    /// `prefix`.
    pub fn requests(&self, method: &str, prefix: &str) -> u64 {
        self.requests.matching(method, prefix)
    }

    /// Watches open now whose path starts with `prefix` (`/api/v1/pods`): each client's
    /// watch of a kind is one. A watch with a field selector is counted under its path and
    /// `?fieldSelector=` the selector (`/api/v1/pods?fieldSelector=spec.nodeName=n`).
    pub fn open_watches(&self, prefix: &str) -> u64 {
        self.open_watches.matching(prefix)
    }

    /// The client addresses (ip and port of each connection) that hold an open watch now.
    pub fn watching_peers(&self) -> std::collections::BTreeSet<SocketAddr> {
        self.open_watches.peers()
    }

    /// While `on`, lists do not answer (a leaf too slow to list; they answer once it is
    /// off); gets, watches and `/readyz` work.
    pub fn stall_lists(&self, on: bool) {
        self.stall_lists
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The cluster name used in kubeconfigs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cluster CA (serving certificate issuer and client CA).
    pub fn ca(&self) -> &Arc<Ca> {
        &self.ca
    }

    /// The store behind the server, for direct typed or JSON access.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The connections this server accepted and has open, by client certificate user and ALPN
    /// protocol (an upgraded HTTP/1.1 connection counts as open until it is handed over).
    pub fn connections(&self) -> &crate::connections::Connections {
        self.served.connections()
    }

    /// Stops accepting and cuts every open connection, watches included.
    pub fn stop(&self) {
        self.served.stop();
    }

    /// A kubeconfig (YAML) with the cluster CA embedded and a client certificate minted for
    /// `user` in `groups`.
    pub fn kubeconfig(&self, user: &str, groups: &[&str]) -> Result<String, ApiError> {
        let id = self.ca.issue_client(user, groups)?;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        Ok(self.render_kubeconfig(
            user,
            &[
                ("client-certificate-data", b64(&id.cert_pem)),
                ("client-key-data", b64(&id.key_pem)),
            ],
        ))
    }

    /// A kubeconfig (YAML) that authenticates with a bearer `token`.
    pub fn kubeconfig_with_token(&self, user: &str, token: &str) -> String {
        self.render_kubeconfig(user, &[("token", token.to_string())])
    }

    fn render_kubeconfig(&self, user: &str, credentials: &[(&str, String)]) -> String {
        // JSON strings are valid YAML scalars, which quotes names like `system:node:x` safely.
        let q = |s: &str| json!(s).to_string();
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca.cert_pem());
        let mut out = String::new();
        out.push_str("apiVersion: v1\nkind: Config\nclusters:\n");
        out.push_str(&format!("- name: {}\n  cluster:\n", q(&self.name)));
        out.push_str(&format!("    server: {}\n", q(&self.url())));
        out.push_str(&format!("    certificate-authority-data: {}\n", q(&ca)));
        out.push_str(&format!("users:\n- name: {}\n  user:\n", q(user)));
        for (key, value) in credentials {
            out.push_str(&format!("    {key}: {}\n", q(value)));
        }
        out.push_str(&format!(
            "contexts:\n- name: {ctx}\n  context:\n    cluster: {cluster}\n    user: {user}\n    namespace: \"default\"\ncurrent-context: {ctx}\n",
            ctx = q(&format!("{}-{}", self.name, user)),
            cluster = q(&self.name),
            user = q(user),
        ));
        out
    }
}

/// What kube-apiserver creates at start: the system namespaces and the
/// `extension-apiserver-authentication` ConfigMap carrying the client CA.
fn seed(store: &Store, ca: &Ca) -> Result<(), Failure> {
    let namespaces = kinds::by_resource("", "namespaces")
        .ok_or_else(|| Failure::internal("namespaces are not served"))?;
    let configmaps = kinds::by_resource("", "configmaps")
        .ok_or_else(|| Failure::internal("configmaps are not served"))?;
    for ns in SYSTEM_NAMESPACES {
        ignore_existing(store.create(namespaces, "", json!({ "metadata": { "name": ns } })))?;
    }
    ignore_existing(store.create(
        configmaps,
        "kube-system",
        json!({
            "metadata": { "name": "extension-apiserver-authentication" },
            "data": { "client-ca-file": ca.cert_pem() },
        }),
    ))?;
    Ok(())
}

fn ignore_existing(result: Result<serde_json::Value, Failure>) -> Result<(), Failure> {
    match result {
        Ok(_) => Ok(()),
        Err(f) if f.reason == "AlreadyExists" => Ok(()),
        Err(f) => Err(f),
    }
}

//! The kubelet-compatible HTTPS API that the root apiserver calls for every virtual node.
//!
//! One listener serves all virtual nodes (they share relaylet's address): a request names a pod,
//! the pod index says which virtual node it is on, and the registry says which leaf that is.
//! Every request is authenticated first, and bad input gets a `metav1.Status` answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use hyper::body::Incoming;
use hyper_util::rt::TokioTimer;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::Instrument;

use crate::auth::{Access, AuthError, Authenticator, Caller};
use crate::counterpart::LeafPodMatch;
use crate::counterpart_proof::{self as counterpart, RootPod};
use crate::kubelet_request::{KubeletRequest, RequestError};
use crate::leaf::Registry;
use crate::limits::Gate;
use crate::metrics::Metrics;
use crate::pod_index::{PodIndex, RouteError};
use crate::relay::Relay;
use crate::resource_metrics::{self, NodeStats};
use crate::session::SessionInfo;
use crate::status::{self, Refusal};

/// How long a client has to complete the TLS handshake, and then to send its request headers.
/// Slow clients (slowloris) are cut after this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head accepted (request line and headers), and most header lines.
const MAX_HEAD_BYTES: usize = 128 * 1024;
const MAX_HEADERS: usize = 100;
/// Most bytes all header lines together may have.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The client certificate chain the caller presented, leaf first.
#[derive(Clone, Default)]
struct PeerCert(Option<Arc<CertificateDer<'static>>>);

/// Everything a request handler needs.
pub struct NodeServer {
    pub gate: Arc<Gate>,
    pub auth: Authenticator,
    pub registry: Registry,
    pub pods: PodIndex,
    pub relay: Relay,
    pub metrics: Metrics,
    pub stats: Arc<NodeStats>,
    /// The virtual node this listener is dedicated to (see `node_ports.rs`); `None` on the
    /// shared port, which serves every virtual node's pods.
    pub node: Option<String>,
    /// `NODE_NAME_PREFIX`: a pod on a node with this prefix but no leaf has lost its leaf.
    pub node_name_prefix: String,
    /// What proves a leaf pod to be a root pod's counterpart (`LEAF_POD_MATCH`).
    pub leaf_pod_match: LeafPodMatch,
}

impl NodeServer {
    fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/healthz", axum::routing::get(node_healthz))
            .route("/metrics", axum::routing::get(node_metrics))
            .route(
                "/metrics/resource",
                axum::routing::get(node_resource_metrics),
            )
            .route("/stats/summary", axum::routing::get(node_summary))
            .route("/pods", axum::routing::get(node_pods))
            .fallback(handle)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(self)
    }
}

/// Serves the kubelet API on `listener` until `stop` fires; open sessions are not waited for
/// (the relay's own stop token ends them).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    server: Arc<NodeServer>,
    stop: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let gate = server.gate.clone();
    let app = server.router();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        // A stranger's idle TCP connections hold only the small handshake budget, never the
        // connections the root apiserver needs (see `limits`).
        let handshake = match gate.handshake(peer.ip()) {
            Ok(permit) => permit,
            Err(err) => {
                tracing::debug!(%peer, %err, "connection closed before TLS");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let stop = stop.clone();
        let gate = gate.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, %err, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            drop(handshake);
            let cert = PeerCert(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map(|c| Arc::new(c.clone().into_owned())),
            );
            // Over a cap, the connection is still answered (a 503 Status, then closed), so the
            // caller learns why; the permit-holding connections are not disturbed.
            let (_permit, app) = match gate.tls_connection(peer.ip(), cert.0.is_some()) {
                Ok(permit) => (Some(permit), app),
                Err(err) => {
                    tracing::warn!(%peer, %err, "connection refused");
                    (None, refusal(err.to_string()))
                }
            };
            serve_connection(tls, cert, peer, app, stop).await;
        });
    }
}

async fn serve_connection(
    tls: crate::splice::CallerStream,
    cert: PeerCert,
    peer: SocketAddr,
    app: Router,
    stop: CancellationToken,
) {
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(cert.clone());
        req.extensions_mut().insert(peer);
        let app = app.clone();
        async move {
            match oversized_head(req.headers()) {
                Some(refusal) => Ok(refusal),
                None => app.oneshot(req).await,
            }
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS);
    let conn = builder
        .serve_connection(crate::splice::ServedIo::new(tls), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(err) = result {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        }
        _ = stop.cancelled() => {
            // Let a request in progress finish; upgraded streams are already detached.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// A 431 for requests whose header lines add up to more than [`MAX_HEADER_BYTES`]. hyper's
/// buffer cap stops most oversized heads, but how much it reads at once depends on timing; this
/// makes the limit exact for every route.
fn oversized_head(headers: &http::HeaderMap) -> Option<Response> {
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    (bytes > MAX_HEADER_BYTES).then(|| {
        status::response(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("request headers are {bytes} bytes; at most {MAX_HEADER_BYTES} allowed"),
        )
    })
}

/// A router that answers every request with 503 and `message`, and closes the connection.
fn refusal(message: String) -> Router {
    Router::new().fallback(move || {
        let message = message.clone();
        async move {
            let mut resp = status::response(StatusCode::SERVICE_UNAVAILABLE, message);
            resp.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
            resp
        }
    })
}

async fn handle(State(server): State<Arc<NodeServer>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let logs = path.starts_with("/containerLogs/");
    let resp = handle_call(server, req).await;
    if logs {
        let resp = status::as_kubelet_text(resp).await;
        if !resp.status().is_success() {
            tracing::info!(code = resp.status().as_u16(), path = %path, "containerLogs refused");
        }
        resp
    } else {
        resp
    }
}

/// Authenticates, parses, authorizes, finds the leaf pod and relays one kubelet call.
async fn handle_call(server: Arc<NodeServer>, req: Request) -> Response {
    match call(server, req).await {
        Ok(resp) => resp,
        Err(refusal) => refusal.into_response(),
    }
}

async fn call(server: Arc<NodeServer>, req: Request) -> Result<Response, Refusal> {
    let caller = server.authenticate(peer_cert(&req), req.headers()).await?;
    if server.auth.mode() == crate::config::AuthMode::None {
        tracing::warn!(user = %caller.user, path = %req.uri().path(), "AUTH_MODE=none: serving an unauthenticated caller");
    }

    let kreq = KubeletRequest::parse(req.uri().path(), req.uri().query()).map_err(|err| {
        let code = match err {
            RequestError::UnknownRoute(_) => StatusCode::NOT_FOUND,
            _ => StatusCode::BAD_REQUEST,
        };
        Refusal::new(code, err.to_string())
    })?;
    served(&kreq, &req)?;

    // Authorize before saying anything about the pod (whether it exists, its UID, its node),
    // like the kubelet: against the pod's node when it is on one, else against every node.
    let route = server.pods.route(&kreq.namespace, &kreq.pod).await;
    let access_node = match &route {
        Ok(route) => route.node_name.as_str(),
        Err(_) => server.node.as_deref().unwrap_or(""),
    };
    let access = Access::for_call(kreq.kind, req.method(), access_node);
    server.authorize(&caller, &access).await?;

    let route = route.map_err(|err| server.route_refusal(err))?;
    if let (Some(asked), Some(actual)) = (&kreq.uid, &route.uid)
        && asked != actual
    {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!(
                "pod {}/{} with UID {asked} not found (the pod now has UID {actual})",
                kreq.namespace, kreq.pod
            ),
        ));
    }
    let leaf = server.registry.by_node(&route.node_name).ok_or_else(|| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "virtual node {} has no registered leaf cluster",
                route.node_name
            ),
        )
    })?;

    // The leaf pod is the one the administrator's mapping and the syncer's marker name, read
    // fresh from the leaf: never one the root pod's author chose.
    let root = RootPod {
        namespace: &kreq.namespace,
        name: &kreq.pod,
        uid: route.uid.as_deref(),
    };
    let target = counterpart::verify(&leaf, &server.leaf_pod_match, root)
        .await
        .map_err(|err| {
            server.metrics.counterpart_refusal(&leaf.name, err.reason());
            tracing::warn!(
                user = %caller.user,
                verb = %kreq.kind,
                namespace = %kreq.namespace,
                pod = %kreq.pod,
                leaf = %leaf.name,
                rule = %server.leaf_pod_match,
                %err,
                "call refused: no proven leaf counterpart"
            );
            Refusal::new(err.status(), err.to_string())
        })?;

    let permit = if kreq.kind.is_streaming() {
        let permit = server.gate.session(&caller.user).map_err(|err| {
            tracing::warn!(user = %caller.user, %err, "session refused");
            Refusal::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
        })?;
        Some(permit)
    } else {
        None
    };
    let path = kreq.leaf_path(&target.namespace, &target.name);
    let info = SessionInfo {
        kind: kreq.kind,
        user: caller.user.clone(),
        namespace: kreq.namespace.clone(),
        pod: kreq.pod.clone(),
        container: kreq.container.clone(),
        leaf: leaf.name.clone(),
        leaf_namespace: target.namespace,
        leaf_pod: target.name,
        node: route.node_name.clone(),
    };
    let span = info.span();
    Ok(async move {
        server
            .relay
            .forward(req.map(Body::new), info, leaf, path, permit)
            .await
    }
    .instrument(span)
    .await)
}

/// axum's 405 for the fixed routes, with a `metav1.Status` body like every other error.
async fn method_not_allowed(req: Request) -> Response {
    status::response(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not served for {}", req.method(), req.uri().path()),
    )
}

/// The client certificate the TLS handshake verified, if any.
fn peer_cert(req: &Request) -> PeerCert {
    req.extensions()
        .get::<PeerCert>()
        .cloned()
        .unwrap_or_default()
}

/// A 405 for a method the kubelet does not serve on this call, and a 400 for an upgrade that
/// HTTP/1.0 cannot carry; checked before anything reaches the leaf.
fn served(kreq: &KubeletRequest, req: &Request) -> Result<(), Refusal> {
    let methods = kreq.kind.methods();
    if !methods.contains(req.method()) {
        let allowed: Vec<&str> = methods.iter().map(http::Method::as_str).collect();
        let mut refusal = Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "{} is not served for {}; use {}",
                req.method(),
                kreq.kind,
                allowed.join(" or ")
            ),
        );
        refusal.allow = Some(allowed.join(", "));
        return Err(refusal);
    }
    if kreq.kind.is_streaming() && req.version() < http::Version::HTTP_11 {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{} needs a connection upgrade, which {:?} cannot carry: use HTTP/1.1",
                kreq.kind,
                req.version()
            ),
        ));
    }
    Ok(())
}

impl NodeServer {
    /// Who is calling: the one authentication every route goes through (a verified client
    /// certificate from the TLS handshake, or a bearer token).
    /// (Takes the request's parts, not the request: a borrowed body would make the future
    /// unsendable.)
    async fn authenticate(
        &self,
        cert: PeerCert,
        headers: &http::HeaderMap,
    ) -> Result<Caller, Refusal> {
        self.auth
            .authenticate(cert.0.as_deref(), headers)
            .await
            .map_err(|err| self.auth_refusal(err))
    }

    /// Whether `caller` may do `access`; counted either way.
    async fn authorize(&self, caller: &Caller, access: &Access) -> Result<(), Refusal> {
        match self.auth.authorize(caller, access).await {
            Ok(()) => {
                self.metrics.auth_decision("allowed");
                Ok(())
            }
            Err(err) => {
                tracing::info!(user = %caller.user, verb = %access.verb, node = %access.node, "access denied");
                Err(self.auth_refusal(err))
            }
        }
    }

    /// A refused caller, counted in the auth metrics.
    fn auth_refusal(&self, err: AuthError) -> Refusal {
        self.metrics.auth_decision(match err {
            AuthError::Forbidden { .. } => "denied",
            AuthError::Unavailable(_) => "error",
            _ => "unauthenticated",
        });
        Refusal::new(err.status(), err.to_string())
    }

    /// Why a call's pod cannot be reached through this relaylet.
    fn route_refusal(&self, err: RouteError) -> Refusal {
        match err {
            RouteError::NotOnVirtualNode { node, .. }
                if !self.node_name_prefix.is_empty()
                    && node.starts_with(&self.node_name_prefix) =>
            {
                Refusal::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "virtual node {node} has no registered leaf cluster: its leaf Secret is missing or invalid (see relaylet's log)"
                    ),
                )
            }
            err @ (RouteError::NotFound { .. } | RouteError::NotOnVirtualNode { .. }) => {
                Refusal::new(StatusCode::NOT_FOUND, err.to_string())
            }
            err @ RouteError::Root { .. } => {
                Refusal::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            }
        }
    }

    /// The virtual node a node-level path (`/metrics`, `/stats/summary`, `/pods`) is about: the
    /// node of this listener, or on the shared port the only virtual node there is. With several,
    /// the shared port cannot tell which node a scraper means (they share relaylet's address), so
    /// it answers 404 naming the nodes' own ports.
    fn node_for_path(&self) -> Result<String, Refusal> {
        if let Some(node) = &self.node {
            return Ok(node.clone());
        }
        let nodes: Vec<String> = self
            .registry
            .snapshot()
            .values()
            .map(|l| l.node_name.clone())
            .collect();
        match nodes.as_slice() {
            [only] => Ok(only.clone()),
            _ => Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!(
                    "this port serves {} virtual nodes; node-level paths are served on each node's own kubelet port (status.daemonEndpoints.kubeletEndpoint.Port)",
                    nodes.len()
                ),
            )),
        }
    }

    /// Authenticates the caller and authorizes the path on the listener's node, like a 1.36
    /// kubelet (`Access::for_path`); the node on success. With `any_node`, a shared port serving
    /// several nodes authorizes against all of them instead of answering 404 (for `/healthz`,
    /// which is the same for every node).
    async fn authorize_node_path(&self, req: Request, any_node: bool) -> Result<String, Refusal> {
        let caller = self.authenticate(peer_cert(&req), req.headers()).await?;
        let node = match self.node_for_path() {
            Ok(node) => node,
            Err(_) if any_node => String::new(),
            Err(refusal) => return Err(refusal),
        };
        let access = Access::for_path(req.uri().path(), req.method(), &node);
        self.authorize(&caller, &access).await?;
        Ok(node)
    }
}

/// The kubelet's `/healthz`, behind `nodes/healthz` (or `nodes/proxy`) like a 1.36 kubelet's.
/// The pod's probes use the metrics port instead, which needs no credentials.
async fn node_healthz(
    State(server): State<Arc<NodeServer>>,
    req: Request,
) -> Result<&'static str, Refusal> {
    server.authorize_node_path(req, true).await?;
    Ok("ok")
}

/// relaylet's own metrics, behind `nodes/metrics` (the apiserver's `nodes/{name}/proxy/metrics`).
async fn node_metrics(
    State(server): State<Arc<NodeServer>>,
    req: Request,
) -> Result<Response, Refusal> {
    server.authorize_node_path(req, false).await?;
    Ok(server.metrics.response())
}

/// The node's pods' usage in the kubelet's `/metrics/resource` format (what metrics-server
/// scrapes).
async fn node_resource_metrics(
    State(server): State<Arc<NodeServer>>,
    req: Request,
) -> Result<Response, Refusal> {
    let node = server.authorize_node_path(req, false).await?;
    let text = match server.stats.usage(&node).await {
        Ok(usage) => resource_metrics::encode_resource_metrics(Some(&usage)),
        Err(err) => {
            tracing::warn!(%node, %err, "resource metrics unavailable");
            resource_metrics::encode_resource_metrics(None)
        }
    };
    let mut resp = Response::new(Body::from(text));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(resource_metrics::TEXT_CONTENT_TYPE),
    );
    Ok(resp)
}

/// The node's pods' usage as the kubelet's stats Summary.
async fn node_summary(
    State(server): State<Arc<NodeServer>>,
    req: Request,
) -> Result<Response, Refusal> {
    let node = server.authorize_node_path(req, false).await?;
    let usage = server
        .stats
        .usage(&node)
        .await
        .map_err(|err| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    Ok(axum::Json(resource_metrics::summary(&usage)).into_response())
}

/// The root pods bound to the node, as the kubelet's `/pods` PodList.
async fn node_pods(
    State(server): State<Arc<NodeServer>>,
    req: Request,
) -> Result<Response, Refusal> {
    let node = server.authorize_node_path(req, false).await?;
    let items = server
        .stats
        .pods(&node)
        .await
        .map_err(|err| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    Ok(axum::Json(serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    }))
    .into_response())
}

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
use axum::response::Response;
use http::StatusCode;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::Instrument;

use crate::auth::{Access, Authenticator};
use crate::kubelet_request::{KubeletRequest, RequestError};
use crate::leaf::Registry;
use crate::limits::Gate;
use crate::pod_index::{PodIndex, RouteError};
use crate::relay::Relay;
use crate::status;

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
}

impl NodeServer {
    fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .fallback(handle)
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
        let acceptor = acceptor.clone();
        let stop = stop.clone();
        // Over a cap, the connection is still answered (a 503 Status, then closed), so the
        // caller learns why; the permit-holding connections are not disturbed.
        let (permit, app) = match gate.connection(peer.ip()) {
            Ok(permit) => (Some(permit), app.clone()),
            Err(err) => {
                tracing::warn!(%peer, %err, "connection refused");
                (None, refusal(err.to_string()))
            }
        };
        tokio::spawn(async move {
            let _permit = permit;
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
            let cert = PeerCert(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .map(|c| Arc::new(c.clone().into_owned())),
            );
            serve_connection(tls, cert, peer, app, stop).await;
        });
    }
}

async fn serve_connection(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
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
        .serve_connection(TokioIo::new(tls), service)
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
    let cert = req
        .extensions()
        .get::<PeerCert>()
        .cloned()
        .unwrap_or_default();
    let caller = match server
        .auth
        .authenticate(cert.0.as_deref(), req.headers())
        .await
    {
        Ok(caller) => caller,
        Err(err) => return status::response(err.status(), err.to_string()),
    };
    if server.auth.mode() == crate::config::AuthMode::None {
        tracing::warn!(user = %caller.user, path = %req.uri().path(), "AUTH_MODE=none: serving an unauthenticated caller");
    }

    let parsed = KubeletRequest::parse(req.uri().path(), req.uri().query());
    let kreq = match parsed {
        Ok(r) => r,
        Err(err @ RequestError::UnknownRoute(_)) => {
            return status::response(StatusCode::NOT_FOUND, err.to_string());
        }
        Err(err) => return status::response(StatusCode::BAD_REQUEST, err.to_string()),
    };
    let route = match server.pods.route(&kreq.namespace, &kreq.pod).await {
        Ok(route) => route,
        Err(err @ (RouteError::NotFound { .. } | RouteError::NotOnVirtualNode { .. })) => {
            return status::response(StatusCode::NOT_FOUND, err.to_string());
        }
        Err(err @ RouteError::Root { .. }) => {
            return status::response(StatusCode::SERVICE_UNAVAILABLE, err.to_string());
        }
    };
    if let (Some(asked), Some(actual)) = (&kreq.uid, &route.uid)
        && asked != actual
    {
        return status::response(
            StatusCode::NOT_FOUND,
            format!(
                "pod {}/{} with UID {asked} not found (the pod now has UID {actual})",
                kreq.namespace, kreq.pod
            ),
        );
    }
    let Some(leaf) = server.registry.by_node(&route.node_name) else {
        return status::response(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "virtual node {} has no registered leaf cluster",
                route.node_name
            ),
        );
    };
    let access = Access::for_call(kreq.kind, req.method(), &route.node_name);
    if let Err(err) = server.auth.authorize(&caller, &access).await {
        tracing::info!(user = %caller.user, verb = %access.verb, node = %access.node, "access denied");
        return status::response(err.status(), err.to_string());
    }
    let span = tracing::info_span!(
        "kubelet_call",
        kind = %kreq.kind,
        namespace = %kreq.namespace,
        pod = %kreq.pod,
        container = %kreq.container,
        leaf = %leaf.name,
        user = %caller.user,
    );
    let permit = if kreq.kind.is_streaming() {
        match server.gate.session(&caller.user) {
            Ok(permit) => Some(permit),
            Err(err) => {
                tracing::warn!(user = %caller.user, %err, "session refused");
                return status::response(StatusCode::SERVICE_UNAVAILABLE, err.to_string());
            }
        }
    } else {
        None
    };
    let path = kreq.leaf_path(&route.leaf_namespace, &route.leaf_pod);
    async move {
        tracing::info!("relaying");
        server
            .relay
            .forward(req.map(Body::new), kreq.kind, leaf, path, permit)
            .await
    }
    .instrument(span)
    .await
}

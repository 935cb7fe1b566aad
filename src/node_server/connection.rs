//! One listener of the kubelet API: each connection's TLS handshake, its place under the
//! connection caps, and the limits on its request heads, before the routes see a request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::response::Response;
use http::StatusCode;
use hyper::body::Incoming;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::filters::PeerCert;
use super::server::NodeServer;
use crate::model::status;
use crate::ops::limits::Unauthenticated;
use crate::ops::listener;
use crate::ops::read_ahead::ReadAhead;

/// How long a client has to complete the TLS handshake, and then to send its request headers.
/// Slow clients (slowloris) are cut after this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head accepted (request line and headers), and most header lines.
const MAX_HEAD_BYTES: usize = 128 * 1024;
const MAX_HEADERS: usize = 100;
/// Most bytes all header lines together may have.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// The request head limit of a connection without a client certificate, whose caller is not
/// known until a request authenticates (a bearer token): small, so that the connections
/// strangers may hold (`MAX_UNAUTHENTICATED_CONNECTIONS`) hold little memory. A long token and
/// an exec's command line fit; hyper needs at least 8 KiB.
pub const UNAUTHENTICATED_HEAD_BYTES: usize = 16 * 1024;

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
    let app = server.clone().router();
    let closing = refusal(
        "relaylet: this listener has stopped (relaylet is shutting down, or the virtual node was removed)"
            .to_string(),
    );
    loop {
        let Some((tcp, peer)) = listener::next(&listener, &stop, "kubelet").await else {
            return;
        };
        let _ = tcp.set_nodelay(true);
        // A stranger's idle TCP connections hold only the small handshake budget, never the
        // connections the root apiserver needs (see `limits`).
        let handshake = match gate.handshake(peer.ip()) {
            Ok(permit) => permit,
            Err(err) => {
                tracing::debug!(%peer, %err, "connection closed before TLS");
                server.metrics.limit_refusal(err.cap());
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let stop = stop.clone();
        let gate = gate.clone();
        let app = app.clone();
        let closing = closing.clone();
        let metrics = server.metrics.clone();
        tokio::spawn(async move {
            let tcp = ReadAhead::new(tcp);
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
            let certified = cert.0.is_some();
            let (permit, app) = match gate.tls_connection(peer.ip(), certified) {
                Ok(permit) => (Some(permit), app),
                Err(err) => {
                    tracing::warn!(%peer, %err, "connection refused");
                    metrics.limit_refusal(err.cap());
                    (None, refusal(err.to_string()))
                }
            };
            let unauthenticated = permit
                .as_ref()
                .map(|p| p.unauthenticated.clone())
                .unwrap_or_default();
            let head = if certified {
                MAX_HEAD_BYTES
            } else {
                UNAUTHENTICATED_HEAD_BYTES
            };
            let conn = Conn {
                cert,
                peer,
                unauthenticated,
                head,
            };
            serve_connection(tls, conn, app, closing, stop).await;
            drop(permit);
        });
    }
}

/// What a connection knows of its caller, handed to each of its requests.
struct Conn {
    cert: PeerCert,
    peer: SocketAddr,
    /// Its place in the unauthenticated budget, given back when a request authenticates.
    unauthenticated: Unauthenticated,
    /// Its request head limit: [`MAX_HEAD_BYTES`], or [`UNAUTHENTICATED_HEAD_BYTES`] without a
    /// client certificate.
    head: usize,
}

async fn serve_connection(
    tls: crate::relay::splice::CallerStream,
    conn: Conn,
    app: Router,
    closing: Router,
    stop: CancellationToken,
) {
    let Conn {
        cert,
        peer,
        unauthenticated,
        head,
    } = conn;
    let header_bytes = MAX_HEADER_BYTES.min(head);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(cert.clone());
        req.extensions_mut().insert(peer);
        req.extensions_mut().insert(unauthenticated.clone());
        // Once shutdown has begun, a request that arrives on a connection kept alive from
        // before is refused (and the connection closed), as a new connection would be.
        let app = if stop.is_cancelled() {
            closing.clone()
        } else {
            app.clone()
        };
        async move {
            match oversized_head(req.headers(), header_bytes) {
                Some(refusal) => Ok(refusal),
                None => app.oneshot(req).await,
            }
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(head)
        .max_headers(MAX_HEADERS);
    let conn = builder
        .serve_connection(crate::relay::splice::ServedIo::new(tls), service)
        .with_upgrades();
    // Not hyper's `graceful_shutdown` when `stop` fires: it ended connections whose upgrade
    // was still in flight (tests/shutdown.rs saw kubectl's just-opened exec fail as a refused
    // upgrade about one run in two). The refusal above keeps new requests out; a request in
    // progress, upgrade included, ends as it would have. Idle connections close when the
    // root apiserver drops them or the process ends.
    if let Err(err) = conn.await {
        tracing::debug!(%peer, %err, "connection ended with an error");
    }
}

/// A 431 for requests whose header lines add up to more than `limit` bytes. hyper's buffer cap
/// stops most oversized heads, but how much it reads at once depends on timing; this makes the
/// limit exact for every route.
fn oversized_head(headers: &http::HeaderMap, limit: usize) -> Option<Response> {
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    (bytes > limit).then(|| {
        status::response(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("request headers are {bytes} bytes; at most {limit} allowed"),
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

//! One listener of the kubelet API: each connection's TLS handshake, its place under the
//! connection caps (a client certificate's caller proven or not, see `caps::gate`), and the
//! limits on its request heads, before the routes see a request.

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
use super::server::{NodeServer, ThisNode};
use crate::caps::{CertCaller, Standing};
use crate::model::kubelet_request::Kind;
use crate::model::status;
use crate::node_server::auth::{Access, Caller, caller_from_cert};
use crate::ops::ReadAhead;
use crate::ops::listener;

/// How long a client has to complete the TLS handshake, and then to send its request headers.
/// Slow clients (slowloris) are cut after this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head accepted (request line and headers), and most header lines.
const MAX_HEAD_BYTES: usize = 128 * 1024;
const MAX_HEADERS: usize = 100;
/// Most bytes all header lines together may have.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// The request head limit of every connection but a proven caller's few (see `caps::gate`):
/// small, so that what any caller's connections hold is bounded by the connection caps times
/// it. A long token and an exec's command line fit; hyper needs at least 8 KiB.
pub const SMALL_HEAD_BYTES: usize = 16 * 1024;
/// How long a certificate caller's proof (one SubjectAccessReview, shared by its concurrent
/// connections) may take before the connection goes on unproven.
const PROOF_TIMEOUT: Duration = Duration::from_secs(5);

/// What every listener shares: the server, its routes and the answer of a stopped listener.
/// Built once: a router is about 10 KiB, and a replica listens on a port for each virtual node
/// of the fleet, not only those it serves.
#[derive(Clone)]
pub struct Listeners {
    server: Arc<NodeServer>,
    app: Router,
    closing: Router,
}

impl Listeners {
    pub fn new(server: Arc<NodeServer>) -> Listeners {
        Listeners {
            app: server.clone().router(),
            closing: refusal(
                "relaylet: this listener has stopped (relaylet is shutting down, or the virtual node was removed)"
                    .to_string(),
            ),
            server,
        }
    }
}

/// Serves the kubelet API of virtual node `node` (every node on the shared port, `None`) on
/// `listener` until `stop` fires; open sessions are not waited for (the relay's own stop token
/// ends them).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    listeners: Listeners,
    node: Option<String>,
    stop: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let Listeners {
        server,
        app,
        closing,
    } = listeners;
    let gate = server.gate.clone();
    let this = ThisNode(node.map(Arc::from));
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
        let server = server.clone();
        let this = this.clone();
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
            // caller learns why; the permit-holding connections are not disturbed. The
            // connection permit comes first, so that a proof's wait is counted.
            let admitted = match gate.connection(peer.ip()) {
                Ok(connection) => {
                    // A certificate the authenticator refuses (two CNs) counts as none.
                    let caller = cert.0.as_deref().and_then(|c| caller_from_cert(c).ok());
                    let who = caller.as_ref().map(|c| CertCaller::new(&c.user, &c.groups));
                    let proven = match (&caller, &who) {
                        (Some(caller), Some(who)) => proven(&server, &this, caller, who).await,
                        _ => false,
                    };
                    gate.admit(connection, peer.ip(), who.as_ref(), proven)
                }
                Err(err) => Err(err),
            };
            let (permit, app) = match admitted {
                Ok(permit) => (Some(permit), app),
                Err(err) => {
                    tracing::warn!(%peer, %err, "connection refused");
                    server.metrics.limit_refusal(err.cap());
                    (None, refusal(err.to_string()))
                }
            };
            let standing = permit
                .as_ref()
                .map(|p| p.standing.clone())
                .unwrap_or_default();
            let head = if permit.as_ref().is_some_and(|p| p.large_head()) {
                MAX_HEAD_BYTES
            } else {
                SMALL_HEAD_BYTES
            };
            let conn = Conn {
                cert,
                peer,
                standing,
                head,
                this,
            };
            serve_connection(tls, conn, app, closing, stop).await;
            drop(permit);
        });
    }
}

/// Whether a certificate caller is proven: authorized lately, or allowed now to run commands
/// on the node this listener serves (every node on the shared port), which is what the root
/// apiserver's calls need and is then cached for them. One check for concurrent connections of
/// the caller; a root apiserver that does not answer in [`PROOF_TIMEOUT`] leaves it unproven.
async fn proven(server: &NodeServer, this: &ThisNode, caller: &Caller, who: &CertCaller) -> bool {
    let access = Access::for_call(Kind::Exec, &http::Method::POST, this.to_authorize());
    let proven = server
        .gate
        .proven()
        .prove(who.identity, || async {
            matches!(
                tokio::time::timeout(PROOF_TIMEOUT, server.auth.authorize(caller, &access)).await,
                Ok(Ok(()))
            )
        })
        .await;
    if !proven {
        tracing::debug!(user = %caller.user, "certificate caller not proven: small budget until authorized");
    }
    proven
}

/// What a connection knows of its caller, handed to each of its requests.
struct Conn {
    cert: PeerCert,
    peer: SocketAddr,
    /// Its place in the budget of connections not authorized yet, given back when a request is.
    standing: Standing,
    /// Its request head limit: [`MAX_HEAD_BYTES`] for a proven caller's connection with a large
    /// head permit, else [`SMALL_HEAD_BYTES`].
    head: usize,
    /// The node of its listener.
    this: ThisNode,
}

async fn serve_connection(
    tls: crate::relay::CallerStream,
    conn: Conn,
    app: Router,
    closing: Router,
    stop: CancellationToken,
) {
    let Conn {
        cert,
        peer,
        standing,
        head,
        this,
    } = conn;
    let header_bytes = MAX_HEADER_BYTES.min(head);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(cert.clone());
        req.extensions_mut().insert(peer);
        req.extensions_mut().insert(standing.clone());
        req.extensions_mut().insert(this.clone());
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
        .serve_connection(crate::relay::ServedIo::new(tls), service)
        .with_upgrades();
    // Not hyper's `graceful_shutdown` when `stop` fires: it ended connections whose upgrade
    // was still in flight (tests/it/shutdown.rs saw kubectl's just-opened exec fail as a refused
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

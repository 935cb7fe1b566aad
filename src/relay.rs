//! Re-issues one kubelet call to the leaf apiserver and hands the answer back.
//!
//! Streaming calls (exec, attach, port-forward) are upgrades: the caller's upgrade headers go to
//! the leaf unchanged, so the leaf's kubelet negotiates the protocol with the real client
//! (SPDY/3.1, any WebSocket `channel.k8s.io` version, port-forward); when the leaf answers 101,
//! relaylet answers 101 with the leaf's negotiated headers and splices the two connections.
//! Anything else the leaf answers (403 for a refused protocol, 404 for a missing container, a
//! `metav1.Status` body) is passed back as it is, so `kubectl` prints the leaf's real error.
//! Logs are a plain streamed body, relayed chunk by chunk with backpressure.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, Request, StatusCode, header};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::frames::{self, Frames};
use crate::leaf::Leaf;
use crate::limits::Permit;
use crate::metrics::Metrics;
use crate::session::{self, Session, SessionInfo};
use crate::shutdown::OpenSessions;
use crate::splice::{self, ClientSide, End, Meter};
use crate::status::{self, Refusal};

/// Headers of the caller's upgrade request that the leaf needs to negotiate the same protocol.
const UPGRADE_REQUEST_HEADERS: [&str; 5] = [
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
];

/// Headers of the leaf's 101 that tell the caller what was negotiated.
const UPGRADE_RESPONSE_HEADERS: [&str; 4] = [
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-accept",
    "sec-websocket-protocol",
];

/// Headers of a non-101 leaf answer worth passing back.
const PASSED_RESPONSE_HEADERS: [&str; 3] = [
    "content-type",
    "x-accepted-stream-protocol-versions",
    "retry-after",
];

/// Relay settings shared by every call.
#[derive(Clone)]
pub struct Relay {
    pub creation_timeout: Duration,
    pub idle_timeout: Duration,
    /// Fires when open sessions must end (shutdown grace over).
    pub stop: CancellationToken,
    /// Counts running sessions, so shutdown can wait for them.
    pub open: OpenSessions,
    pub metrics: Metrics,
}

impl Relay {
    /// Relays `req` to `path` (path and query) on `leaf`. A streaming session holds `permit`
    /// until its splice ends. `info` describes the call for the session log lines and metrics.
    pub async fn forward(
        &self,
        req: Request<Body>,
        info: SessionInfo,
        leaf: Arc<Leaf>,
        path: String,
        permit: Option<Permit<String>>,
    ) -> Response {
        let streaming = info.kind.is_streaming();
        let session = Session::start(info, &self.metrics, &self.open, permit);
        if streaming {
            self.forward_upgrade(req, leaf, path, session).await
        } else {
            self.forward_logs(req, leaf, path, session).await
        }
    }

    async fn forward_upgrade(
        &self,
        mut req: Request<Body>,
        leaf: Arc<Leaf>,
        path: String,
        mut session: Session,
    ) -> Response {
        if !is_upgrade(req.headers()) {
            session.set_result(session::Result::BadRequest);
            return status::response(
                StatusCode::BAD_REQUEST,
                "this call needs a streaming upgrade (SPDY/3.1 or WebSocket): Connection: Upgrade and Upgrade headers are missing",
            );
        }
        let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
            session.set_result(session::Result::BadRequest);
            return status::response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the connection cannot be upgraded",
            );
        };

        let mut leaf_req = Request::builder()
            .method(req.method().clone())
            .uri(path.as_str())
            .header(header::CONNECTION, "Upgrade");
        for name in UPGRADE_REQUEST_HEADERS {
            for value in req.headers().get_all(name) {
                leaf_req = leaf_req.header(name, value);
            }
        }
        let leaf_req = match leaf_req.body(kube::client::Body::empty()) {
            Ok(r) => r,
            Err(err) => {
                session.set_result(session::Result::BadRequest);
                return status::response(
                    StatusCode::BAD_REQUEST,
                    format!("bad upgrade headers: {err}"),
                );
            }
        };

        let leaf_resp = self.send(&leaf, leaf_req).await;
        session.leaf_answered();
        let mut leaf_resp = match leaf_resp {
            Ok(resp) => resp,
            Err(refusal) => {
                session.set_result(session::Result::LeafUnreachable);
                return refusal.into_response();
            }
        };
        if leaf_resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            session.set_result(session::Result::Rejected);
            return pass_back(leaf_resp, None);
        }

        let mut answer = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        answer = answer.header(header::CONNECTION, "Upgrade");
        for name in UPGRADE_RESPONSE_HEADERS {
            for value in leaf_resp.headers().get_all(name) {
                answer = answer.header(name, value);
            }
        }
        // What the leaf negotiated decides whether relaylet can end this session honestly
        // (see `frames`).
        let protocol = match frames::protocol(session.info().kind, leaf_resp.headers()) {
            Ok(protocol) => Some(protocol),
            Err(why) => {
                tracing::debug!(
                    parent: &session.info().span(),
                    %why,
                    "session not tracked: a cut will reset the caller's connection"
                );
                None
            }
        };
        let leaf_upgrade = hyper::upgrade::on(&mut leaf_resp);
        let relay = self.clone();
        let leaf_name = leaf.name.clone();
        tokio::spawn(
            async move {
                // The session (and its place under the caps) lasts until its splice ends.
                let mut session = session;
                let (client, leaf_io) = match tokio::try_join!(on_upgrade, leaf_upgrade) {
                    Ok(both) => both,
                    Err(err) => {
                        tracing::warn!(parent: &session.info().span(), %err, "upgrade did not complete");
                        session.set_result(session::Result::UpgradeFailed);
                        return;
                    }
                };
                let client = match ClientSide::from_upgraded(client) {
                    Ok(client) => client,
                    Err(_) => {
                        tracing::error!(
                            parent: &session.info().span(),
                            "caller connection is not the TLS stream the node server accepted"
                        );
                        session.set_result(session::Result::UpgradeFailed);
                        return;
                    }
                };
                let meter = Meter {
                    to_leaf: relay.metrics.bytes_counter("to_leaf"),
                    to_client: relay.metrics.bytes_counter("to_client"),
                };
                let outcome = splice::splice(
                    client,
                    TokioIo::new(leaf_io),
                    splice::Options {
                        idle: relay.idle_timeout,
                        stop: relay.stop.clone(),
                        meter: &meter,
                        leaf_name: &leaf_name,
                    },
                    Frames::new(protocol),
                )
                .await;
                let result = match outcome.end {
                    End::Completed => session::Result::Completed,
                    End::ClientClosed => session::Result::ClientClosed,
                    End::LeafLost => session::Result::LeafLost,
                    End::IdleTimeout => session::Result::IdleTimeout,
                    End::Shutdown => session::Result::Shutdown,
                };
                session.ended(result, outcome.to_leaf, outcome.to_client);
            }
            // This task lives as long as the session. An info span held that long takes a
            // slot in tracing-subscriber's registry per open session, and the registry keeps
            // the slots (and the heap pages they pin) after the sessions end: 30 MB stayed
            // resident after 9,500 sessions closed (`relaylet-dev bench`). The session's log
            // lines name it themselves (its two warnings take the call's span for the moment
            // they are logged), so the task's span is enabled only at debug level.
            .instrument(tracing::debug_span!("splice")),
        );
        answer.body(Body::empty()).unwrap_or_else(|err| {
            status::response(
                StatusCode::BAD_GATEWAY,
                format!("leaf sent unusable upgrade headers: {err}"),
            )
        })
    }

    async fn forward_logs(
        &self,
        req: Request<Body>,
        leaf: Arc<Leaf>,
        path: String,
        mut session: Session,
    ) -> Response {
        if req.method() != http::Method::GET {
            session.set_result(session::Result::BadRequest);
            return status::response(StatusCode::METHOD_NOT_ALLOWED, "containerLogs takes GET");
        }
        let leaf_req = match Request::get(path.as_str()).body(kube::client::Body::empty()) {
            Ok(r) => r,
            Err(err) => {
                session.set_result(session::Result::BadRequest);
                return status::response(StatusCode::BAD_REQUEST, format!("bad request: {err}"));
            }
        };
        let resp = self.send(&leaf, leaf_req).await;
        session.leaf_answered();
        match resp {
            Ok(resp) => {
                if !resp.status().is_success() {
                    session.set_result(session::Result::Rejected);
                    return pass_back(resp, None);
                }
                // The session ends with the body: when the leaf's stream ends, or when the
                // caller stops reading and the body is dropped.
                let counted = CountedBody {
                    session,
                    counter: self.metrics.bytes_counter("to_client"),
                    bytes: 0,
                };
                pass_back(resp, Some(counted))
            }
            Err(refusal) => {
                session.set_result(session::Result::LeafUnreachable);
                refusal.into_response()
            }
        }
    }

    /// Sends a request to the leaf within the creation timeout; on failure, why not.
    async fn send(
        &self,
        leaf: &Leaf,
        req: Request<kube::client::Body>,
    ) -> Result<http::Response<kube::client::Body>, Refusal> {
        match tokio::time::timeout(self.creation_timeout, leaf.stream_client.send(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(err)) => Err(Refusal::new(
                StatusCode::BAD_GATEWAY,
                format!("leaf cluster {} is unreachable: {err}", leaf.name),
            )),
            Err(_) => Err(Refusal::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "leaf cluster {} did not answer within {:?}",
                    leaf.name, self.creation_timeout
                ),
            )),
        }
    }
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str()
            .map(|s| {
                s.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
            .unwrap_or(false)
    });
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

/// What a relayed log body has carried; the session ends when the body is done or dropped.
struct CountedBody {
    session: Session,
    counter: prometheus_client::metrics::counter::Counter,
    bytes: u64,
}

/// Passes a leaf answer back with its status, the headers that matter, and its body streamed;
/// with `counted`, every data frame is counted and the session ends with the body.
fn pass_back(resp: http::Response<kube::client::Body>, counted: Option<CountedBody>) -> Response {
    let (parts, body) = resp.into_parts();
    let body = match counted {
        None => Body::new(body),
        Some(counted) => Body::from_stream(counted_stream(body, counted)),
    };
    let mut answer = Response::builder().status(parts.status);
    for name in PASSED_RESPONSE_HEADERS {
        let name = HeaderName::from_static(name);
        for value in parts.headers.get_all(&name) {
            answer = answer.header(&name, value);
        }
    }
    answer.body(body).unwrap_or_else(|err| {
        status::response(
            StatusCode::BAD_GATEWAY,
            format!("leaf sent unusable headers: {err}"),
        )
    })
}

/// The data of `body` as a stream, counted into `counted`; the end of the body (or an error)
/// marks the session's result. Dropped early, the session keeps its "client closed" result.
fn counted_stream(
    body: kube::client::Body,
    counted: CountedBody,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send {
    use http_body_util::BodyExt;
    futures::stream::unfold(Some((body, counted)), |state| async move {
        let (mut body, mut counted) = state?;
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let n = data.len() as u64;
                        counted.bytes += n;
                        counted.counter.inc_by(n);
                        let bytes = counted.bytes;
                        counted
                            .session
                            .ended(session::Result::ClientClosed, 0, bytes);
                        return Some((Ok(data), Some((body, counted))));
                    }
                }
                Some(Err(err)) => {
                    tracing::debug!(%err, "leaf log stream failed");
                    let bytes = counted.bytes;
                    counted
                        .session
                        .ended(session::Result::LeafUnreachable, 0, bytes);
                    return Some((Err(std::io::Error::other(err.to_string())), None));
                }
                None => {
                    let bytes = counted.bytes;
                    counted.session.ended(session::Result::Completed, 0, bytes);
                    return None;
                }
            }
        }
    })
}

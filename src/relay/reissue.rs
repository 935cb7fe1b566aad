//! Re-issuing one kubelet call to the leaf apiserver and handing the answer back: an upgrade
//! is answered with the leaf's 101 and spliced, anything else passed back as the leaf said it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, Request, StatusCode, header};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::frames::{self, Frames};
use super::session::{self, Session, SessionInfo};
use super::splice::{self, ClientSide, End, Meter};
use crate::caps::StreamPermit;
use crate::kube_client;
use crate::leaf::Leaf;
use crate::model::status::{self, Refusal};
use crate::ops::Metrics;
use crate::ops::OpenSessions;

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
    /// Relays `req` to `path` (path and query) on `leaf`. The session holds `permit` (its place
    /// under the caps) until its splice or log stream ends. `info` describes the call for the session log lines and metrics.
    pub async fn forward(
        &self,
        req: Request<Body>,
        info: SessionInfo,
        leaf: Arc<Leaf>,
        path: String,
        permit: StreamPermit,
    ) -> Response {
        let streaming = info.kind.is_streaming();
        let session = Session::start(info, &self.metrics, &self.open, permit);
        if streaming {
            self.forward_upgrade(req, leaf, path, session).await
        } else {
            self.forward_logs(req, leaf, path, session).await
        }
    }

    /// An upgrade: asks the leaf, and when it answers 101 splices the two connections in a
    /// task of the session's own.
    async fn forward_upgrade(
        &self,
        req: Request<Body>,
        leaf: Arc<Leaf>,
        path: String,
        session: Session,
    ) -> Response {
        let Upgrade {
            on_upgrade,
            leaf_upgrade,
            answer,
            protocol,
        } = match self.upgrade(req, &leaf, &path, &session).await {
            Ok(upgrade) => upgrade,
            Err(unrelayed) => return unrelayed.answer(session),
        };
        // The task keeps only what the splice needs, not the whole `Relay`: it lives as long as
        // the session, and every byte it holds is held once per open session.
        let splicing = Splicing {
            idle: self.idle_timeout,
            stop: self.stop.clone(),
            meter: Meter {
                to_leaf: self.metrics.bytes_counter("to_leaf"),
                to_client: self.metrics.bytes_counter("to_client"),
            },
        };
        tokio::spawn(
            async move {
                // The session (and its place under the caps) lasts until its splice ends.
                let mut session = session;
                let (result, to_leaf, to_client) = splicing
                    .run(on_upgrade, leaf_upgrade, protocol, &leaf.name, &session)
                    .await;
                session.ended(result, to_leaf, to_client);
            }
            // This task lives as long as the session. An info span held that long takes a
            // slot in tracing-subscriber's registry per open session, and the registry keeps
            // the slots (and the heap pages they pin) after the sessions end. The session's log
            // lines name it themselves (its two warnings take the call's span for the moment
            // they are logged), so the task's span is enabled only at debug level.
            .instrument(tracing::debug_span!("splice")),
        );
        answer
    }

    /// Re-issues the caller's upgrade request to the leaf; the leaf's 101 turned into the
    /// caller's, or why the call ends here.
    async fn upgrade(
        &self,
        mut req: Request<Body>,
        leaf: &Leaf,
        path: &str,
        session: &Session,
    ) -> Result<Upgrade, Unrelayed> {
        if !is_upgrade(req.headers()) {
            return Err(Unrelayed::new(
                session::Result::BadRequest,
                status::response(
                    StatusCode::BAD_REQUEST,
                    "this call needs a streaming upgrade (SPDY/3.1 or WebSocket): Connection: Upgrade and Upgrade headers are missing",
                ),
            ));
        }
        let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
            return Err(Unrelayed::new(
                session::Result::BadRequest,
                status::response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the connection cannot be upgraded",
                ),
            ));
        };

        let mut leaf_req = Request::builder()
            .method(req.method().clone())
            .uri(path)
            .header(header::CONNECTION, "Upgrade");
        for name in UPGRADE_REQUEST_HEADERS {
            for value in req.headers().get_all(name) {
                leaf_req = leaf_req.header(name, value);
            }
        }
        let leaf_req = leaf_req.body(kube::client::Body::empty()).map_err(|err| {
            Unrelayed::new(
                session::Result::BadRequest,
                status::response(
                    StatusCode::BAD_REQUEST,
                    format!("bad upgrade headers: {err}"),
                ),
            )
        })?;

        let leaf_resp = self.send(leaf, leaf_req).await;
        session.leaf_answered();
        let mut leaf_resp = leaf_resp
            .map_err(|refusal| Unrelayed::new(session::Result::LeafUnreachable, refusal))?;
        if leaf_resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Err(Unrelayed::new(
                session::Result::Rejected,
                pass_back(leaf_resp, None),
            ));
        }

        let mut answer = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        answer = answer.header(header::CONNECTION, "Upgrade");
        for name in UPGRADE_RESPONSE_HEADERS {
            for value in leaf_resp.headers().get_all(name) {
                answer = answer.header(name, value);
            }
        }
        let answer = answer.body(Body::empty()).map_err(|err| {
            Unrelayed::new(
                session::Result::UpgradeFailed,
                status::response(
                    StatusCode::BAD_GATEWAY,
                    format!("leaf sent unusable upgrade headers: {err}"),
                ),
            )
        })?;
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
        Ok(Upgrade {
            on_upgrade,
            leaf_upgrade: hyper::upgrade::on(&mut leaf_resp),
            answer,
            protocol,
        })
    }

    /// Logs: the leaf's body streamed back, counted; the session ends with it.
    async fn forward_logs(
        &self,
        req: Request<Body>,
        leaf: Arc<Leaf>,
        path: String,
        session: Session,
    ) -> Response {
        match self.logs(req, &leaf, &path, &session).await {
            Ok(resp) => {
                // The session ends with the body: when the leaf's stream ends, or when the
                // caller stops reading and the body is dropped.
                let counted = CountedBody {
                    session,
                    counter: self.metrics.bytes_counter("to_client"),
                    bytes: 0,
                };
                pass_back(resp, Some(counted))
            }
            Err(unrelayed) => unrelayed.answer(session),
        }
    }

    /// Asks the leaf for the logs; its successful answer, or why the call ends here.
    async fn logs(
        &self,
        req: Request<Body>,
        leaf: &Leaf,
        path: &str,
        session: &Session,
    ) -> Result<http::Response<kube_client::Body>, Unrelayed> {
        if req.method() != http::Method::GET {
            return Err(Unrelayed::new(
                session::Result::BadRequest,
                status::response(StatusCode::METHOD_NOT_ALLOWED, "containerLogs takes GET"),
            ));
        }
        let leaf_req = Request::get(path)
            .body(kube::client::Body::empty())
            .map_err(|err| {
                Unrelayed::new(
                    session::Result::BadRequest,
                    status::response(StatusCode::BAD_REQUEST, format!("bad request: {err}")),
                )
            })?;
        let resp = self.send(leaf, leaf_req).await;
        session.leaf_answered();
        let resp =
            resp.map_err(|refusal| Unrelayed::new(session::Result::LeafUnreachable, refusal))?;
        if !resp.status().is_success() {
            return Err(Unrelayed::new(
                session::Result::Rejected,
                pass_back(resp, None),
            ));
        }
        Ok(resp)
    }

    /// Sends a request to the leaf within the creation timeout; on failure, why not.
    async fn send(
        &self,
        leaf: &Leaf,
        req: Request<kube::client::Body>,
    ) -> Result<http::Response<kube_client::Body>, Refusal> {
        match tokio::time::timeout(self.creation_timeout, leaf.stream_client().send(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(err)) => Err(Refusal::new(
                StatusCode::BAD_GATEWAY,
                // hyper's message leaves the cause out; a dial error names the leaf and proxy.
                format!(
                    "leaf cluster {} is unreachable: {}",
                    leaf.name,
                    crate::leaf::error_chain(&err)
                ),
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

/// An accepted upgrade: the caller's and the leaf's connections to come, the caller's 101,
/// and the protocol the leaf negotiated (if relaylet can track it).
struct Upgrade {
    on_upgrade: OnUpgrade,
    leaf_upgrade: OnUpgrade,
    answer: Response,
    protocol: Option<frames::Protocol>,
}

/// A call that ends before anything is relayed: how its session counts, and the answer.
struct Unrelayed {
    result: session::Result,
    answer: Response,
}

impl Unrelayed {
    fn new(result: session::Result, answer: impl IntoResponse) -> Unrelayed {
        Unrelayed {
            result,
            answer: answer.into_response(),
        }
    }

    /// Ends `session` with this result and gives the caller's answer.
    fn answer(self, mut session: Session) -> Response {
        session.set_result(self.result);
        self.answer
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
fn pass_back(resp: http::Response<kube_client::Body>, counted: Option<CountedBody>) -> Response {
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
    body: kube_client::Body,
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

/// What a session's splice task needs from the relay.
struct Splicing {
    idle: Duration,
    stop: CancellationToken,
    meter: Meter,
}

impl Splicing {
    /// Waits for both upgrades and splices the connections; how the session ended and the
    /// bytes it moved each way (to the leaf, to the caller).
    async fn run(
        self,
        on_upgrade: OnUpgrade,
        leaf_upgrade: OnUpgrade,
        protocol: Option<frames::Protocol>,
        leaf_name: &str,
        session: &Session,
    ) -> (session::Result, u64, u64) {
        let (client, leaf_io) = match tokio::try_join!(on_upgrade, leaf_upgrade) {
            Ok(both) => both,
            Err(err) => {
                tracing::warn!(parent: &session.info().span(), %err, "upgrade did not complete");
                return (session::Result::UpgradeFailed, 0, 0);
            }
        };
        let Ok(client) = ClientSide::from_upgraded(client) else {
            tracing::error!(
                parent: &session.info().span(),
                "caller connection is not the TLS stream the node server accepted"
            );
            return (session::Result::UpgradeFailed, 0, 0);
        };
        let outcome = splice::splice(
            client,
            TokioIo::new(leaf_io),
            splice::Options {
                idle: self.idle,
                stop: self.stop,
                meter: &self.meter,
                leaf_name,
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
        (result, outcome.to_leaf, outcome.to_client)
    }
}

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
use axum::response::Response;
use http::{HeaderMap, HeaderName, Request, StatusCode, header};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::kubelet_request::Kind;
use crate::leaf::Leaf;
use crate::limits::Permit;
use crate::splice::{self, ClientSide};
use crate::status;

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
}

impl Relay {
    /// Relays `req` to `path` (path and query) on `leaf`. A streaming session holds `permit`
    /// until its splice ends.
    pub async fn forward(
        &self,
        req: Request<Body>,
        kind: Kind,
        leaf: Arc<Leaf>,
        path: String,
        permit: Option<Permit<String>>,
    ) -> Response {
        if kind.is_streaming() {
            self.forward_upgrade(req, leaf, path, permit).await
        } else {
            self.forward_logs(req, leaf, path).await
        }
    }

    async fn forward_upgrade(
        &self,
        mut req: Request<Body>,
        leaf: Arc<Leaf>,
        path: String,
        permit: Option<Permit<String>>,
    ) -> Response {
        if !is_upgrade(req.headers()) {
            return status::response(
                StatusCode::BAD_REQUEST,
                "this call needs a streaming upgrade (SPDY/3.1 or WebSocket): Connection: Upgrade and Upgrade headers are missing",
            );
        }
        let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
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
                return status::response(
                    StatusCode::BAD_REQUEST,
                    format!("bad upgrade headers: {err}"),
                );
            }
        };

        let mut leaf_resp = match self.send(&leaf, leaf_req).await {
            Ok(resp) => resp,
            Err(resp) => return resp,
        };
        if leaf_resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return pass_back(leaf_resp);
        }

        let mut answer = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        answer = answer.header(header::CONNECTION, "Upgrade");
        for name in UPGRADE_RESPONSE_HEADERS {
            for value in leaf_resp.headers().get_all(name) {
                answer = answer.header(name, value);
            }
        }
        let leaf_upgrade = hyper::upgrade::on(&mut leaf_resp);
        let relay = self.clone();
        let leaf_name = leaf.name.clone();
        tokio::spawn(
            async move {
                // The session counts against the caps until its splice ends.
                let _permit = permit;
                let (client, leaf_io) = match tokio::try_join!(on_upgrade, leaf_upgrade) {
                    Ok(both) => both,
                    Err(err) => {
                        tracing::warn!(%err, leaf = %leaf_name, "upgrade did not complete");
                        return;
                    }
                };
                let client = match client
                    .downcast::<TokioIo<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>()
                {
                    Ok(parts) => ClientSide {
                        io: parts.io.into_inner(),
                        read_ahead: parts.read_buf,
                    },
                    Err(_) => {
                        tracing::error!(
                            "caller connection is not the TLS stream the node server accepted"
                        );
                        return;
                    }
                };
                let outcome = splice::splice(
                    client,
                    TokioIo::new(leaf_io),
                    relay.idle_timeout,
                    relay.stop.clone(),
                )
                .await;
                tracing::info!(
                    to_leaf = outcome.to_leaf,
                    to_client = outcome.to_client,
                    end = ?outcome.end,
                    "stream closed"
                );
            }
            .in_current_span(),
        );
        answer.body(Body::empty()).unwrap_or_else(|err| {
            status::response(
                StatusCode::BAD_GATEWAY,
                format!("leaf sent unusable upgrade headers: {err}"),
            )
        })
    }

    async fn forward_logs(&self, req: Request<Body>, leaf: Arc<Leaf>, path: String) -> Response {
        if req.method() != http::Method::GET {
            return status::response(StatusCode::METHOD_NOT_ALLOWED, "containerLogs takes GET");
        }
        let leaf_req = match Request::get(path.as_str()).body(kube::client::Body::empty()) {
            Ok(r) => r,
            Err(err) => {
                return status::response(StatusCode::BAD_REQUEST, format!("bad request: {err}"));
            }
        };
        match self.send(&leaf, leaf_req).await {
            Ok(resp) => pass_back(resp),
            Err(resp) => resp,
        }
    }

    /// Sends a request to the leaf within the creation timeout; on failure, the answer to give.
    async fn send(
        &self,
        leaf: &Leaf,
        req: Request<kube::client::Body>,
    ) -> Result<http::Response<kube::client::Body>, Response> {
        match tokio::time::timeout(self.creation_timeout, leaf.stream_client.send(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(err)) => Err(status::response(
                StatusCode::BAD_GATEWAY,
                format!("leaf cluster {} is unreachable: {err}", leaf.name),
            )),
            Err(_) => Err(status::response(
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

/// Passes a leaf answer back with its status, the headers that matter, and its body streamed.
fn pass_back(resp: http::Response<kube::client::Body>) -> Response {
    let (parts, body) = resp.into_parts();
    let mut answer = Response::builder().status(parts.status);
    for name in PASSED_RESPONSE_HEADERS {
        let name = HeaderName::from_static(name);
        for value in parts.headers.get_all(&name) {
            answer = answer.header(&name, value);
        }
    }
    answer.body(Body::new(body)).unwrap_or_else(|err| {
        status::response(
            StatusCode::BAD_GATEWAY,
            format!("leaf sent unusable headers: {err}"),
        )
    })
}

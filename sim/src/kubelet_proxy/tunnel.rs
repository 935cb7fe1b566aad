//! Port-forward over WebSockets by tunnelling SPDY (apiserver 1.31+ `StreamTunnel`).
//!
//! kubectl offers `SPDY/3.1+portforward.k8s.io` as a WebSocket subprotocol and then speaks plain
//! SPDY port-forward inside WebSocket binary messages. The apiserver turns the request into a SPDY
//! upgrade towards the kubelet (POST, `Upgrade: SPDY/3.1`, the protocols without the prefix) and,
//! once the kubelet switches, accepts the WebSocket and copies bytes: each kubelet read becomes
//! one binary message, each binary message is written to the kubelet.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderValue, Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::backend::{Backend, forward_request};
use super::error::ProxyError;
use super::passthrough::relay;
use super::websocket::{self, ServerSocket};
use crate::spdy::upgrade::{PROTOCOL_VERSION_HEADER, SPDY_31};

/// The subprotocol prefix that marks SPDY tunnelled in WebSockets.
pub(crate) const TUNNELING_PREFIX: &str = "SPDY/3.1+";

/// Whether the request asks for a tunnel (`IsWebSocketRequestWithTunnelingProtocol`).
pub(crate) fn is_tunnel_request(headers: &http::HeaderMap) -> bool {
    websocket::is_websocket_request(headers)
        && websocket::offered_protocols(headers)
            .iter()
            .any(|p| p.starts_with(TUNNELING_PREFIX))
}

fn plain_error(status: StatusCode, message: &str) -> Response {
    let mut response = Response::new(Body::from(format!("{message}\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

pub(crate) async fn tunnel(
    backend: &Backend,
    mut req: Request<Body>,
    path_and_query: &str,
) -> Response {
    let spdy_protocols: Vec<String> = websocket::offered_protocols(req.headers())
        .into_iter()
        .filter(|p| p.starts_with(TUNNELING_PREFIX) && p.ends_with(".k8s.io"))
        .map(|p| p[TUNNELING_PREFIX.len()..].to_string())
        .collect();
    if spdy_protocols.is_empty() {
        return plain_error(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: no tunneling spdy protocols provided",
        );
    }
    let mut headers = req.headers().clone();
    for name in [
        header::SEC_WEBSOCKET_PROTOCOL,
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_VERSION,
        header::UPGRADE,
        header::CONTENT_LENGTH,
    ] {
        headers.remove(name);
    }
    headers.insert(header::UPGRADE, HeaderValue::from_static(SPDY_31));
    headers.remove(PROTOCOL_VERSION_HEADER);
    for protocol in &spdy_protocols {
        if let Ok(value) = HeaderValue::from_str(protocol) {
            headers.append(PROTOCOL_VERSION_HEADER, value);
        }
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));

    let mut sender = match backend.connect().await {
        Ok(sender) => sender,
        Err(err) => return err.dialing_backend().into_response(),
    };
    let request = match forward_request(
        Method::POST,
        &headers,
        backend,
        path_and_query,
        true,
        Body::empty(),
    ) {
        Ok(request) => request,
        Err(err) => return err.into_response(),
    };
    let mut response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(err) => {
            return ProxyError::Dial(err.to_string())
                .dialing_backend()
                .into_response();
        }
    };
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return relay(response);
    }
    let has = |name: header::HeaderName, token: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains(token))
    };
    if !has(header::CONNECTION, "upgrade") || !has(header::UPGRADE, "spdy/3.1") {
        return plain_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unable to upgrade: missing upgrade headers in response",
        );
    }
    let chosen = response
        .headers()
        .get(PROTOCOL_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| format!("{TUNNELING_PREFIX}{p}"));
    let (accepted, client_upgrade) = match websocket::accept(&mut req, chosen.as_deref()) {
        Ok(pair) => pair,
        Err(refusal) => return refusal,
    };
    let backend_upgrade = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        let (client, kubelet) =
            tokio::join!(websocket::server_socket(client_upgrade), backend_upgrade);
        match (client, kubelet) {
            (Ok(client), Ok(kubelet)) => pump(client, TokioIo::new(kubelet)).await,
            (Err(err), _) | (_, Err(err)) => tracing::debug!(%err, "tunnel did not start"),
        }
    });
    accepted
}

/// Copies WebSocket binary messages to the kubelet and kubelet bytes back as binary messages,
/// until either side ends; then both are closed.
async fn pump<K>(client: ServerSocket, kubelet: K)
where
    K: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut ws_tx, mut ws_rx) = client.split();
    let (mut k_rx, mut k_tx) = tokio::io::split(kubelet);
    let upstream = async {
        while let Some(message) = ws_rx.next().await {
            match message {
                Ok(Message::Binary(data)) => {
                    if k_tx.write_all(&data).await.is_err() {
                        return;
                    }
                }
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                // Text is not tunnel framing; a close or an error ends the tunnel.
                Ok(Message::Text(_) | Message::Close(_)) | Err(_) => return,
            }
        }
    };
    let downstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match k_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    if ws_tx.send(Message::Binary(chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let close = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        let _ = ws_tx.send(Message::Close(Some(close))).await;
    };
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
    let _ = k_tx.shutdown().await;
}

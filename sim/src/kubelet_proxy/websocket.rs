//! The server side of a WebSocket handshake, for the two places the apiserver terminates
//! WebSockets itself (the v5 stream translator and the port-forward tunnel).

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// The upgraded connection of an accepted WebSocket.
pub(crate) type ServerSocket = WebSocketStream<TokioIo<Upgraded>>;

fn header_has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// `wsstream.IsWebSocketRequest`: `Connection: Upgrade` and `Upgrade: websocket`.
pub(crate) fn is_websocket_request(headers: &HeaderMap) -> bool {
    header_has_token(headers, header::CONNECTION, "upgrade")
        && header_has_token(headers, header::UPGRADE, "websocket")
}

/// Every `Sec-WebSocket-Protocol` value offered, split on commas and trimmed, in order.
pub(crate) fn offered_protocols(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Checks the handshake and answers 101 with `protocol`; the caller awaits the returned upgrade.
/// A request that is not a valid version-13 handshake gets 400, like gorilla's upgrader.
#[allow(clippy::result_large_err)]
pub(crate) fn accept(
    req: &mut Request<Body>,
    protocol: Option<&str>,
) -> Result<(Response, OnUpgrade), Response> {
    let bad = |msg: &str| {
        let mut response = Response::new(Body::from(format!("{msg}\n")));
        *response.status_mut() = StatusCode::BAD_REQUEST;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    };
    if !is_websocket_request(req.headers()) {
        return Err(bad(
            "websocket: the client is not using the websocket protocol",
        ));
    }
    if req
        .headers()
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(|v| v.as_bytes())
        != Some(b"13")
    {
        return Err(bad(
            "websocket: unsupported version: 13 not found in 'Sec-Websocket-Version' header",
        ));
    }
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY) else {
        return Err(bad(
            "websocket: not a websocket handshake: 'Sec-WebSocket-Key' header is missing or blank",
        ));
    };
    let accept_key = derive_accept_key(key.as_bytes());
    let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
        return Err(bad("websocket: response does not implement http.Hijacker"));
    };
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(value) = HeaderValue::from_str(&accept_key) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, value);
    }
    if let Some(value) = protocol.and_then(|p| HeaderValue::from_str(p).ok()) {
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, value);
    }
    Ok((response, on_upgrade))
}

/// Waits for the 101 to go out and wraps the connection as the WebSocket server.
pub(crate) async fn server_socket(on_upgrade: OnUpgrade) -> Result<ServerSocket, hyper::Error> {
    let upgraded = on_upgrade.await?;
    Ok(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await)
}

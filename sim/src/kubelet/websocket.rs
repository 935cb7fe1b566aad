//! The WebSocket transport of the kubelet streaming API (`channel.k8s.io` family).
//!
//! Mirrors upstream `wsstream.Conn` as the kubelet uses it: the handshake picks the first
//! subprotocol *the client* lists that the server supports (403, empty body, when none match);
//! every message is one channel byte plus data (base64 protocols: ASCII `'0'+channel` and
//! base64 text); the kubelet greets with an empty message on the lowest writable channel; v5
//! adds `[0xFF, channel]` to close a client stream; the exit status goes on channel 3 and the
//! connection ends with a normal close frame.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, Method, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use super::idle::Activity;
use super::status::StatusFormat;
use super::streams::{OutMsg, OutStream, ResizeDecoder, StreamOptions, TransportEnds};

/// Remote command subprotocols the kubelet accepts (plus none at all).
pub const REMOTE_COMMAND_PROTOCOLS: &[&str] = &[
    "",
    "channel.k8s.io",
    "base64.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "v5.channel.k8s.io",
];

/// Port-forward subprotocols the kubelet accepts (plus none at all).
pub const PORT_FORWARD_PROTOCOLS: &[&str] = &["", "v4.channel.k8s.io", "v4.base64.channel.k8s.io"];

/// The upgraded connection type.
pub type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// True for a WebSocket upgrade request (`Upgrade: websocket` and `Connection: upgrade`).
pub fn is_websocket(headers: &HeaderMap) -> bool {
    let upgrade = headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let connection = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("upgrade"));
    upgrade && connection
}

/// Checks a WebSocket handshake and picks a subprotocol. `Ok((protocol, 101 response))`, or
/// the refusal to send (405, 400 or 403 like `golang.org/x/net/websocket`).
// Both arms are responses that go straight back to hyper; boxing one would only add noise.
#[allow(clippy::result_large_err)]
pub fn accept(
    method: &Method,
    headers: &HeaderMap,
    supported: &[&str],
) -> Result<(String, Response), Response> {
    let plain = |code: StatusCode| {
        Response::builder()
            .status(code)
            .body(Body::empty())
            .unwrap_or_default()
    };
    if method != Method::GET {
        return Err(plain(StatusCode::METHOD_NOT_ALLOWED));
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(key) = header("sec-websocket-key").filter(|k| !k.is_empty()) else {
        return Err(plain(StatusCode::BAD_REQUEST));
    };
    if header("sec-websocket-version") != Some("13") {
        let mut refused = plain(StatusCode::BAD_REQUEST);
        refused.headers_mut().insert(
            "sec-websocket-version",
            http::HeaderValue::from_static("13"),
        );
        return Err(refused);
    }
    // Only the first header counts, split on commas, like x/net/websocket.
    let offered: Vec<&str> = match header("sec-websocket-protocol").map(str::trim) {
        Some(list) if !list.is_empty() => list.split(',').map(str::trim).collect(),
        _ => vec![""],
    };
    let Some(chosen) = offered.iter().find(|p| supported.contains(p)) else {
        return Err(plain(StatusCode::FORBIDDEN));
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut builder = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::CONNECTION, "Upgrade")
        .header("sec-websocket-accept", accept);
    if !chosen.is_empty() {
        builder = builder.header("sec-websocket-protocol", *chosen);
    }
    let response = builder
        .body(Body::empty())
        .map_err(|_| plain(StatusCode::BAD_REQUEST))?;
    Ok((chosen.to_string(), response))
}

/// Wraps an upgraded connection as a server-side WebSocket.
pub async fn from_upgraded(upgraded: hyper::upgrade::Upgraded) -> Ws {
    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await
}

/// Channel framing for one negotiated subprotocol.
#[derive(Debug, Clone, Copy)]
pub struct Codec {
    pub base64: bool,
    /// v5: `[0xFF, channel]` closes a client stream.
    pub stream_close: bool,
}

/// What one client message means.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    Data(u8, Bytes),
    /// v5: the client closed its side of a channel.
    Close(u8),
    /// Empty or undecodable: upstream ignores it.
    Ignore,
}

impl Codec {
    pub fn for_protocol(protocol: &str) -> Self {
        Codec {
            base64: protocol.contains("base64"),
            stream_close: protocol == "v5.channel.k8s.io",
        }
    }

    pub fn encode(self, channel: u8, data: &[u8]) -> Message {
        if self.base64 {
            let mut text = String::with_capacity(1 + data.len().div_ceil(3) * 4);
            text.push(char::from(b'0' + channel));
            text.push_str(&BASE64.encode(data));
            Message::text(text)
        } else {
            let mut frame = Vec::with_capacity(1 + data.len());
            frame.push(channel);
            frame.extend_from_slice(data);
            Message::binary(frame)
        }
    }

    pub fn decode(self, payload: &[u8]) -> Incoming {
        let Some((&first, rest)) = payload.split_first() else {
            return Incoming::Ignore;
        };
        if self.stream_close && first == 0xFF {
            return match rest {
                [channel] => Incoming::Close(*channel),
                _ => Incoming::Ignore,
            };
        }
        if self.base64 {
            let Some(channel) = first.checked_sub(b'0') else {
                return Incoming::Ignore;
            };
            match BASE64.decode(rest) {
                Ok(data) => Incoming::Data(channel, Bytes::from(data)),
                Err(_) => Incoming::Ignore,
            }
        } else {
            Incoming::Data(first, Bytes::copy_from_slice(rest))
        }
    }
}

/// The payload of a data-bearing message (text or binary).
pub fn payload(msg: &Message) -> Option<&[u8]> {
    match msg {
        Message::Binary(b) => Some(b),
        Message::Text(t) => Some(t.as_bytes()),
        _ => None,
    }
}

/// A normal-closure close frame, as the kubelet sends when a session ends.
pub fn normal_close() -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}

/// Runs a remote command session over `ws` until the command finishes or the client leaves.
pub async fn run_remote_command(
    ws: Ws,
    protocol: &str,
    opts: StreamOptions,
    ends: TransportEnds,
    idle_timeout: Duration,
) {
    let codec = Codec::for_protocol(protocol);
    let format = if protocol.starts_with("v4.") || protocol.starts_with("v5.") {
        StatusFormat::Json
    } else {
        StatusFormat::Text
    };
    let TransportEnds {
        stdin,
        resize,
        mut output,
        gone,
    } = ends;
    let activity = Activity::start(idle_timeout, gone.clone());
    let (mut sink, mut stream) = ws.split();

    // Tell the client the session is up: an empty message on the lowest writable channel.
    let greeting = if opts.stdout {
        1
    } else if opts.stderr {
        2
    } else {
        3
    };
    if sink.send(codec.encode(greeting, &[])).await.is_err() {
        gone.cancel();
        return;
    }

    let reader_gone = gone.clone();
    let reader_activity = activity.clone();
    let reader = tokio::spawn(async move {
        let mut stdin = stdin;
        let mut resize_decoder = ResizeDecoder::default();
        let mut resize = resize;
        loop {
            let msg = tokio::select! {
                _ = reader_gone.cancelled() => break,
                msg = stream.next() => msg,
            };
            let Some(Ok(msg)) = msg else { break };
            reader_activity.touch();
            if matches!(msg, Message::Close(_)) {
                break;
            }
            let Some(data) = payload(&msg) else { continue };
            match codec.decode(data) {
                Incoming::Data(0, data) => {
                    if let Some(tx) = &stdin
                        && tx.send(data).await.is_err()
                    {
                        stdin = None;
                    }
                }
                Incoming::Data(4, data) => {
                    let Some(tx) = &resize else { continue };
                    match resize_decoder.feed(&data) {
                        Ok(sizes) => {
                            for size in sizes {
                                let _ = tx.send(size).await;
                            }
                        }
                        Err(why) => {
                            tracing::debug!(%why, "ignoring further resize events");
                            resize = None;
                        }
                    }
                }
                Incoming::Close(0) => stdin = None,
                _ => {}
            }
        }
        // The client is gone (or closed the connection): the session ends with it.
        reader_gone.cancel();
    });

    loop {
        let msg = tokio::select! {
            _ = gone.cancelled() => break,
            msg = output.recv() => msg,
        };
        let result = match msg {
            Some(OutMsg::Data(stream, data)) => {
                let (channel, wanted) = match stream {
                    OutStream::Stdout => (1, opts.stdout),
                    OutStream::Stderr => (2, opts.stderr),
                };
                if !wanted || data.is_empty() {
                    continue;
                }
                activity.touch();
                sink.send(codec.encode(channel, &data)).await
            }
            Some(OutMsg::Close(_)) => continue,
            Some(OutMsg::Finish(outcome)) => {
                if let Some(status) = outcome.encode(format) {
                    let _ = sink.send(codec.encode(3, &status)).await;
                }
                let _ = sink.send(normal_close()).await;
                let _ = sink.close().await;
                break;
            }
            None => {
                let _ = sink.send(normal_close()).await;
                break;
            }
        };
        if result.is_err() {
            break;
        }
    }
    gone.cancel();
    let _ = reader.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_base64_framing() {
        let bin = Codec::for_protocol("v4.channel.k8s.io");
        assert_eq!(payload(&bin.encode(1, b"hi")).unwrap(), b"\x01hi");
        assert_eq!(
            bin.decode(b"\x00abc"),
            Incoming::Data(0, Bytes::from_static(b"abc"))
        );
        // v4 has no stream close: 0xFF is just an (unknown) channel.
        assert_eq!(
            bin.decode(b"\xff\x00"),
            Incoming::Data(255, Bytes::from_static(b"\x00"))
        );
        let b64 = Codec::for_protocol("base64.channel.k8s.io");
        assert_eq!(payload(&b64.encode(2, b"hi")).unwrap(), b"2aGk=");
        assert_eq!(
            b64.decode(b"0aGk="),
            Incoming::Data(0, Bytes::from_static(b"hi"))
        );
        assert_eq!(b64.decode(b"0!!"), Incoming::Ignore);
        let v5 = Codec::for_protocol("v5.channel.k8s.io");
        assert_eq!(v5.decode(b"\xff\x00"), Incoming::Close(0));
        assert_eq!(v5.decode(b""), Incoming::Ignore);
    }

    #[test]
    fn handshake_picks_the_clients_first_supported_protocol() {
        let mut h = HeaderMap::new();
        h.insert(
            "sec-websocket-key",
            "dGhlIHNhbXBsZSBub25jZQ==".parse().unwrap(),
        );
        h.insert("sec-websocket-version", "13".parse().unwrap());
        h.insert(
            "sec-websocket-protocol",
            "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap(),
        );
        let (p, resp) = accept(&Method::GET, &h, REMOTE_COMMAND_PROTOCOLS).unwrap();
        assert_eq!(p, "v5.channel.k8s.io");
        assert_eq!(
            resp.headers()["sec-websocket-accept"],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        let (p, _) = accept(&Method::GET, &h, PORT_FORWARD_PROTOCOLS).unwrap();
        assert_eq!(p, "v4.channel.k8s.io");
        h.insert(
            "sec-websocket-protocol",
            "v9.channel.k8s.io".parse().unwrap(),
        );
        let refused = accept(&Method::GET, &h, REMOTE_COMMAND_PROTOCOLS).unwrap_err();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        let refused = accept(&Method::POST, &h, REMOTE_COMMAND_PROTOCOLS).unwrap_err();
        assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
}

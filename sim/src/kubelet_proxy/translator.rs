//! WebSocket `v5.channel.k8s.io` exec/attach translated to SPDY toward the kubelet
//! (apiserver 1.30+ `StreamTranslatorHandler`).
//!
//! The apiserver accepts the client's WebSocket itself (only `v5.channel.k8s.io`), says
//! "connected" with an empty message on the lowest writable channel, and then runs client-go's
//! SPDY executor against the kubelet: it offers v5..v1, opens the error, stdin, stdout, stderr
//! and resize streams the options call for, copies the channels, and finally writes its own
//! `metav1.Status` to channel 3 (success, the exit code as `NonZeroExitCode`, or an internal
//! error) and closes the WebSocket normally. A kubelet that refuses the upgrade is reported the
//! same way, after the WebSocket was accepted, exactly as upstream does.

use axum::body::Body;
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use http::Request;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::backend::Backend;
use super::location::{KubeletTarget, StreamOptions};
use super::websocket::{self, ServerSocket};
use crate::channel::{self, ChannelMessage, Protocol};
use crate::spdy::{self, Connection, Stream, StreamReader, StreamWriter, UpgradeError};

/// What client-go's executor offers the kubelet, newest first.
const SPDY_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

/// How often the translator pings the kubelet (client-go's `PingPeriod` for the translator).
const PING_PERIOD: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `req` is a WebSocket asking for `v5.channel.k8s.io`
/// (`IsWebSocketRequestWithStreamCloseProtocol`).
pub(crate) fn is_v5_request(headers: &http::HeaderMap) -> bool {
    websocket::is_websocket_request(headers)
        && websocket::offered_protocols(headers)
            .iter()
            .any(|p| p == Protocol::V5.name())
}

/// Accepts the WebSocket and runs the translation in the background.
pub(crate) fn translate(
    backend: Backend,
    mut req: Request<Body>,
    target: KubeletTarget,
    options: StreamOptions,
) -> Response {
    let (response, on_upgrade) = match websocket::accept(&mut req, Some(Protocol::V5.name())) {
        Ok(pair) => pair,
        Err(refusal) => return refusal,
    };
    tokio::spawn(async move {
        match websocket::server_socket(on_upgrade).await {
            Ok(socket) => run(socket, backend, target, options).await,
            Err(err) => tracing::debug!(%err, "WebSocket upgrade did not complete"),
        }
    });
    response
}

/// A `metav1.Status` as the translator writes it (Go field order, empty fields omitted).
#[derive(Serialize)]
struct Status {
    metadata: serde_json::Map<String, serde_json::Value>,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
}

#[derive(Serialize)]
struct Details {
    causes: Vec<Cause>,
}

#[derive(Serialize)]
struct Cause {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    message: String,
}

fn success() -> Vec<u8> {
    encode(&Status {
        metadata: Default::default(),
        status: "Success",
        message: None,
        reason: None,
        details: None,
        code: None,
    })
}

/// `codeExitToStatusError`: the message wraps client-go's `CodeExitError` text.
fn exit_code(rc: u8) -> Vec<u8> {
    encode(&Status {
        metadata: Default::default(),
        status: "Failure",
        message: Some(format!(
            "command terminated with non-zero exit code: command terminated with exit code {rc}"
        )),
        reason: Some("NonZeroExitCode"),
        details: Some(Details {
            causes: vec![Cause {
                reason: Some("ExitCode"),
                message: rc.to_string(),
            }],
        }),
        code: None,
    })
}

/// `apierrors.NewInternalError(err)`.
fn internal_error(err: &str) -> Vec<u8> {
    encode(&Status {
        metadata: Default::default(),
        status: "Failure",
        message: Some(format!("Internal error occurred: {err}")),
        reason: Some("InternalError"),
        details: Some(Details {
            causes: vec![Cause {
                reason: None,
                message: err.to_string(),
            }],
        }),
        code: Some(500),
    })
}

fn encode(status: &Status) -> Vec<u8> {
    // Serialising plain strings and maps cannot fail; an empty body would still read as an error.
    serde_json::to_vec(status).unwrap_or_default()
}

/// What the executor makes of the kubelet's error stream, as the Status bytes we send.
fn status_from_error_stream(protocol: &str, read: std::io::Result<Vec<u8>>) -> Vec<u8> {
    let message = match read {
        Err(err) => return internal_error(&format!("error reading from error stream: {err}")),
        Ok(message) if message.is_empty() => return success(),
        Ok(message) => message,
    };
    let json_status = matches!(protocol, "v4.channel.k8s.io" | "v5.channel.k8s.io");
    if !json_status {
        let text = String::from_utf8_lossy(&message);
        return internal_error(&format!("error executing remote command: {text}"));
    }
    let parsed: serde_json::Value = match serde_json::from_slice(&message) {
        Ok(v) => v,
        Err(e) => {
            return internal_error(&format!(
                "error stream protocol error: {e} in {:?}",
                String::from_utf8_lossy(&message)
            ));
        }
    };
    match parsed["status"].as_str() {
        Some("Success") => success(),
        Some("Failure") if parsed["reason"] == "NonZeroExitCode" => {
            let Some(causes) = parsed["details"]["causes"].as_array() else {
                return internal_error("error stream protocol error: details must be set");
            };
            match causes.iter().find(|c| c["reason"] == "ExitCode") {
                Some(cause) => {
                    let text = cause["message"].as_str().unwrap_or("");
                    match text.parse::<u8>() {
                        Ok(rc) => exit_code(rc),
                        Err(_) => internal_error(&format!(
                            "error stream protocol error: invalid exit code value {text:?}"
                        )),
                    }
                }
                None => internal_error("error stream protocol error: no ExitCode cause given"),
            }
        }
        Some("Failure") => internal_error(parsed["message"].as_str().unwrap_or("")),
        _ => internal_error("error stream protocol error: unknown error"),
    }
}

/// How client-go reports a refused SPDY upgrade: the kubelet's own Status if the body is one,
/// else `unable to upgrade connection: <body>`.
fn status_from_upgrade_error(err: &UpgradeError) -> Vec<u8> {
    if let UpgradeError::Status { body, .. } = err {
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
            && value["kind"] == "Status"
        {
            return serde_json::to_vec(&value).unwrap_or_default();
        }
        let text = String::from_utf8_lossy(body);
        return internal_error(&format!("unable to upgrade connection: {}", text.trim()));
    }
    internal_error(&err.to_string())
}

/// The streams the executor opened, by type.
struct Streams {
    error: Stream,
    stdin: Option<Stream>,
    stdout: Option<Stream>,
    stderr: Option<Stream>,
    resize: Option<Stream>,
}

async fn open_streams(
    conn: &Connection,
    protocol: &str,
    options: StreamOptions,
) -> Result<Streams, spdy::SpdyError> {
    let open =
        |ty: &'static str| conn.open_stream(vec![("streamType".to_string(), ty.to_string())]);
    let error = open("error").await?;
    let stdin = if options.stdin {
        Some(open("stdin").await?)
    } else {
        None
    };
    let stdout = if options.stdout {
        Some(open("stdout").await?)
    } else {
        None
    };
    let stderr = if options.stderr && !options.tty {
        Some(open("stderr").await?)
    } else {
        None
    };
    let resize_capable = matches!(
        protocol,
        "v3.channel.k8s.io" | "v4.channel.k8s.io" | "v5.channel.k8s.io"
    );
    let resize = if options.tty && resize_capable {
        Some(open("resize").await?)
    } else {
        None
    };
    Ok(Streams {
        error,
        stdin,
        stdout,
        stderr,
        resize,
    })
}

async fn run(
    socket: ServerSocket,
    backend: Backend,
    target: KubeletTarget,
    options: StreamOptions,
) {
    let (mut ws_tx, mut ws_rx) = socket.split();
    let (out, mut out_rx) = mpsc::channel::<Message>(32);
    let writer = tokio::spawn(async move {
        while let Some(message) = out_rx.recv().await {
            let closing = matches!(message, Message::Close(_));
            if ws_tx.send(message).await.is_err() || closing {
                break;
            }
        }
        let _ = ws_tx.close().await;
    });
    let send = |channel_id: u8, data: &[u8]| {
        channel::data(Protocol::V5, channel_id, data).map_err(|e| e.to_string())
    };

    let first = if options.stdout {
        channel::STDOUT
    } else if options.stderr {
        channel::STDERR
    } else {
        channel::ERROR
    };
    if let Ok(hello) = send(first, &[]) {
        let _ = out.send(hello).await;
    }

    let status = session(&backend, &target, options, &mut ws_rx, &out).await;
    if let Some(status) = status {
        if let Ok(message) = send(channel::ERROR, &status) {
            let _ = out.send(message).await;
        }
        let close = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        let _ = out.send(Message::Close(Some(close))).await;
    }
    drop(out);
    let _ = writer.await;
}

/// Runs the SPDY side. Returns the Status to send, or `None` if the client went away.
async fn session<S>(
    backend: &Backend,
    target: &KubeletTarget,
    options: StreamOptions,
    ws_rx: &mut S,
    out: &mpsc::Sender<Message>,
) -> Option<Vec<u8>>
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let url = backend.url(&target.path_and_query());
    let (protocol, conn, _incoming) =
        match spdy::upgrade_client(&url, backend.tls.clone(), SPDY_PROTOCOLS, &[]).await {
            Ok(upgraded) => upgraded,
            Err(err) => return Some(status_from_upgrade_error(&err)),
        };
    // client-go's round tripper pings the kubelet every 5 s for the life of the connection.
    let pinger = conn.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PING_PERIOD);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = pinger.closed() => return,
                _ = tick.tick() => {
                    if pinger.ping().await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let streams = match open_streams(&conn, &protocol, options).await {
        Ok(streams) => streams,
        Err(err) => {
            conn.goaway().await;
            return Some(internal_error(&err.to_string()));
        }
    };
    let Streams {
        mut error,
        mut stdin,
        stdout,
        stderr,
        mut resize,
    } = streams;
    // The executor never writes to stdout/stderr, but keeps them open until it tears the
    // connection down, so keep the write halves until then.
    let (stdout_r, stdout_w) = split(stdout);
    let (stderr_r, stderr_w) = split(stderr);

    let outputs = async {
        let copy_out = |reader: Option<StreamReader>, channel_id: u8| async move {
            if let Some(reader) = reader {
                forward(reader, channel_id, out).await;
            }
        };
        let mut message = Vec::new();
        let (_, _, read) = tokio::join!(
            copy_out(stdout_r, channel::STDOUT),
            copy_out(stderr_r, channel::STDERR),
            error.read_to_end(&mut message),
        );
        read.map(|_| message)
    };
    let client = client_input(ws_rx, stdin.as_mut(), resize.as_mut());
    let status = tokio::select! {
        read = outputs => Some(status_from_error_stream(&protocol, read)),
        _ = client => None,
    };
    if status.is_some() {
        // client-go's Close: reset every stream, then GOAWAY.
        let _ = error.reset().await;
        for stream in [&stdin, &resize].into_iter().flatten() {
            let _ = stream.reset().await;
        }
        for writer in [&stdout_w, &stderr_w].into_iter().flatten() {
            let _ = writer.reset().await;
        }
        conn.goaway().await;
    } else {
        // The client is gone: cut the kubelet session at once.
        conn.abort();
    }
    status
}

fn split(stream: Option<Stream>) -> (Option<StreamReader>, Option<StreamWriter>) {
    match stream.map(Stream::into_split) {
        Some((reader, writer)) => (Some(reader), Some(writer)),
        None => (None, None),
    }
}

/// Copies one kubelet output stream to its WebSocket channel until EOF.
async fn forward(mut reader: StreamReader, channel_id: u8, out: &mpsc::Sender<Message>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let Ok(message) = channel::data(Protocol::V5, channel_id, &buf[..n]) else {
                    return;
                };
                if out.send(message).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Reads the client's messages: stdin data and close, resize events. Returns when the client
/// closes the WebSocket or goes away.
async fn client_input<S>(
    ws_rx: &mut S,
    mut stdin: Option<&mut Stream>,
    mut resize: Option<&mut Stream>,
) where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    while let Some(message) = ws_rx.next().await {
        let message = match message {
            Ok(Message::Close(_)) | Err(_) => return,
            Ok(message) => message,
        };
        match channel::decode(Protocol::V5, &message) {
            Ok(Some(ChannelMessage::Data {
                channel: channel::STDIN,
                data,
            })) => {
                if let Some(stream) = stdin.as_mut()
                    && stream.write_all(&data).await.is_err()
                {
                    stdin = None;
                }
            }
            Ok(Some(ChannelMessage::Close {
                channel: channel::STDIN,
            })) => {
                if let Some(stream) = stdin.take() {
                    let _ = stream.shutdown().await;
                }
            }
            Ok(Some(ChannelMessage::Data {
                channel: channel::RESIZE,
                data,
            })) => {
                let Some(stream) = resize.as_mut() else {
                    continue;
                };
                // Like the upstream size queue: the first undecodable event ends resizing.
                match serde_json::from_slice::<TerminalSize>(&data) {
                    Ok(size) => {
                        let line =
                            format!("{{\"Width\":{},\"Height\":{}}}\n", size.width, size.height);
                        if stream.write_all(line.as_bytes()).await.is_err() {
                            resize = None;
                        }
                    }
                    Err(_) => resize = None,
                }
            }
            // Other channels are not readable for the server; ignore them as wsstream does.
            Ok(_) => {}
            Err(err) => {
                tracing::debug!(%err, "bad message from the v5 client");
                return;
            }
        }
    }
}

#[derive(serde::Deserialize)]
struct TerminalSize {
    #[serde(rename = "Width")]
    width: u16,
    #[serde(rename = "Height")]
    height: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_statuses_become_translator_statuses() {
        let exit3 = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        let out = status_from_error_stream("v4.channel.k8s.io", Ok(exit3.to_vec()));
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: command terminated with exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#
        );
        let ok = status_from_error_stream(
            "v4.channel.k8s.io",
            Ok(br#"{"metadata":{},"status":"Success"}"#.to_vec()),
        );
        assert_eq!(ok, br#"{"metadata":{},"status":"Success"}"#);
        assert_eq!(
            status_from_error_stream("v5.channel.k8s.io", Ok(Vec::new())),
            ok
        );
        let cut = status_from_error_stream(
            "v4.channel.k8s.io",
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "gone",
            )),
        );
        let cut: serde_json::Value = serde_json::from_slice(&cut).expect("json");
        assert_eq!(cut["code"], 500);
        assert_eq!(cut["reason"], "InternalError");
        let v1 = status_from_error_stream("channel.k8s.io", Ok(b"boom".to_vec()));
        let v1: serde_json::Value = serde_json::from_slice(&v1).expect("json");
        assert_eq!(
            v1["message"],
            "Internal error occurred: error executing remote command: boom"
        );
    }
}

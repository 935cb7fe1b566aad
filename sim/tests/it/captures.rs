//! Our SPDY and WebSocket channel code against real peers' bytes.
//!
//! The captures (see `testdata/captures/README.md`) were recorded between kubectl / client-go and
//! the upstream kubelet streaming server. Here every SPDY frame of both directions is decoded with
//! our codec (one zlib context per direction, as on the wire), the facts of each session are
//! checked, frames without header blocks are re-encoded byte for byte, and recorded client and
//! server byte streams are replayed against our own `Connection` in the opposite role.
//!
//! The capture directory is `$RELAYLET_CAPTURES_DIR`, else `testdata/captures` in the workspace,
//! else `../shared/testdata/captures` beside it. A missing directory fails the tests loudly.

use std::collections::BTreeMap;
use std::io::{Cursor, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use bytes::BytesMut;
use relaylet_sim::channel::{self, ChannelMessage, Protocol};
use relaylet_sim::spdy::frame::{FLAG_FIN, Frame, FrameDecoder, FrameEncoder, goaway, rst};
use relaylet_sim::spdy::{Connection, Role, negotiate};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::protocol::{Role as WsRole, WebSocket};
use tokio_tungstenite::tungstenite::{self, Message};

const T: Duration = Duration::from_secs(5);

/// The kubelet's SPDY remotecommand protocols, newest first.
const KUBELET_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

fn captures_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("RELAYLET_CAPTURES_DIR") {
        return PathBuf::from(dir);
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for candidate in [
        workspace.join("testdata/captures"),
        workspace.join("../shared/testdata/captures"),
    ] {
        if candidate.join("README.md").exists() {
            return candidate;
        }
    }
    panic!("capture directory not found; set RELAYLET_CAPTURES_DIR");
}

#[derive(Debug)]
struct Chunk {
    conn: u64,
    c2s: bool,
    t: f64,
    bytes: Vec<u8>,
}

fn load(name: &str) -> Vec<Chunk> {
    let path = captures_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("JSON line");
            Chunk {
                conn: v["conn"].as_u64().expect("conn"),
                c2s: v["dir"].as_str().expect("dir") == "c2s",
                t: v["t"].as_f64().expect("t"),
                bytes: base64::engine::general_purpose::STANDARD
                    .decode(v["b64"].as_str().expect("b64"))
                    .expect("base64"),
            }
        })
        .collect()
}

/// Both directions of one TCP connection, reassembled.
struct Conn {
    c2s: Vec<u8>,
    s2c: Vec<u8>,
    /// Time of the last server chunk: client bytes recorded after it arrived after the close.
    last_s2c_t: f64,
    c2s_chunks: Vec<(f64, usize)>,
}

fn connections(chunks: &[Chunk]) -> BTreeMap<u64, Conn> {
    let mut conns: BTreeMap<u64, Conn> = BTreeMap::new();
    for chunk in chunks {
        let conn = conns.entry(chunk.conn).or_insert_with(|| Conn {
            c2s: Vec::new(),
            s2c: Vec::new(),
            last_s2c_t: 0.0,
            c2s_chunks: Vec::new(),
        });
        if chunk.c2s {
            conn.c2s_chunks.push((chunk.t, conn.c2s.len()));
            conn.c2s.extend_from_slice(&chunk.bytes);
        } else {
            conn.last_s2c_t = chunk.t;
            conn.s2c.extend_from_slice(&chunk.bytes);
        }
    }
    conns
}

/// An HTTP/1.1 message head: start line and headers in wire order.
struct Head {
    start: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn header_map(&self) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (n, v) in &self.headers {
            map.append(
                http::HeaderName::from_bytes(n.as_bytes()).expect("name"),
                http::HeaderValue::from_str(v).expect("value"),
            );
        }
        map
    }
}

/// Splits an HTTP head off the front of `bytes`.
fn split_head(bytes: &[u8]) -> (Head, &[u8]) {
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of HTTP head");
    let text = std::str::from_utf8(&bytes[..end]).expect("ASCII head");
    let mut lines = text.split("\r\n");
    let start = lines.next().expect("start line").to_string();
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').expect("header line");
            (n.trim().to_string(), v.trim().to_string())
        })
        .collect();
    (Head { start, headers }, &bytes[end + 4..])
}

/// A decoded frame with the exact bytes it came from.
struct Decoded {
    frame: Frame,
    raw: Vec<u8>,
}

/// Decodes every complete frame; returns them and the undecoded tail.
fn decode_all(bytes: &[u8]) -> (Vec<Decoded>, Vec<u8>) {
    let mut decoder = FrameDecoder::new();
    let mut buf = BytesMut::from(bytes);
    let mut frames = Vec::new();
    let mut offset = 0;
    loop {
        let before = buf.len();
        match decoder.decode(&mut buf).expect("frame decodes") {
            Some(frame) => {
                let used = before - buf.len();
                frames.push(Decoded {
                    frame,
                    raw: bytes[offset..offset + used].to_vec(),
                });
                offset += used;
            }
            None => return (frames, bytes[offset..].to_vec()),
        }
    }
}

/// What one direction of a SPDY session carried, per stream.
#[derive(Default, Debug)]
struct Session {
    /// stream id -> streamtype, from the client's SYN_STREAMs.
    types: BTreeMap<u32, String>,
    data: BTreeMap<u32, Vec<u8>>,
    fin: Vec<u32>,
    rst: Vec<(u32, u32)>,
    replies: Vec<u32>,
    goaway: Option<(u32, u32)>,
}

fn summarize(frames: &[Decoded]) -> Session {
    let mut s = Session::default();
    for d in frames {
        match &d.frame {
            Frame::SynStream {
                stream_id,
                headers,
                flags,
                ..
            } => {
                assert_eq!(*flags, 0, "client-go opens streams without flags");
                let ty = headers
                    .iter()
                    .find(|(n, _)| n == "streamtype")
                    .map(|(_, v)| v.clone())
                    .expect("every stream has a streamtype header");
                assert!(
                    headers.iter().all(|(n, _)| n == &n.to_ascii_lowercase()),
                    "names are lowercase on the wire"
                );
                s.types.insert(*stream_id, ty);
            }
            Frame::SynReply {
                stream_id, headers, ..
            } => {
                assert!(headers.is_empty(), "the kubelet's SYN_REPLY is empty");
                s.replies.push(*stream_id);
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                s.data
                    .entry(*stream_id)
                    .or_default()
                    .extend_from_slice(data);
                if flags & FLAG_FIN != 0 {
                    s.fin.push(*stream_id);
                }
            }
            Frame::RstStream { stream_id, status } => s.rst.push((*stream_id, *status)),
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => s.goaway = Some((*last_good_stream_id, *status)),
            other => panic!("unexpected frame in a capture: {other:?}"),
        }
    }
    s
}

/// A SPDY exec session: heads, decoded frames of both directions, and the stream types.
struct SpdyExec {
    request: Head,
    response: Head,
    client: Session,
    server: Session,
}

impl SpdyExec {
    fn id_of(&self, streamtype: &str) -> u32 {
        *self
            .client
            .types
            .iter()
            .find(|(_, t)| *t == streamtype)
            .unwrap_or_else(|| panic!("no {streamtype} stream"))
            .0
    }

    fn server_data(&self, streamtype: &str) -> &[u8] {
        self.server
            .data
            .get(&self.id_of(streamtype))
            .map(|v| v.as_slice())
            .unwrap_or(&[])
    }

    fn client_data(&self, streamtype: &str) -> &[u8] {
        self.client
            .data
            .get(&self.id_of(streamtype))
            .map(|v| v.as_slice())
            .unwrap_or(&[])
    }

    fn status(&self) -> Value {
        serde_json::from_slice(self.server_data("error")).expect("Status JSON on the error stream")
    }
}

/// Decodes a SPDY exec connection and checks what every such session shares.
fn spdy_exec(conn: &Conn) -> SpdyExec {
    let (request, c2s) = split_head(&conn.c2s);
    let (response, s2c) = split_head(&conn.s2c);
    assert!(request.start.starts_with("POST "), "{}", request.start);
    assert_eq!(request.all("Upgrade"), ["SPDY/3.1"]);
    assert_eq!(request.all("Connection"), ["Upgrade"]);
    assert_eq!(response.start, "HTTP/1.1 101 Switching Protocols");
    assert_eq!(response.all("Upgrade"), ["SPDY/3.1"]);

    let (server_frames, server_tail) = decode_all(s2c);
    assert!(
        server_tail.is_empty(),
        "server bytes end on a frame boundary"
    );
    let (client_frames, client_tail) = decode_all(c2s);
    if !client_tail.is_empty() {
        // The tap relayed the client's last writes raw once the server had closed: those bytes
        // arrived after the server's final chunk and are not SPDY. Prove that is all they are.
        let tail_start = conn.c2s.len() - client_tail.len();
        let t = conn
            .c2s_chunks
            .iter()
            .rev()
            .find(|(_, off)| *off <= tail_start)
            .expect("chunk")
            .0;
        assert!(
            t >= conn.last_s2c_t,
            "undecodable client bytes before the close"
        );
    }
    for d in client_frames.iter().chain(&server_frames) {
        reencode_matches(d);
    }
    let exec = SpdyExec {
        client: summarize(&client_frames),
        server: summarize(&server_frames),
        request,
        response,
    };
    // Client streams are odd, opened in order, and each got an (empty) reply.
    let ids: Vec<u32> = exec.client.types.keys().copied().collect();
    assert!(ids.iter().all(|id| id % 2 == 1));
    assert_eq!(exec.server.replies, ids);
    assert_eq!(exec.client.types.get(&1).map(String::as_str), Some("error"));
    // The kubelet ends with RST CANCEL on the streams it did not FIN, then GOAWAY OK.
    assert!(exec.server.rst.iter().all(|(_, s)| *s == rst::CANCEL));
    let last = *ids.last().expect("streams");
    assert_eq!(exec.server.goaway, Some((last, goaway::OK)));
    exec
}

/// Frames without a header block re-encode to the very same bytes; frames with one re-encode to
/// bytes that decode to the same frame (Go's deflate and ours pick different encodings).
fn reencode_matches(d: &Decoded) {
    let mut out = BytesMut::new();
    FrameEncoder::new()
        .encode(&d.frame, &mut out)
        .expect("encode");
    match d.frame {
        Frame::SynStream { .. } | Frame::SynReply { .. } | Frame::Headers { .. } => {
            let (again, tail) = decode_all(&out);
            assert!(tail.is_empty());
            assert_eq!(again.len(), 1);
            assert_eq!(again[0].frame, d.frame);
        }
        _ => assert_eq!(&out[..], &d.raw[..], "{:?}", d.frame),
    }
}

fn exit_code(status: &Value) -> Option<String> {
    status["details"]["causes"]
        .as_array()?
        .iter()
        .find(|c| c["reason"] == "ExitCode")?["message"]
        .as_str()
        .map(String::from)
}

fn assert_exit(status: &Value, code: &str) {
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(exit_code(status).as_deref(), Some(code));
    assert!(
        status["message"]
            .as_str()
            .expect("message")
            .ends_with(&format!("exit code {code}"))
    );
}

fn assert_success(status: &Value) {
    assert_eq!(
        status,
        &serde_json::json!({"metadata": {}, "status": "Success"})
    );
}

#[test]
fn client_go_exec_with_stdin_stderr_and_exit_3() {
    let conns = connections(&load("spdy-v4-exec-stdin-stderr-exit3.jsonl"));
    let exec = spdy_exec(&conns[&1]);
    assert!(
        exec.request
            .start
            .contains("/exec/default/testpod/main?command=sh&command=-c&")
    );
    assert!(exec.request.start.contains("&error=1&input=1&output=1 "));
    assert_eq!(
        exec.request.all("X-Stream-Protocol-Version"),
        KUBELET_PROTOCOLS
    );
    assert_eq!(
        exec.response.all("X-Stream-Protocol-Version"),
        ["v4.channel.k8s.io"]
    );
    assert_eq!(
        negotiate(&exec.request.header_map(), KUBELET_PROTOCOLS).expect("negotiates"),
        Some("v4.channel.k8s.io".to_string())
    );
    let types: Vec<&str> = exec.client.types.values().map(String::as_str).collect();
    assert_eq!(types, ["error", "stdin", "stdout", "stderr"]);
    assert_eq!(exec.client_data("stdin"), b"hello\n");
    assert_eq!(exec.client.fin, [exec.id_of("stdin")]);
    assert_eq!(exec.server_data("stdout"), b"hello\n");
    assert_eq!(exec.server_data("stderr"), b"err\n");
    assert_eq!(
        exec.server.fin,
        [exec.id_of("stdout"), exec.id_of("stderr")]
    );
    assert_exit(&exec.status(), "3");
    // The error stream is never FINed by the kubelet: it is reset after the Status.
    assert!(
        exec.server
            .rst
            .contains(&(exec.id_of("error"), rst::CANCEL))
    );
}

#[test]
fn client_go_exec_with_tty_and_resize() {
    let conns = connections(&load("spdy-v4-exec-tty-resize.jsonl"));
    let exec = spdy_exec(&conns[&1]);
    assert!(exec.request.start.contains("&output=1&tty=1 "));
    let types: Vec<&str> = exec.client.types.values().map(String::as_str).collect();
    assert_eq!(
        types,
        ["error", "stdout", "resize"],
        "a tty has no stderr stream"
    );
    let sizes: Vec<(u64, u64)> = exec
        .client_data("resize")
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|line| {
            let v: Value = serde_json::from_slice(line).expect("resize JSON");
            (
                v["Width"].as_u64().expect("Width"),
                v["Height"].as_u64().expect("Height"),
            )
        })
        .collect();
    assert_eq!(sizes, [(100, 40), (132, 50)]);
    assert_eq!(exec.server_data("stdout"), b"40 100\r\n50 132\r\n");
    assert_success(&exec.status());
}

#[test]
fn kubectl_127_exec_over_spdy_exit_4() {
    let conns = connections(&load("kubectl-1.27-exec-spdy.jsonl"));
    let (get, _) = split_head(&conns[&1].c2s);
    assert!(
        get.start
            .starts_with("GET /api/v1/namespaces/default/pods/testpod ")
    );
    let exec = spdy_exec(&conns[&2]);
    assert!(
        exec.request
            .start
            .contains("/api/v1/namespaces/default/pods/testpod/exec?command=sh&command=-c")
    );
    assert!(
        exec.request
            .start
            .contains("&container=main&stderr=true&stdout=true ")
    );
    assert_eq!(
        exec.request.all("X-Stream-Protocol-Version"),
        KUBELET_PROTOCOLS
    );
    let types: Vec<&str> = exec.client.types.values().map(String::as_str).collect();
    assert_eq!(types, ["error", "stdout", "stderr"]);
    assert_eq!(exec.server_data("stdout"), b"out\n");
    assert_eq!(exec.server_data("stderr"), b"err\n");
    assert_exit(&exec.status(), "4");
}

#[test]
fn kubectl_127_exec_with_stdin_and_stdin_close() {
    let conns = connections(&load("kubectl-1.27-exec-stdin.jsonl"));
    let exec = spdy_exec(&conns[&2]);
    assert!(
        exec.request
            .start
            .contains("?command=cat&container=main&stderr=true&stdin=true&stdout=true ")
    );
    assert_eq!(exec.client_data("stdin"), b"abc\n");
    assert!(exec.client.fin.contains(&exec.id_of("stdin")));
    assert_eq!(exec.server_data("stdout"), b"abc\n");
    assert_eq!(exec.server_data("stderr"), b"");
    assert_success(&exec.status());
}

#[test]
fn kubectl_133_falls_back_to_spdy_after_a_v5_refusal() {
    let conns = connections(&load("kubectl-1.33-exec-ws-v5-refused-then-spdy.jsonl"));
    let (ws, _) = split_head(&conns[&2].c2s);
    assert!(
        ws.start
            .starts_with("GET /api/v1/namespaces/default/pods/testpod/exec?")
    );
    assert_eq!(ws.all("Upgrade"), ["websocket"]);
    assert_eq!(ws.all("Sec-WebSocket-Protocol"), ["v5.channel.k8s.io"]);
    let (refusal, rest) = split_head(&conns[&2].s2c);
    assert_eq!(refusal.start, "HTTP/1.1 403 Forbidden");
    assert!(refusal.headers.is_empty() && rest.is_empty());

    let exec = spdy_exec(&conns[&3]);
    let offered = exec.request.all("X-Stream-Protocol-Version");
    assert_eq!(
        offered,
        [
            "v5.channel.k8s.io",
            "v4.channel.k8s.io",
            "v3.channel.k8s.io",
            "v2.channel.k8s.io",
            "channel.k8s.io"
        ],
        "repeated headers in preference order"
    );
    let headers = exec.request.header_map();
    // A kubelet without v5 picks v4, as recorded; one with v5 honours the client's order.
    assert_eq!(
        negotiate(&headers, KUBELET_PROTOCOLS).expect("negotiates"),
        Some("v4.channel.k8s.io".into())
    );
    assert_eq!(
        exec.response.all("X-Stream-Protocol-Version"),
        ["v4.channel.k8s.io"]
    );
    assert_eq!(
        negotiate(&headers, &["channel.k8s.io", "v5.channel.k8s.io"]).expect("negotiates"),
        Some("v5.channel.k8s.io".into())
    );
    let err = negotiate(&headers, &["v6.channel.k8s.io"]).expect_err("no common protocol");
    assert!(err.to_string().starts_with(
        "unable to upgrade: unable to negotiate protocol: client supports [v5.channel.k8s.io v4"
    ));
    assert_eq!(exec.server_data("stdout"), b"out133\n");
    assert_exit(&exec.status(), "2");
}

/// Removes HTTP/1.1 chunked framing.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size");
        let size = usize::from_str_radix(
            std::str::from_utf8(&body[..line_end]).expect("hex").trim(),
            16,
        )
        .expect("chunk size");
        body = &body[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[test]
fn kubectl_127_logs_tail_is_a_plain_chunked_body() {
    let conns = connections(&load("kubectl-1.27-logs-tail.jsonl"));
    let conn = &conns[&1];
    let (_, rest) = split_head(&conn.c2s);
    let (logs, _) = split_head(rest);
    assert_eq!(
        logs.start,
        "GET /api/v1/namespaces/default/pods/testpod/log?container=main&tailLines=2 HTTP/1.1"
    );
    // Two responses on one keep-alive connection: the pod, then the log.
    let (pod_head, rest) = split_head(&conn.s2c);
    assert_eq!(pod_head.all("Transfer-Encoding"), ["chunked"]);
    let end = rest
        .windows(5)
        .position(|w| w == b"0\r\n\r\n")
        .expect("end of pod body");
    let pod: Value = serde_json::from_slice(&dechunk(&rest[..end + 5])).expect("pod JSON");
    assert_eq!(pod["metadata"]["name"], "testpod");
    let (log_head, log_body) = split_head(&rest[end + 5..]);
    assert_eq!(log_head.start, "HTTP/1.1 200 OK");
    let log = dechunk(log_body);
    let text = String::from_utf8(log).expect("UTF-8 log");
    assert_eq!(
        text.lines().count(),
        2,
        "tailLines=2 gives two lines: {text:?}"
    );
}

/// An in-memory socket for tungstenite: reads the recorded bytes, discards writes.
struct Replay(Cursor<Vec<u8>>);

impl Read for Replay {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        Read::read(&mut self.0, buf)
    }
}

impl Write for Replay {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every WebSocket message in `bytes`, parsed by tungstenite as `role` would receive them.
fn ws_messages(bytes: &[u8], role: WsRole) -> Vec<Message> {
    let mut ws = WebSocket::from_raw_socket(Replay(Cursor::new(bytes.to_vec())), role, None);
    let mut out = Vec::new();
    loop {
        match ws.read() {
            Ok(msg) => out.push(msg),
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                return out;
            }
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return out;
            }
            Err(tungstenite::Error::Protocol(_)) => return out,
            Err(e) => panic!("WebSocket parse: {e}"),
        }
    }
}

#[test]
fn websocket_v4_exec_decodes_with_channel_framing() {
    let conns = connections(&load("ws-v4-exec-harness-client.jsonl"));
    let conn = &conns[&1];
    let (request, c2s) = split_head(&conn.c2s);
    let (response, s2c) = split_head(&conn.s2c);
    assert!(request.start.starts_with("GET /exec/default/testpod/main?"));
    assert_eq!(response.start, "HTTP/1.1 101 Switching Protocols");
    let protocol = Protocol::from_name(response.all("Sec-WebSocket-Protocol")[0]).expect("known");
    assert_eq!(protocol, Protocol::V4);

    let messages = ws_messages(s2c, WsRole::Client);
    let mut decoded = Vec::new();
    for msg in &messages {
        if let Message::Close(frame) = msg {
            assert_eq!(frame.as_ref().map(|f| u16::from(f.code)), Some(1000));
            continue;
        }
        let item = channel::decode(protocol, msg).expect("valid v4 framing");
        // Re-encoding gives back the very message the kubelet sent.
        if let Some(item) = &item {
            assert_eq!(&channel::encode(protocol, item).expect("encode"), msg);
        }
        decoded.push(item);
    }
    let data = |ch: u8| -> Vec<u8> {
        decoded
            .iter()
            .flatten()
            .filter_map(|m| match m {
                ChannelMessage::Data { channel, data } if *channel == ch => Some(data.to_vec()),
                _ => None,
            })
            .flatten()
            .collect()
    };
    // The kubelet's first message is an empty one on stdout, saying "connected".
    assert_eq!(
        decoded.first(),
        Some(&Some(ChannelMessage::Data {
            channel: channel::STDOUT,
            data: bytes::Bytes::new()
        }))
    );
    assert_eq!(data(channel::STDOUT), b"via-ws\n");
    assert_eq!(data(channel::STDERR), b"e\n");
    let status: Value = serde_json::from_slice(&data(channel::ERROR)).expect("Status");
    assert_exit(&status, "5");
    assert!(matches!(messages.last(), Some(Message::Close(_))));

    // The client only answered the close handshake.
    let client = ws_messages(c2s, WsRole::Server);
    assert!(matches!(client.first(), Some(Message::Close(_))));
}

/// Replays client-go's recorded bytes into our server-side connection.
#[tokio::test]
async fn recorded_client_go_bytes_drive_our_server() {
    let conns = connections(&load("spdy-v4-exec-stdin-stderr-exit3.jsonl"));
    let (_, c2s) = split_head(&conns[&1].c2s);
    let (mut peer, ours) = tokio::io::duplex(1 << 20);
    let (_conn, mut incoming) = Connection::new(ours, Role::Server);
    peer.write_all(c2s).await.expect("replay");
    let mut seen = Vec::new();
    let mut stdin = None;
    for _ in 0..4 {
        let stream = timeout(T, incoming.next())
            .await
            .expect("stream in time")
            .expect("stream");
        seen.push((
            stream.id(),
            stream.header("streamType").expect("type").to_string(),
        ));
        if stream.header("streamtype") == Some("stdin") {
            stdin = Some(stream);
        }
    }
    assert_eq!(
        seen,
        [
            (1, "error".to_string()),
            (3, "stdin".to_string()),
            (5, "stdout".to_string()),
            (7, "stderr".to_string())
        ]
    );
    let mut got = Vec::new();
    timeout(T, stdin.expect("stdin").read_to_end(&mut got))
        .await
        .expect("in time")
        .expect("stdin ends with the client's FIN");
    assert_eq!(got, b"hello\n");
}

/// Replays the kubelet's recorded bytes into our client-side connection, answering each of our
/// SYN_STREAMs with the kubelet's recorded SYN_REPLY, then the rest of its output.
#[tokio::test]
async fn recorded_kubelet_bytes_drive_our_client() {
    let conns = connections(&load("spdy-v4-exec-stdin-stderr-exit3.jsonl"));
    let (_, s2c) = split_head(&conns[&1].s2c);
    let (server_frames, _) = decode_all(s2c);
    let (peer, ours) = tokio::io::duplex(1 << 20);
    let (client, _incoming) = Connection::new(ours, Role::Client);

    let kubelet = tokio::spawn(async move {
        let (mut rd, mut wr) = tokio::io::split(peer);
        let mut dec = FrameDecoder::new();
        let mut buf = BytesMut::new();
        let mut frames = server_frames.into_iter();
        let mut opened = Vec::new();
        while opened.len() < 4 {
            match dec.decode(&mut buf).expect("our frames decode") {
                Some(Frame::SynStream {
                    stream_id, headers, ..
                }) => {
                    opened.push((stream_id, headers));
                    let reply = frames.next().expect("recorded reply");
                    assert!(
                        matches!(reply.frame, Frame::SynReply { stream_id: id, .. } if id == stream_id)
                    );
                    wr.write_all(&reply.raw).await.expect("write reply");
                }
                Some(_) => {}
                None => {
                    assert!(
                        rd.read_buf(&mut buf).await.expect("read") > 0,
                        "client hung up"
                    );
                }
            }
        }
        // Wait for stdin's data and FIN before the kubelet answers, as the real one did.
        let mut stdin = Vec::new();
        loop {
            match dec.decode(&mut buf).expect("decode") {
                Some(Frame::Data {
                    stream_id: 3,
                    flags,
                    data,
                }) => {
                    stdin.extend_from_slice(&data);
                    if flags & FLAG_FIN != 0 {
                        break;
                    }
                }
                Some(_) => {}
                None => {
                    assert!(
                        rd.read_buf(&mut buf).await.expect("read") > 0,
                        "client hung up"
                    );
                }
            }
        }
        for rest in frames {
            wr.write_all(&rest.raw).await.expect("write");
        }
        (opened, stdin)
    });

    let open = |ty: &str| {
        let client = client.clone();
        let ty = ty.to_string();
        async move {
            timeout(T, client.open_stream(vec![("streamType".into(), ty)]))
                .await
                .expect("reply in time")
                .expect("open")
        }
    };
    let mut error = open("error").await;
    let mut stdin = open("stdin").await;
    let mut stdout = open("stdout").await;
    let mut stderr = open("stderr").await;
    stdin.write_all(b"hello\n").await.expect("stdin");
    stdin.shutdown().await.expect("stdin FIN");

    assert_eq!(read_all(&mut stdout).await, b"hello\n");
    assert_eq!(read_all(&mut stderr).await, b"err\n");
    // The error stream ends with the kubelet's RST (no FIN) and must still read to a clean end.
    let status: Value = serde_json::from_slice(&read_all(&mut error).await).expect("Status");
    assert_exit(&status, "3");
    let (opened, stdin_seen) = timeout(T, kubelet).await.expect("in time").expect("join");
    assert_eq!(stdin_seen, b"hello\n");
    let ids: Vec<u32> = opened.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [1, 3, 5, 7]);
    assert_eq!(
        opened[0].1,
        [("streamtype".to_string(), "error".to_string())]
    );
    timeout(T, client.closed())
        .await
        .expect("GOAWAY recorded, then EOF");
}

async fn read_all(stream: &mut relaylet_sim::spdy::Stream) -> Vec<u8> {
    let mut v = Vec::new();
    timeout(T, stream.read_to_end(&mut v))
        .await
        .expect("in time")
        .expect("clean end");
    v
}

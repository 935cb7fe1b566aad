//! exec, attach and negotiation over SPDY/3.1 against the kubelet stand-in, with the SPDY
//! client from `relaylet_sim::spdy` (a client-go–like peer) and with the client halves of
//! real client-go sessions replayed byte for byte from the wire captures.

use crate::kubelet_support as support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use bytes::BytesMut;
use relaylet_sim::spdy::frame::{Frame, FrameDecoder};
use relaylet_sim::spdy::{Connection, Incoming, Stream, UpgradeError, upgrade_client};
use support::{Harness, pod, shell_container};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

const T: Duration = Duration::from_secs(20);

async fn harness(test: &str) -> Harness {
    let h = Harness::start_with(test, |cfg| {
        cfg.stream_creation_timeout = Duration::from_millis(500)
    })
    .await;
    h.kubelet
        .run_pod(pod("testpod", vec![shell_container("main", "sleep 1000")]))
        .await
        .unwrap();
    h
}

async fn connect(
    h: &Harness,
    path: &str,
    protocols: &[&str],
) -> Result<(String, Connection, Incoming), UpgradeError> {
    let url = format!("https://{}{}", h.addr(), path);
    let tls = h.ca.client_config(Some(&h.client_id)).unwrap();
    upgrade_client(&url, tls, protocols, &[]).await
}

async fn open(conn: &Connection, stream_type: &str) -> Stream {
    conn.open_stream(vec![("streamType".into(), stream_type.into())])
        .await
        .unwrap()
}

async fn read_all(stream: &mut Stream) -> Vec<u8> {
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.unwrap();
    buf
}

const EXIT3: &str = "/exec/default/testpod/main?command=sh&command=-c&command=cat%3B+echo+err+%3E%262%3B+exit+3&error=1&input=1&output=1";

#[tokio::test]
async fn v4_exec_streams_and_json_status() {
    let h = harness("spdy-v4").await;
    timeout(T, async {
        let (proto, conn, _incoming) = connect(
            &h,
            EXIT3,
            &["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"],
        )
        .await
        .unwrap();
        assert_eq!(proto, "v4.channel.k8s.io");
        let mut error = open(&conn, "error").await;
        let mut stdin = open(&conn, "stdin").await;
        let mut stdout = open(&conn, "stdout").await;
        let mut stderr = open(&conn, "stderr").await;
        stdin.write_all(b"hello\n").await.unwrap();
        stdin.shutdown().await.unwrap();
        let (out, err, status) =
            tokio::join!(read_all(&mut stdout), read_all(&mut stderr), read_all(&mut error));
        assert_eq!(out, b"hello\n");
        assert_eq!(err, b"err\n");
        assert_eq!(
            String::from_utf8(status).unwrap(),
            r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c cat; echo err \u003e\u00262; exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#
        );
        conn.closed().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn v5_is_chosen_when_offered_first_and_old_versions_write_text() {
    let h = harness("spdy-versions").await;
    timeout(T, async {
        let path = "/exec/default/testpod/main?command=sh&command=-c&command=exit+2&output=1";
        let (proto, conn, _i) = connect(&h, path, &["v5.channel.k8s.io", "v4.channel.k8s.io"])
            .await
            .unwrap();
        assert_eq!(proto, "v5.channel.k8s.io");
        let mut error = open(&conn, "error").await;
        let _stdout = open(&conn, "stdout").await;
        let status = String::from_utf8(read_all(&mut error).await).unwrap();
        assert!(status.contains(r#""message":"2""#), "{status}");

        let (proto, conn, _i) = connect(&h, path, &["v2.channel.k8s.io"]).await.unwrap();
        assert_eq!(proto, "v2.channel.k8s.io");
        let mut error = open(&conn, "error").await;
        let _stdout = open(&conn, "stdout").await;
        assert_eq!(
            String::from_utf8(read_all(&mut error).await).unwrap(),
            "command terminated with non-zero exit code: error executing command [sh -c exit 2], exit code 2"
        );
        // v1 (`channel.k8s.io`): the kubelet resets the error stream as soon as all streams
        // are there, so no status ever arrives — upstream keeps that 1.0 behaviour.
        let (proto, conn, _i) = connect(&h, path, &["channel.k8s.io"]).await.unwrap();
        assert_eq!(proto, "channel.k8s.io");
        let mut error = open(&conn, "error").await;
        let _stdout = open(&conn, "stdout").await;
        assert!(read_all(&mut error).await.is_empty());
        conn.closed().await;
        // Success writes nothing on the error stream before v4.
        let ok = "/exec/default/testpod/main?command=true&output=1";
        let (_, conn, _i) = connect(&h, ok, &["v3.channel.k8s.io"]).await.unwrap();
        let mut error = open(&conn, "error").await;
        let _stdout = open(&conn, "stdout").await;
        assert!(read_all(&mut error).await.is_empty());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn v4_tty_resize_stream() {
    let h = harness("spdy-tty").await;
    timeout(T, async {
        let path = "/exec/default/testpod/main?command=sh&command=-c&command=trap+%22stty+size%3B+exit+0%22+WINCH%3B+stty+size%3B+while+true%3B+do+sleep+0.05%3B+done&output=1&tty=1";
        let (_, conn, _i) = connect(&h, path, &["v4.channel.k8s.io"]).await.unwrap();
        let mut error = open(&conn, "error").await;
        let mut stdout = open(&conn, "stdout").await;
        let mut resize = open(&conn, "resize").await;
        resize
            .write_all(b"{\"Width\":100,\"Height\":40}\n")
            .await
            .unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while !seen.ends_with(b"40 100\r\n") {
            let n = stdout.read(&mut buf).await.unwrap();
            assert!(n > 0);
            seen.extend_from_slice(&buf[..n]);
        }
        resize
            .write_all(b"{\"Width\":132,\"Height\":50}\n")
            .await
            .unwrap();
        let rest = read_all(&mut stdout).await;
        assert_eq!(rest, b"50 132\r\n");
        assert_eq!(read_all(&mut error).await, br#"{"metadata":{},"status":"Success"}"#);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn negotiation_and_stream_creation_failures() {
    let h = harness("spdy-negotiation").await;
    timeout(T, async {
        let ok = "/exec/default/testpod/main?command=true&output=1";
        match connect(&h, ok, &["v9.channel.k8s.io"]).await {
            Err(UpgradeError::Status {
                status,
                headers,
                body,
            }) => {
                assert_eq!(status, 403);
                let accepted: Vec<_> = headers
                    .get_all("x-accepted-stream-protocol-versions")
                    .iter()
                    .map(|v| v.to_str().unwrap().to_string())
                    .collect();
                assert_eq!(
                    accepted,
                    [
                        "v5.channel.k8s.io",
                        "v4.channel.k8s.io",
                        "v3.channel.k8s.io",
                        "v2.channel.k8s.io",
                        "channel.k8s.io"
                    ]
                );
                let message = "unable to upgrade: unable to negotiate protocol: client supports [v9.channel.k8s.io], server accepts [v5.channel.k8s.io v4.channel.k8s.io v3.channel.k8s.io v2.channel.k8s.io channel.k8s.io]";
                assert_eq!(
                    String::from_utf8_lossy(&body),
                    format!("{message}\n{message}\n")
                );
            }
            other => panic!("expected 403, got {:?}", other.map(|r| r.0)),
        }
        // The client opens only some of its streams: the kubelet gives up after the creation
        // timeout and closes the connection without running anything.
        let marker = h
            .data_dir
            .join("containers/default_testpod_uid-testpod/main/ran");
        let path = "/exec/default/testpod/main?command=touch&command=ran&output=1&error=1";
        let (_, conn, _i) = connect(&h, path, &["v4.channel.k8s.io"]).await.unwrap();
        let _error = open(&conn, "error").await;
        conn.closed().await;
        assert!(!marker.exists());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn attach_over_spdy_sees_live_output_and_types_into_stdin() {
    let h = harness("spdy-attach").await;
    let mut c = shell_container("repl", "while read line; do echo \"got $line\"; done");
    c.stdin = true;
    h.kubelet
        .run_pod(pod("interactive", vec![c]))
        .await
        .unwrap();
    timeout(T, async {
        let path = "/attach/default/interactive/repl?input=1&output=1&error=1";
        let (_, conn, _i) = connect(&h, path, &["v4.channel.k8s.io"]).await.unwrap();
        let mut error = open(&conn, "error").await;
        let mut stdin = open(&conn, "stdin").await;
        let mut stdout = open(&conn, "stdout").await;
        let _stderr = open(&conn, "stderr").await;
        stdin.write_all(b"one\n").await.unwrap();
        let mut buf = [0u8; 64];
        let n = stdout.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"got one\n");
        // Closing stdin ends the attach session but not the container.
        stdin.shutdown().await.unwrap();
        assert_eq!(
            read_all(&mut error).await,
            br#"{"metadata":{},"status":"Success"}"#
        );
        let status = h
            .kubelet
            .container_status("default", "interactive", "repl")
            .unwrap();
        assert!(status.running);
    })
    .await
    .unwrap();
}

// ---- replaying real client-go sessions -------------------------------------------------------

/// One recorded socket read: (connection, client-to-server?, time, bytes).
type Chunk = (u64, bool, f64, Vec<u8>);

fn capture(name: &str) -> Vec<Chunk> {
    // Same lookup as tests/captures.rs: env override, the workspace, or the shared dir beside it.
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::var("RELAYLET_CAPTURES_DIR")
        .map(PathBuf::from)
        .ok()
        .or_else(|| {
            [
                workspace.join("testdata/captures"),
                workspace.join("../shared/testdata/captures"),
            ]
            .into_iter()
            .find(|d| d.join("README.md").exists())
        })
        .expect("capture directory not found; set RELAYLET_CAPTURES_DIR");
    let text = std::fs::read_to_string(dir.join(name)).unwrap();
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v["b64"].as_str().unwrap())
                .unwrap();
            (
                v["conn"].as_u64().unwrap(),
                v["dir"] == "c2s",
                v["t"].as_f64().unwrap(),
                bytes,
            )
        })
        .collect()
}

/// What a server said on each stream, independent of chunking and interleaving.
#[derive(Debug, Default, PartialEq)]
struct StreamTranscript {
    replied: bool,
    data: Vec<u8>,
    fin: bool,
    reset: bool,
}

/// Decodes server-to-client SPDY bytes into per-stream transcripts; `true` if GOAWAY came.
fn transcript(bytes: &[u8]) -> (BTreeMap<u32, StreamTranscript>, bool) {
    let mut decoder = FrameDecoder::new();
    let mut buf = BytesMut::from(bytes);
    let mut streams: BTreeMap<u32, StreamTranscript> = BTreeMap::new();
    let mut goaway = false;
    while let Some(frame) = decoder.decode(&mut buf).unwrap() {
        match frame {
            Frame::SynReply {
                stream_id, headers, ..
            } => {
                assert!(headers.is_empty(), "the kubelet's replies carry no headers");
                streams.entry(stream_id).or_default().replied = true;
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                let s = streams.entry(stream_id).or_default();
                s.data.extend_from_slice(&data);
                s.fin |= flags & 1 != 0;
            }
            Frame::RstStream { stream_id, .. } => {
                streams.entry(stream_id).or_default().reset = true
            }
            Frame::GoAway { .. } => goaway = true,
            other => panic!("unexpected frame from the kubelet: {other:?}"),
        }
    }
    (streams, goaway)
}

/// A captured session to replay: which connection of the capture carries the SPDY exec, the
/// kubelet request line to send instead of the recorded one (kubectl talked to an apiserver
/// path), and the protocol our kubelet should pick.
struct Replay {
    file: &'static str,
    conn: u64,
    request_line: Option<&'static str>,
    protocol: &'static str,
}

/// Sends the client half of a captured session (with its timing) to our kubelet; returns the
/// recorded server bytes and ours, both after the HTTP response head.
async fn replay(h: &Harness, r: &Replay) -> (Vec<u8>, Vec<u8>) {
    let chunks: Vec<Chunk> = capture(r.file)
        .into_iter()
        .filter(|c| c.0 == r.conn)
        .collect();
    let mut recorded_server = Vec::new();
    for (_, c2s, _, bytes) in &chunks {
        if !*c2s {
            recorded_server.extend_from_slice(bytes);
        }
    }
    let head_end = recorded_server
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap()
        + 4;
    let recorded_server = recorded_server[head_end..].to_vec();

    let mut tls = h.tls().await;
    let (mut rd, mut wr) = tokio::io::split(&mut tls);
    let reader = async {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            // Stop once the GOAWAY is in: the client side of the capture ends there.
            if got.windows(4).any(|w| w == b"\x80\x03\x00\x07") {
                break;
            }
        }
        got
    };
    let writer = async {
        let start = tokio::time::Instant::now();
        let t0 = chunks[0].2;
        let mut first = true;
        for (_, c2s, t, bytes) in &chunks {
            if !*c2s {
                continue;
            }
            // After the server's GOAWAY the captured client only closes; that part is not
            // a SPDY conversation any more.
            if bytes.starts_with(b"\x80\x03") && bytes.len() > 100 {
                break;
            }
            tokio::time::sleep_until(start + Duration::from_secs_f64((t - t0).max(0.0))).await;
            let mut bytes = bytes.clone();
            if first {
                first = false;
                if let Some(line) = r.request_line {
                    let eol = bytes.windows(2).position(|w| w == b"\r\n").unwrap();
                    let mut rewritten = line.as_bytes().to_vec();
                    rewritten.extend_from_slice(&bytes[eol..]);
                    bytes = rewritten;
                }
            }
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
    };
    let (got, ()) = tokio::join!(reader, writer);
    let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(
        head.contains(&format!("x-stream-protocol-version: {}", r.protocol)),
        "{head}"
    );
    (recorded_server, got[head_end..].to_vec())
}

#[tokio::test]
async fn replayed_client_go_and_kubectl_sessions_get_the_kubelets_answers() {
    let h = harness("spdy-replay").await;
    let sessions = [
        Replay {
            file: "spdy-v4-exec-stdin-stderr-exit3.jsonl",
            conn: 1,
            request_line: None,
            protocol: "v4.channel.k8s.io",
        },
        Replay {
            file: "spdy-v4-exec-tty-resize.jsonl",
            conn: 1,
            request_line: None,
            protocol: "v4.channel.k8s.io",
        },
        Replay {
            file: "kubectl-1.27-exec-stdin.jsonl",
            conn: 2,
            request_line: Some(
                "POST /exec/default/testpod/main?command=cat&input=1&output=1&error=1 HTTP/1.1",
            ),
            protocol: "v4.channel.k8s.io",
        },
        Replay {
            file: "kubectl-1.27-exec-spdy.jsonl",
            conn: 2,
            request_line: Some(
                "POST /exec/default/testpod/main?command=sh&command=-c&command=echo+out%3B+echo+err+%3E%262%3B+exit+4&output=1&error=1 HTTP/1.1",
            ),
            protocol: "v4.channel.k8s.io",
        },
        // kubectl 1.33 offers v5 first; the recorded (1.26) kubelet knew only v4, a current one
        // picks v5 — and answers with the same frames.
        Replay {
            file: "kubectl-1.33-exec-ws-v5-refused-then-spdy.jsonl",
            conn: 3,
            request_line: Some(
                "POST /exec/default/testpod/main?command=sh&command=-c&command=echo+out133%3B+exit+2&output=1&error=1 HTTP/1.1",
            ),
            protocol: "v5.channel.k8s.io",
        },
    ];
    timeout(T, async {
        for session in &sessions {
            let (recorded, ours) = replay(&h, session).await;
            let (want, want_goaway) = transcript(&recorded);
            let (got, got_goaway) = transcript(&ours);
            assert!(want_goaway && got_goaway, "{}: GOAWAY", session.file);
            assert_eq!(got, want, "{}: per-stream answers differ", session.file);
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn idle_spdy_sessions_are_cut_without_a_status_like_the_kubelet() {
    let h = Harness::start_with("spdy-idle", |cfg| {
        cfg.stream_idle_timeout = Duration::from_millis(400)
    })
    .await;
    h.kubelet
        .run_pod(pod("testpod", vec![shell_container("main", "sleep 1000")]))
        .await
        .unwrap();
    timeout(T, async {
        let path = "/exec/default/testpod/main?command=sleep&command=1000&output=1";
        let (_, conn, _i) = connect(&h, path, &["v4.channel.k8s.io"]).await.unwrap();
        let mut error = open(&conn, "error").await;
        let _stdout = open(&conn, "stdout").await;
        let mut status = Vec::new();
        // The kubelet's idle timeout cuts the connection under the open error stream and
        // writes nothing on it; whether the read ends in EOF (spdystream closes the streams of a
        // dead connection) or a reset depends on which the client sees first. (client-go then
        // reads the empty error stream as success: upstream's flaw, which relaylet does not
        // copy when it cuts a session itself.)
        let _ = error.read_to_end(&mut status).await;
        assert!(status.is_empty(), "{:?}", String::from_utf8_lossy(&status));
        conn.closed().await;
    })
    .await
    .unwrap();
}

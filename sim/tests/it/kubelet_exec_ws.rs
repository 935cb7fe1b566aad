//! exec over WebSocket against the kubelet stand-in, driven by kube-rs (v5/v4 as kube-rs
//! negotiates) and by raw tungstenite clients for the other `channel.k8s.io` subprotocols.

use crate::kubelet_support as support;

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use kube::api::AttachParams;
use kube::core::kubelet_debug::KubeletDebugParams;
use support::{Harness, pod, shell_container};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(20);

fn params(name: &str) -> KubeletDebugParams<'_> {
    KubeletDebugParams {
        name,
        namespace: "default",
        pod_uid: None,
    }
}

async fn harness_with_pod(test: &str) -> Harness {
    support::init_crypto();
    let h = Harness::start(test).await;
    h.kubelet
        .run_pod(pod("web", vec![shell_container("main", "sleep 1000")]))
        .await
        .unwrap();
    h
}

/// Runs `script` through kube-rs; returns (stdout, stderr, exit code from the status).
async fn kube_exec(h: &Harness, script: &str) -> (String, String, i32) {
    let client = h.kube_client().await;
    let ap = AttachParams::default().stdout(true).stderr(true);
    let mut proc = client
        .kubelet_node_exec(&params("web"), "main", ["sh", "-c", script], &ap)
        .await
        .unwrap();
    let mut stdout = proc.stdout().unwrap();
    let mut stderr = proc.stderr().unwrap();
    let status = proc.take_status().unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    let (a, b) = tokio::join!(
        stdout.read_to_string(&mut out),
        stderr.read_to_string(&mut err)
    );
    a.unwrap();
    b.unwrap();
    let status = timeout(T, status).await.unwrap().unwrap();
    let code = match status.status.as_deref() {
        Some("Success") => 0,
        _ => {
            assert_eq!(
                status.reason.as_deref(),
                Some("NonZeroExitCode"),
                "{status:?}"
            );
            let causes = status.details.unwrap().causes.unwrap();
            assert_eq!(causes[0].reason.as_deref(), Some("ExitCode"));
            causes[0].message.as_deref().unwrap().parse().unwrap()
        }
    };
    (out, err, code)
}

#[tokio::test]
async fn kube_rs_exec_splits_output_and_reports_exit_codes() {
    let h = harness_with_pod("exec-codes").await;
    timeout(T, async {
        let (out, err, code) = kube_exec(&h, "echo out; echo err >&2; exit 3").await;
        assert_eq!((out.as_str(), err.as_str(), code), ("out\n", "err\n", 3));
        let (out, err, code) = kube_exec(&h, "printf ok").await;
        assert_eq!((out.as_str(), err.as_str(), code), ("ok", "", 0));
        // Killed by a signal: 128 + signal number, as the runtime reports it.
        let (_, _, code) = kube_exec(&h, "kill -9 $$").await;
        assert_eq!(code, 137);
        let (_, err, code) = kube_exec(&h, "no-such-command-anywhere").await;
        assert_eq!(code, 127);
        assert!(err.contains("not found"), "{err}");
        // The container's environment and working directory apply to exec.
        let (out, _, code) = kube_exec(&h, "echo $GREETING $HOSTNAME; pwd").await;
        assert_eq!(code, 0);
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("hello-from-env web"));
        assert!(lines.next().unwrap().ends_with("/default_web_uid-web/main"));
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn kube_rs_exec_stdin_close_ends_cat() {
    let h = harness_with_pod("exec-stdin").await;
    timeout(T, async {
        let client = h.kube_client().await;
        let ap = AttachParams::default()
            .stdin(true)
            .stdout(true)
            .stderr(true);
        let mut proc = client
            .kubelet_node_exec(&params("web"), "main", ["cat"], &ap)
            .await
            .unwrap();
        let mut stdin = proc.stdin().unwrap();
        let mut stdout = proc.stdout().unwrap();
        let status = proc.take_status().unwrap();
        stdin.write_all(b"abc\n").await.unwrap();
        let mut buf = [0u8; 4];
        stdout.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"abc\n");
        // Closing stdin (v5 close signal) must end `cat` with success.
        stdin.shutdown().await.unwrap();
        let status = status.await.unwrap();
        assert_eq!(status.status.as_deref(), Some("Success"));
        let mut rest = Vec::new();
        stdout.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn kube_rs_exec_tty_sees_resizes() {
    let h = harness_with_pod("exec-tty").await;
    timeout(T, async {
        let client = h.kube_client().await;
        let ap = AttachParams::default().stdout(true).stderr(false).tty(true);
        let mut proc = client
            .kubelet_node_exec(
                &params("web"),
                "main",
                [
                    "sh",
                    "-c",
                    "trap 'stty size; exit 0' WINCH; stty size; while true; do sleep 0.05; done",
                ],
                &ap,
            )
            .await
            .unwrap();
        let mut resize = proc.terminal_size().unwrap();
        let mut stdout = proc.stdout().unwrap();
        let status = proc.take_status().unwrap();
        resize
            .send(kube::api::TerminalSize {
                width: 100,
                height: 40,
            })
            .await
            .unwrap();
        let mut seen = String::new();
        let mut buf = [0u8; 256];
        while !seen.contains("40 100\r\n") {
            let n = stdout.read(&mut buf).await.unwrap();
            assert!(n > 0, "output ended early: {seen:?}");
            seen.push_str(std::str::from_utf8(&buf[..n]).unwrap());
        }
        resize
            .send(kube::api::TerminalSize {
                width: 132,
                height: 50,
            })
            .await
            .unwrap();
        // The resize reaches the process as SIGWINCH; its trap prints the new size.
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).await.unwrap();
        assert!(rest.contains("50 132\r\n"), "{rest:?}");
        assert_eq!(status.await.unwrap().status.as_deref(), Some("Success"));
    })
    .await
    .unwrap();
}

/// Reads messages until the close frame; returns (channel, payload) in order.
async fn collect_frames<S>(ws: &mut S) -> Vec<(u8, Vec<u8>)>
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let mut frames = Vec::new();
    while let Some(msg) = ws.next().await {
        match msg.unwrap() {
            Message::Binary(b) => frames.push((b[0], b[1..].to_vec())),
            Message::Text(t) => {
                let bytes = t.as_bytes();
                use base64::Engine;
                let data = base64::engine::general_purpose::STANDARD
                    .decode(&bytes[1..])
                    .unwrap();
                frames.push((bytes[0] - b'0', data));
            }
            Message::Close(frame) => {
                let frame = frame.unwrap();
                assert_eq!(u16::from(frame.code), 1000);
                break;
            }
            _ => {}
        }
    }
    frames
}

fn joined(frames: &[(u8, Vec<u8>)], channel: u8) -> Vec<u8> {
    frames
        .iter()
        .filter(|(c, _)| *c == channel)
        .flat_map(|(_, d)| d.clone())
        .collect()
}

#[tokio::test]
async fn raw_websocket_protocols_write_status_per_version() {
    let h = harness_with_pod("exec-raw").await;
    timeout(T, async {
        let path = "/exec/default/web/main?command=sh&command=-c&command=echo+via-ws%3B+echo+e+%3E%262%3B+exit+5&error=1&output=1";

        // v4 binary: greeting, then data, then the JSON Status, byte for byte as the kubelet.
        let (mut ws, resp) = h.websocket(path, "v4.channel.k8s.io").await.unwrap();
        assert_eq!(resp.headers()["sec-websocket-protocol"], "v4.channel.k8s.io");
        let frames = collect_frames(&mut ws).await;
        assert_eq!(frames[0], (1, Vec::new()), "greeting on stdout");
        assert_eq!(joined(&frames, 1), b"via-ws\n");
        assert_eq!(joined(&frames, 2), b"e\n");
        assert_eq!(
            String::from_utf8(joined(&frames, 3)).unwrap(),
            r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c echo via-ws; echo e \u003e\u00262; exit 5], exit code 5","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"5"}]}}"#
        );

        // v4 base64: same content, text frames.
        let (mut ws, _) = h.websocket(path, "v4.base64.channel.k8s.io").await.unwrap();
        let frames = collect_frames(&mut ws).await;
        assert_eq!(joined(&frames, 1), b"via-ws\n");
        assert!(String::from_utf8(joined(&frames, 3)).unwrap().contains("\"ExitCode\""));

        // Pre-v4 protocols carry only the error text.
        for proto in ["channel.k8s.io", "base64.channel.k8s.io"] {
            let (mut ws, _) = h.websocket(path, proto).await.unwrap();
            let frames = collect_frames(&mut ws).await;
            assert_eq!(
                String::from_utf8(joined(&frames, 3)).unwrap(),
                "command terminated with non-zero exit code: error executing command [sh -c echo via-ws; echo e >&2; exit 5], exit code 5"
            );
        }
        let ok = "/exec/default/web/main?command=true&output=1";
        let (mut ws, _) = h.websocket(ok, "channel.k8s.io").await.unwrap();
        assert!(joined(&collect_frames(&mut ws).await, 3).is_empty());

        // The client's order wins; unknown protocols are refused with 403.
        let (_, resp) = h
            .websocket(ok, "base64.channel.k8s.io, v4.channel.k8s.io")
            .await
            .unwrap();
        assert_eq!(resp.headers()["sec-websocket-protocol"], "base64.channel.k8s.io");
        match h.websocket(ok, "v9.channel.k8s.io").await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 403)
            }
            other => panic!("expected 403, got {other:?}"),
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn raw_websocket_v5_close_and_stdin_only_greeting() {
    let h = harness_with_pod("exec-v5").await;
    timeout(T, async {
        // stdin only: the greeting goes to the error channel.
        let path = "/exec/default/web/main?command=sh&command=-c&command=cat+%3E+got.txt&input=1";
        let (mut ws, _) = h.websocket(path, "v5.channel.k8s.io").await.unwrap();
        let first = ws.next().await.unwrap().unwrap();
        assert_eq!(first, Message::binary(vec![3u8]));
        ws.send(Message::binary(b"\x00line\n".to_vec()))
            .await
            .unwrap();
        ws.send(Message::binary(vec![0xFF, 0])).await.unwrap();
        let frames = collect_frames(&mut ws).await;
        assert_eq!(joined(&frames, 3), br#"{"metadata":{},"status":"Success"}"#);
        let written = std::fs::read_to_string(
            h.data_dir
                .join("containers/default_web_uid-web/main/got.txt"),
        )
        .unwrap();
        assert_eq!(written, "line\n");
    })
    .await
    .unwrap();
}

/// A container runtime does not end an exec whose client left (containerd and CRI-O alike:
/// kubernetes/kubernetes#89031, kubernetes/kubectl#1076): the process only loses its stdin, and
/// it dies with its container.
#[tokio::test]
async fn client_disconnect_leaves_the_exec_process_running_until_its_container_ends() {
    let h = harness_with_pod("exec-kill").await;
    timeout(T, async {
        let path = "/exec/default/web/main?command=sh&command=-c&command=echo+%24%24%3B+cat+%3E%2Fdev%2Fnull%3B+echo+eof+%3E+stdin-closed%3B+exec+sleep+1000&stdin=1&output=1";
        let (mut ws, _) = h.websocket(path, "v4.channel.k8s.io").await.unwrap();
        let mut pid_text = String::new();
        while !pid_text.ends_with('\n') {
            if let Message::Binary(b) = ws.next().await.unwrap().unwrap() {
                pid_text.push_str(std::str::from_utf8(&b[1..]).unwrap());
            }
        }
        let pid = nix::unistd::Pid::from_raw(pid_text.trim().parse().unwrap());
        assert!(support::is_alive(pid.as_raw()), "process should run");
        drop(ws);
        // The event: the process saw its stdin end (it writes the file next).
        let marker = h
            .data_dir
            .join("containers/default_web_uid-web/main/stdin-closed");
        while !marker.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // It went on to exec sleep (same pid) rather than being killed.
        let mut cmdline = String::new();
        while !cmdline.starts_with("sleep") {
            cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            assert!(support::is_alive(pid.as_raw()), "the exec process was killed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Its container ends: so does the exec process.
        h.kubelet.remove_pod("default", "web").await;
        while support::is_alive(pid.as_raw()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn request_errors_match_the_kubelet() {
    let h = harness_with_pod("exec-errors").await;
    timeout(T, async {
        let (code, body) = h.get("/exec/default/nope/main?command=true&output=1").await;
        assert_eq!((code.as_u16(), body.as_str()), (404, "pod does not exist"));
        let (code, body) = h.get("/exec/default/web/nope?command=true&output=1").await;
        assert_eq!(
            (code.as_u16(), body.as_str()),
            (500, "container not found (\"nope\")")
        );
        let (code, body) = h.get("/exec/default/web/main?command=true").await;
        assert_eq!(
            (code.as_u16(), body.as_str()),
            (400, "you must specify at least 1 of stdin, stdout, stderr")
        );
        // A plain request is refused by the kubelet's upgrade-aware proxy (its responder
        // always answers 500); an upgrade without a protocol fails the SPDY handshake.
        let (code, body) = h.get("/exec/default/web/main?command=true&output=1").await;
        assert_eq!(
            (code.as_u16(), body.as_str()),
            (500, "Upgrade request required\n")
        );
        let resp = h
            .request(
                "POST",
                "/exec/default/web/main?command=true&output=1",
                &[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")],
            )
            .await;
        assert_eq!(resp.status(), 400);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &body[..],
            b"unable to upgrade: X-Stream-Protocol-Version is required\n"
        );
        let (code, _) = h.get("/nothing/here").await;
        assert_eq!(code.as_u16(), 404);
        assert_eq!(h.get("/healthz").await.1, "ok");
        // The uid form of the route works too.
        let (code, _) = h
            .get("/exec/default/nope/uid-x/main?command=true&output=1")
            .await;
        assert_eq!(code.as_u16(), 404);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn idle_sessions_are_closed_and_their_process_left_running() {
    support::init_crypto();
    // A current-thread test runtime: the kubelet's tasks log to this thread's subscriber.
    let log = Captured::default();
    let _subscriber = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .without_time()
            .with_writer(log.clone())
            .finish(),
    );
    let h = Harness::start_with("exec-idle", |cfg| {
        cfg.stream_idle_timeout = Duration::from_millis(400)
    })
    .await;
    h.kubelet
        .run_pod(pod("web", vec![shell_container("main", "sleep 1000")]))
        .await
        .unwrap();
    timeout(T, async {
        let path = "/exec/default/web/main?command=sh&command=-c&command=echo+%24%24%3B+exec+sleep+1000&output=1";
        let (mut ws, _) = h.websocket(path, "v4.channel.k8s.io").await.unwrap();
        let mut pid_text = String::new();
        while !pid_text.ends_with('\n') {
            if let Message::Binary(b) = ws.next().await.unwrap().unwrap() {
                pid_text.push_str(std::str::from_utf8(&b[1..]).unwrap());
            }
        }
        let pid = nix::unistd::Pid::from_raw(pid_text.trim().parse().unwrap());
        // Nothing moves: the kubelet ends the session after the idle timeout, without a
        // status (the command did not finish).
        let mut status = Vec::new();
        while let Some(Ok(msg)) = ws.next().await {
            if let Message::Binary(b) = msg
                && b.first() == Some(&3)
            {
                status.extend_from_slice(&b[1..]);
            }
        }
        assert!(status.is_empty(), "{}", String::from_utf8_lossy(&status));
        // The cause, from the kubelet's log: its idle timer, with the configured timeout (the
        // command would run for 1000 s, nothing else ends it).
        let log = log.text();
        assert!(
            log.contains("streaming connection idle, closing timeout=400ms"),
            "{log}"
        );
        // The kubelet closed the connection, not the process (a runtime leaves it running);
        // it ends with its container.
        assert!(support::is_alive(pid.as_raw()), "the idle cut killed the process");
        h.kubelet.remove_pod("default", "web").await;
        while support::is_alive(pid.as_raw()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn removing_the_pod_ends_its_exec_sessions() {
    let h = harness_with_pod("exec-removed").await;
    timeout(T, async {
        let path = "/exec/default/web/main?command=sh&command=-c&command=echo+up%3B+exec+sleep+1000&output=1";
        let (mut ws, _) = h.websocket(path, "v4.channel.k8s.io").await.unwrap();
        // Wait for the process to be up.
        loop {
            if let Message::Binary(b) = ws.next().await.unwrap().unwrap()
                && b[1..] == *b"up\n"
            {
                break;
            }
        }
        h.kubelet.remove_pod("default", "web").await;
        let frames = collect_frames(&mut ws).await;
        let status = String::from_utf8(joined(&frames, 3)).unwrap();
        assert!(status.contains(r#""message":"137""#), "{status}");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn kube_rs_interactive_tty_shell() {
    let h = harness_with_pod("exec-tty-stdin").await;
    timeout(T, async {
        let client = h.kube_client().await;
        let ap = AttachParams::interactive_tty();
        let mut proc = client
            .kubelet_node_exec(&params("web"), "main", ["sh"], &ap)
            .await
            .unwrap();
        let mut stdin = proc.stdin().unwrap();
        let mut stdout = proc.stdout().unwrap();
        let status = proc.take_status().unwrap();
        stdin
            .write_all(b"echo \"tty: $(tty)\"; exit 7\n")
            .await
            .unwrap();
        let mut seen = String::new();
        stdout.read_to_string(&mut seen).await.unwrap();
        // The terminal echoes the input and the shell runs on a real pseudo-terminal.
        assert!(seen.contains("tty: /dev/pts/"), "{seen:?}");
        let status = status.await.unwrap();
        let causes = status.details.unwrap().causes.unwrap();
        assert_eq!(causes[0].message.as_deref(), Some("7"));
    })
    .await
    .unwrap();
}

/// Log output written by a `tracing_subscriber::fmt` subscriber, kept for assertions.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log lock")).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

//! A session that relaylet cuts (idle timeout), or whose leaf connection dies before the leaf
//! sent an exit status, never reads as success through the root apiserver: every kubectl (1.27
//! SPDY; 1.33 and 1.35 with WebSockets on and off) exits non-zero and prints relaylet's message,
//! a WebSocket v4 client (passed through by the apiserver) reads a Failure Status on channel 3,
//! and the session counts as `idle_timeout` or `leaf_lost`. A session the leaf ends itself is
//! untouched (its Status arrives byte for byte) and counts as `completed`, whichever side's
//! close relaylet happens to see first.
//!
//! The root apiserver's proxy turns relaylet's resets into clean closes (as upstream
//! `UpgradeAwareHandler` does), and client-go's SPDY executor reads streams that end without a
//! Status as exit code 0; so these tests fail on a relaylet that only resets.

use relaylet_dev::testkit as support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use relaylet_dev::sandbox::{RELAYLET_LEAF_USER, RELAYLET_NAMESPACE, Settings};
use relaylet_sim::channel::Protocol;
use relaylet_sim::spdy::upgrade_client;
use support::forwarder::Forwarder;
use support::{Background, Env, RT, Run, env, kubectl_variants, ws_exec};
use tokio::io::AsyncReadExt;

const IDLE: &str = "2s";

fn settings() -> Settings {
    Settings {
        env: BTreeMap::from([("STREAM_IDLE_TIMEOUT".to_string(), IDLE.to_string())]),
        // leaf-3 (demo-3) for the test of sessions clients end, whose counts the others' would
        // disturb.
        leaves: vec!["leaf-1".into(), "leaf-2".into(), "leaf-3".into()],
        ..Settings::default()
    }
}

/// Generous bounds for things that happen within a second or two; never asserted as timings.
const WITHIN: Duration = Duration::from_secs(60);

fn metrics(e: &Env) -> String {
    e.sandbox.relaylet.metrics.encode().unwrap_or_default()
}

/// The value of one `relaylet_sessions_total` series (0 when absent).
fn sessions_total(e: &Env, leaf: &str, result: &str) -> u64 {
    let series =
        format!("relaylet_sessions_total{{kind=\"exec\",leaf=\"{leaf}\",result=\"{result}\"}} ");
    metrics(e)
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn wait_for(what: &str, check: impl FnMut() -> bool) {
    support::wait_until(what, WITHIN, check);
}

/// Starts `kubectl exec <pod> -- sh -c <script>` in every variant.
fn spawn_kubectls(e: &'static Env, pod: &str, script: &str) -> Vec<Background> {
    kubectl_variants()
        .into_iter()
        .map(|(k, spdy)| {
            let run = Run::new(&k, &e.kubeconfig, &["exec", pod, "--", "sh", "-c", script]);
            let what = format!("kubectl {} spdy-only={spdy}", k.version);
            Background::spawn(if spdy { run.spdy_only() } else { run }, what)
        })
        .collect()
}

/// Points relaylet's kubeconfig Secret for `leaf` at `forwarder` and waits until relaylet
/// has rebuilt the leaf from it.
fn route_leaf_through(e: &Env, leaf: &str, forwarder: &Forwarder) {
    let registry = &e.sandbox.relaylet.registry;
    let node = e.sandbox.config.node_name(leaf);
    let before = registry.by_node(&node).expect("the leaf is registered");
    let store = e.sandbox.root.api.store();
    let mut secret: Secret = store
        .get_typed(RELAYLET_NAMESPACE, &format!("leaf-{leaf}"))
        .expect("leaf Secret");
    let cluster = &e.sandbox.leaves[leaf];
    let kubeconfig = cluster
        .kubeconfig(RELAYLET_LEAF_USER, &[])
        .expect("kubeconfig")
        .replace(&cluster.api.url(), &format!("https://{}", forwarder.addr));
    secret.data = Some(BTreeMap::from([(
        relaylet::leaf::KUBECONFIG_KEY.to_string(),
        ByteString(kubeconfig.into_bytes()),
    )]));
    store.update_typed(&secret).expect("update the leaf Secret");
    wait_for("relaylet rebuilds the leaf from its new Secret", || {
        registry
            .by_node(&node)
            .is_some_and(|now| !Arc::ptr_eq(&now, &before))
    });
    wait_for("relaylet talks to the leaf through the forwarder", || {
        forwarder.accepted() > 0
    });
}

/// Idle timeout: nothing moves for 2 s after the first line, and relaylet ends the session.
#[test]
fn an_idle_cut_fails_every_client_with_relaylets_message() {
    let e = env(settings);
    let script = "echo started; sleep 60; echo too-late";
    let before = sessions_total(e, "leaf-1", "idle_timeout");
    let kubectls = spawn_kubectls(e, "demo-1", script);
    let ws = [Protocol::V4, Protocol::V4Base64].map(|protocol| {
        RT.spawn(async move {
            let socket = ws_exec::open(e, "demo-1", script, protocol).await;
            (protocol, ws_exec::read_all(socket, protocol, None).await)
        })
    });

    let message = format!("relaylet: idle timeout after {IDLE}");
    let mut wrong = Vec::new();
    for k in kubectls {
        let what = k.what.clone();
        let ended = k.finish(WITHIN);
        if ended.code == Some(0) || !ended.stderr.contains(&message) || ended.stdout != "started\n"
        {
            wrong.push(format!("{what}: {ended:?}"));
        }
    }
    for task in ws {
        let (protocol, read) = RT.block_on(task).expect("WebSocket client");
        if read.stdout != b"started\n" || !read.failed_with(&message) || !read.closed_cleanly {
            wrong.push(format!("WebSocket {protocol:?}: {read:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "every client must fail with {message:?}:\n{}",
        wrong.join("\n")
    );
    wait_for("seven idle cuts counted", || {
        sessions_total(e, "leaf-1", "idle_timeout") >= before + 7
    });
}

/// The leaf connection is aborted mid-session (a dying leaf apiserver or network): relaylet
/// says so on the error stream, and counts `leaf_lost`, not `completed`.
#[test]
fn a_lost_leaf_connection_fails_every_client_with_relaylets_message() {
    let e = env(settings);
    let forwarder = RT.block_on(Forwarder::start(
        e.sandbox.leaves["leaf-2"]
            .api
            .url()
            .trim_start_matches("https://")
            .parse()
            .expect("leaf address"),
    ));
    route_leaf_through(e, "leaf-2", &forwarder);
    let completed_before = sessions_total(e, "leaf-2", "completed");
    let lost_before = sessions_total(e, "leaf-2", "leaf_lost");

    // Output every 0.2 s: never idle.
    let script = "while true; do echo tick; sleep 0.2; done";
    let kubectls = spawn_kubectls(e, "demo-2", script);
    let mut ws = Vec::new();
    let mut ws_started = Vec::new();
    for protocol in [Protocol::V4, Protocol::V4Base64] {
        let (tx, rx) = tokio::sync::oneshot::channel();
        ws_started.push(rx);
        ws.push(RT.spawn(async move {
            let socket = ws_exec::open(e, "demo-2", script, protocol).await;
            (
                protocol,
                ws_exec::read_all(socket, protocol, Some(tx)).await,
            )
        }));
    }
    for k in &kubectls {
        assert_eq!(
            k.next_line(WITHIN).as_deref(),
            Some("tick"),
            "{}: the session runs",
            k.what
        );
    }
    for started in ws_started {
        RT.block_on(started).expect("the WebSocket session runs");
    }

    forwarder.abort_all();

    let message = "relaylet: connection to leaf cluster leaf-2 lost";
    let mut wrong = Vec::new();
    for k in kubectls {
        let what = k.what.clone();
        let ended = k.finish(WITHIN);
        if ended.code == Some(0) || !ended.stderr.contains(message) {
            wrong.push(format!("{what}: {ended:?}"));
        }
    }
    for task in ws {
        let (protocol, read) = RT.block_on(task).expect("WebSocket client");
        if !read.failed_with(message) || !read.closed_cleanly {
            wrong.push(format!("WebSocket {protocol:?}: {read:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "every client must fail with {message:?}:\n{}",
        wrong.join("\n")
    );
    wait_for("seven lost leaves counted", || {
        sessions_total(e, "leaf-2", "leaf_lost") >= lost_before + 7
    });
    assert_eq!(
        sessions_total(e, "leaf-2", "completed"),
        completed_before,
        "a lost leaf is not a completed session"
    );
}

/// Sessions the leaf ends itself: the leaf's Status arrives byte for byte (nothing injected),
/// and each counts `completed` even when the client closes the instant it has the Status, so
/// that relaylet often sees the client's close before the leaf's.
#[test]
fn a_session_the_leaf_ends_is_untouched_and_completed_whoever_closes_first() {
    let e = env(settings);
    const SESSIONS: u64 = 60;
    let completed_before = sessions_total(e, "leaf-1", "completed");
    let client_closed_before = sessions_total(e, "leaf-1", "client_closed");
    // Exactly what the sim kubelet writes for `exit 3` (checked against real kubelet captures).
    let expected = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c echo out; exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
    RT.block_on(async {
        let tls = e.kubelet_api_tls(Some(&e.kubelet_client_identity()));
        let url = format!(
            "https://{}/exec/default/demo-1/main?command=sh&command=-c&command=echo+out%3B+exit+3&output=1",
            e.sandbox.relaylet.addr
        );
        for i in 0..SESSIONS {
            let (proto, conn, _incoming) =
                upgrade_client(&url, tls.clone(), &["v4.channel.k8s.io"], &[])
                    .await
                    .expect("upgrade");
            assert_eq!(proto, "v4.channel.k8s.io");
            let mut error = conn
                .open_stream(vec![("streamType".into(), "error".into())])
                .await
                .expect("error stream");
            let mut stdout = conn
                .open_stream(vec![("streamType".into(), "stdout".into())])
                .await
                .expect("stdout stream");
            let mut out = Vec::new();
            stdout.read_to_end(&mut out).await.expect("stdout");
            let mut status = Vec::new();
            error.read_to_end(&mut status).await.expect("status");
            assert_eq!(out, b"out\n", "session {i}");
            assert_eq!(
                String::from_utf8_lossy(&status),
                String::from_utf8_lossy(expected),
                "session {i}: the leaf's Status, untouched"
            );
            // Gone the instant the Status is in, as kubectl is.
            conn.abort();
        }
    });
    wait_for("every session counted", || {
        sessions_total(e, "leaf-1", "completed") - completed_before
            + sessions_total(e, "leaf-1", "client_closed")
            - client_closed_before
            >= SESSIONS
    });
    assert_eq!(
        sessions_total(e, "leaf-1", "client_closed"),
        client_closed_before,
        "a session whose leaf sent its Status is completed, whoever closed first"
    );
    assert_eq!(
        sessions_total(e, "leaf-1", "completed"),
        completed_before + SESSIONS
    );
}

/// A WebSocket v4 client (fabric8, client-node, python) that ends its own session while the
/// command still runs: its close frame goes to the leaf, the leaf's side then ends without an
/// exit status, and that is the client's doing, not a lost leaf. The session counts
/// `client_closed`, and relaylet writes no Failure Status to a client that has gone.
#[test]
fn a_websocket_client_that_ends_its_session_is_client_closed_and_sent_no_status() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let e = env(settings);
    for protocol in [Protocol::V4, Protocol::V4Base64] {
        let closed_before = sessions_total(e, "leaf-3", "client_closed");
        let lost_before = sessions_total(e, "leaf-3", "leaf_lost");
        let read = RT.block_on(async {
            // Output every 0.2 s keeps the session clear of the 2 s idle timeout.
            let mut socket = ws_exec::open(
                e,
                "demo-3",
                "while true; do echo tick; sleep 0.2; done",
                protocol,
            )
            .await;
            // Running: the first output is in.
            while let Some(message) = socket.next().await {
                match message.expect("a message") {
                    Message::Binary(data) if data.len() > 1 => break,
                    Message::Text(data) if data.len() > 1 => break,
                    _ => {}
                }
            }
            socket.send(Message::Close(None)).await.expect("close");
            ws_exec::read_all(socket, protocol, None).await
        });
        assert!(
            read.error.is_empty(),
            "{protocol:?}: a Status was written to a client that had closed: {:?}",
            String::from_utf8_lossy(&read.error)
        );
        wait_for("the session counted client_closed", || {
            sessions_total(e, "leaf-3", "client_closed") > closed_before
        });
        assert_eq!(
            sessions_total(e, "leaf-3", "leaf_lost"),
            lost_before,
            "{protocol:?}: the client ended the session, the leaf was not lost"
        );
    }
}

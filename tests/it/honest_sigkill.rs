//! The one cut relaylet cannot make honest: relaylet itself killed (SIGKILL, the OOM killer).
//! Nothing runs to write a Status; the kernel closes relaylet's connections, and the root
//! apiserver's proxy (like upstream `UpgradeAwareHandler`) closes kubectl's connection cleanly.
//! This test records what users then see, so that the statement in docs/operations.md ("When
//! relaylet ends a session") stays true: over SPDY (kubectl 1.27, and 1.33 and 1.35 with
//! WebSockets off) kubectl exits 0 with its output cut short and no error; over WebSocket
//! (1.33 and 1.35 by default), which the root proxies to relaylet unchanged because relaylet
//! declares ExtendWebSocketsToKubelet, kubectl exits 1 with `websocket: close 1006 (abnormal
//! closure)`; a WebSocket v4 client sees the connection end with neither a Status nor a close
//! frame.
//!
//! relaylet runs here as its own process (the shipped binary, configured by env vars like the
//! sandbox's in-process replica), takes over the virtual nodes when the in-process replica
//! shuts down, and is then killed with SIGKILL in the middle of the sessions.

use relaylet_dev::testkit as support;

use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::channel::Protocol;
use support::{Background, RT, Run, env, kubectl_variants, ws_exec};

const WITHIN: Duration = Duration::from_secs(60);

#[test]
fn a_killed_relaylet_reads_as_success_to_every_kubectl() {
    let e = env(Settings::default);
    let mut replica = support::process::RelayletProcess::start(
        e,
        std::path::Path::new(env!("CARGO_BIN_EXE_relaylet")),
        "relaylet-killed",
        &[],
    );

    // The in-process replica shuts down (it stops accepting at once and hands leadership
    // over); from then on every session the root apiserver opens reaches the other process.
    e.sandbox.shutdown.begin.cancel();
    let k = relaylet_sim::tools::kubectl("1.35").expect("kubectl 1.35");
    support::wait_until(
        "the relaylet process serves the virtual nodes",
        WITHIN,
        || {
            let out = Run::new(
                &k,
                &e.kubeconfig,
                &["exec", "demo-1", "--", "echo", "served"],
            )
            .output();
            String::from_utf8_lossy(&out.stdout) == "served\n"
        },
    );

    let script = "while true; do echo tick; sleep 0.2; done";
    let kubectls: Vec<Background> = kubectl_variants()
        .into_iter()
        .map(|(k, spdy)| {
            let run = Run::new(
                &k,
                &e.kubeconfig,
                &["exec", "demo-1", "--", "sh", "-c", script],
            );
            let what = format!("kubectl {} spdy-only={spdy}", k.version);
            Background::spawn(if spdy { run.spdy_only() } else { run }, what)
        })
        .collect();
    let (ws_tx, ws_rx) = tokio::sync::oneshot::channel();
    let ws = RT.spawn(async move {
        let socket = ws_exec::open(e, "demo-1", script, Protocol::V4).await;
        ws_exec::read_all(socket, Protocol::V4, Some(ws_tx)).await
    });
    for k in &kubectls {
        assert_eq!(k.next_line(WITHIN).as_deref(), Some("tick"), "{}", k.what);
    }
    RT.block_on(ws_rx).expect("the WebSocket session runs");

    // SIGKILL.
    replica.child.kill().expect("SIGKILL");
    let _ = replica.child.wait();

    let mut seen = Vec::new();
    for k in kubectls {
        let what = k.what.clone();
        let ended = k.finish(WITHIN);
        seen.push(format!(
            "{what}: exit {:?}, stderr {:?}",
            ended.code, ended.stderr
        ));
        assert!(ended.stdout.starts_with("tick\n"), "{what}: {ended:?}");
        if spdy_or_old(&what) {
            assert_eq!(
                (ended.code, ended.stderr.as_str()),
                (Some(0), ""),
                "{what}: docs/operations.md says a killed relaylet reads as success over SPDY; \
                 if this changed, say so"
            );
        } else {
            // WebSocket, proxied to relaylet by the root (relaylet declares
            // ExtendWebSocketsToKubelet): the connection ends without a close frame.
            assert_eq!(ended.code, Some(1), "{what}: {ended:?}");
            assert!(
                ended
                    .stderr
                    .contains("websocket: close 1006 (abnormal closure)"),
                "{what}: {ended:?}"
            );
        }
    }
    let read = RT.block_on(ws).expect("WebSocket client");
    assert!(
        read.error.is_empty() && !read.closed_cleanly,
        "WebSocket v4: no Status and no close frame: {read:?}"
    );
    eprintln!(
        "what users see when relaylet is killed:\n{}",
        seen.join("\n")
    );
}

/// Whether a kubectl run (`kubectl <version> spdy-only=<bool>`) speaks SPDY to the root: forced
/// to, or a kubectl before 1.30 (WebSockets became its default in 1.30).
fn spdy_or_old(what: &str) -> bool {
    what.contains("spdy-only=true") || what.contains("kubectl 1.27")
}

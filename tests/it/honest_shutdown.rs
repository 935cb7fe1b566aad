//! A session cut at the end of relaylet's shutdown grace period never reads as success through
//! the root apiserver: every kubectl (1.27 SPDY; 1.33 and 1.35 with WebSockets on and off) exits
//! non-zero and prints `relaylet: shutting down`, a WebSocket v4 client reads a Failure Status
//! on channel 3, and the sessions count as `shutdown`. (Its own binary: shutting down ends the
//! sandbox's relaylet for good.)

use relaylet_dev::testkit as support;

use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::channel::Protocol;
use support::{Background, RT, Run, env, kubectl_variants, ws_exec};

const WITHIN: Duration = Duration::from_secs(60);

fn settings() -> Settings {
    let mut s = Settings::default();
    s.env.insert("SHUTDOWN_GRACE_PERIOD".into(), "2s".into());
    s
}

fn sessions_total(e: &support::Env, leaf: &str, result: &str) -> u64 {
    let series =
        format!("relaylet_sessions_total{{kind=\"exec\",leaf=\"{leaf}\",result=\"{result}\"}} ");
    e.sandbox
        .relaylet
        .metrics
        .encode()
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_shutdown_cut_fails_every_client_with_relaylets_message() {
    let e = env(settings);
    // Output every 0.2 s: the sessions would run for ever, never idle.
    let script = "while true; do echo tick; sleep 0.2; done";
    let kubectls: Vec<Background> = kubectl_variants()
        .into_iter()
        .enumerate()
        .map(|(i, (k, spdy))| {
            // Both leaves.
            let pod = if i % 2 == 0 { "demo-1" } else { "demo-2" };
            let run = Run::new(&k, &e.kubeconfig, &["exec", pod, "--", "sh", "-c", script]);
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
        assert_eq!(
            k.next_line(WITHIN).as_deref(),
            Some("tick"),
            "{}: the session runs",
            k.what
        );
    }
    RT.block_on(ws_rx).expect("the WebSocket session runs");

    // SIGTERM: sessions get the 2 s grace period, then relaylet cuts them.
    e.sandbox.shutdown.begin.cancel();

    let message = "relaylet: shutting down";
    let mut wrong = Vec::new();
    for k in kubectls {
        let what = k.what.clone();
        let ended = k.finish(WITHIN);
        if ended.code == Some(0) || !ended.stderr.contains(message) {
            wrong.push(format!("{what}: {ended:?}"));
        }
    }
    let read = RT.block_on(ws).expect("WebSocket client");
    if !read.failed_with(message) || !read.closed_cleanly {
        wrong.push(format!("WebSocket v4: {read:?}"));
    }
    assert!(
        wrong.is_empty(),
        "every client must fail with {message:?}:\n{}",
        wrong.join("\n")
    );
    support::wait_until(
        "six sessions counted as cut by the shutdown",
        WITHIN,
        || sessions_total(e, "leaf-1", "shutdown") + sessions_total(e, "leaf-2", "shutdown") >= 6,
    );
}

//! `ExtendWebSocketsToKubelet` and a 1.37 root (1.35 leaves), each test with its own world, in
//! turn:
//!
//! - With `EXTEND_WEBSOCKETS_TO_KUBELET=false` relaylet declares nothing on its virtual Node, so
//!   the root translates kubectl 1.35's WebSocket calls to SPDY before they reach relaylet, as
//!   every root before 1.36 does. The same calls as
//!   `real_k8s::websocket_calls_are_proxied_to_relaylet_by_the_1_37_root` (declared, proxied)
//!   pass, and the root counts them as `translated_at_apiserver`.
//! - With it declared (the default), relaylet as its own process is SIGKILLed in the middle of
//!   exec sessions: what kubectl 1.27 (SPDY), kubectl 1.35 (WebSocket v5, now proxied to relaylet
//!   unchanged) and a WebSocket v4 client see, asserted as it is (docs/operations.md, "When
//!   relaylet ends a session").
//! - With 1.37 leaves whose kubelet declares the feature as a 1.36+ kubelet does (and translates
//!   WebSocket calls itself), the leaf apiserver proxies relaylet's re-issued calls to the kubelet
//!   too: no apiserver on the path translates (the bytes cross both apiservers as WebSocket frames).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use relaylet_dev::testkit::realk8s::harness::K8s;
use relaylet_dev::testkit::realk8s::websocket_calls::{counted_since, run_all, streaming_counts};
use relaylet_dev::testkit::realk8s::world::{Setup, World};
use relaylet_dev::testkit::{self as support, Background, Run, text, wait_until, ws_exec};
use relaylet_sim::channel::Protocol;

const WITHIN: Duration = Duration::from_secs(60);

/// One world at a time: each test starts its own clusters.
fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn with_the_setting_off_the_1_37_root_translates_and_every_call_works() {
    let _turn = turn();
    let w = World::start(Setup {
        env: &[("EXTEND_WEBSOCKETS_TO_KUBELET", "false")],
        root_version: K8s::V1_37,
        leaf_version: K8s::V1_35,
        ..Setup::default()
    });
    w.sync_pod("leaf-1", "default", "demo");
    w.sync_pod("leaf-1", "default", "attached");
    let declared = w.root.kubectl_ok(&[
        "get",
        "node",
        "relaylet-leaf-1",
        "-o",
        "jsonpath={.status.declaredFeatures}",
    ]);
    assert_eq!(declared.trim(), "", "nothing is declared");
    let k = support::kubectl("1.35");
    let before = streaming_counts(&w.root);
    run_all(&w, &k, "demo", "attached");
    let after = streaming_counts(&w.root);
    for subresource in ["exec", "attach", "portforward"] {
        assert!(
            counted_since(&before, &after, subresource, "translated_at_apiserver") > 0,
            "{subresource}: {after:?}"
        );
        assert_eq!(
            counted_since(&before, &after, subresource, "proxied_to_kubelet"),
            0,
            "{subresource}: {after:?}"
        );
    }
}

/// relaylet SIGKILLed mid-exec, the virtual Node declaring `ExtendWebSocketsToKubelet` to a
/// 1.37 root. kubectl 1.27 speaks SPDY, which the root proxies as it always did: when
/// relaylet's connection dies the root closes kubectl's cleanly, and kubectl exits 0 with its
/// output cut short. kubectl 1.35's WebSocket v5 session is now proxied unchanged, so the
/// WebSocket it holds ends without a close frame: kubectl reports the abnormal closure and
/// fails. The v4 client, proxied unchanged by every root, sees neither a Status nor a close
/// frame, as before.
#[test]
fn a_killed_relaylet_fails_websocket_kubectl_through_a_1_37_root() {
    let _turn = turn();
    let w = World::start(Setup {
        root_version: K8s::V1_37,
        leaf_version: K8s::V1_35,
        ..Setup::default()
    });
    w.sync_pod("leaf-1", "default", "demo");
    // relaylet as its own process (replica 1) takes over when the in-process replica stops;
    // from then on every session the root opens reaches the process.
    let mut process =
        w.spawn_relaylet_process(1, std::path::Path::new(env!("CARGO_BIN_EXE_relaylet")), &[]);
    w.stop_replica(0);
    let k135 = support::kubectl("1.35");
    wait_until(
        "the relaylet process serves the virtual node",
        WITHIN,
        || {
            let out = Run::new(
                &k135,
                w.root_kubeconfig(),
                &["exec", "demo", "--", "echo", "served"],
            )
            .output();
            text(&out.stdout) == "served\n"
        },
    );
    let declared = w.root.kubectl_ok(&[
        "get",
        "node",
        "relaylet-leaf-1",
        "-o",
        "jsonpath={.status.declaredFeatures}",
    ]);
    assert_eq!(declared.trim(), r#"["ExtendWebSocketsToKubelet"]"#);

    let script = "while true; do echo tick; sleep 0.2; done";
    let k127 = support::kubectl("1.27");
    let kubectls = [("1.27 (SPDY)", &k127), ("1.35 (WebSocket)", &k135)].map(|(what, k)| {
        let run = Run::new(
            k,
            w.root_kubeconfig(),
            &["exec", "demo", "--", "sh", "-c", script],
        );
        Background::spawn(run, format!("kubectl {what}"))
    });
    let addr = w.root.url.trim_start_matches("https://").to_string();
    let tls = ws_exec::admin_tls(&w.root.ca);
    let (ws_tx, ws_rx) = tokio::sync::oneshot::channel();
    let ws = w.runtime.spawn(async move {
        let socket = ws_exec::open_at(tls, &addr, "demo", script, Protocol::V4).await;
        ws_exec::read_all(socket, Protocol::V4, Some(ws_tx)).await
    });
    for k in &kubectls {
        assert_eq!(k.next_line(WITHIN).as_deref(), Some("tick"), "{}", k.what);
    }
    w.runtime
        .block_on(ws_rx)
        .expect("the WebSocket v4 session runs");

    process.kill();

    let [spdy, websocket] = kubectls.map(|k| {
        let what = k.what.clone();
        (what, k.finish(WITHIN))
    });
    let read = w.runtime.block_on(ws).expect("WebSocket v4 client");
    eprintln!(
        "what users see when relaylet is killed (1.37 root, ExtendWebSocketsToKubelet declared):\n\
         {}: exit {:?}, stderr {:?}\n{}: exit {:?}, stderr {:?}\nWebSocket v4: status {:?}, close frame {}",
        spdy.0,
        spdy.1.code,
        spdy.1.stderr,
        websocket.0,
        websocket.1.code,
        websocket.1.stderr,
        text(&read.error),
        read.closed_cleanly
    );
    assert!(spdy.1.stdout.starts_with("tick\n"), "{spdy:?}");
    assert_eq!(
        (spdy.1.code, spdy.1.stderr.as_str()),
        (Some(0), ""),
        "{spdy:?}: SPDY through the root reads a killed relaylet as success"
    );
    assert!(websocket.1.stdout.starts_with("tick\n"), "{websocket:?}");
    assert_eq!(websocket.1.code, Some(1), "{websocket:?}");
    assert!(
        websocket
            .1
            .stderr
            .contains("websocket: close 1006 (abnormal closure)"),
        "{websocket:?}"
    );
    assert!(
        read.error.is_empty() && !read.closed_cleanly,
        "WebSocket v4: no Status and no close frame: {read:?}"
    );
}

/// A 1.37 root and 1.37 leaves: leaf-1's kubelet declares `ExtendWebSocketsToKubelet` (as real
/// 1.36+ kubelets do), leaf-2's does not. Every kubectl 1.35 WebSocket call works on both; the
/// root proxies all of them to relaylet, and leaf-1's apiserver proxies them on to its kubelet
/// while leaf-2's translates them to SPDY.
#[test]
fn a_declaring_leaf_kubelet_gets_the_calls_proxied_by_its_apiserver_too() {
    let _turn = turn();
    let w = World::start(Setup {
        root_version: K8s::V1_37,
        leaf_version: K8s::V1_37,
        leaves: &["leaf-1", "leaf-2"],
        declaring_leaves: &["leaf-1"],
        ..Setup::default()
    });
    let declared = |leaf: &str| {
        w.leaf(leaf)
            .kubectl_ok(&[
                "get",
                "node",
                &format!("{leaf}-node"),
                "-o",
                "jsonpath={.status.declaredFeatures}",
            ])
            .trim()
            .to_string()
    };
    assert_eq!(declared("leaf-1"), r#"["ExtendWebSocketsToKubelet"]"#);
    assert_eq!(declared("leaf-2"), "");
    let k = support::kubectl("1.35");
    for (leaf, leaf_proxy_type) in [
        ("leaf-1", "proxied_to_kubelet"),
        ("leaf-2", "translated_at_apiserver"),
    ] {
        let (demo, attached) = (format!("demo-{leaf}"), format!("attached-{leaf}"));
        w.sync_pod(leaf, "default", &demo);
        w.sync_pod(leaf, "default", &attached);
        let root_before = streaming_counts(&w.root);
        let leaf_before = streaming_counts(w.leaf(leaf));
        run_all(&w, &k, &demo, &attached);
        let root_after = streaming_counts(&w.root);
        let leaf_after = streaming_counts(w.leaf(leaf));
        for subresource in ["exec", "attach", "portforward"] {
            assert!(
                counted_since(&root_before, &root_after, subresource, "proxied_to_kubelet") > 0,
                "root, {leaf}, {subresource}: {root_after:?}"
            );
            assert!(
                counted_since(&leaf_before, &leaf_after, subresource, leaf_proxy_type) > 0,
                "{leaf}'s apiserver, {subresource}: {leaf_after:?}"
            );
        }
    }
}

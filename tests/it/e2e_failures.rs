//! Failures a user must understand: a cut relaylet makes itself (idle timeout) reads as an error,
//! never as success, to a SPDY client that sends no pings (relaylet's Failure Status on the
//! error stream; `honest_endings.rs` has the same through the root apiserver with every
//! kubectl); an unreachable leaf is a 502 naming the leaf; a pod whose virtual node lost its
//! leaf is a 503 naming the node.

use relaylet_dev::testkit as support;

use std::collections::BTreeMap;
use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::spdy::{Connection, Stream, upgrade_client};
use support::{RT, Run, describe, env, text, wait_until};
use tokio::io::AsyncReadExt;

fn settings() -> Settings {
    Settings {
        env: BTreeMap::from([("STREAM_IDLE_TIMEOUT".to_string(), "2s".to_string())]),
        ..Settings::default()
    }
}

/// Opens a SPDY exec to relaylet's kubelet API as the root apiserver would (its kubelet client
/// certificate), offering v4 like client-go.
async fn spdy_exec(e: &support::Env, query: &str) -> (Connection, Stream, Stream) {
    let tls = e.kubelet_api_tls(Some(&e.kubelet_client_identity()));
    let url = format!(
        "https://{}/exec/default/demo-1/main?{query}",
        e.sandbox.relaylet.addr
    );
    let (proto, conn, _incoming) = upgrade_client(&url, tls, &["v4.channel.k8s.io"], &[])
        .await
        .expect("upgrade");
    assert_eq!(proto, "v4.channel.k8s.io");
    let error = conn
        .open_stream(vec![("streamType".into(), "error".into())])
        .await
        .unwrap();
    let stdout = conn
        .open_stream(vec![("streamType".into(), "stdout".into())])
        .await
        .unwrap();
    (conn, error, stdout)
}

#[test]
fn an_idle_cut_is_an_error_not_a_success() {
    let e = env(settings);
    RT.block_on(async {
        // A command that would print after 30 s: nothing moves for the 2 s idle timeout.
        let (_conn, mut error, mut stdout) = spdy_exec(
            e,
            "command=sh&command=-c&command=sleep+30%3B+echo+late&output=1",
        )
        .await;
        let mut status = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(20), error.read_to_end(&mut status)).await;
        let mut out = Vec::new();
        let _ = stdout.read_to_end(&mut out).await;
        // client-go's rule: an exit Status on the error stream, or a clean end of it (exit 0).
        // relaylet's cut says why on the error stream, so it can never read as exit 0.
        assert!(matches!(read, Ok(Ok(_))), "{read:?}");
        let status: serde_json::Value = serde_json::from_slice(&status).unwrap_or_else(|err| {
            panic!(
                "a Status on the error stream: {err}: {:?}",
                String::from_utf8_lossy(&status)
            )
        });
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["message"], "relaylet: idle timeout after 2s");
        assert!(out.is_empty());
    });
}

#[test]
fn a_busy_stream_is_not_idle() {
    let e = env(settings);
    RT.block_on(async {
        // Output every 0.5 s for 4 s: longer than the idle timeout, never idle for it.
        let (_conn, mut error, mut stdout) = spdy_exec(
            e,
            "command=sh&command=-c&command=for+i+in+1+2+3+4+5+6+7+8%3B+do+echo+%24i%3B+sleep+0.5%3B+done&output=1",
        )
        .await;
        let mut status = Vec::new();
        let mut out = Vec::new();
        let (a, b) = tokio::join!(error.read_to_end(&mut status), stdout.read_to_end(&mut out));
        a.unwrap();
        b.unwrap();
        assert_eq!(String::from_utf8_lossy(&out), "1\n2\n3\n4\n5\n6\n7\n8\n");
        assert!(String::from_utf8_lossy(&status).contains("Success"));
    });
}

#[test]
fn an_unreachable_leaf_is_a_502_naming_it_and_a_lost_leaf_a_503_naming_the_node() {
    let e = env(settings);
    let k = relaylet_sim::tools::kubectl("1.35").unwrap();
    // Runs after the other tests of this binary are past their sessions on leaf-1: it only
    // touches leaf-2.
    e.sandbox.leaves["leaf-2"].api.stop();
    let out = Run::new(&k, &e.kubeconfig, &["exec", "demo-2", "--", "true"]).output();
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        text(&out.stderr).contains("leaf cluster leaf-2 is unreachable"),
        "{}",
        describe(&k, &out)
    );
    let out = Run::new(&k, &e.kubeconfig, &["logs", "demo-2"]).output();
    assert!(
        text(&out.stderr).contains("leaf cluster leaf-2 is unreachable"),
        "{}",
        describe(&k, &out)
    );

    // The leaf's Secret goes: the pod's virtual node has no leaf any more. (The controller then
    // deletes the Node, so the root apiserver stops calling; a direct call still gets a clear
    // answer.)
    let store = e.sandbox.root.api.store();
    store
        .delete_typed::<k8s_openapi::api::core::v1::Secret>(
            relaylet_dev::sandbox::RELAYLET_NAMESPACE,
            "leaf-leaf-2",
        )
        .expect("delete the leaf Secret");
    // Until relaylet has seen the Secret go, the leaf is still registered (and unreachable).
    let client = RT.block_on(e.kubelet_api_client());
    let mut last = None;
    wait_until("a 503 naming the node", Duration::from_secs(60), || {
        let request = http::Request::get("/containerLogs/default/demo-2/main")
            .body(Vec::new())
            .expect("request");
        let got = RT.block_on(client.request_text(request));
        let done = matches!(&got, Err(kube::Error::Api(s)) if s.code == 503);
        last = Some(got);
        done
    });
    let Some(Err(kube::Error::Api(status))) = last else {
        unreachable!("wait_until returned on a 503")
    };
    // The pod index may or may not have dropped the node yet: either way the same cause.
    let route_gone = "virtual node relaylet-leaf-2 has no registered leaf cluster: its leaf Secret is missing or invalid (see relaylet's log)";
    let leaf_gone = "virtual node relaylet-leaf-2 has no registered leaf cluster";
    assert!(
        [route_gone, leaf_gone].contains(&status.message.as_str()),
        "{status:?}"
    );
}

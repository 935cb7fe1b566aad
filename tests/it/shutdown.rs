//! Graceful shutdown with two replicas: when the leader begins shutting down (what SIGTERM does),
//! it stops accepting, hands leadership over at once, lets an open exec finish within the grace
//! period, and cuts a session that outlives it with a Failure Status (`relaylet: shutting
//! down`), so kubectl reports an error rather than success. The other replica then serves the virtual nodes.

use relaylet_dev::testkit as support;

use std::io::{Read, Write};
use std::process::{Child, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use relaylet::ops::Shutdown;
use relaylet_dev::sandbox::{RELAYLET_NAMESPACE, RELAYLET_ROOT_USER, Settings};
use support::{RT, Run, env, text, wait_exit, wait_until};

/// Short, so the test ends soon after the long session is cut; the short session needs none of
/// it (it ends on a line written to its stdin, not after some time).
const GRACE: Duration = Duration::from_secs(4);

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

fn settings() -> Settings {
    let mut s = Settings::default();
    s.env.insert(
        "SHUTDOWN_GRACE_PERIOD".into(),
        format!("{}s", GRACE.as_secs()),
    );
    s
}

/// kubectl with its stdin a pipe the test holds.
fn spawn(run: Run<'_>) -> Child {
    let mut cmd = run.command();
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("kubectl starts")
}

/// Waits for `child` to exit; its exit code and output.
fn finish(mut child: Child) -> (Option<i32>, String, String) {
    let (mut o, mut e) = (
        child.stdout.take().expect("stdout"),
        child.stderr.take().expect("stderr"),
    );
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = o.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = e.read_to_string(&mut text);
        text
    });
    let status = wait_exit(child, HANG).expect("kubectl exits");
    (
        status.code(),
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// The holders the leader Lease had in the root's changes after revision `since`, in order
/// (`None`: released).
fn lease_holders(sb: &relaylet_dev::sandbox::Sandbox, since: u64) -> Vec<Option<String>> {
    let (events, _) = sb
        .root
        .api
        .store()
        .events_since(since)
        .expect("the root keeps its history");
    events
        .iter()
        .filter(|e| {
            e.key.resource == "leases"
                && e.key.namespace == RELAYLET_NAMESPACE
                && e.key.name == relaylet::replicas::LEADER_LEASE
        })
        .map(|e| {
            let lease: Lease =
                serde_json::from_value((*e.object).clone()).expect("a Lease in the store");
            lease.spec.and_then(|s| s.holder_identity)
        })
        .collect()
}

fn metrics(running: &relaylet::Running) -> String {
    running.metrics.encode().unwrap_or_default()
}

#[test]
fn sigterm_lets_open_sessions_finish_and_hands_leadership_over_at_once() {
    let e = env(settings);
    let sb = &e.sandbox;
    let k = relaylet_sim::tools::kubectl("1.35").expect("kubectl 1.35");
    assert!(
        sb.relaylet.leadership.is_leader(),
        "the sandbox's relaylet leads"
    );

    // Two sessions on the leader: one ends when told to (a line on its stdin), the other
    // would run long after the grace period. Opened before the second replica starts: a Node
    // assigned to it moves there while they run, and they stay here (a session is not moved).
    let mut short = spawn(Run::new(
        &k,
        &e.kubeconfig,
        &[
            "exec",
            "-i",
            "demo-1",
            "--",
            "sh",
            "-c",
            "read line; echo finished $line",
        ],
    ));
    let long = spawn(Run::new(
        &k,
        &e.kubeconfig,
        &[
            "exec",
            "demo-2",
            "--",
            "sh",
            "-c",
            "sleep 60; echo too-late",
        ],
    ));
    wait_until("both sessions open", HANG, || {
        let m = metrics(&sb.relaylet);
        m.contains("relaylet_sessions_active{kind=\"exec\",leaf=\"leaf-1\"} 1")
            && m.contains("relaylet_sessions_active{kind=\"exec\",leaf=\"leaf-2\"} 1")
    });

    // A second replica, configured the same apart from its identity and its listeners, which
    // bind port 0 (`relaylet::start` reports the bound addresses).
    let mut config = sb.config.clone();
    config.pod_name = Some("relaylet-1".into());
    config.node_server_port = 0;
    config.metrics_addr = "127.0.0.1:0".parse().expect("address");
    let second_shutdown = Shutdown::default();
    let started_at = sb.root.api.store().revision();
    let second = RT.block_on(async {
        // Its Pod: with leader election a replica counts only as a Running pod of its install.
        let admin = relaylet_dev::sandbox::kube_client(&sb.root.admin_kubeconfig()?).await?;
        relaylet_dev::sandbox::replica_pod::running(
            &admin,
            RELAYLET_NAMESPACE,
            "relaylet-1",
            "127.0.0.1",
        )
        .await?;
        let root =
            relaylet_dev::sandbox::kube_client(&sb.root.kubeconfig(RELAYLET_ROOT_USER, &[])?)
                .await?;
        relaylet::start(config, root, second_shutdown.clone()).await
    });
    let second = second.expect("second replica starts");
    assert_ne!(second.addr, sb.relaylet.addr, "its own kubelet port");
    // The leader renews twice with the second replica's election running beside it (a round
    // every 2 s each): the second one has tried and not taken the Lease.
    wait_until("the leader renews with two replicas", HANG, || {
        lease_holders(sb, started_at)
            .iter()
            .filter(|h| h.as_deref() == Some("relaylet-0"))
            .count()
            >= 2
    });
    assert!(!second.leadership.is_leader(), "only one leader");
    assert!(
        lease_holders(sb, started_at)
            .iter()
            .all(|h| h.as_deref() == Some("relaylet-0")),
        "{:?}",
        lease_holders(sb, started_at)
    );

    // A connection kept alive from before (a caller without a certificate: 401).
    let mut kept = RT
        .block_on(e.connect_kubelet_api(None))
        .expect("a connection to the kubelet port");
    let (before, _) = RT.block_on(support::raw_http::get(&mut kept, "/pods"));
    assert!(before.starts_with("HTTP/1.1 401"), "{before}");

    // SIGTERM.
    let term_at = sb.root.api.store().revision();
    sb.shutdown.begin.cancel();

    // A request on the kept connection is refused like a new connection, and it is closed.
    let (after, body) = RT.block_on(support::raw_http::get(&mut kept, "/pods"));
    assert!(
        after.starts_with("HTTP/1.1 503") && body.contains("relaylet: this listener has stopped"),
        "{after} {body}"
    );

    // Leadership moves at once: the leader releases its Lease (empty holder), and the other
    // takes it on its next round, without waiting for the Lease (10 s) to expire.
    wait_until("the second replica leads", HANG, || {
        second.leadership.is_leader()
    });
    // Each holder once (renewals repeat it), from the old leader's last renewal on.
    let mut holders = lease_holders(sb, term_at);
    holders.dedup();
    if holders.first() == Some(&Some("relaylet-0".to_string())) {
        holders.remove(0);
    }
    assert_eq!(
        holders,
        [None, Some("relaylet-1".to_string())],
        "released by the old leader, then taken by the other"
    );
    assert!(!sb.relaylet.leadership.is_leader());
    wait_until("the leader gauges follow", HANG, || {
        metrics(&sb.relaylet).contains("relaylet_leader 0\n")
            && metrics(&second).contains("relaylet_leader 1\n")
    });

    // No new connections on the old leader, and it reports not ready.
    let refused = std::net::TcpStream::connect(sb.relaylet.addr)
        .expect_err("the old leader stopped accepting");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    let ready = RT.block_on(async {
        let mut tcp = tokio::net::TcpStream::connect(sb.relaylet.metrics_addr).await?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tcp.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").await?;
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    });
    assert!(
        ready
            .as_deref()
            .is_ok_and(|a| a.starts_with("HTTP/1.0 503") || a.starts_with("HTTP/1.1 503")),
        "{ready:?}"
    );

    // The short session still works after SIGTERM and finishes normally, while the long one
    // is still open and the old server still draining: open sessions are not cut at SIGTERM.
    short
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"now\n")
        .expect("write to the short session");
    let (code, out, err) = finish(short);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "finished now\n"),
        "stderr: {err}"
    );
    // kubectl may exit a moment before relaylet has counted the session's end.
    wait_until("the short session is counted as completed", HANG, || {
        metrics(&sb.relaylet).contains(
            "relaylet_sessions_total{kind=\"exec\",leaf=\"leaf-1\",result=\"completed\"} 1",
        )
    });
    let m = metrics(&sb.relaylet);
    assert!(
        m.contains("relaylet_sessions_active{kind=\"exec\",leaf=\"leaf-2\"} 1"),
        "the long session is still open: {m}"
    );
    assert!(!sb.relaylet.server.is_finished(), "still draining");

    // The long one is cut when the grace period ends, and kubectl says so; the metric names
    // the cause.
    let (code, out, err) = finish(long);
    assert_ne!(code, Some(0), "a cut session is not a success: {out} {err}");
    assert!(err.contains("relaylet: shutting down"), "{err}");
    assert!(!out.contains("too-late"));
    wait_until("the old leader's server ends", HANG, || {
        sb.relaylet.server.is_finished()
    });
    let text_metrics = metrics(&sb.relaylet);
    assert!(
        text_metrics.contains(
            "relaylet_sessions_total{kind=\"exec\",leaf=\"leaf-2\",result=\"shutdown\"} 1"
        ),
        "{text_metrics}"
    );

    // The new leader points the virtual nodes at itself and serves them.
    wait_until("exec works through the new leader", HANG, || {
        let out = Run::new(
            &k,
            &e.kubeconfig,
            &["exec", "demo-1", "--", "echo", "again"],
        )
        .output();
        text(&out.stdout) == "again\n"
    });

    second_shutdown.begin.cancel();
    second_shutdown.sessions.cancel();
}

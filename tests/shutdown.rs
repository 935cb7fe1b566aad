//! Graceful shutdown with two replicas: when the leader begins shutting down (what SIGTERM does),
//! it stops accepting, hands leadership over at once, lets an open exec finish within the grace
//! period, and cuts a session that outlives it with a Failure Status (`relaylet: shutting
//! down`), so kubectl reports an error rather than success. The other replica then serves the virtual nodes.

mod support;

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use relaylet::sandbox::{RELAYLET_NAMESPACE, RELAYLET_ROOT_USER, Settings};
use relaylet::shutdown::Shutdown;
use support::{RT, Run, env, text};

const GRACE: Duration = Duration::from_secs(6);

fn settings() -> Settings {
    let mut s = Settings::default();
    s.env.insert(
        "SHUTDOWN_GRACE_PERIOD".into(),
        format!("{}s", GRACE.as_secs()),
    );
    s
}

fn spawn(run: Run<'_>) -> Child {
    let mut cmd = run.command();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("kubectl starts")
}

/// Waits up to `within` for `child` to exit; its exit code and output.
fn finish(mut child: Child, within: Duration) -> (Option<i32>, String, String, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut out = String::new();
            let mut err = String::new();
            if let Some(mut o) = child.stdout.take() {
                let _ = o.read_to_string(&mut out);
            }
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return (status.code(), out, err, start.elapsed());
        }
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kubectl still running after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_for(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

    // A second replica, configured the same apart from its identity and ports.
    let mut config = sb.config.clone();
    config.pod_name = Some("relaylet-1".into());
    config.node_server_port = free_port();
    config.metrics_addr = "127.0.0.1:0".parse().unwrap();
    let second_shutdown = Shutdown::default();
    let second = RT.block_on(async {
        let root =
            relaylet::sandbox::kube_client(&sb.root.kubeconfig(RELAYLET_ROOT_USER, &[])?).await?;
        relaylet::start(config, root, second_shutdown.clone()).await
    });
    let second = second.expect("second replica starts");
    std::thread::sleep(Duration::from_secs(3));
    assert!(!second.leadership.is_leader(), "only one leader");

    // Two sessions on the leader: one ends within the grace period, one would outlive it.
    let short = spawn(Run::new(
        &k,
        &e.kubeconfig,
        &["exec", "demo-1", "--", "sh", "-c", "sleep 3; echo finished"],
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
    wait_for("both sessions open", Duration::from_secs(10), || {
        sb.relaylet
            .metrics
            .encode()
            .unwrap_or_default()
            .contains("relaylet_sessions_active{kind=\"exec\",leaf=\"leaf-1\"} 1")
            && sb
                .relaylet
                .metrics
                .encode()
                .unwrap_or_default()
                .contains("relaylet_sessions_active{kind=\"exec\",leaf=\"leaf-2\"} 1")
    });

    // SIGTERM.
    let term = Instant::now();
    sb.shutdown.begin.cancel();

    // Leadership moves at once: the leader releases its Lease, the other takes it on its next
    // round (every 2 s), long before the Lease (10 s) could have expired.
    let took_over = wait_for("the second replica leads", Duration::from_secs(5), || {
        second.leadership.is_leader()
    });
    assert!(took_over < Duration::from_secs(5));
    let lease: Lease = sb
        .root
        .api
        .store()
        .get_typed(RELAYLET_NAMESPACE, relaylet::LEADER_LEASE)
        .expect("leader lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("relaylet-1")
    );
    assert!(!sb.relaylet.leadership.is_leader());
    wait_for("the leader gauges follow", Duration::from_secs(1), || {
        let old = sb.relaylet.metrics.encode().unwrap_or_default();
        let new = second.metrics.encode().unwrap_or_default();
        old.contains("relaylet_leader 0\n") && new.contains("relaylet_leader 1\n")
    });

    // No new connections on the old leader, and it reports not ready.
    assert!(
        std::net::TcpStream::connect_timeout(&sb.relaylet.addr, Duration::from_secs(1)).is_err(),
        "the old leader stopped accepting"
    );
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

    // The short session finishes normally inside the grace period.
    let (code, out, err, _) = finish(short, GRACE + Duration::from_secs(5));
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "finished\n"),
        "stderr: {err}"
    );
    assert!(term.elapsed() < GRACE, "finished within the grace period");

    // The long one is cut when the grace period ends, and kubectl says so.
    let (code, out, err, _) = finish(long, GRACE + Duration::from_secs(10));
    let cut_after = term.elapsed();
    assert_ne!(code, Some(0), "a cut session is not a success: {out} {err}");
    assert!(err.contains("relaylet: shutting down"), "{err}");
    assert!(!out.contains("too-late"));
    assert!(
        cut_after >= GRACE,
        "not cut before the grace period: {cut_after:?}"
    );
    wait_for(
        "the old leader's server ends",
        Duration::from_secs(5),
        || sb.relaylet.server.is_finished(),
    );
    let text_metrics = sb.relaylet.metrics.encode().unwrap_or_default();
    assert!(
        text_metrics.contains(
            "relaylet_sessions_total{kind=\"exec\",leaf=\"leaf-2\",result=\"shutdown\"} 1"
        ),
        "{text_metrics}"
    );

    // The new leader points the virtual nodes at itself and serves them.
    wait_for(
        "exec works through the new leader",
        Duration::from_secs(20),
        || {
            let out = Run::new(
                &k,
                &e.kubeconfig,
                &["exec", "demo-1", "--", "echo", "again"],
            )
            .output();
            text(&out.stdout) == "again\n"
        },
    );

    second_shutdown.begin.cancel();
    second_shutdown.sessions.cancel();
}

//! The one cut relaylet cannot make honest: relaylet itself killed (SIGKILL, the OOM killer).
//! Nothing runs to write a Status; the kernel closes relaylet's connections, and the root
//! apiserver's proxy (like upstream `UpgradeAwareHandler`) closes kubectl's connection cleanly.
//! This test records what users then see, so that the statement in docs/operations.md ("When
//! relaylet ends a session") stays true: every kubectl (1.27 SPDY; 1.33 and 1.35 with
//! WebSockets on and off) exits 0 with its output cut short and no error, and a WebSocket v4
//! client sees the connection end with neither a Status nor a close frame. Only the apiserver
//! could turn this into an error.
//!
//! relaylet runs here as its own process (the shipped binary, configured by env vars like the
//! sandbox's in-process replica), takes over the virtual nodes when the in-process replica
//! shuts down, and is then killed with SIGKILL in the middle of the sessions.

use relaylet_dev::testkit as support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use relaylet_dev::sandbox::{RELAYLET_NAMESPACE, RELAYLET_ROOT_USER, Settings};
use relaylet_sim::channel::Protocol;
use support::{Background, RT, Run, env, kubectl_variants, ws_exec};

const WITHIN: Duration = Duration::from_secs(60);

/// Kills the replica if the test ends early.
struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_relaylet_reads_as_success_to_every_kubectl() {
    let e = env(Settings::default);
    let files = e.sandbox.files();
    let kubeconfig = files.join("relaylet-root.kubeconfig");
    std::fs::write(
        &kubeconfig,
        e.sandbox
            .root
            .kubeconfig(RELAYLET_ROOT_USER, &[])
            .expect("relaylet's root kubeconfig"),
    )
    .expect("write kubeconfig");
    let replica = Command::new(env!("CARGO_BIN_EXE_relaylet"))
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("LEAF_NODE_IP", "127.0.0.1")
        // A process told its port by number (NODE_SERVER_PORT must be 1-65535): see
        // relaylet_sim::ports.
        .env(
            "NODE_SERVER_PORT",
            relaylet_sim::ports::free_loopback_port()
                .expect("a free port")
                .port()
                .to_string(),
        )
        .env("PREFERRED-ADDRESS-TYPE", "InternalDNS")
        .env("AUTH_MODE", "webhook")
        .env("APISERVER_CERT_LOCATION", files.join("tls.crt"))
        .env("APISERVER_KEY_LOCATION", files.join("tls.key"))
        .env("POD_NAME", "relaylet-killed")
        .env("POD_NAMESPACE", RELAYLET_NAMESPACE)
        .env("METRICS_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("relaylet starts as its own process");
    let mut replica = Replica(replica);

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
    replica.0.kill().expect("SIGKILL");
    let _ = replica.0.wait();

    let mut seen = Vec::new();
    for k in kubectls {
        let what = k.what.clone();
        let ended = k.finish(WITHIN);
        seen.push(format!(
            "{what}: exit {:?}, stderr {:?}",
            ended.code, ended.stderr
        ));
        assert!(ended.stdout.starts_with("tick\n"), "{what}: {ended:?}");
        assert_eq!(
            (ended.code, ended.stderr.as_str()),
            (Some(0), ""),
            "{what}: docs/operations.md says a killed relaylet reads as success; if this changed, \
             say so"
        );
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

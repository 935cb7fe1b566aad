//! Fair caps behind the root apiserver: every call it relays carries its own identity, so the
//! per-user caps cannot tell end users apart; the pod's namespace can. Through the sandbox's
//! root with kubectl, one namespace holding its share of followed logs and of exec sessions
//! gets the namespaced refusal (naming the namespace and the cap) for its next one, while
//! another namespace's `kubectl logs -f` and `kubectl exec` are still served.

use relaylet_dev::testkit as support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use relaylet_dev::sandbox::{Settings, demo_pod};
use support::{RT, Run, describe, env, kubectls, text};

/// The pod of a second namespace, in leaf-1 beside `default`'s demo-1 (a namespace the root
/// and the leaf both have from their start).
const TENANT_B: (&str, &str) = ("kube-public", "tenant-b");

fn settings() -> Settings {
    let mut pod = demo_pod(TENANT_B.1);
    pod.namespace = TENANT_B.0.to_string();
    Settings {
        env: BTreeMap::from([
            ("MAX_SESSIONS".to_string(), "8".to_string()),
            ("MAX_SESSIONS_PER_NAMESPACE".to_string(), "2".to_string()),
            ("MAX_LOG_STREAMS".to_string(), "8".to_string()),
            ("MAX_LOG_STREAMS_PER_NAMESPACE".to_string(), "2".to_string()),
        ]),
        pods: vec![("leaf-1".into(), pod)],
        ..Settings::default()
    }
}

/// A kubectl left running (a followed log, a long exec); killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kubectl args` and waits for its first stdout line (the stream is open).
fn streaming(e: &support::Env, k: &relaylet_sim::tools::Kubectl, args: &[&str]) -> Running {
    let mut cmd = Run::new(k, &e.kubeconfig, args).command();
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    let mut child = cmd.spawn().expect("kubectl starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("a line");
    assert!(!line.is_empty(), "kubectl {args:?} printed nothing");
    // Keep reading, so a chatty stream never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while stdout.read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    Running(child)
}

/// relaylet's count of refusals at `cap`.
fn refusals(e: &support::Env, cap: &str) -> f64 {
    RT.block_on(async {
        let got = support::metrics::http_get(e.sandbox.relaylet.metrics_addr, "/metrics").await;
        support::metrics::count(
            &support::metrics::parse(&got.body),
            "relaylet_limit_refusals_total",
            &[("cap", cap)],
        )
    })
}

#[test]
fn one_namespace_at_its_share_does_not_starve_another() {
    let e = env(settings);
    let k = kubectls().pop().expect("a kubectl");
    let (ns_b, pod_b) = TENANT_B;

    // `default` takes its two followed logs ...
    let logs_before = refusals(e, "log_streams_per_namespace");
    let follows: Vec<Running> = (0..2)
        .map(|_| streaming(e, &k, &["logs", "-f", "--tail=1", "demo-1"]))
        .collect();
    // ... and its third is refused, naming the namespace and the cap (the root apiserver
    // quotes relaylet's text in its own message).
    let out = Run::new(&k, &e.kubeconfig, &["logs", "-f", "--tail=1", "demo-1"]).output();
    assert!(!out.status.success(), "{}", describe(&k, &out));
    let said = text(&out.stderr);
    assert!(
        said.contains(
            r#"namespace \"default\" has its maximum of 2 open log streams (MAX_LOG_STREAMS_PER_NAMESPACE)"#
        ),
        "{}",
        describe(&k, &out)
    );
    assert_eq!(refusals(e, "log_streams_per_namespace") - logs_before, 1.0);
    // Another namespace's reader is served meanwhile.
    let other = streaming(e, &k, &["-n", ns_b, "logs", "-f", "--tail=1", pod_b]);

    // The same for exec sessions: `default` holds two ...
    let sessions_before = refusals(e, "sessions_per_namespace");
    let execs: Vec<Running> = (0..2)
        .map(|i| {
            let marker = format!("held-{i}");
            let script = format!("echo {marker}; sleep 600");
            streaming(e, &k, &["exec", "demo-1", "--", "sh", "-c", &script])
        })
        .collect();
    // ... its third is refused ...
    let out = Run::new(
        &k,
        &e.kubeconfig,
        &["exec", "demo-1", "--", "echo", "third"],
    )
    .output();
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        text(&out.stderr).contains(
            "namespace \"default\" has its maximum of 2 open exec, attach and port-forward streams (MAX_SESSIONS_PER_NAMESPACE)"
        ),
        "{}",
        describe(&k, &out)
    );
    // (kubectl 1.35 tries WebSocket, then SPDY: one refusal or two)
    assert!(refusals(e, "sessions_per_namespace") - sessions_before >= 1.0);
    // ... while another namespace's exec is served.
    let out = Run::new(
        &k,
        &e.kubeconfig,
        &["-n", ns_b, "exec", pod_b, "--", "echo", "served"],
    )
    .output();
    assert!(
        out.status.success() && text(&out.stdout) == "served\n",
        "{}",
        describe(&k, &out)
    );

    // Once `default`'s streams end, its share is free again.
    drop(execs);
    drop(follows);
    support::wait_until(
        "default's exec is served again",
        Duration::from_secs(60),
        || {
            let out = Run::new(
                &k,
                &e.kubeconfig,
                &["exec", "demo-1", "--", "echo", "again"],
            )
            .output();
            out.status.success() && text(&out.stdout) == "again\n"
        },
    );
    drop(other);
}

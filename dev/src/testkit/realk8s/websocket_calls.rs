//! The calls kubectl 1.35 makes over WebSocket by default (exec with stdin, stdout, stderr and
//! an exit code; exec -it with a resize; attach; cp; port-forward with two connections; logs),
//! run through a world's root apiserver, and what the root says it did with them:
//! `apiserver_websocket_streaming_requests_total{subresource, proxy_type}`. A 1.36+ root
//! proxies them to a node that declares `ExtendWebSocketsToKubelet` (`proxied_to_kubelet`)
//! and translates them to SPDY for any other node (`translated_at_apiserver`); both must work.

#![allow(dead_code)]

use std::collections::BTreeMap;

use relaylet_sim::tools::Kubectl;

use super::harness::ControlPlane;
use super::world::{self, World};
use crate::testkit::{Run, describe, text};

/// The root's count per (subresource, proxy_type).
pub type StreamingCounts = BTreeMap<(String, String), u64>;

/// Reads an apiserver's `apiserver_websocket_streaming_requests_total` (the root's, or a
/// leaf's: relaylet re-issues WebSocket calls to the leaf apiserver unchanged, which proxies or
/// translates them for its own node in turn).
pub fn streaming_counts(apiserver: &ControlPlane) -> StreamingCounts {
    let metrics = apiserver.kubectl_ok(&["get", "--raw", "/metrics"]);
    let mut counts = StreamingCounts::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_websocket_streaming_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let value = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        counts.insert((label("subresource"), label("proxy_type")), value);
    }
    counts
}

/// How many more calls of `subresource` the root handled as `proxy_type` since `before`.
pub fn counted_since(
    before: &StreamingCounts,
    after: &StreamingCounts,
    subresource: &str,
    proxy_type: &str,
) -> u64 {
    let key = (subresource.to_string(), proxy_type.to_string());
    after.get(&key).copied().unwrap_or(0) - before.get(&key).copied().unwrap_or(0)
}

/// Runs every call with `k` against pod `demo` (which serves HTTP on 8080 and writes its log)
/// and pod `attached` (whose main process echoes its stdin as `got <line>`), asserting each.
pub fn run_all(w: &World, k: &Kubectl, demo: &str, attached: &str) {
    exec_with_stdin_stderr_and_exit_code(w, k, demo);
    exec_tty_with_resize(w, k, demo);
    attach_with_stdin(w, k, attached);
    cp_both_ways(w, k, demo);
    port_forward_two_connections(w, k, demo);
    logs(w, k, demo);
}

pub fn exec_with_stdin_stderr_and_exit_code(w: &World, k: &Kubectl, pod: &str) {
    let out = Run::new(
        k,
        w.root_kubeconfig(),
        &[
            "exec",
            "-i",
            pod,
            "--",
            "sh",
            "-c",
            "cat; echo \"argv: $0\" >&2; exit 3",
            "two words",
        ],
    )
    .stdin(b"from stdin\n")
    .output();
    assert_eq!(out.status.code(), Some(3), "{}", describe(k, &out));
    assert_eq!(text(&out.stdout), "from stdin\n", "{}", describe(k, &out));
    assert!(
        text(&out.stderr).contains("argv: two words"),
        "{}",
        describe(k, &out)
    );
}

pub fn exec_tty_with_resize(w: &World, k: &Kubectl, pod: &str) {
    crate::testkit::assert_tty_size_and_resize(k, w.root_kubeconfig(), pod, false);
}

pub fn attach_with_stdin(w: &World, k: &Kubectl, pod: &str) {
    let marker = format!("attach-websocket-{}", std::process::id());
    let run = Run::new(k, w.root_kubeconfig(), &["attach", "-i", pod]);
    let seen = crate::testkit::attach_round_trip(run, &marker);
    assert!(
        seen.last() == Some(&format!("got {marker}")),
        "kubectl {} attach: {seen:?}",
        k.version
    );
}

/// `kubectl cp` is `tar` over exec, in both directions.
pub fn cp_both_ways(w: &World, k: &Kubectl, pod: &str) {
    let dir = w.dir.path().join(format!("cp-{}", k.version));
    std::fs::create_dir_all(&dir).expect("cp dir");
    let local = dir.join("up.txt");
    let content = "copied through relaylet\n".repeat(1000);
    std::fs::write(&local, &content).expect("cp source");
    let remote = format!("{pod}:relaylet-cp-{}.txt", k.version);
    let up = Run::new(
        k,
        w.root_kubeconfig(),
        &["cp", &local.display().to_string(), &remote],
    )
    .output();
    assert!(up.status.success(), "cp up: {}", describe(k, &up));
    let back = dir.join("down.txt");
    let down = Run::new(
        k,
        w.root_kubeconfig(),
        &["cp", &remote, &back.display().to_string()],
    )
    .output();
    assert!(down.status.success(), "cp down: {}", describe(k, &down));
    assert_eq!(
        std::fs::read_to_string(&back).unwrap_or_default(),
        content,
        "kubectl {} cp: the file came back changed",
        k.version
    );
}

pub fn port_forward_two_connections(w: &World, k: &Kubectl, pod: &str) {
    let answers = world::port_forward_answers(k, w.root_kubeconfig(), pod, 2);
    assert_eq!(answers.len(), 2);
    for body in answers {
        assert!(
            body.ends_with(&format!("hello from default/{pod}\n")),
            "kubectl {} port-forward: {body:?}",
            k.version
        );
    }
}

pub fn logs(w: &World, k: &Kubectl, pod: &str) {
    let out = Run::new(k, w.root_kubeconfig(), &["logs", pod, "--tail=1"]).output();
    assert!(out.status.success(), "{}", describe(k, &out));
    assert!(
        text(&out.stdout).starts_with("tick "),
        "{}",
        describe(k, &out)
    );
}

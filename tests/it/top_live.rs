//! `kubectl top` in the sandbox with real numbers, through the production path end to end:
//! each leaf's kubelet stand-in reads its processes' CPU and memory from /proc and serves them
//! at `/metrics/resource`, the leaf's metrics-server stand-in turns them into `metrics.k8s.io`
//! PodMetrics, relaylet answers the root's scrapes of each virtual node from those, and the
//! root's metrics-server stand-in fills the root's `metrics.k8s.io` for kubectl.
//!
//! A pod spinning on a CPU (leaf-1) and one sleeping (leaf-2) tell real numbers from made-up
//! ones: the spinner must show more CPU than the sleeper, in the leaf and in the root.

use relaylet_dev::testkit as support;

use std::collections::BTreeMap;
use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::cluster::{SimContainer, SimPod};
use support::{Run, describe, env, text};

fn pod(name: &str, script: &str) -> SimPod {
    SimPod {
        namespace: "default".into(),
        name: name.into(),
        containers: vec![SimContainer {
            name: "main".into(),
            command: vec!["sh".into(), "-c".into(), script.into()],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn settings() -> Settings {
    Settings {
        pods: vec![
            ("leaf-1".into(), pod("spinner", "while :; do :; done")),
            ("leaf-2".into(), pod("sleeper", "exec sleep 3600")),
        ],
        metrics_resolution: Some(Duration::from_secs(1)),
        ..Settings::default()
    }
}

/// `kubectl top <what> --no-headers` rows as name → (millicores, MiB), once every name in
/// `want` has a row (metrics need two scrapes in the leaf and two in the root first).
fn top(
    kubectl: &str,
    kubeconfig: &std::path::Path,
    what: &str,
    want: &[&str],
) -> BTreeMap<String, (u64, u64)> {
    let k = relaylet_sim::tools::kubectl(kubectl).expect("kubectl installed");
    let mut rows = BTreeMap::new();
    support::wait_until(
        &format!("kubectl {kubectl} top {what} lists {want:?}"),
        Duration::from_secs(90),
        || {
            let out = Run::new(&k, kubeconfig, &["top", what, "--no-headers"]).output();
            if out.status.code() != Some(0) {
                // "metrics not available yet" until the scrapes have run.
                return false;
            }
            rows = text(&out.stdout)
                .lines()
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let cpu = f.get(1)?.strip_suffix('m')?.parse().ok()?;
                    // `top node` has a CPU% column between CPU and memory.
                    let memory = f
                        .iter()
                        .skip(2)
                        .find_map(|v| v.strip_suffix("Mi")?.parse().ok())?;
                    Some((f[0].to_string(), (cpu, memory)))
                })
                .collect();
            want.iter().all(|w| rows.contains_key(*w))
        },
    );
    let out = Run::new(&k, kubeconfig, &["top", what]).output();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&k, &out));
    rows
}

#[test]
fn a_leaf_sees_its_own_processes() {
    let e = env(settings);
    let kubeconfig = e.sandbox.files().join("leaf-1-admin.kubeconfig");
    std::fs::write(
        &kubeconfig,
        e.sandbox.leaves["leaf-1"].admin_kubeconfig().unwrap(),
    )
    .unwrap();
    let pods = top("1.35", &kubeconfig, "pod", &["spinner", "demo-1"]);
    let (spinner, demo) = (pods["spinner"], pods["demo-1"]);
    assert!(
        spinner.0 > demo.0,
        "the spinner uses more CPU than the idle demo pod: {pods:?}"
    );
    assert!(
        spinner.0 >= 100,
        "a spinning shell uses a tenth of a core at least: {pods:?}"
    );
    assert!(demo.1 >= 5, "a Python process holds megabytes: {pods:?}");
    let nodes = top("1.35", &kubeconfig, "node", &["leaf-1-node"]);
    assert!(
        nodes["leaf-1-node"].0 >= spinner.0 / 2,
        "{nodes:?} {pods:?}"
    );
}

#[test]
fn the_root_shows_leaf_usage_through_relaylet() {
    let e = env(settings);
    for kubectl in ["1.27", "1.35"] {
        let pods = top(
            kubectl,
            &e.kubeconfig,
            "pod",
            &["spinner", "sleeper", "demo-1", "demo-2"],
        );
        assert!(
            pods["spinner"].0 > pods["sleeper"].0,
            "kubectl {kubectl}: the spinner uses more CPU than the sleeper: {pods:?}"
        );
        assert!(pods["spinner"].0 >= 100, "kubectl {kubectl}: {pods:?}");
        assert!(pods["demo-2"].1 >= 5, "kubectl {kubectl}: {pods:?}");
        let nodes = top(
            kubectl,
            &e.kubeconfig,
            "node",
            &["relaylet-leaf-1", "relaylet-leaf-2"],
        );
        // Each virtual node sums its own pods: leaf-1's has the spinner.
        assert!(
            nodes["relaylet-leaf-1"].0 > nodes["relaylet-leaf-2"].0,
            "kubectl {kubectl}: {nodes:?}"
        );
        assert!(
            nodes["relaylet-leaf-2"].1 >= pods["demo-2"].1,
            "kubectl {kubectl}: a node's memory includes its pods' {nodes:?} {pods:?}"
        );
    }
}

//! `kubectl top` data for virtual nodes: the leaf stand-ins serve `metrics.k8s.io` PodMetrics,
//! and relaylet's per-node kubelet ports turn exactly each virtual node's pods into the kubelet's
//! `/metrics/resource` (checked with a Prometheus text parser), `/stats/summary` and `/pods`.
//! Leaf-1 also has usage for a pod that is not on its virtual node: it must not be counted.

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::metrics as metrics_support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use metrics_support::{Got, https_get, parse, value};
use relaylet_dev::sandbox::Settings;
use relaylet_sim::cluster::{SimContainer, SimPod};
use serde_json::json;
use support::{RT, Run, describe, env, text};

const MI: f64 = 1024.0 * 1024.0;

fn worker() -> SimPod {
    SimPod {
        namespace: "default".into(),
        name: "worker-a".into(),
        containers: vec![SimContainer {
            name: "main".into(),
            command: vec!["sleep".into(), "3600".into()],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn settings() -> Settings {
    Settings {
        pods: vec![("leaf-1".into(), worker())],
        // The test writes the leaves' metrics.k8s.io itself.
        metrics_resolution: None,
        // and reads each new sample at once: no answer served again past a millisecond.
        env: std::collections::BTreeMap::from([(
            "NODE_STATS_CACHE_TTL".to_string(),
            "1ms".to_string(),
        )]),
        ..Settings::default()
    }
}

/// Writes a PodMetrics object into `leaf`'s stand-in, as metrics-server would serve it there.
fn put_metrics(leaf: &str, pod: &str, at: Timestamp, cpu: &str, memory: &str) {
    let e = env(settings);
    let store = e.sandbox.leaves[leaf].api.store();
    store
        .upsert_object(json!({
            "apiVersion": "metrics.k8s.io/v1beta1",
            "kind": "PodMetrics",
            "metadata": {"name": pod, "namespace": "default"},
            "timestamp": at.to_string(),
            "window": "30s",
            "containers": [{"name": "main", "usage": {"cpu": cpu, "memory": memory}}],
        }))
        .expect("PodMetrics stored");
}

fn node_get(node: &str, path: &str) -> Got {
    let e = env(settings);
    let ca = &e.sandbox.root.ca;
    let admin = ca
        .issue_client("metrics-scraper", &["system:masters"])
        .unwrap();
    let addr = e
        .sandbox
        .relaylet
        .node_ports
        .addr_of(node)
        .unwrap_or_else(|| panic!("{node} has its own kubelet port"));
    RT.block_on(https_get(
        addr,
        ca.client_config(Some(&admin)).unwrap(),
        path,
        &[],
    ))
}

/// Seeds every PodMetrics once (tests in this binary run in parallel and share them).
fn seeded() -> Timestamp {
    static T0: std::sync::OnceLock<Timestamp> = std::sync::OnceLock::new();
    *T0.get_or_init(|| {
        let t0 = Timestamp::now() - SignedDuration::from_secs(5);
        let t0 = Timestamp::from_second(t0.as_second()).expect("whole seconds");
        put_metrics("leaf-1", "demo-1", t0, "100m", "10Mi");
        put_metrics("leaf-1", "worker-a", t0, "250m", "20Mi");
        // In leaf-1 but not on relaylet-leaf-1 (no root pod): never part of the node.
        put_metrics("leaf-1", "leaf-local", t0, "900m", "500Mi");
        put_metrics("leaf-2", "demo-2", t0, "50m", "5Mi");
        t0
    })
}

#[test]
fn the_leaf_stand_in_serves_pod_metrics_to_kubectl_top() {
    let e = env(settings);
    seeded();
    let kubeconfig = e.sandbox.files().join("leaf-1-admin.kubeconfig");
    std::fs::write(
        &kubeconfig,
        e.sandbox.leaves["leaf-1"].admin_kubeconfig().unwrap(),
    )
    .unwrap();
    let k = relaylet_sim::tools::kubectl("1.35").expect("kubectl 1.35");
    let out = Run::new(
        &k,
        &kubeconfig,
        &["top", "pod", "-n", "default", "--no-headers"],
    )
    .output();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&k, &out));
    let rows: BTreeSet<String> = text(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    // (demo-1's numbers change in the other test.)
    for row in ["worker-a 250m 20Mi", "leaf-local 900m 500Mi"] {
        assert!(rows.contains(row), "{row} in {rows:?}");
    }
    assert!(rows.iter().any(|r| r.starts_with("demo-1 ")), "{rows:?}");
}

#[test]
fn each_virtual_node_reports_exactly_its_pods() {
    env(settings);
    let t0 = seeded();
    let ms = |t: Timestamp| t.as_millisecond();

    let got = node_get("relaylet-leaf-1", "/metrics/resource");
    assert_eq!(got.status, 200, "{}", got.body);
    assert!(got.content_type.starts_with("text/plain; version=0.0.4"));
    let s = parse(&got.body);
    fn pod(name: &str) -> Vec<(&'static str, &str)> {
        vec![("namespace", "default"), ("pod", name)]
    }
    fn container(name: &str) -> Vec<(&'static str, &str)> {
        vec![
            ("namespace", "default"),
            ("pod", name),
            ("container", "main"),
        ]
    }
    assert_eq!(
        value(
            &s,
            "container_memory_working_set_bytes",
            &container("demo-1")
        ),
        Some(10.0 * MI)
    );
    assert_eq!(
        value(&s, "pod_memory_working_set_bytes", &pod("worker-a")),
        Some(20.0 * MI)
    );
    // First sight of a container: rate × window.
    let cpu = |s: &prometheus_parse::Scrape, name: &str| {
        value(s, "container_cpu_usage_seconds_total", &container(name)).unwrap()
    };
    assert!((cpu(&s, "demo-1") - 3.0).abs() < 1e-9);
    assert!((cpu(&s, "worker-a") - 7.5).abs() < 1e-9);
    assert_eq!(
        value(&s, "pod_memory_working_set_bytes", &pod("leaf-local")),
        None
    );
    assert_eq!(
        value(&s, "pod_memory_working_set_bytes", &pod("demo-2")),
        None
    );
    assert_eq!(
        value(&s, "node_memory_working_set_bytes", &[]),
        Some(30.0 * MI)
    );
    assert!((value(&s, "node_cpu_usage_seconds_total", &[]).unwrap() - 10.5).abs() < 1e-9);
    assert_eq!(value(&s, "resource_scrape_error", &[]), Some(0.0));
    let sample = s
        .samples
        .iter()
        .find(|x| x.metric == "container_memory_working_set_bytes")
        .unwrap();
    assert_eq!(
        sample.timestamp.timestamp_millis(),
        ms(t0),
        "leaf's sample time"
    );

    let got = node_get("relaylet-leaf-2", "/metrics/resource");
    let s2 = parse(&got.body);
    assert_eq!(
        value(&s2, "pod_memory_working_set_bytes", &pod("demo-2")),
        Some(5.0 * MI)
    );
    assert_eq!(
        value(&s2, "pod_memory_working_set_bytes", &pod("demo-1")),
        None
    );
    assert_eq!(
        value(&s2, "node_memory_working_set_bytes", &[]),
        Some(5.0 * MI)
    );
    assert!((value(&s2, "node_cpu_usage_seconds_total", &[]).unwrap() - 1.5).abs() < 1e-9);

    // The leaf measures again 10 s later at a new rate: the counters grow by rate × 10 s, so
    // the rate metrics-server derives between the two scrapes is the leaf's.
    let t1 = t0 + SignedDuration::from_secs(10);
    put_metrics("leaf-1", "demo-1", t1, "200m", "12Mi");
    let s = parse(&node_get("relaylet-leaf-1", "/metrics/resource").body);
    assert!(
        (cpu(&s, "demo-1") - 5.0).abs() < 1e-9,
        "{}",
        cpu(&s, "demo-1")
    );
    assert!((cpu(&s, "worker-a") - 7.5).abs() < 1e-9);
    assert!((value(&s, "node_cpu_usage_seconds_total", &[]).unwrap() - 12.5).abs() < 1e-9);
    assert_eq!(
        value(&s, "node_memory_working_set_bytes", &[]),
        Some(32.0 * MI)
    );
    // Scraping again without a new sample changes nothing.
    let again = parse(&node_get("relaylet-leaf-1", "/metrics/resource").body);
    assert!((cpu(&again, "demo-1") - 5.0).abs() < 1e-9);

    // The same numbers as the kubelet's stats Summary.
    let got = node_get("relaylet-leaf-2", "/stats/summary");
    assert_eq!(got.status, 200, "{}", got.body);
    let summary: serde_json::Value = serde_json::from_str(&got.body).unwrap();
    assert_eq!(summary["node"]["nodeName"], "relaylet-leaf-2");
    assert_eq!(
        summary["node"]["memory"]["workingSetBytes"],
        5 * 1024 * 1024
    );
    assert_eq!(summary["node"]["cpu"]["usageNanoCores"], 50_000_000);
    let pods = summary["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 1, "{summary}");
    assert_eq!(pods[0]["podRef"]["name"], "demo-2");
    assert_eq!(
        pods[0]["containers"][0]["cpu"]["usageCoreNanoSeconds"],
        1_500_000_000u64
    );

    // /pods lists the root pods bound to the node.
    let got = node_get("relaylet-leaf-1", "/pods");
    assert_eq!(got.status, 200, "{}", got.body);
    let list: serde_json::Value = serde_json::from_str(&got.body).unwrap();
    assert_eq!(list["kind"], "PodList");
    let names: BTreeSet<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, BTreeSet::from(["demo-1", "worker-a"]));

    through_the_root_apiserver(t0);
}

/// The path metrics-server and operators take: the root apiserver's
/// `nodes/{name}/proxy/metrics/resource`, dialled at the Node's `daemonEndpoints` port, which
/// the virtual node controller sets to the node's own kubelet listener.
fn through_the_root_apiserver(t0: Timestamp) {
    let e = env(settings);
    let node = "relaylet-leaf-2";
    let own = e.sandbox.relaylet.node_ports.addr_of(node).unwrap();
    let store = e.sandbox.root.api.store();
    support::wait_until(
        &format!(
            "the controller writes the node's own port {} into daemonEndpoints",
            own.port()
        ),
        std::time::Duration::from_secs(60),
        || {
            let n: Node = store.get_typed("", node).expect("the virtual node");
            let port = n
                .status
                .and_then(|s| s.daemon_endpoints)
                .and_then(|d| d.kubelet_endpoint)
                .map(|k| k.port);
            port == Some(i32::from(own.port()))
        },
    );
    let k = relaylet_sim::tools::kubectl("1.35").expect("kubectl 1.35");
    let raw = |path: &str| {
        let out = Run::new(
            &k,
            &e.kubeconfig,
            &["get", "--raw", &format!("/api/v1/nodes/{node}/proxy{path}")],
        )
        .output();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&k, &out));
        text(&out.stdout)
    };

    // A metrics-server-like scraper: two scrapes, rates from the counters' deltas over the
    // samples' own timestamps, usage written to the root's metrics.k8s.io.
    let first = parse(&raw("/metrics/resource"));
    put_metrics(
        "leaf-2",
        "demo-2",
        t0 + SignedDuration::from_secs(10),
        "50m",
        "5Mi",
    );
    let second = parse(&raw("/metrics/resource"));
    let sample = |s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]| {
        s.samples
            .iter()
            .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
            .map(|x| {
                let v = match x.value {
                    prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Untyped(v) => v,
                    _ => f64::NAN,
                };
                (v, x.timestamp.timestamp_millis())
            })
            .unwrap_or_else(|| panic!("{name} {labels:?} scraped"))
    };
    let rate = |name: &str, labels: &[(&str, &str)]| {
        let (v1, t1) = sample(&first, name, labels);
        let (v2, t2) = sample(&second, name, labels);
        assert!(t2 > t1, "{name}: a newer sample");
        (v2 - v1) / ((t2 - t1) as f64 / 1000.0)
    };
    let demo2 = [("namespace", "default"), ("pod", "demo-2")];
    let pod_cores = rate("pod_cpu_usage_seconds_total", &demo2);
    let node_cores = rate("node_cpu_usage_seconds_total", &[]);
    assert!((pod_cores - 0.05).abs() < 1e-9, "{pod_cores}");
    assert!((node_cores - 0.05).abs() < 1e-9, "{node_cores}");
    let (pod_memory, _) = sample(&second, "pod_memory_working_set_bytes", &demo2);
    let (node_memory, _) = sample(&second, "node_memory_working_set_bytes", &[]);
    let now = Timestamp::now().to_string();
    let cpu = |cores: f64| format!("{}n", (cores * 1e9).round() as u64);
    let root_store = e.sandbox.root.api.store();
    root_store
        .upsert_object(json!({
            "apiVersion": "metrics.k8s.io/v1beta1", "kind": "PodMetrics",
            "metadata": {"name": "demo-2", "namespace": "default"},
            "timestamp": now, "window": "10s",
            "containers": [{"name": "main", "usage": {
                "cpu": cpu(pod_cores), "memory": format!("{}", pod_memory as u64)}}],
        }))
        .unwrap();
    root_store
        .upsert_object(json!({
            "apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetrics",
            "metadata": {"name": node},
            "timestamp": now, "window": "10s",
            "usage": {"cpu": cpu(node_cores), "memory": format!("{}", node_memory as u64)},
        }))
        .unwrap();

    let top = |args: &[&str]| {
        let out = Run::new(&k, &e.kubeconfig, args).output();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&k, &out));
        text(&out.stdout)
            .lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    let pods = top(&["top", "pod", "demo-2", "--no-headers"]);
    assert_eq!(pods, vec![vec!["demo-2", "50m", "5Mi"]]);
    let nodes = top(&["top", "node", node, "--no-headers"]);
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(
        (
            nodes[0][0].as_str(),
            nodes[0][1].as_str(),
            nodes[0][3].as_str()
        ),
        (node, "50m", "5Mi"),
        "{nodes:?}"
    );

    // The stats Summary through the same path.
    let summary: serde_json::Value = serde_json::from_str(&raw("/stats/summary")).unwrap();
    assert_eq!(summary["node"]["nodeName"], node);
    assert_eq!(summary["pods"][0]["podRef"]["name"], "demo-2");
}

#[test]
fn node_level_paths_are_authorized_like_the_kubelet() {
    let e = env(settings);
    let ca = &e.sandbox.root.ca;
    let viewer = ca.issue_client("viewer", &[]).unwrap();
    let addr = e
        .sandbox
        .relaylet
        .node_ports
        .addr_of("relaylet-leaf-2")
        .unwrap();
    for path in ["/metrics/resource", "/stats/summary", "/pods"] {
        let got = RT.block_on(https_get(
            addr,
            ca.client_config(Some(&viewer)).unwrap(),
            path,
            &[],
        ));
        assert_eq!(got.status, 403, "{path}: {}", got.body);
        let wanted = if path == "/pods" {
            "nodes/proxy"
        } else if path.starts_with("/stats") {
            "nodes/stats"
        } else {
            "nodes/metrics"
        };
        assert!(got.body.contains(wanted), "{path}: {}", got.body);
    }
}

//! A metrics-server stand-in: what fills a cluster's `metrics.k8s.io` so `kubectl top` works.
//!
//! Like metrics-server it scrapes every Node's kubelet at `/metrics/resource` once per
//! resolution, at the address and port the apiserver would dial for that Node (its preferred
//! address types and `daemonEndpoints`), with a client certificate of its own. CPU is a counter
//! there, so a container's (and a node's) CPU rate needs two scrapes: the difference of the
//! counters over the difference of their sample timestamps; the window is that difference and
//! the timestamp the newer sample's. A pod is reported only if it exists in the cluster and every
//! container it was scraped with has a rate; what is no longer scraped stops being reported.
//! metrics-server serves from memory; the stand-in writes PodMetrics and NodeMetrics into the
//! apiserver stand-in's store, which serves `metrics.k8s.io` read-only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use axum::body::Body;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::apiserver::Store;
use crate::apiserver::kinds;
use crate::kubelet_proxy::KubeletClient;

/// The most a `/metrics/resource` answer may hold.
const MAX_SCRAPE_BYTES: usize = 16 << 20;

/// A running metrics-server stand-in; it stops when dropped.
pub struct MetricsServer {
    stop: CancellationToken,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl MetricsServer {
    /// Scrapes the Nodes of `store` every `resolution` through `kubelets` (its TLS client config
    /// carries the scraper's identity) and keeps the store's `metrics.k8s.io` objects current.
    pub fn start(store: Store, kubelets: KubeletClient, resolution: Duration) -> MetricsServer {
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            let mut state = State::default();
            let mut tick = tokio::time::interval(resolution);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tick.tick() => {}
                }
                state.scrape_all(&store, &kubelets).await;
            }
        });
        MetricsServer { stop }
    }
}

/// A CPU counter and a memory gauge read at one time (milliseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    cpu_seconds: f64,
    memory_bytes: f64,
    at_ms: i64,
}

/// A rate between two points.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rate {
    nanocores: u64,
    memory_bytes: u64,
    /// The newer point's time and the distance between the two.
    at_ms: i64,
    window_ms: i64,
}

impl Rate {
    /// The rate from `older` to `newer`; none if time did not move forward or the counter went
    /// back (a restarted container starts its counter again).
    fn between(older: Point, newer: Point) -> Option<Rate> {
        let window_ms = newer.at_ms - older.at_ms;
        let cpu = newer.cpu_seconds - older.cpu_seconds;
        if window_ms <= 0 || cpu < 0.0 {
            return None;
        }
        Some(Rate {
            nanocores: (cpu / (window_ms as f64 / 1000.0) * 1e9).round() as u64,
            memory_bytes: newer.memory_bytes.max(0.0) as u64,
            at_ms: newer.at_ms,
            window_ms,
        })
    }
}

/// (namespace, pod).
type PodKey = (String, String);
/// (namespace, pod, container).
type ContainerKey = (String, String, String);

/// One node's scrape: the node's point and each container's.
#[derive(Debug, Default, Clone, PartialEq)]
struct Scrape {
    node: Option<Point>,
    containers: BTreeMap<ContainerKey, Point>,
}

/// A point while its samples are read.
#[derive(Debug, Default)]
struct Partial {
    cpu_seconds: Option<f64>,
    memory_bytes: Option<f64>,
    at_ms: i64,
}

impl Partial {
    fn point(&self) -> Option<Point> {
        Some(Point {
            cpu_seconds: self.cpu_seconds?,
            memory_bytes: self.memory_bytes?,
            at_ms: self.at_ms,
        })
    }
}

#[derive(Default)]
struct State {
    /// Each node's previous scrape.
    previous: HashMap<String, Scrape>,
    /// What the last round wrote: (namespace, pod) and node names.
    written_pods: HashSet<PodKey>,
    written_nodes: HashSet<String>,
}

impl State {
    async fn scrape_all(&mut self, store: &Store, kubelets: &KubeletClient) {
        let Ok(nodes) = store.list_typed::<Node>(None) else {
            return;
        };
        let pods: HashMap<PodKey, Pod> = store
            .list_typed::<Pod>(None)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| {
                let key = (p.metadata.namespace.clone()?, p.metadata.name.clone()?);
                Some((key, p))
            })
            .collect();
        let mut pods_now: HashSet<PodKey> = HashSet::new();
        let mut nodes_now = HashSet::new();
        for node in &nodes {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            let scrape = match scrape(kubelets, node).await {
                Ok(scrape) => scrape,
                Err(e) => {
                    // metrics-server logs a failed node and goes on with the others.
                    tracing::debug!(node = %name, error = %e, "metrics-server stand-in: scrape failed");
                    self.previous.remove(&name);
                    continue;
                }
            };
            if let Some(old) = self.previous.get(&name) {
                if let (Some(a), Some(b)) = (old.node, scrape.node)
                    && let Some(rate) = Rate::between(a, b)
                    && write(store, node_metrics(node, rate))
                {
                    nodes_now.insert(name.clone());
                }
                for ((namespace, pod_name), containers) in pod_rates(old, &scrape) {
                    let key = (namespace, pod_name);
                    if let Some(pod) = pods.get(&key)
                        && write(store, pod_metrics(pod, &containers))
                    {
                        pods_now.insert(key);
                    }
                }
            }
            self.previous.insert(name, scrape);
        }
        if let Some(kind) = kinds::lookup("metrics.k8s.io", "v1beta1", "pods") {
            for (namespace, name) in self.written_pods.difference(&pods_now) {
                let _ = store.delete(kind, namespace, name, None);
            }
        }
        if let Some(kind) = kinds::lookup("metrics.k8s.io", "v1beta1", "nodes") {
            for name in self.written_nodes.difference(&nodes_now) {
                let _ = store.delete(kind, "", name, None);
            }
        }
        self.written_pods = pods_now;
        self.written_nodes = nodes_now;
    }
}

fn write(store: &Store, object: Value) -> bool {
    match store.upsert_object(object) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e.message, "metrics-server stand-in: storing metrics failed");
            false
        }
    }
}

/// Each pod's container rates between two scrapes; a pod with any container lacking a rate is
/// left out, as metrics-server leaves out a pod it cannot report whole.
fn pod_rates(old: &Scrape, new: &Scrape) -> BTreeMap<PodKey, Vec<(String, Rate)>> {
    // None once a container of the pod has no rate.
    let mut pods: BTreeMap<PodKey, Option<Vec<(String, Rate)>>> = BTreeMap::new();
    for ((namespace, pod, container), point) in &new.containers {
        let rate = old
            .containers
            .get(&(namespace.clone(), pod.clone(), container.clone()))
            .and_then(|older| Rate::between(*older, *point));
        let entry = pods
            .entry((namespace.clone(), pod.clone()))
            .or_insert_with(|| Some(Vec::new()));
        match (entry.as_mut(), rate) {
            (Some(list), Some(rate)) => list.push((container.clone(), rate)),
            _ => *entry = None,
        }
    }
    pods.into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
}

async fn scrape(kubelets: &KubeletClient, node: &Node) -> Result<Scrape, String> {
    let req = http::Request::get("/metrics/resource")
        .body(Body::empty())
        .map_err(|e| e.to_string())?;
    let response = kubelets.proxy_node(req, node, "metrics/resource").await;
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), MAX_SCRAPE_BYTES)
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        return Err(format!("{status}: {}", text.trim()));
    }
    parse(&text)
}

/// The samples metrics-server reads from the kubelet's text; other families are ignored.
fn parse(text: &str) -> Result<Scrape, String> {
    let mut node = Partial::default();
    let mut containers: BTreeMap<ContainerKey, Partial> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let sample = Sample::parse(line).ok_or_else(|| format!("bad sample line {line:?}"))?;
        let container = || {
            Some((
                sample.label("namespace")?,
                sample.label("pod")?,
                sample.label("container")?,
            ))
        };
        match sample.name.as_str() {
            "resource_scrape_error" if sample.value != 0.0 => {
                return Err("the kubelet reported resource_scrape_error 1".into());
            }
            "node_cpu_usage_seconds_total" => {
                node.cpu_seconds = Some(sample.value);
                node.at_ms = sample.at_ms;
            }
            "node_memory_working_set_bytes" => node.memory_bytes = Some(sample.value),
            "container_cpu_usage_seconds_total" => {
                if let Some(key) = container() {
                    let c = containers.entry(key).or_default();
                    c.cpu_seconds = Some(sample.value);
                    c.at_ms = sample.at_ms;
                }
            }
            "container_memory_working_set_bytes" => {
                if let Some(key) = container() {
                    containers.entry(key).or_default().memory_bytes = Some(sample.value);
                }
            }
            _ => {}
        }
    }
    Ok(Scrape {
        node: node.point(),
        containers: containers
            .into_iter()
            .filter_map(|(key, c)| Some((key, c.point()?)))
            .collect(),
    })
}

/// One line of the Prometheus text format: `name{k="v",...} value [timestamp_ms]`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
    at_ms: i64,
}

impl Sample {
    fn parse(line: &str) -> Option<Sample> {
        let name_end = line.find(['{', ' '])?;
        let name = line[..name_end].to_string();
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(after) = rest.strip_prefix('{') {
            let mut chars = after.char_indices();
            let mut key = String::new();
            let close = loop {
                let (i, c) = chars.next()?;
                match c {
                    '}' => break i,
                    ',' | ' ' => {}
                    '=' => {
                        if chars.next()?.1 != '"' {
                            return None;
                        }
                        let mut value = String::new();
                        loop {
                            match chars.next()?.1 {
                                '"' => break,
                                '\\' => match chars.next()?.1 {
                                    'n' => value.push('\n'),
                                    other => value.push(other),
                                },
                                other => value.push(other),
                            }
                        }
                        labels.push((std::mem::take(&mut key), value));
                    }
                    other => key.push(other),
                }
            };
            rest = &after[close + 1..];
        }
        let mut fields = rest.split_whitespace();
        let value = fields.next()?.parse().ok()?;
        let at_ms = match fields.next() {
            Some(ts) => ts.parse().ok()?,
            None => 0,
        };
        Some(Sample {
            name,
            labels,
            value,
            at_ms,
        })
    }

    fn label(&self, key: &str) -> Option<String> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }
}

/// A Go duration as metav1.Duration writes it (`10s`, `1.5s`).
fn go_duration(ms: i64) -> String {
    let secs = ms / 1000;
    let frac = ms % 1000;
    if frac == 0 {
        format!("{secs}s")
    } else {
        format!("{secs}.{}s", format!("{frac:03}").trim_end_matches('0'))
    }
}

fn rfc3339(at_ms: i64) -> String {
    jiff::Timestamp::from_millisecond(at_ms)
        .map(|t| t.round(jiff::Unit::Second).unwrap_or(t).to_string())
        .unwrap_or_default()
}

/// A usage as metrics-server writes it: CPU in nanocores, memory in bytes (Ki when whole).
fn usage(rate: &Rate) -> Value {
    let memory = if rate.memory_bytes.is_multiple_of(1024) {
        format!("{}Ki", rate.memory_bytes / 1024)
    } else {
        rate.memory_bytes.to_string()
    };
    json!({"cpu": format!("{}n", rate.nanocores), "memory": memory})
}

fn pod_metrics(pod: &Pod, containers: &[(String, Rate)]) -> Value {
    let at_ms = containers.iter().map(|(_, r)| r.at_ms).max().unwrap_or(0);
    let window_ms = containers
        .iter()
        .map(|(_, r)| r.window_ms)
        .max()
        .unwrap_or(0);
    json!({
        "apiVersion": "metrics.k8s.io/v1beta1",
        "kind": "PodMetrics",
        "metadata": {
            "name": pod.metadata.name,
            "namespace": pod.metadata.namespace,
            "labels": pod.metadata.labels.clone().unwrap_or_default(),
        },
        "timestamp": rfc3339(at_ms),
        "window": go_duration(window_ms),
        "containers": containers
            .iter()
            .map(|(name, rate)| json!({"name": name, "usage": usage(rate)}))
            .collect::<Vec<_>>(),
    })
}

fn node_metrics(node: &Node, rate: Rate) -> Value {
    json!({
        "apiVersion": "metrics.k8s.io/v1beta1",
        "kind": "NodeMetrics",
        "metadata": {
            "name": node.metadata.name,
            "labels": node.metadata.labels.clone().unwrap_or_default(),
        },
        "timestamp": rfc3339(rate.at_ms),
        "window": go_duration(rate.window_ms),
        "usage": usage(&rate),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP container_cpu_usage_seconds_total [STABLE] x
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container=\"main\",namespace=\"default\",pod=\"a\"} 2 10000
container_cpu_usage_seconds_total{container=\"side\",namespace=\"default\",pod=\"a\"} 1 10000
container_memory_working_set_bytes{container=\"main\",namespace=\"default\",pod=\"a\"} 2048 10000
container_memory_working_set_bytes{container=\"side\",namespace=\"default\",pod=\"a\"} 100 10000
node_cpu_usage_seconds_total 3 10000
node_memory_working_set_bytes 2148 10000
resource_scrape_error 0
";

    fn later(cpu_main: f64, cpu_side: f64, at: i64) -> Scrape {
        let text = TEXT
            .replace("} 2 10000", &format!("}} {cpu_main} {at}"))
            .replace("} 1 10000", &format!("}} {cpu_side} {at}"))
            .replace(
                "node_cpu_usage_seconds_total 3",
                &format!("node_cpu_usage_seconds_total {}", cpu_main + cpu_side),
            )
            .replace("10000", &at.to_string());
        parse(&text).expect("parses")
    }

    #[test]
    fn samples_parse_with_labels_escapes_and_timestamps() {
        let s = Sample::parse(r#"m{a="x\"y",b="1\\2\n"} 1.5e3 42"#).expect("parses");
        assert_eq!(s.name, "m");
        assert_eq!(s.label("a").as_deref(), Some("x\"y"));
        assert_eq!(s.label("b").as_deref(), Some("1\\2\n"));
        assert_eq!((s.value, s.at_ms), (1500.0, 42));
        let bare = Sample::parse("node_cpu_usage_seconds_total 7").expect("parses");
        assert_eq!((bare.value, bare.at_ms, bare.labels.len()), (7.0, 0, 0));
        assert!(Sample::parse("m{a=x} 1").is_none());
        assert!(Sample::parse("m 1 notatime").is_none());
    }

    #[test]
    fn a_rate_needs_two_scrapes_and_forward_time() {
        let first = parse(TEXT).expect("parses");
        assert_eq!(first.containers.len(), 2);
        // 0.5 s of CPU over 2 s is 250m; the window is the 2 s between the samples.
        let second = later(2.5, 1.0, 12000);
        let rates = pod_rates(&first, &second);
        let a = &rates[&("default".to_string(), "a".to_string())];
        assert_eq!(a[0].0, "main");
        assert_eq!(
            a[0].1,
            Rate {
                nanocores: 250_000_000,
                memory_bytes: 2048,
                at_ms: 12000,
                window_ms: 2000
            }
        );
        assert_eq!(a[1].1.nanocores, 0);
        // The same timestamp again gives no rate; nor does a counter that went back.
        assert!(pod_rates(&second, &second).is_empty());
        assert!(pod_rates(&second, &later(1.0, 1.0, 14000)).is_empty());
        let node = Rate::between(first.node.expect("node"), second.node.expect("node"));
        assert_eq!(node.map(|r| r.nanocores), Some(250_000_000));
    }

    #[test]
    fn objects_are_written_as_metrics_server_serves_them() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "default", "labels": {"app": "x"}}
        }))
        .expect("pod");
        let rate = Rate {
            nanocores: 250_000_000,
            memory_bytes: 2048,
            at_ms: 1_700_000_012_000,
            window_ms: 1500,
        };
        let m = pod_metrics(&pod, &[("main".into(), rate)]);
        assert_eq!(m["metadata"]["labels"]["app"], "x");
        assert_eq!(m["window"], "1.5s");
        assert_eq!(m["timestamp"], "2023-11-14T22:13:32Z");
        assert_eq!(
            m["containers"][0]["usage"],
            json!({"cpu": "250000000n", "memory": "2Ki"})
        );
        assert_eq!(go_duration(10_000), "10s");
        assert_eq!(go_duration(10_050), "10.05s");
    }

    #[test]
    fn a_scrape_error_is_an_error() {
        assert!(parse("resource_scrape_error 1\n").is_err());
        assert!(parse("garbage{\n").is_err());
    }
}

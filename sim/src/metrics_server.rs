//! A metrics-server stand-in: what fills a cluster's `metrics.k8s.io` so `kubectl top` works.
//!
//! Like metrics-server it scrapes every Node's kubelet at `/metrics/resource` once per
//! resolution, at the address and port the apiserver would dial for that Node (its preferred
//! address types and `daemonEndpoints`), with a client certificate of its own. CPU is a counter
//! there, so a container's (and a node's) CPU rate needs two scrapes: the difference of the
//! counters over the difference of their sample timestamps; the window is that difference and
//! the timestamp the newer sample's. It keeps metrics-server's rules (v0.8 `decodeBatch`,
//! `storage`): a series with a zero CPU counter or memory is dropped (a pod with one such
//! container entirely); a scrape whose samples are no newer keeps the previous point, so the
//! rate survives it; a container that restarted, or whose counter went back, has no rate; a
//! pod is reported only if it exists in the cluster and every container has two points; what
//! is no longer scraped stops being reported. (Its shortcut for containers younger than one
//! resolution is not modelled.)
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

/// A CPU counter (nanoseconds), a memory gauge and a start time, read at one time
/// (milliseconds since the epoch): metrics-server's `MetricsPoint`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Point {
    cpu_ns: u64,
    memory_bytes: u64,
    /// When the container started (`container_start_time_seconds`, ms); 0 for a node.
    start_ms: i64,
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
    /// metrics-server's `resourceUsage(last, prev)`: none if the start time or the counter
    /// went back (it logs and skips the container).
    fn between(prev: Point, last: Point) -> Option<Rate> {
        if last.start_ms < prev.start_ms || last.cpu_ns < prev.cpu_ns {
            return None;
        }
        let window_ms = last.at_ms - prev.at_ms;
        if window_ms <= 0 {
            return None;
        }
        Some(Rate {
            nanocores: ((last.cpu_ns - prev.cpu_ns) as f64 / (window_ms as f64 / 1000.0)) as u64,
            memory_bytes: last.memory_bytes,
            at_ms: last.at_ms,
            window_ms,
        })
    }
}

/// The newest point of a node or container and the one before it, as metrics-server stores
/// them (`last`, `prev`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stored {
    last: Point,
    prev: Option<Point>,
}

impl Stored {
    /// metrics-server's `Store` step for one series: a newer point pushes the stored one to
    /// `prev`; a point no newer keeps the stored `prev` if that is older still. A container
    /// that started after the stored point was taken has restarted: no `prev`.
    fn next(old: Option<&Stored>, new: Point) -> Stored {
        let prev = old.and_then(|old| {
            if new.start_ms > old.last.at_ms {
                None
            } else if new.at_ms > old.last.at_ms {
                Some(old.last)
            } else {
                old.prev.filter(|p| p.at_ms < new.at_ms)
            }
        });
        Stored { last: new, prev }
    }

    fn rate(&self) -> Option<Rate> {
        Rate::between(self.prev?, self.last)
    }
}

/// (namespace, pod).
type PodKey = (String, String);

/// One round's scrape of every node: each node's point and each pod's containers' points.
#[derive(Debug, Default, Clone, PartialEq)]
struct Batch {
    nodes: BTreeMap<String, Point>,
    pods: BTreeMap<PodKey, BTreeMap<String, Point>>,
}

#[derive(Default)]
struct State {
    nodes: HashMap<String, Stored>,
    pods: HashMap<PodKey, BTreeMap<String, Stored>>,
    /// What the last round wrote: (namespace, pod) and node names.
    written_pods: HashSet<PodKey>,
    written_nodes: HashSet<String>,
}

impl State {
    async fn scrape_all(&mut self, store: &Store, kubelets: &KubeletClient) {
        let Ok(nodes) = store.list_typed::<Node>(None) else {
            return;
        };
        let mut batch = Batch::default();
        for node in &nodes {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            match scrape(kubelets, node).await {
                Ok(one) => {
                    if let Some(point) = one.nodes.get("") {
                        batch.nodes.insert(name, *point);
                    }
                    batch.pods.extend(one.pods);
                }
                // metrics-server logs a failed node and goes on with the others.
                Err(e) => {
                    tracing::debug!(node = %name, error = %e, "metrics-server stand-in: scrape failed")
                }
            }
        }
        self.store(batch);
        self.publish(store, &nodes);
    }

    /// Replaces the stored series with this round's, each keeping its `prev` as upstream does.
    fn store(&mut self, batch: Batch) {
        self.nodes = batch
            .nodes
            .into_iter()
            .map(|(name, point)| {
                let stored = Stored::next(self.nodes.get(&name), point);
                (name, stored)
            })
            .collect();
        self.pods = batch
            .pods
            .into_iter()
            .map(|(key, containers)| {
                let old = self.pods.get(&key);
                let stored = containers
                    .into_iter()
                    .map(|(name, point)| {
                        let s = Stored::next(old.and_then(|o| o.get(&name)), point);
                        (name, s)
                    })
                    .collect();
                (key, stored)
            })
            .collect();
    }

    /// Writes what metrics-server would answer now: a pod (existing in the cluster) whose every
    /// container has two points, a node with two points; removes what it no longer would.
    fn publish(&mut self, store: &Store, nodes: &[Node]) {
        let mut pods_now: HashSet<PodKey> = HashSet::new();
        for pod in store.list_typed::<Pod>(None).unwrap_or_default() {
            let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name)
            else {
                continue;
            };
            let key = (namespace.clone(), name.clone());
            let Some(containers) = self.pods.get(&key) else {
                continue;
            };
            if containers.values().any(|c| c.prev.is_none()) {
                continue;
            }
            let rates: Vec<(String, Rate)> = containers
                .iter()
                .filter_map(|(name, c)| Some((name.clone(), c.rate()?)))
                .collect();
            if write(store, pod_metrics(&pod, &rates)) {
                pods_now.insert(key);
            }
        }
        let mut nodes_now = HashSet::new();
        for node in nodes {
            let Some(name) = &node.metadata.name else {
                continue;
            };
            if let Some(rate) = self.nodes.get(name).and_then(Stored::rate)
                && write(store, node_metrics(node, rate))
            {
                nodes_now.insert(name.clone());
            }
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

/// One node's `/metrics/resource` as a batch (the node's point under the name "").
async fn scrape(kubelets: &KubeletClient, node: &Node) -> Result<Batch, String> {
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

/// The samples metrics-server reads from the kubelet's text (its `decodeBatch`): a node point
/// only if it has a time, CPU and memory; a pod only if every container has CPU and memory
/// (a zero counts as missing, as upstream drops those); other families are ignored.
fn parse(text: &str) -> Result<Batch, String> {
    let mut node = Point::default();
    let mut pods: BTreeMap<PodKey, BTreeMap<String, Point>> = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let sample = Sample::parse(line).ok_or_else(|| format!("bad sample line {line:?}"))?;
        match sample.name.as_str() {
            "resource_scrape_error" if sample.value != 0.0 => {
                return Err("the kubelet reported resource_scrape_error 1".into());
            }
            "node_cpu_usage_seconds_total" => {
                node.cpu_ns = (sample.value * 1e9) as u64;
                node.at_ms = sample.at_ms;
            }
            "node_memory_working_set_bytes" => {
                node.memory_bytes = sample.value as u64;
                node.at_ms = sample.at_ms;
            }
            "container_cpu_usage_seconds_total" => {
                if let Some(c) = container_point(&mut pods, &sample) {
                    c.cpu_ns = (sample.value * 1e9) as u64;
                    c.at_ms = sample.at_ms;
                }
            }
            "container_memory_working_set_bytes" => {
                if let Some(c) = container_point(&mut pods, &sample) {
                    c.memory_bytes = sample.value as u64;
                    c.at_ms = sample.at_ms;
                }
            }
            "container_start_time_seconds" => {
                if let Some(c) = container_point(&mut pods, &sample) {
                    c.start_ms = (sample.value * 1000.0) as i64;
                }
            }
            _ => {}
        }
    }
    let complete = |p: &Point| p.at_ms != 0 && p.cpu_ns != 0 && p.memory_bytes != 0;
    let mut batch = Batch::default();
    if complete(&node) {
        batch.nodes.insert(String::new(), node);
    }
    batch.pods = pods
        .into_iter()
        .filter(|(_, containers)| containers.values().all(complete))
        .collect();
    Ok(batch)
}

/// The point of the container a sample names (namespace, pod and container labels).
fn container_point<'a>(
    pods: &'a mut BTreeMap<PodKey, BTreeMap<String, Point>>,
    sample: &Sample,
) -> Option<&'a mut Point> {
    let key = (sample.label("namespace")?, sample.label("pod")?);
    let name = sample.label("container")?;
    Some(pods.entry(key).or_default().entry(name).or_default())
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

/// A usage as metrics-server writes it: Quantities in canonical form, CPU from nanocores
/// (`250m`), memory in bytes with the largest binary suffix that is exact (`20Mi`).
fn usage(rate: &Rate) -> Value {
    json!({"cpu": cpu_quantity(rate.nanocores), "memory": memory_quantity(rate.memory_bytes)})
}

fn cpu_quantity(nanocores: u64) -> String {
    match nanocores {
        0 => "0".to_string(),
        n if n.is_multiple_of(1_000_000_000) => (n / 1_000_000_000).to_string(),
        n if n.is_multiple_of(1_000_000) => format!("{}m", n / 1_000_000),
        n if n.is_multiple_of(1_000) => format!("{}u", n / 1_000),
        n => format!("{n}n"),
    }
}

fn memory_quantity(bytes: u64) -> String {
    for (shift, suffix) in [(40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A PodMetrics object; its time and window are the earliest container's, as upstream's.
fn pod_metrics(pod: &Pod, containers: &[(String, Rate)]) -> Value {
    let earliest = containers.iter().map(|(_, r)| r).min_by_key(|r| r.at_ms);
    let (at_ms, window_ms) = earliest.map_or((0, 0), |r| (r.at_ms, r.window_ms));
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

    fn text(main_cpu: f64, side_cpu: f64, at: i64) -> String {
        format!(
            "# HELP container_cpu_usage_seconds_total [STABLE] x
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{{container=\"main\",namespace=\"default\",pod=\"a\"}} {main_cpu} {at}
container_cpu_usage_seconds_total{{container=\"side\",namespace=\"default\",pod=\"a\"}} {side_cpu} {at}
container_memory_working_set_bytes{{container=\"main\",namespace=\"default\",pod=\"a\"}} 2097152 {at}
container_memory_working_set_bytes{{container=\"side\",namespace=\"default\",pod=\"a\"}} 100 {at}
container_start_time_seconds{{container=\"main\",namespace=\"default\",pod=\"a\"}} 1 {at}
container_start_time_seconds{{container=\"side\",namespace=\"default\",pod=\"a\"}} 1 {at}
node_cpu_usage_seconds_total {} {at}
node_memory_working_set_bytes 2097252 {at}
resource_scrape_error 0
",
            main_cpu + side_cpu
        )
    }

    fn round(state: &mut State, text: &str) {
        let mut batch = parse(text).expect("parses");
        batch.nodes = batch
            .nodes
            .into_values()
            .map(|p| ("n".to_string(), p))
            .collect();
        state.store(batch);
    }

    fn pod_rates(state: &State) -> Vec<(String, Option<Rate>)> {
        state.pods[&("default".to_string(), "a".to_string())]
            .iter()
            .map(|(name, s)| (name.clone(), s.rate()))
            .collect()
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
    fn a_rate_needs_two_points_and_survives_a_scrape_with_no_news() {
        let mut state = State::default();
        round(&mut state, &text(2.0, 1.0, 10_000));
        assert_eq!(
            pod_rates(&state),
            vec![("main".into(), None), ("side".into(), None)]
        );
        // 0.5 s of CPU over 2 s is 250m; the window is the 2 s between the samples.
        round(&mut state, &text(2.5, 1.0, 12_000));
        let main = Rate {
            nanocores: 250_000_000,
            memory_bytes: 2_097_152,
            at_ms: 12_000,
            window_ms: 2_000,
        };
        assert_eq!(pod_rates(&state)[0], ("main".into(), Some(main)));
        assert_eq!(pod_rates(&state)[1].1.map(|r| r.nanocores), Some(0));
        assert_eq!(
            state.nodes["n"].rate().map(|r| r.nanocores),
            Some(250_000_000)
        );
        // A scrape whose samples are no newer (relaylet repeats a leaf's sample until the leaf
        // has a new one) keeps the rate, as metrics-server keeps its previous point.
        round(&mut state, &text(2.5, 1.0, 12_000));
        assert_eq!(pod_rates(&state)[0], ("main".into(), Some(main)));
        assert!(state.nodes["n"].rate().is_some());
        // A counter that went back gives no rate for that container.
        round(&mut state, &text(1.0, 1.0, 14_000));
        assert_eq!(pod_rates(&state)[0].1, None);
    }

    #[test]
    fn a_restarted_container_starts_without_a_previous_point() {
        let mut state = State::default();
        round(&mut state, &text(2.0, 1.0, 10_000));
        round(&mut state, &text(2.5, 1.0, 12_000));
        let restarted =
            text(0.1, 1.0, 14_000).replacen("pod=\"a\"} 1 14000", "pod=\"a\"} 13 14000", 1);
        round(&mut state, &restarted);
        assert_eq!(pod_rates(&state)[0].1, None);
        assert!(pod_rates(&state)[1].1.is_some());
    }

    #[test]
    fn incomplete_or_zero_series_are_dropped_like_upstream() {
        // A container with no CPU time makes its whole pod incomplete; the node stays.
        let batch = parse(&text(0.0, 1.0, 10_000)).expect("parses");
        assert!(batch.pods.is_empty());
        assert_eq!(batch.nodes.len(), 1);
        let no_memory = text(1.0, 1.0, 10_000).replace(
            "node_memory_working_set_bytes 2097252",
            "node_memory_working_set_bytes 0",
        );
        assert!(parse(&no_memory).expect("parses").nodes.is_empty());
        assert!(parse("resource_scrape_error 1\n").is_err());
        assert!(parse("garbage{\n").is_err());
    }

    #[test]
    fn objects_are_written_as_metrics_server_serves_them() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "default", "labels": {"app": "x"}}
        }))
        .expect("pod");
        let rate = |at_ms, window_ms| Rate {
            nanocores: 250_000_000,
            memory_bytes: 20 << 20,
            at_ms,
            window_ms,
        };
        let m = pod_metrics(
            &pod,
            &[
                ("main".into(), rate(1_700_000_012_000, 1500)),
                ("side".into(), rate(1_700_000_013_000, 2500)),
            ],
        );
        assert_eq!(m["metadata"]["labels"]["app"], "x");
        assert_eq!(m["window"], "1.5s");
        assert_eq!(m["timestamp"], "2023-11-14T22:13:32Z");
        assert_eq!(
            m["containers"][0]["usage"],
            json!({"cpu": "250m", "memory": "20Mi"})
        );
        assert_eq!(go_duration(10_000), "10s");
        assert_eq!(go_duration(10_050), "10.05s");
        assert_eq!(cpu_quantity(1_000_000_000), "1");
        assert_eq!(cpu_quantity(1_500), "1500n");
        assert_eq!(cpu_quantity(12_000), "12u");
        assert_eq!(memory_quantity(1000), "1000");
        assert_eq!(memory_quantity(3 << 10), "3Ki");
    }
}

//! [`NodeStats`]: a virtual node's usage, read from its leaf's PodMetrics (shared by
//! concurrent callers, cached briefly), counted into the totals the kubelet's answers carry.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};
use serde::Deserialize;
use tokio::sync::Semaphore;

use super::reuse::Reuse;

use crate::kube_client::{continued, page_of, paged};
use crate::leaf::{Leaf, Registry};
use crate::model::counterpart::LeafPodMatch;
use crate::model::quantity::Milli;
use crate::routing::{LeafPod, RootPod, counterpart_target};

/// The least a CPU counter reports: 1 µs, which survives metrics-server's conversion of the
/// text's seconds to whole nanoseconds (a kubelet's counter is never 0: starting a process
/// takes CPU).
pub const LEAST_CPU_SECONDS: f64 = 1e-6;
/// Items per page of every LIST a node-level read makes (client-go's pager default).
const PAGE: u32 = 500;
/// Node-level reads computed at once, over all nodes: what a flood of scrapes can make relaylet
/// ask of the root and the leaves at one time.
const CONCURRENT_READS: usize = 4;

/// Why a node's stats could not be gathered.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("virtual node {0} has no registered leaf cluster")]
    NoLeaf(String),
    #[error("listing the pods of virtual node {node} in the root cluster: {source}")]
    RootPods {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading metrics.k8s.io pod metrics from leaf {leaf}: {source}")]
    LeafMetrics {
        leaf: String,
        #[source]
        source: kube::Error,
    },
    #[error("leaf {leaf} sent unreadable pod metrics: {message}")]
    BadMetrics { leaf: String, message: String },
    #[error("listing pods in leaf {leaf}: {source}")]
    LeafPods {
        leaf: String,
        #[source]
        source: kube::Error,
    },
}

/// One container's usage, as relaylet exports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    pub name: String,
    /// Cumulative CPU seconds (see the module comment).
    pub cpu_seconds: f64,
    /// The leaf's current rate, in cores.
    pub cpu_cores: f64,
    pub memory_bytes: u64,
    pub start_time: Option<Timestamp>,
}

/// One root pod's usage.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUsage {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub start_time: Option<Timestamp>,
    /// When the leaf measured it.
    pub timestamp: Timestamp,
    pub containers: Vec<ContainerUsage>,
}

impl PodUsage {
    pub fn cpu_seconds(&self) -> f64 {
        self.containers.iter().map(|c| c.cpu_seconds).sum()
    }
    pub fn cpu_cores(&self) -> f64 {
        self.containers.iter().map(|c| c.cpu_cores).sum()
    }
    pub fn memory_bytes(&self) -> u64 {
        self.containers.iter().map(|c| c.memory_bytes).sum()
    }
}

/// A virtual node's usage: its pods and their sums.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeUsage {
    pub node: String,
    pub timestamp: Timestamp,
    pub cpu_seconds: f64,
    pub cpu_cores: f64,
    pub memory_bytes: u64,
    pub pods: Vec<PodUsage>,
}

/// The CPU counters kept between scrapes.
#[derive(Default)]
struct Counters {
    /// (node, leaf namespace, leaf pod, container) -> (last sample time, cumulative seconds).
    containers: HashMap<(String, String, String, String), (Timestamp, f64)>,
    /// node -> cumulative seconds.
    nodes: HashMap<String, f64>,
}

/// Builds node usage from the root's pods and the leaves' metrics. Cheap to share.
pub struct NodeStats {
    root: Client,
    registry: Registry,
    rule: LeafPodMatch,
    counters: Mutex<Counters>,
    /// How old an answer may be when it is served again (`NODE_STATS_CACHE_TTL`).
    max_age: Duration,
    /// Each registered node's latest answers.
    latest: Mutex<HashMap<String, Arc<Latest>>>,
    reads: Semaphore,
}

/// One node's latest answers.
#[derive(Default)]
struct Latest {
    usage: Reuse<NodeUsage>,
    pods: Reuse<Vec<Pod>>,
}

/// `metrics.k8s.io/v1beta1` PodMetrics, the fields relaylet reads.
#[derive(Deserialize)]
struct PodMetricsList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<PodMetrics>,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "continue")]
    continue_: Option<String>,
}

#[derive(Deserialize)]
struct PodMetrics {
    metadata: MetricsMeta,
    timestamp: String,
    window: String,
    #[serde(default)]
    containers: Vec<ContainerMetrics>,
}

#[derive(Deserialize)]
struct MetricsMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Deserialize)]
struct ContainerMetrics {
    name: String,
    #[serde(default)]
    usage: BTreeMap<String, String>,
}

impl NodeStats {
    /// `rule` proves leaf pods to be root pods' counterparts (`LEAF_POD_MATCH`); answers are
    /// served again while younger than `max_age`.
    pub fn new(
        root: Client,
        registry: Registry,
        rule: LeafPodMatch,
        max_age: Duration,
    ) -> NodeStats {
        NodeStats {
            root,
            registry,
            rule,
            counters: Mutex::new(Counters::default()),
            max_age,
            latest: Mutex::new(HashMap::new()),
            reads: Semaphore::new(CONCURRENT_READS),
        }
    }

    /// `node`'s latest answers, if it is a registered virtual node. Nodes that are gone are
    /// forgotten here, so this stays as large as the registry.
    fn latest(&self, node: &str) -> Result<(Arc<Leaf>, Arc<Latest>), StatsError> {
        let leaf = self
            .registry
            .by_node(node)
            .ok_or_else(|| StatsError::NoLeaf(node.to_string()))?;
        let mut all = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        if !all.contains_key(node) {
            all.retain(|name, _| self.registry.by_node(name).is_some());
        }
        let latest = all.entry(node.to_string()).or_default().clone();
        Ok((leaf, latest))
    }

    /// The root pods bound to `node`.
    pub async fn pods(&self, node: &str) -> Result<Arc<Vec<Pod>>, StatsError> {
        let (_, latest) = self.latest(node)?;
        latest
            .pods
            .get(self.max_age, async {
                // The semaphore is never closed, so acquiring never fails.
                let _permit = self.reads.acquire().await.ok();
                self.root_pods(node).await
            })
            .await
    }

    /// The usage of `node`'s pods, measured by its leaf.
    pub async fn usage(&self, node: &str) -> Result<Arc<NodeUsage>, StatsError> {
        let (leaf, latest) = self.latest(node)?;
        latest
            .usage
            .get(self.max_age, async {
                // The semaphore is never closed, so acquiring never fails.
                let _permit = self.reads.acquire().await.ok();
                let pods = self.root_pods(node).await?;
                let proven = self.counterparts(&leaf, &pods).await?;
                let metrics = leaf_pod_metrics(&leaf).await?;
                let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
                Ok(counters.combine(node, &proven, metrics, Timestamp::now()))
            })
            .await
    }

    /// The root pods bound to `node`, listed in pages.
    async fn root_pods(&self, node: &str) -> Result<Vec<Pod>, StatsError> {
        let api: Api<Pod> = Api::all(self.root.clone());
        let params = ListParams::default()
            .fields(&format!("spec.nodeName={node}"))
            .limit(PAGE);
        paged(|token| {
            let params = continued(&params, token);
            let api = api.clone();
            async move { api.list(&params).await.map(page_of) }
        })
        .await
        .map_err(|source| StatsError::RootPods {
            node: node.to_string(),
            source,
        })
    }

    /// The root pods whose leaf counterparts prove to be theirs, with those leaf pods: one list
    /// of the leaf's pod metadata per scrape, not a read per pod.
    async fn counterparts<'p>(
        &self,
        leaf: &Leaf,
        pods: &'p [Pod],
    ) -> Result<Vec<(&'p Pod, LeafPod)>, StatsError> {
        let targets = pods.iter().filter_map(|pod| {
            let root = RootPod {
                namespace: pod.metadata.namespace.as_deref()?,
                name: pod.metadata.name.as_deref()?,
                uid: pod.metadata.uid.as_deref(),
            };
            Some((pod, root, counterpart_target(leaf, root).ok()?))
        });
        if self.rule == LeafPodMatch::Name {
            return Ok(targets.map(|(pod, _, target)| (pod, target)).collect());
        }
        let mut params = ListParams::default().limit(PAGE);
        if let LeafPodMatch::Label { key, value } = &self.rule {
            params = params.labels(&format!("{key}={value}"));
        }
        let calls = leaf.client();
        let listed = paged(|token| {
            let params = continued(&params, token);
            let calls = calls.clone();
            async move { calls.list_metadata::<Pod>(None, &params).await.map(page_of) }
        })
        .await
        .map_err(|source| StatsError::LeafPods {
            leaf: leaf.name.clone(),
            source,
        })?;
        let leaf_pods: HashMap<(String, String), _> = listed
            .into_iter()
            .filter_map(|p| {
                let key = (p.metadata.namespace.clone()?, p.metadata.name.clone()?);
                Some((key, p.metadata))
            })
            .collect();
        Ok(targets
            .filter(|(_, root, target)| {
                leaf_pods
                    .get(&(target.namespace.clone(), target.name.clone()))
                    .is_some_and(|meta| self.rule.refusal(root.uid, meta).is_none())
            })
            .map(|(pod, _, target)| (pod, target))
            .collect())
    }
}

impl Counters {
    /// Joins root pods with leaf metrics and advances the CPU counters.
    fn combine(
        &mut self,
        node: &str,
        pods: &[(&Pod, LeafPod)],
        metrics: Vec<PodMetrics>,
        now: Timestamp,
    ) -> NodeUsage {
        let by_leaf_name: HashMap<(String, String), PodMetrics> = metrics
            .into_iter()
            .map(|m| ((m.metadata.namespace.clone(), m.metadata.name.clone()), m))
            .collect();
        let counters = self;
        let mut node_increment = 0.0;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (pod, leaf_pod) in pods {
            let (leaf_ns, leaf_name) = (&leaf_pod.namespace, &leaf_pod.name);
            let Some(m) = by_leaf_name.get(&(leaf_ns.clone(), leaf_name.clone())) else {
                continue;
            };
            let Ok(timestamp) = m.timestamp.parse::<Timestamp>() else {
                tracing::debug!(pod = %leaf_name, "pod metrics with an unreadable timestamp");
                continue;
            };
            let window = parse_go_duration(&m.window).unwrap_or(0.0);
            let mut containers = Vec::new();
            for c in &m.containers {
                let cores = c
                    .usage
                    .get("cpu")
                    .and_then(|q| Milli::parse(q).ok())
                    .map(|m| m.0 as f64 / 1000.0)
                    .unwrap_or(0.0)
                    .max(0.0);
                let memory = c
                    .usage
                    .get("memory")
                    .and_then(|q| Milli::parse(q).ok())
                    .map(|m| u64::try_from(m.0 / 1000).unwrap_or(0))
                    .unwrap_or(0);
                let key = (
                    node.to_string(),
                    leaf_ns.clone(),
                    leaf_name.clone(),
                    c.name.clone(),
                );
                seen.insert(key.clone());
                let cumulative = match counters.containers.get_mut(&key) {
                    Some((last, total)) => {
                        if timestamp > *last {
                            let dt = timestamp.duration_since(*last).as_secs_f64();
                            let inc = cores * dt.max(0.0);
                            *total += inc;
                            node_increment += inc;
                            *last = timestamp;
                        }
                        *total
                    }
                    None => {
                        let first = (cores * window).max(LEAST_CPU_SECONDS);
                        counters.containers.insert(key, (timestamp, first));
                        node_increment += first;
                        first
                    }
                };
                containers.push(ContainerUsage {
                    name: c.name.clone(),
                    cpu_seconds: cumulative,
                    cpu_cores: cores,
                    memory_bytes: memory,
                    start_time: container_start(pod, &c.name),
                });
            }
            out.push(PodUsage {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                start_time: pod
                    .status
                    .as_ref()
                    .and_then(|s| s.start_time.as_ref())
                    .map(|t| t.0),
                timestamp,
                containers,
            });
        }
        // Containers that are gone stop being tracked (keeps the map bounded).
        counters
            .containers
            .retain(|key, _| key.0 != node || seen.contains(key));
        let node_total = counters.nodes.entry(node.to_string()).or_insert(0.0);
        *node_total += node_increment;
        let timestamp = out.iter().map(|p| p.timestamp).max().unwrap_or(now);
        NodeUsage {
            node: node.to_string(),
            timestamp,
            cpu_seconds: node_total.max(LEAST_CPU_SECONDS),
            cpu_cores: out.iter().map(PodUsage::cpu_cores).sum(),
            memory_bytes: out.iter().map(PodUsage::memory_bytes).sum(),
            pods: out,
        }
    }
}

fn container_start(pod: &Pod, container: &str) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == container)?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()
        .map(|t| t.0)
}

/// Every PodMetrics the leaf has, in pages (filtered by the caller).
async fn leaf_pod_metrics(leaf: &Leaf) -> Result<Vec<PodMetrics>, StatsError> {
    let bad = |message: String| StatsError::BadMetrics {
        leaf: leaf.name.clone(),
        message,
    };
    paged(|token| async move {
        let mut uri = format!("/apis/metrics.k8s.io/v1beta1/pods?limit={PAGE}");
        if let Some(token) = token {
            let token: String = form_urlencoded::byte_serialize(token.as_bytes()).collect();
            uri.push_str("&continue=");
            uri.push_str(&token);
        }
        let req = http::Request::get(uri)
            .body(Vec::new())
            .map_err(|e| bad(e.to_string()))?;
        let text =
            leaf.client()
                .request_text(req)
                .await
                .map_err(|source| StatsError::LeafMetrics {
                    leaf: leaf.name.clone(),
                    source,
                })?;
        let list: PodMetricsList = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        Ok((list.items, list.metadata.continue_))
    })
    .await
}

/// Seconds in a Go duration string (`30s`, `1m0.5s`, `150ms`), as metrics.k8s.io writes windows.
pub fn parse_go_duration(s: &str) -> Option<f64> {
    crate::config::parse_duration(s.trim())
        .ok()
        .map(|d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_server::resource_metrics::encode;
    use serde_json::json;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("30s"), Some(30.0));
        assert_eq!(parse_go_duration("1m0.5s"), Some(60.5));
        assert_eq!(parse_go_duration("150ms"), Some(0.15));
        assert_eq!(parse_go_duration("soon"), None);
        assert_eq!(parse_go_duration(""), None);
    }

    fn root_pod(name: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"nodeName": "vn", "containers": [{"name": "main"}]},
        }))
        .unwrap()
    }

    /// The root pod with its leaf counterpart, in leaf namespace `leaf_ns`.
    fn proven<'p>(pod: &'p Pod, leaf_ns: &str) -> (&'p Pod, LeafPod) {
        let name = pod.metadata.name.clone().unwrap();
        (
            pod,
            LeafPod {
                namespace: leaf_ns.into(),
                name,
            },
        )
    }

    fn leaf_metrics(ns: &str, name: &str, at: &str, cpu: &str, memory: &str) -> PodMetrics {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "timestamp": at,
            "window": "30s",
            "containers": [{"name": "main", "usage": {"cpu": cpu, "memory": memory}}],
        }))
        .unwrap()
    }

    #[test]
    fn cpu_is_integrated_per_container_and_the_node_never_goes_back() {
        let mut c = Counters::default();
        let now = Timestamp::now();
        // "b" runs in leaf namespace "mapped"; "other" is in the leaf but not on the node, and
        // "a" in "mapped" is another pod than root "a".
        let (a, b) = (root_pod("a"), root_pod("b"));
        let pods = vec![proven(&a, "default"), proven(&b, "mapped")];
        let first = c.combine(
            "vn",
            &pods,
            vec![
                leaf_metrics("default", "a", "2026-01-01T00:00:00Z", "100m", "1Mi"),
                leaf_metrics("mapped", "b", "2026-01-01T00:00:00Z", "1", "2Mi"),
                leaf_metrics("default", "other", "2026-01-01T00:00:00Z", "4", "1Gi"),
                leaf_metrics("mapped", "a", "2026-01-01T00:00:00Z", "2", "8Mi"),
            ],
            now,
        );
        assert_eq!(first.pods.len(), 2);
        assert_eq!(first.pods[1].name, "b", "reported under the root name");
        assert!((first.pods[0].cpu_seconds() - 3.0).abs() < 1e-9);
        assert!((first.pods[1].cpu_seconds() - 30.0).abs() < 1e-9);
        assert!((first.cpu_seconds - 33.0).abs() < 1e-9);
        assert_eq!(first.memory_bytes, 3 * 1024 * 1024);

        // 10 s later "a" runs at 500m; "b" is gone from the node.
        let second = c.combine(
            "vn",
            &pods[..1],
            vec![leaf_metrics(
                "default",
                "a",
                "2026-01-01T00:00:10Z",
                "500m",
                "1Mi",
            )],
            now,
        );
        assert!((second.pods[0].cpu_seconds() - 8.0).abs() < 1e-9);
        assert!(
            (second.cpu_seconds - 38.0).abs() < 1e-9,
            "the node counter keeps b's seconds: {}",
            second.cpu_seconds
        );
        assert_eq!(c.containers.len(), 1, "b's counter is dropped");

        // The same sample again (or an older one) changes nothing.
        let third = c.combine(
            "vn",
            &pods[..1],
            vec![leaf_metrics(
                "default",
                "a",
                "2026-01-01T00:00:05Z",
                "900m",
                "1Mi",
            )],
            now,
        );
        assert!((third.pods[0].cpu_seconds() - 8.0).abs() < 1e-9);
        assert!((third.cpu_seconds - 38.0).abs() < 1e-9);
    }

    #[test]
    fn an_idle_container_and_its_node_never_report_zero_cpu_seconds() {
        // metrics-server (v0.8 decodeBatch) drops a container whose counter is 0, and the
        // whole pod with it: an idle leaf pod would vanish from the root's kubectl top.
        let mut c = Counters::default();
        let idle = root_pod("idle");
        let pods = vec![proven(&idle, "default")];
        let at = |t: &str| vec![leaf_metrics("default", "idle", t, "0", "1Mi")];
        let first = c.combine("vn", &pods, at("2026-01-01T00:00:00Z"), Timestamp::now());
        assert_eq!(first.pods[0].cpu_seconds(), LEAST_CPU_SECONDS);
        assert_eq!(first.cpu_seconds, LEAST_CPU_SECONDS);
        // Seen by metrics-server as whole nanoseconds, as it parses the text.
        let text = encode::encode_resource_metrics(Some(&first));
        let line = text
            .lines()
            .find(|l| l.starts_with("container_cpu_usage_seconds_total{"))
            .expect("a container sample");
        let seconds: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!((seconds * 1e9) as u64 > 0, "{line}");
        // Later idle samples add nothing: the rate metrics-server derives stays 0.
        let later = c.combine("vn", &pods, at("2026-01-01T00:00:10Z"), Timestamp::now());
        assert_eq!(later.pods[0].cpu_seconds(), LEAST_CPU_SECONDS);
        // A node with no pods at all still reports a counter above 0.
        let empty = c.combine("vn2", &[], Vec::new(), Timestamp::now());
        assert_eq!(empty.cpu_seconds, LEAST_CPU_SECONDS);
    }

    #[test]
    fn the_text_format_carries_sample_times_and_sums() {
        let mut c = Counters::default();
        let usage = c.combine(
            "vn",
            &[proven(&root_pod("a"), "default")],
            vec![leaf_metrics(
                "default",
                "a",
                "2026-01-01T00:00:00Z",
                "250m",
                "4Ki",
            )],
            Timestamp::now(),
        );
        let text = encode::encode_resource_metrics(Some(&usage));
        assert!(text.contains(
            "container_cpu_usage_seconds_total{container=\"main\",namespace=\"default\",pod=\"a\"} 7.5 1767225600000"
        ));
        assert!(text.contains("node_memory_working_set_bytes 4096 1767225600000"));
        assert!(text.contains("resource_scrape_error 0"));
        assert!(encode::encode_resource_metrics(None).contains("resource_scrape_error 1"));
    }
}

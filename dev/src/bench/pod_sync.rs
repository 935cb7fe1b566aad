//! `relaylet-dev bench --only podsync`: what running a pod through relaylet costs (issue 56),
//! against running the same pod in the leaf directly.
//!
//! Starts a simulated root and one simulated leaf (`leaf-0`, one node whose kubelet stand-in
//! runs every pod's containers as real processes and writes their status as a kubelet does;
//! the leaf's scheduler stand-in binds unbound pods to it), and one relaylet process with pod
//! sync on (`relaylet serve`, configured by env vars as in a real install; a cluster admin in
//! both clusters: this measures cost, not RBAC). Every pod has one container,
//! `trap 'exit 0' TERM; sleep 3600 & wait`, which exits at once on SIGTERM.
//!
//! Two routes, each run by the benchmark as a user would, through the apiservers (so pods get
//! the apiserver's defaults: `Pending`, a 30 s grace period, graceful deletion):
//! - **direct**: the pod is created in the leaf (namespace `direct`, unbound);
//! - **relayed**: the pod is created in the root (namespace `bench`) bound to the virtual Node
//!   `relaylet-leaf-0`; relaylet makes its copy in the leaf and mirrors its status.
//!
//! Each route creates its N pods in batches (20 at once, the next batch once the last is
//! Running and Ready), then deletes them in batches of the same size (default grace) until
//! gone; the direct route first, then the relayed one, so that the pods of one never sit in
//! the leaf during the other's figures. Transitions are seen by watches of the apiservers'
//! stores in this process (no polling); every time is the observer's clock: from just before
//! the create (delete) request until the watch shows the pod Running with `Ready=True`
//! (deleted from the store). For the relayed route that is the root pod: its status is
//! relaylet's, and it goes only once relaylet has seen its copy go. A warm-up pod per route runs
//! through the whole cycle before anything is counted.
//!
//! Figures (`ratio` = relayed / direct, so 1.0 is "no overhead" and lower is better):
//! 1. start latency p50 and p99 (create until Running and Ready);
//! 2. delete latency p50 and p99 (delete until gone);
//! 3. root writes per pod: the root apiserver's request counts (by method and path) over the
//!    relayed route's whole life, from before its first create until 5 s after its last pod is
//!    gone: PUT and PATCH on each pod's `status`, and DELETE on each pod less the benchmark's own
//!    delete, over N (the design target is at most 3); also every write relaylet made to the
//!    root in that window (the Node's and its Lease's heartbeats too) and its reads of the pods;
//! 4. relaylet's memory per synced pod: RSS with the N pods Running (5 s after the last is
//!    Ready) over RSS before the first, per pod; and RSS 5 s after all are gone over before;
//!    beside it the heap in use (`relaylet_heap_in_use_bytes`, glibc's `mallinfo2`) over the
//!    same window, per pod: the live records without the pages the allocator holds free;
//! 5. relaylet's leaf requests per pod over the same window: creates, patches, deletes and
//!    GETs of the copies, and every request it made to the leaf apiserver (watches and probes
//!    included); only relaylet talks to the leaf apiserver then (the kubelet stand-in and the
//!    observers read its store);
//! 6. relaylet's CPU time per pod over that window, and its reconciles that failed
//!    (`relaylet_pod_sync_errors_total`), which should be none.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use relaylet_sim::apiserver::Store;
use relaylet_sim::apiserver::kinds::{self, Kind};
use relaylet_sim::apiserver::store::Change;
use relaylet_sim::cluster::{Cluster, ClusterOptions};
use serde_json::{Value, json};
use tokio::process::Child;
use tokio::sync::watch;

use super::node_view::NodeView;
use super::procfs;
use super::report::percentile;

/// relaylet's namespace in the root.
const NAMESPACE: &str = "relaylet-system";
/// relaylet's identity in both clusters (a cluster admin: this measures cost, not RBAC).
const USER: &str = "relaylet-podsync";
/// The leaf, and the virtual Node relaylet shows for it.
const LEAF: &str = "leaf-0";
const VIRTUAL_NODE: &str = "relaylet-leaf-0";
/// Where the relayed pods are created (root; their copies land in the leaf namespace of the
/// same name) and where the direct pods are (leaf).
const RELAYED_NAMESPACE: &str = "bench";
const DIRECT_NAMESPACE: &str = "direct";
/// The container: exits at once on SIGTERM (the process group gets it: `sleep` too).
const SCRIPT: &str = "trap 'exit 0' TERM; sleep 3600 & wait";
/// Time given to relaylet before a memory reading and after the last pod went.
const SETTLE: Duration = Duration::from_secs(5);
/// Only turns a hang into a failure; nothing is measured against it.
const BATCH_LIMIT: Duration = Duration::from_secs(180);
/// The design target for relaylet's root writes per pod over its life.
pub const ROOT_WRITES_TARGET: f64 = 3.0;

/// How many pods, and how many at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Pods per route.
    pub pods: usize,
    /// Pods created (or deleted) at once; the next batch waits for the last.
    pub batch: usize,
    /// Pods created at once on one leaf for `podsync_1000_pods_all_running`.
    pub at_once: usize,
}

impl Size {
    pub fn for_mode(smoke: bool, quick: bool) -> Size {
        if smoke {
            Size {
                pods: 10,
                batch: 5,
                at_once: 20,
            }
        } else if quick {
            Size {
                pods: 200,
                batch: 20,
                at_once: 1000,
            }
        } else {
            Size {
                pods: 1000,
                batch: 20,
                at_once: 1000,
            }
        }
    }
}

/// One figure: the direct route's value where there is one, relaylet's, and their ratio.
#[derive(Debug, Clone)]
pub struct PodSyncFigure {
    pub name: &'static str,
    pub unit: &'static str,
    pub direct: Option<f64>,
    pub relayed: f64,
    /// relayed / direct.
    pub ratio: Option<f64>,
    /// Pods behind the figure.
    pub n: usize,
}

impl PodSyncFigure {
    /// The `--json` line.
    pub fn json(&self) -> String {
        let round = |v: f64| (v * 1000.0).round() / 1000.0;
        json!({
            "name": self.name,
            "unit": self.unit,
            "direct": self.direct.map(round),
            "relayed": round(self.relayed),
            "ratio": self.ratio.map(round),
            "n": self.n,
        })
        .to_string()
    }
}

/// The figures as they come (printed to stderr at once).
#[derive(Default)]
struct Figures(Vec<PodSyncFigure>);

impl Figures {
    /// A figure of both routes.
    fn both(
        &mut self,
        name: &'static str,
        unit: &'static str,
        direct: f64,
        relayed: f64,
        n: usize,
    ) {
        let ratio = (direct > 0.0).then(|| relayed / direct);
        let ratio_text = ratio.map_or("-".to_string(), |r| format!("{r:.3}"));
        eprintln!("  {name}: direct {direct:.3} relayed {relayed:.3} {unit} (ratio {ratio_text})");
        self.0.push(PodSyncFigure {
            name,
            unit,
            direct: Some(direct),
            relayed,
            ratio,
            n,
        });
    }

    /// A figure of relaylet alone.
    fn relayed(&mut self, name: &'static str, unit: &'static str, value: f64, n: usize) {
        eprintln!("  {name}: {value:.3} {unit}");
        self.0.push(PodSyncFigure {
            name,
            unit,
            direct: None,
            relayed: value,
            ratio: None,
            n,
        });
    }
}

/// The figures as a Markdown table.
pub fn table(figures: &[PodSyncFigure]) -> String {
    let mut out = String::from(
        "| figure | unit | direct | relayed | ratio | n |\n|---|---|---:|---:|---:|---:|\n",
    );
    for f in figures {
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {} | {} |\n",
            f.name,
            f.unit,
            f.direct.map_or("-".to_string(), |d| format!("{d:.2}")),
            f.relayed,
            f.ratio.map_or("-".to_string(), |r| format!("{r:.3}")),
            f.n
        ));
    }
    out
}

/// The issue's targets: (row, at most, unit).
const TARGETS: [(&str, f64, &str); 6] = [
    ("podsync_overhead_p50", 50.0, "ms"),
    ("podsync_overhead_p99", 250.0, "ms"),
    ("podsync_1000_pods_all_running", 20.0, "s"),
    ("podsync_memory_per_pod", MEMORY_TARGET, "B"),
    ("podsync_root_writes_per_pod", ROOT_WRITES_TARGET, "writes"),
    ("podsync_delete_overhead_p99", 500.0, "ms"),
];

/// Memory per synced pod: 1 KiB beyond the record relaylet keeps of every leaf pod it routes
/// to, which a synced pod's copy has too (the fleet benchmark's `memory per leaf pod` as
/// measured when pod sync came: docs/performance.md, "Leaf pods").
const MEMORY_TARGET: f64 = 1024.0 + 327.0;

/// One line per target (relaylet's figures): met or not, with the figure.
pub fn targets(figures: &[PodSyncFigure]) -> Vec<String> {
    TARGETS
        .iter()
        .map(|(row, most, unit)| {
            let value = figures.iter().find(|f| f.name == *row).map(|f| f.relayed);
            match value {
                Some(v) if v <= *most => format!("{row} <= {most} {unit}: met ({v:.2})"),
                Some(v) => format!("{row} <= {most} {unit}: NOT met ({v:.2})"),
                None => format!("{row} <= {most} {unit}: not measured"),
            }
        })
        .collect()
}

/// Measures both routes with `size.pods` pods each; the figures in order.
pub async fn run(size: Size) -> anyhow::Result<Vec<PodSyncFigure>> {
    let files = tempfile::Builder::new()
        .prefix("relaylet-podsync-")
        .tempdir()?;
    let world = World::start(files.path()).await?;
    let result = measure(&world, size).await;
    let result = match result {
        Ok(figures) => Ok(figures),
        Err(err) => Err(err.context(format!(
            "relaylet's last log lines:\n{}",
            tail(&world.relaylet.log, 20)
        ))),
    };
    world.relaylet.stop().await;
    result
}

async fn measure(world: &World, size: Size) -> anyhow::Result<Vec<PodSyncFigure>> {
    let mut out = Figures::default();
    let direct = &world.direct;
    let relayed = &world.relayed;

    // A warm-up pod per route: connections made, relaylet's leaf namespace and service
    // account ensured, both its watches listed. Nothing of it is counted.
    for route in [direct, relayed] {
        let name = vec![format!("{}-warm", route.prefix)];
        route.create(&name).await?;
        route.delete(&name).await?;
    }

    // 1. Pods in batches: each pod's start and delete latency, what each costs.
    eprintln!(
        "podsync: {} pods per route, {} at once; direct",
        size.pods, size.batch
    );
    let direct_names = names(direct.prefix, size.pods);
    let direct_start = route_up(direct, &direct_names, size.batch).await?;
    let direct_delete = route_down(direct, &direct_names, size.batch).await?;

    eprintln!("podsync: relayed");
    tokio::time::sleep(SETTLE).await;
    let pid = world.relaylet.pid;
    let cpu_before = procfs::cpu_time(pid)?;
    let root_before = Counts::of(&world.root.api, RELAYED_NAMESPACE);
    let leaf_before = Counts::of(&world.leaf.api, RELAYED_NAMESPACE);
    let errors_before = world.relaylet.sync_errors().await?;
    let relayed_names = names(relayed.prefix, size.pods);
    let relayed_start = route_up(relayed, &relayed_names, size.batch).await?;
    tokio::time::sleep(SETTLE).await;
    let root_status = RootPodWrites::of(&world.root.api, &relayed_names);
    let relayed_delete = route_down(relayed, &relayed_names, size.batch).await?;
    tokio::time::sleep(SETTLE).await;
    let cpu_used = procfs::cpu_time(pid)?.saturating_sub(cpu_before);
    let root_after = Counts::of(&world.root.api, RELAYED_NAMESPACE);
    let leaf_after = Counts::of(&world.leaf.api, RELAYED_NAMESPACE);
    let root_life = RootPodWrites::of(&world.root.api, &relayed_names);
    let errors = world.relaylet.sync_errors().await? - errors_before;

    let n = size.pods;
    let per_pod = |count: u64| count as f64 / n as f64;
    let p = |samples: &[f64], q: f64| percentile(samples, q).unwrap_or(f64::NAN);
    for (name, overhead, q) in [
        ("podsync_start_p50", Some("podsync_overhead_p50"), 50.0),
        ("podsync_start_p99", Some("podsync_overhead_p99"), 99.0),
    ] {
        let (d, r) = (p(&direct_start, q), p(&relayed_start, q));
        out.both(name, "ms", d, r, n);
        if let Some(overhead) = overhead {
            out.relayed(overhead, "ms", r - d, n);
        }
    }
    for (name, overhead, q) in [
        ("podsync_delete_p50", None, 50.0),
        (
            "podsync_delete_p99",
            Some("podsync_delete_overhead_p99"),
            99.0,
        ),
    ] {
        let (d, r) = (p(&direct_delete, q), p(&relayed_delete, q));
        out.both(name, "ms", d, r, n);
        if let Some(overhead) = overhead {
            out.relayed(overhead, "ms", r - d, n);
        }
    }

    // The root: the benchmark's own create and delete of each pod are not relaylet's.
    out.relayed(
        "podsync_root_writes_per_pod",
        "writes",
        per_pod(root_status.status),
        n,
    );
    out.relayed(
        "podsync_root_life_writes_per_pod",
        "writes",
        per_pod(root_life.status + root_life.deletes.saturating_sub(n as u64)),
        n,
    );
    let root_writes = root_after
        .writes()
        .saturating_sub(root_before.writes())
        .saturating_sub(2 * n as u64);
    out.relayed(
        "podsync_root_all_writes_per_pod",
        "writes",
        per_pod(root_writes),
        n,
    );
    out.relayed(
        "podsync_root_pod_reads_per_pod",
        "reads",
        per_pod(root_life.reads),
        n,
    );

    let leaf = leaf_after.since(&leaf_before);
    for (name, count) in [
        ("podsync_leaf_creates_per_pod", leaf.creates),
        ("podsync_leaf_patches_per_pod", leaf.patches),
        ("podsync_leaf_deletes_per_pod", leaf.deletes),
        ("podsync_leaf_gets_per_pod", leaf.gets),
        ("podsync_leaf_requests_per_pod", leaf.all),
    ] {
        out.relayed(name, "requests", per_pod(count), n);
    }
    out.relayed(
        "podsync_cpu_per_pod",
        "ms",
        cpu_used.as_secs_f64() * 1000.0 / n as f64,
        n,
    );
    out.relayed("podsync_sync_errors", "errors", errors, n);

    // 2. Many pods at once on one leaf: until all are Running, and relaylet's memory with
    // them (the direct route's is its record of leaf pods it does not run).
    let m = size.at_once;
    eprintln!("podsync: {m} pods at once per route");
    let mut all_running = [0.0; 2];
    let mut memory = [0.0; 2];
    let mut heap = [0.0; 2];
    for (i, route) in [direct, relayed].into_iter().enumerate() {
        let names = names(&format!("{}a", route.prefix), m);
        tokio::time::sleep(SETTLE).await;
        let before = procfs::rss_kib(pid)?;
        let heap_before = world.relaylet.heap_in_use().await?;
        all_running[i] = route.create_all(&names).await?;
        tokio::time::sleep(SETTLE).await;
        let with = procfs::rss_kib(pid)?;
        let heap_with = world.relaylet.heap_in_use().await?;
        memory[i] = with.saturating_sub(before) as f64 * 1024.0 / m as f64;
        heap[i] = (heap_with - heap_before).max(0.0) / m as f64;
        route.delete_all(&names).await?;
    }
    out.both(
        "podsync_1000_pods_all_running",
        "s",
        all_running[0],
        all_running[1],
        m,
    );
    out.both("podsync_memory_per_pod", "B", memory[0], memory[1], m);
    out.both("podsync_heap_per_pod", "B", heap[0], heap[1], m);
    Ok(out.0)
}

/// relaylet's requests on the root's pods of `names`, counted since the server started (names
/// of one width, so no name is a prefix of another; these names exist only in this run).
struct RootPodWrites {
    /// PUTs and PATCHes of their `status`.
    status: u64,
    /// DELETEs of them (the benchmark's own included).
    deletes: u64,
    /// GETs of them.
    reads: u64,
}

impl RootPodWrites {
    fn of(api: &relaylet_sim::apiserver::ApiServer, names: &[String]) -> RootPodWrites {
        let path = |name: &str| format!("/api/v1/namespaces/{RELAYED_NAMESPACE}/pods/{name}");
        let mut counts = RootPodWrites {
            status: 0,
            deletes: 0,
            reads: 0,
        };
        for name in names {
            let status = format!("{}/status", path(name));
            counts.status += api.requests("PUT", &status) + api.requests("PATCH", &status);
            counts.deletes += api.requests("DELETE", &path(name));
            counts.reads += api.requests("GET", &path(name));
        }
        counts
    }
}

/// `n` pod names with prefix `prefix`, all of one width.
fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:05}")).collect()
}

/// Creates `names` on `route` in batches; each pod's start latency, ms.
async fn route_up(route: &Route, names: &[String], batch: usize) -> anyhow::Result<Vec<f64>> {
    let mut latencies = Vec::with_capacity(names.len());
    for chunk in names.chunks(batch.max(1)) {
        latencies.extend(route.create(chunk).await?);
    }
    Ok(latencies)
}

/// Deletes `names` on `route` in batches; each pod's delete latency, ms.
async fn route_down(route: &Route, names: &[String], batch: usize) -> anyhow::Result<Vec<f64>> {
    let mut latencies = Vec::with_capacity(names.len());
    for chunk in names.chunks(batch.max(1)) {
        latencies.extend(route.delete(chunk).await?);
    }
    Ok(latencies)
}

/// What the benchmark runs against: the two clusters, relaylet and the two routes.
struct World {
    root: Cluster,
    leaf: Cluster,
    relaylet: Relaylet,
    direct: Route,
    relayed: Route,
}

impl World {
    async fn start(dir: &Path) -> anyhow::Result<World> {
        let root = Cluster::start(ClusterOptions::new("root"))
            .await
            .context("starting the root cluster")?;
        let leaf = Cluster::start(ClusterOptions::new(LEAF))
            .await
            .context("starting the leaf cluster")?;
        // Every change of the run stays in the stores' histories: the observers read them.
        for cluster in [&root, &leaf] {
            cluster.api.store().set_history_limit(2_000_000);
        }
        super::stack::create_namespace(&root, NAMESPACE)?;
        super::stack::create_namespace(&root, RELAYED_NAMESPACE)?;
        super::stack::create_namespace(&leaf, DIRECT_NAMESPACE)?;
        leaf.add_node(&format!("{LEAF}-node"))
            .await
            .context("starting the leaf's node")?;
        let kubeconfig = leaf.kubeconfig(USER, &["system:masters"])?;
        root.api
            .store()
            .create_typed(&crate::sandbox::leaf_secret(NAMESPACE, LEAF, &kubeconfig))
            .map_err(|e| anyhow::anyhow!("creating the leaf Secret: {e}"))?;
        let relaylet = Relaylet::spawn(&root, dir).await?;
        NodeView::wait(
            root.api.store(),
            Duration::from_secs(60),
            "the virtual Node Ready",
            |view| {
                view.iter()
                    .any(|n| node_ready(n) && name_of(n) == VIRTUAL_NODE)
            },
        )
        .await
        .with_context(|| format!("relaylet's last log lines:\n{}", tail(&relaylet.log, 20)))?;
        let root_admin = crate::sandbox::kube_client(&root.admin_kubeconfig()?).await?;
        let leaf_admin = crate::sandbox::kube_client(&leaf.admin_kubeconfig()?).await?;
        let direct = Route {
            name: "direct",
            prefix: "d",
            pods: Api::namespaced(leaf_admin, DIRECT_NAMESPACE),
            namespace: DIRECT_NAMESPACE,
            node: None,
            observer: Observer::start(leaf.api.store(), DIRECT_NAMESPACE)?,
        };
        let relayed = Route {
            name: "relayed",
            prefix: "r",
            pods: Api::namespaced(root_admin, RELAYED_NAMESPACE),
            namespace: RELAYED_NAMESPACE,
            node: Some(VIRTUAL_NODE),
            observer: Observer::start(root.api.store(), RELAYED_NAMESPACE)?,
        };
        Ok(World {
            root,
            leaf,
            relaylet,
            direct,
            relayed,
        })
    }
}

/// One way to run a pod: where it is created, and the watch that sees it Ready and gone.
struct Route {
    name: &'static str,
    prefix: &'static str,
    pods: Api<Pod>,
    namespace: &'static str,
    /// The node the pod is created bound to (the virtual Node); unbound without.
    node: Option<&'static str>,
    observer: Observer,
}

impl Route {
    fn pod(&self, name: &str) -> anyhow::Result<Pod> {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "labels": {"app": "podsync-bench"}},
            "spec": {
                "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", SCRIPT]}],
            },
        });
        if let Some(node) = self.node {
            pod["spec"]["nodeName"] = json!(node);
        }
        serde_json::from_value(pod).context("the benchmark pod")
    }

    /// Creates `names` at once; each one's time from its create until it reads Running and
    /// Ready, ms.
    async fn create(&self, names: &[String]) -> anyhow::Result<Vec<f64>> {
        let pods = names
            .iter()
            .map(|n| self.pod(n))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let sent = futures::future::try_join_all(pods.iter().map(|pod| async move {
            let at = Instant::now();
            self.pods
                .create(&PostParams::default(), pod)
                .await
                .with_context(|| format!("creating {} pod {:?}", self.name, pod.metadata.name))?;
            anyhow::Ok(at)
        }))
        .await?;
        let seen = self
            .observer
            .wait(names, Milestone::Ready, BATCH_LIMIT)
            .await
            .with_context(|| format!("{} pods Running and Ready", self.name))?;
        Ok(elapsed_ms(&sent, &seen))
    }

    /// Creates `names` at once; seconds from the first create until all are Running and Ready.
    async fn create_all(&self, names: &[String]) -> anyhow::Result<f64> {
        let started = Instant::now();
        self.create(names).await?;
        Ok(started.elapsed().as_secs_f64())
    }

    /// Deletes `names` at once and waits until all are gone.
    async fn delete_all(&self, names: &[String]) -> anyhow::Result<()> {
        self.delete(names).await.map(drop)
    }

    /// Deletes `names` at once (default grace); each one's time from its delete until it is
    /// gone, ms.
    async fn delete(&self, names: &[String]) -> anyhow::Result<Vec<f64>> {
        let sent = futures::future::try_join_all(names.iter().map(|name| async move {
            let at = Instant::now();
            self.pods
                .delete(name, &DeleteParams::default())
                .await
                .with_context(|| format!("deleting {} pod {name}", self.name))?;
            anyhow::Ok(at)
        }))
        .await?;
        let seen = self
            .observer
            .wait(names, Milestone::Gone, BATCH_LIMIT)
            .await
            .with_context(|| format!("{} pods gone", self.name))?;
        Ok(elapsed_ms(&sent, &seen))
    }
}

fn elapsed_ms(sent: &[Instant], seen: &[Instant]) -> Vec<f64> {
    sent.iter()
        .zip(seen)
        .map(|(sent, seen)| seen.saturating_duration_since(*sent).as_secs_f64() * 1000.0)
        .collect()
}

/// What the observer waits for.
#[derive(Debug, Clone, Copy)]
enum Milestone {
    /// Running with `Ready=True`.
    Ready,
    /// Deleted from the store.
    Gone,
}

/// When each pod of one namespace was first seen Running and Ready, and gone.
#[derive(Default)]
struct Seen {
    ready: HashMap<String, Instant>,
    gone: HashMap<String, Instant>,
    /// Why the observer stopped, if it did.
    failed: Option<String>,
}

/// Follows the pods of one namespace in one store (a watch of the store's changes, in this
/// process) and notes when each reads Running and Ready and when it goes, at the moment the
/// change is seen.
struct Observer {
    seen: Arc<Mutex<Seen>>,
    news: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Observer {
    fn start(store: &Store, namespace: &'static str) -> anyhow::Result<Observer> {
        let kind = pods_kind()?;
        let store = store.clone();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tell, news) = watch::channel(0);
        // Subscribed before the first read: a change between the two wakes the loop.
        let mut changes = store.subscribe_kind(kind);
        let mut rv = store.revision();
        let shared = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let events = store.events_since(rv);
                let now = Instant::now();
                {
                    let mut seen = lock(&shared);
                    match events {
                        Ok((events, next)) => {
                            for event in events.iter().filter(|e| {
                                e.key.group.is_empty()
                                    && e.key.resource == "pods"
                                    && e.key.namespace == namespace
                            }) {
                                let name = &event.key.name;
                                if event.change == Change::Deleted {
                                    seen.gone.entry(name.clone()).or_insert(now);
                                } else if running_and_ready(&event.object) {
                                    seen.ready.entry(name.clone()).or_insert(now);
                                }
                            }
                            rv = next;
                        }
                        Err(too_old) => {
                            seen.failed = Some(format!(
                                "the store no longer keeps the changes after {rv}: {too_old:?}"
                            ));
                        }
                    }
                }
                tell.send_replace(rv);
                if lock(&shared).failed.is_some() || changes.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Observer { seen, news, task })
    }

    /// Waits until every pod of `names` has reached `milestone`; when each did.
    async fn wait(
        &self,
        names: &[String],
        milestone: Milestone,
        limit: Duration,
    ) -> anyhow::Result<Vec<Instant>> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut news = self.news.clone();
        loop {
            news.borrow_and_update();
            {
                let seen = lock(&self.seen);
                if let Some(failed) = &seen.failed {
                    anyhow::bail!("the observer stopped: {failed}");
                }
                let times = match milestone {
                    Milestone::Ready => &seen.ready,
                    Milestone::Gone => &seen.gone,
                };
                let found: Vec<Instant> =
                    names.iter().filter_map(|n| times.get(n).copied()).collect();
                if found.len() == names.len() {
                    return Ok(found);
                }
            }
            let missing: Vec<&String> = {
                let seen = lock(&self.seen);
                let times = match milestone {
                    Milestone::Ready => &seen.ready,
                    Milestone::Gone => &seen.gone,
                };
                names.iter().filter(|n| !times.contains_key(*n)).collect()
            };
            match tokio::time::timeout_at(deadline, news.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => anyhow::bail!("the observer ended"),
                Err(_) => anyhow::bail!("not within {limit:?}: still waiting for {missing:?}"),
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn pods_kind() -> anyhow::Result<&'static Kind> {
    kinds::by_resource("", "pods").ok_or_else(|| anyhow::anyhow!("the sim serves no pods"))
}

/// Whether a pod (as stored) is Running with `Ready=True`.
fn running_and_ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn name_of(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

/// An apiserver's request counts of interest, as of one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    /// POST on the namespace's pods.
    creates: u64,
    /// PATCH on its pods (and their subresources).
    patches: u64,
    /// DELETE on its pods.
    deletes: u64,
    /// GET on one of its pods (not lists or watches: they are on the collection).
    gets: u64,
    /// Every request, of any method and path.
    all: u64,
    /// Every POST, PUT, PATCH and DELETE, of any path.
    write: u64,
}

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

impl Counts {
    fn of(api: &relaylet_sim::apiserver::ApiServer, namespace: &str) -> Counts {
        let pods = format!("/api/v1/namespaces/{namespace}/pods");
        let one = format!("{pods}/");
        let all_of = |method: &str| api.requests(method, "/");
        Counts {
            creates: api.requests("POST", &pods),
            patches: api.requests("PATCH", &one),
            deletes: api.requests("DELETE", &one),
            gets: api.requests("GET", &one),
            all: METHODS.iter().map(|m| all_of(m)).sum(),
            write: METHODS[1..].iter().map(|m| all_of(m)).sum(),
        }
    }

    fn writes(&self) -> u64 {
        self.write
    }

    /// What was counted since `before`.
    fn since(&self, before: &Counts) -> Counts {
        Counts {
            creates: self.creates.saturating_sub(before.creates),
            patches: self.patches.saturating_sub(before.patches),
            deletes: self.deletes.saturating_sub(before.deletes),
            gets: self.gets.saturating_sub(before.gets),
            all: self.all.saturating_sub(before.all),
            write: self.write.saturating_sub(before.write),
        }
    }
}

/// The relaylet process.
struct Relaylet {
    pid: u32,
    log: PathBuf,
    metrics: SocketAddr,
    child: Child,
}

impl Relaylet {
    /// relaylet as in a real install (env vars, a root kubeconfig, serving certificate files),
    /// pod sync on (its default), one replica.
    async fn spawn(root: &Cluster, dir: &Path) -> anyhow::Result<Relaylet> {
        let (mut command, _node_server_port, log) =
            super::stack::relaylet_command(root, dir, USER)?;
        let metrics = relaylet_sim::ports::free_loopback_port()?;
        let child = command
            .env("LEAF_POD_SYNC", "true")
            .env("METRICS_ADDR", metrics.to_string())
            .spawn()
            .context("starting relaylet serve")?;
        let pid = child.id().context("relaylet exited at once")?;
        Ok(Relaylet {
            pid,
            log,
            metrics,
            child,
        })
    }

    /// Its failed reconciles so far (`relaylet_pod_sync_errors_total`, both sides).
    async fn sync_errors(&self) -> anyhow::Result<f64> {
        self.metric("relaylet_pod_sync_errors_total").await
    }

    /// Its heap in use now (`relaylet_heap_in_use_bytes`), bytes.
    async fn heap_in_use(&self) -> anyhow::Result<f64> {
        self.metric("relaylet_heap_in_use_bytes").await
    }

    /// Metric `name` as its metrics port says now, summed over its series.
    async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let text = tokio::time::timeout(Duration::from_secs(10), scrape(self.metrics))
            .await
            .context("relaylet's metrics did not answer within 10 s")??;
        let body = text
            .split_once("\r\n\r\n")
            .map_or(text.as_str(), |(_, b)| b);
        let metrics = crate::testkit::metrics::parse(body);
        Ok(crate::testkit::metrics::sum(&metrics, name, &[]))
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// `GET /metrics` over plain HTTP/1.0: the whole answer, headers first.
async fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to relaylet's metrics port {addr}"))?;
    tcp.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    tcp.read_to_string(&mut text).await?;
    anyhow::ensure!(
        text.starts_with("HTTP/1.") && text.contains(" 200 "),
        "relaylet's metrics answered {:?}",
        text.lines().next().unwrap_or_default()
    );
    Ok(text)
}

/// The last `lines` lines of file `path` (empty if it cannot be read).
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let last: Vec<&str> = text.lines().rev().take(lines).collect();
    last.into_iter().rev().collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        assert_eq!(
            Size::for_mode(false, false),
            Size {
                pods: 1000,
                batch: 20,
                at_once: 1000,
            }
        );
        assert_eq!(Size::for_mode(false, true).pods, 200);
        assert_eq!(Size::for_mode(true, true).pods, 10);
        let names = names("r", 1000);
        assert_eq!(names[7], "r-00007");
        // No name is a prefix of another: the per-pod request counts match by prefix.
        assert!(names.iter().all(|n| n.len() == 7));
    }

    #[test]
    fn running_and_ready_needs_both() {
        let pod = |phase: &str, ready: &str| json!({"status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}});
        assert!(running_and_ready(&pod("Running", "True")));
        assert!(!running_and_ready(&pod("Running", "False")));
        assert!(!running_and_ready(&pod("Pending", "True")));
    }

    #[test]
    fn targets_are_judged() {
        let figure = |name: &'static str, direct: Option<f64>, relayed: f64| PodSyncFigure {
            name,
            unit: "",
            direct,
            relayed,
            ratio: None,
            n: 1,
        };
        let line = |figures: &[PodSyncFigure], row: &str| {
            targets(figures)
                .into_iter()
                .find(|l| l.starts_with(row))
                .unwrap()
        };
        let writes = "podsync_root_writes_per_pod";
        assert!(line(&[figure(writes, None, 2.5)], writes).ends_with("met (2.50)"));
        assert!(line(&[figure(writes, None, 3.5)], writes).contains("NOT met"));
        assert!(line(&[], writes).ends_with("not measured"));
        let memory = "podsync_memory_per_pod";
        assert!(line(&[figure(memory, Some(0.0), 1300.0)], memory).ends_with("met (1300.00)"));
        assert!(line(&[figure(memory, Some(0.0), 1400.0)], memory).contains("NOT met"));
    }
}

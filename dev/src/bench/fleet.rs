//! `relaylet-dev bench --only fleet`: relaylet against a fleet of leaves (issue 29).
//!
//! Starts a simulated root and as many simulated leaves as asked (100 by default; each its own
//! apiserver, and a kubelet stand-in running one pod shown in the root), then relaylet as its own
//! process (`relaylet serve`, configured by env vars as in a real install) and measures, in one
//! run:
//! - the time from the leaf Secrets' creation until every virtual Node is Ready;
//! - relaylet's memory per leaf (RSS with the fleet registered, over RSS before any Secret);
//! - its memory per leaf pod: 10,000 leaf-local pods (each with a 4 KiB annotation and a CPU
//!   request) are created across the leaves; once every virtual Node's allocatable shows them
//!   (relaylet has seen them all), RSS over its RSS just before they were created (after the
//!   idle window); and its RSS after they are deleted, over that same start;
//! - CPU seconds per idle leaf per hour, and the root apiserver writes per leaf per minute
//!   (Node status and node Lease) over an idle window, beside a kubelet's defaults, and what
//!   that first idle window adds to RSS;
//! - with three replicas (each its own process and address): the share of sessions each
//!   served, `kubectl exec`-like calls to every node through the root apiserver.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use relaylet_sim::apiserver::Store;
use relaylet_sim::cluster::{Cluster, ClusterOptions, SimContainer, SimPod};
use serde_json::json;
use tokio::process::{Child, Command};

use super::client::{self, PodRef, Route, Target};
use super::procfs;

const NAMESPACE: &str = "relaylet-system";
/// relaylet's identity in both clusters (a cluster admin: this measures scale, not RBAC).
const USER: &str = "relaylet-fleet";
/// Bytes of the annotation every bulk leaf pod carries.
const ANNOTATION_BYTES: usize = 4096;
/// What a kubelet writes per minute with its defaults: its node Lease every 10 s and its Node
/// status every 5 minutes when nothing changes (`nodeStatusReportFrequency`).
const KUBELET_WRITES_PER_MINUTE: f64 = 6.0 + 0.2;

/// How big a fleet to measure.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub leaves: usize,
    pub pods: usize,
    /// The idle window CPU and writes are measured over.
    pub idle: Duration,
    /// Calls made to every node for the session share.
    pub calls_per_node: usize,
}

impl Size {
    /// The mode's size; `RELAYLET_FLEET_LEAVES` sets the number of leaves (100 pods each),
    /// `RELAYLET_FLEET_PODS` the number of leaf pods in all.
    pub fn for_mode(smoke: bool, quick: bool) -> Size {
        let mut size = Size::of_mode(smoke, quick);
        let number = |name: &str| std::env::var(name).ok().and_then(|n| n.parse().ok());
        if let Some(leaves) = number("RELAYLET_FLEET_LEAVES") {
            size.leaves = leaves;
            size.pods = leaves * 100;
        }
        if let Some(pods) = number("RELAYLET_FLEET_PODS") {
            size.pods = pods;
        }
        size
    }

    fn of_mode(smoke: bool, quick: bool) -> Size {
        if smoke {
            Size {
                leaves: 4,
                pods: 200,
                // Longer than a node Lease's 10 s renewal, so every leaf writes in the window.
                idle: Duration::from_secs(12),
                calls_per_node: 1,
            }
        } else if quick {
            Size {
                leaves: 30,
                pods: 3_000,
                idle: Duration::from_secs(20),
                calls_per_node: 2,
            }
        } else {
            Size {
                leaves: 100,
                pods: 10_000,
                idle: Duration::from_secs(60),
                calls_per_node: 3,
            }
        }
    }
}

/// One figure of the fleet run.
#[derive(Debug, Clone)]
pub struct FleetFigure {
    pub name: &'static str,
    pub value: f64,
    pub unit: &'static str,
}

/// Measures the fleet; the figures in order.
pub async fn run(size: Size) -> anyhow::Result<Vec<FleetFigure>> {
    let files = tempfile::Builder::new()
        .prefix("relaylet-fleet-")
        .tempdir()?;
    let fleet = Fleet::start(size, files.path()).await?;
    let mut out = Vec::new();
    let mut figure = |name, value, unit| {
        eprintln!("  {name}: {value:.3} {unit}");
        out.push(FleetFigure { name, value, unit });
    };

    // One replica.
    let one = Replica::spawn(&fleet, 0, files.path(), true).await?;
    // Its memory before any leaf (after its watches and caches have started).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_empty = procfs::rss_kib(one.pid)?;
    let started = Instant::now();
    fleet.register_leaves()?;
    fleet
        .wait(
            Duration::from_secs(600),
            "every virtual Node Ready",
            |nodes| nodes.len() == size.leaves && nodes.iter().all(ready),
        )
        .await?;
    figure(
        "fleet_time_to_all_ready",
        started.elapsed().as_secs_f64(),
        "s",
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_fleet = procfs::rss_kib(one.pid)?;
    figure(
        "fleet_memory_per_leaf",
        (rss_fleet.saturating_sub(rss_empty)) as f64 / size.leaves as f64,
        "KiB",
    );

    // Idle: CPU and root writes.
    let cpu_before = procfs::cpu_time(one.pid)?;
    let rv_before = fleet.root_store().revision();
    tokio::time::sleep(size.idle).await;
    let cpu = procfs::cpu_time(one.pid)?.saturating_sub(cpu_before);
    let (node_writes, presence_writes) = fleet.writes_since(rv_before)?;
    let minutes = size.idle.as_secs_f64() / 60.0;
    figure(
        "fleet_cpu_per_idle_leaf_hour",
        cpu.as_secs_f64() / size.leaves as f64 * (3600.0 / size.idle.as_secs_f64()),
        "s",
    );
    figure(
        "fleet_root_writes_per_leaf_minute",
        node_writes as f64 / size.leaves as f64 / minutes,
        "writes",
    );
    figure(
        "kubelet_writes_per_node_minute",
        KUBELET_WRITES_PER_MINUTE,
        "writes",
    );
    figure(
        "fleet_presence_writes_per_replica_minute",
        presence_writes as f64 / minutes,
        "writes",
    );
    // The pods' figures start from here, not from before the idle window: what the idle
    // minute itself adds is its own figure.
    let rss_start = procfs::rss_kib(one.pid)?;
    figure(
        "fleet_idle_rss_growth_per_minute",
        rss_start.saturating_sub(rss_fleet) as f64 / minutes,
        "KiB",
    );

    // Leaf pods: memory per pod, and back after they go.
    let cpu_before_pods = fleet.allocatable_cpu_millis();
    fleet.create_bulk_pods()?;
    let per_leaf = size.pods / size.leaves;
    fleet
        .wait(
            Duration::from_secs(600),
            "every virtual Node shows its leaf pods",
            |nodes| {
                nodes.iter().all(|n| {
                    allocatable_millis(n).is_some_and(|m| {
                        cpu_before_pods
                            .get(&name(n))
                            .is_some_and(|before| *before - m == per_leaf as i64)
                    })
                })
            },
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_pods = procfs::rss_kib(one.pid)?;
    figure(
        "fleet_memory_per_leaf_pod",
        rss_pods.saturating_sub(rss_start) as f64 * 1024.0 / (per_leaf * size.leaves) as f64,
        "B",
    );
    fleet.delete_bulk_pods()?;
    fleet
        .wait(
            Duration::from_secs(600),
            "every virtual Node back to its capacity",
            |nodes| {
                nodes
                    .iter()
                    .all(|n| allocatable_millis(n) == cpu_before_pods.get(&name(n)).copied())
            },
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_after = procfs::rss_kib(one.pid)?;
    figure(
        "fleet_rss_after_pods_deleted_vs_before",
        rss_after as f64 / rss_start as f64,
        "x",
    );
    one.stop().await;

    // Three replicas: the share of sessions each serves.
    let mut three = Vec::new();
    for i in 0..3 {
        three.push(Replica::spawn(&fleet, i, files.path(), false).await?);
    }
    let names: Vec<String> = three.iter().map(|r| r.name.clone()).collect();
    let ips: BTreeMap<String, String> = three
        .iter()
        .map(|r| (r.name.clone(), r.ip.to_string()))
        .collect();
    let room = size.leaves.div_ceil(3);
    let spread = fleet
        .wait(
            Duration::from_secs(600),
            "the virtual Nodes spread over three replicas",
            |nodes| {
                let mut loads: BTreeMap<String, usize> = BTreeMap::new();
                let placed = nodes.iter().all(|n| {
                    let writer = served_by(n);
                    let ok = ready(n) && ips.get(&writer) == first_address(n).as_ref();
                    *loads.entry(writer).or_default() += 1;
                    ok
                });
                placed
                    && nodes.len() == size.leaves
                    && loads.keys().all(|w| names.contains(w))
                    && loads.values().all(|l| *l <= room)
            },
        )
        .await;
    if let Err(err) = spread {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for n in fleet.nodes() {
            *seen
                .entry(format!("{}@{:?}", served_by(&n), first_address(&n)))
                .or_default() += 1;
        }
        let logs: Vec<String> = three
            .iter()
            .map(|r| {
                let log = std::fs::read_to_string(files.path().join(format!("{}.log", r.name)))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                format!(
                    "{}:\n{}",
                    r.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect();
        anyhow::bail!("{err}: writers {seen:?}\n{}", logs.join("\n"));
    }
    // The pod exec subresource of the root apiserver, which dials the Node's first address.
    let admin = fleet
        .root
        .ca
        .issue_client("fleet-admin", &["system:masters"])?;
    let root = Target {
        route: Route::Direct,
        addr: fleet
            .root
            .api
            .url()
            .trim_start_matches("https://")
            .parse()
            .context("root apiserver address")?,
        tls: fleet.root.ca.client_config(Some(&admin))?,
    };
    for _ in 0..size.calls_per_node {
        for i in 0..size.leaves {
            let pod = PodRef {
                namespace: "default".into(),
                name: format!("work-{i}"),
            };
            client::exec_true(&root, &pod)
                .await
                .with_context(|| format!("exec in default/work-{i} through the root"))?;
        }
    }
    let calls = (size.calls_per_node * size.leaves) as f64;
    // Counted when each session ends: give the last ones a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut max_share: f64 = 0.0;
    for r in &three {
        let served = r.sessions().await?;
        eprintln!("  {} served {served} of {calls} sessions", r.name);
        max_share = max_share.max(served / (calls / 3.0));
    }
    figure("fleet_max_replica_share_vs_even", max_share, "x");
    for r in three {
        r.stop().await;
    }
    Ok(out)
}

/// The target lines for the fleet figures.
pub fn targets(figures: &[FleetFigure]) -> Vec<String> {
    let find = |name: &str| figures.iter().find(|f| f.name == name).map(|f| f.value);
    let verdict = |ok: Option<bool>| match ok {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    };
    let per_pod = find("fleet_memory_per_leaf_pod");
    let back = find("fleet_rss_after_pods_deleted_vs_before");
    let share = find("fleet_max_replica_share_vs_even");
    vec![
        format!(
            "fleet_memory_per_leaf_pod <= 1024 B: {}",
            verdict(per_pod.map(|b| b <= 1024.0))
        ),
        format!(
            "fleet_rss_after_pods_deleted_vs_before <= 1.10: {}",
            verdict(back.map(|r| r <= 1.10))
        ),
        format!(
            "fleet_max_replica_share_vs_even <= 1.5: {}",
            verdict(share.map(|s| s <= 1.5))
        ),
    ]
}

/// The root and the leaves.
struct Fleet {
    size: Size,
    root: Cluster,
    leaves: Vec<Cluster>,
    kubeconfig: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    port: u16,
}

impl Fleet {
    async fn start(size: Size, dir: &Path) -> anyhow::Result<Fleet> {
        let root = Cluster::start(ClusterOptions::new("root"))
            .await
            .context("starting the root cluster")?;
        // Every write of the measured windows stays countable.
        root.api.store().set_history_limit(2_000_000);
        super::stack::create_namespace(&root, NAMESPACE)?;
        let mut leaves = Vec::new();
        for i in 0..size.leaves {
            let name = format!("leaf-{i}");
            let leaf = Cluster::start(ClusterOptions::new(&name))
                .await
                .with_context(|| format!("starting {name}"))?;
            let node = format!("{name}-node");
            leaf.add_node(&node).await?;
            let pod = SimPod {
                namespace: "default".into(),
                name: format!("work-{i}"),
                containers: vec![SimContainer {
                    name: "main".into(),
                    command: vec!["sleep".into(), "infinity".into()],
                    ..Default::default()
                }],
                ..Default::default()
            };
            crate::sandbox::sync_pod(&root, &format!("relaylet-{name}"), &leaf, &node, &pod)
                .await
                .with_context(|| format!("the pod of {name}"))?;
            leaves.push(leaf);
        }
        let kubeconfig = dir.join("root.kubeconfig");
        std::fs::write(&kubeconfig, root.kubeconfig(USER, &["system:masters"])?)?;
        let serving = root
            .ca
            .issue_server(&["127.0.0.1", "127.0.0.2", "127.0.0.3"])?;
        let (cert, key) = (dir.join("relaylet.crt"), dir.join("relaylet.key"));
        std::fs::write(&cert, &serving.cert_pem)?;
        std::fs::write(&key, &serving.key_pem)?;
        let port = relaylet_sim::ports::free_loopback_port()?.port();
        Ok(Fleet {
            size,
            root,
            leaves,
            kubeconfig,
            cert,
            key,
            port,
        })
    }

    fn root_store(&self) -> &Store {
        self.root.api.store()
    }

    /// Creates every leaf's Secret, as a user registers leaves.
    fn register_leaves(&self) -> anyhow::Result<()> {
        for (i, leaf) in self.leaves.iter().enumerate() {
            let name = format!("leaf-{i}");
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(format!("leaf-{name}")),
                    namespace: Some(NAMESPACE.into()),
                    labels: Some(BTreeMap::from([(
                        relaylet::config::DEFAULT_LEAF_SECRET_LABEL.to_string(),
                        name,
                    )])),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(
                    relaylet::leaf::KUBECONFIG_KEY.to_string(),
                    ByteString(leaf.kubeconfig(USER, &["system:masters"])?.into_bytes()),
                )])),
                ..Default::default()
            };
            self.root_store()
                .create_typed(&secret)
                .map_err(|e| anyhow::anyhow!("creating a leaf Secret: {e}"))?;
        }
        Ok(())
    }

    /// The virtual Nodes.
    fn nodes(&self) -> Vec<Node> {
        self.root_store()
            .list_typed::<Node>(None)
            .unwrap_or_default()
            .into_iter()
            .filter(|n| name(n).starts_with("relaylet-leaf-"))
            .collect()
    }

    /// Polls the virtual Nodes until `done` holds.
    async fn wait(
        &self,
        limit: Duration,
        what: &str,
        mut done: impl FnMut(&[Node]) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        while !done(&self.nodes()) {
            anyhow::ensure!(Instant::now() < deadline, "{what}: not within {limit:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Writes since `rv`: (virtual Node and node Lease writes, presence Lease writes).
    fn writes_since(&self, rv: u64) -> anyhow::Result<(usize, usize)> {
        let (events, _) = self
            .root_store()
            .events_since(rv)
            .map_err(|e| anyhow::anyhow!("root history: {e:?}"))?;
        let node = events
            .iter()
            .filter(|e| {
                e.key.name.starts_with("relaylet-leaf-")
                    && (e.key.resource == "nodes" || e.key.resource == "leases")
            })
            .count();
        let presence = events
            .iter()
            .filter(|e| {
                e.key.resource == "leases"
                    && e.key.name.starts_with(relaylet::replicas::PRESENCE_PREFIX)
            })
            .count();
        Ok((node, presence))
    }

    fn allocatable_cpu_millis(&self) -> BTreeMap<String, i64> {
        self.nodes()
            .iter()
            .filter_map(|n| Some((name(n), allocatable_millis(n)?)))
            .collect()
    }

    /// Creates `size.pods` leaf-local pods across the leaves, each requesting 1m CPU and
    /// carrying a 4 KiB annotation (API objects only: no process runs them).
    fn create_bulk_pods(&self) -> anyhow::Result<()> {
        let per_leaf = self.size.pods / self.size.leaves;
        let annotation = "x".repeat(ANNOTATION_BYTES);
        for (i, leaf) in self.leaves.iter().enumerate() {
            if leaf.api.store().get_typed::<Namespace>("", "bulk").is_err() {
                super::stack::create_namespace(leaf, "bulk")?;
            }
            for p in 0..per_leaf {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {
                        "namespace": "bulk", "name": format!("bulk-{p}"),
                        "annotations": {"example.com/payload": annotation},
                        "labels": {"app": "bulk"},
                    },
                    "spec": {"nodeName": format!("leaf-{i}-node"), "containers": [{
                        "name": "c", "image": "registry.example/bulk:1",
                        "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}},
                    }]},
                    "status": {"phase": "Running"},
                }))?;
                leaf.api
                    .store()
                    .create_typed(&pod)
                    .map_err(|e| anyhow::anyhow!("creating a bulk pod: {e}"))?;
            }
        }
        Ok(())
    }

    fn delete_bulk_pods(&self) -> anyhow::Result<()> {
        let per_leaf = self.size.pods / self.size.leaves;
        for leaf in &self.leaves {
            for p in 0..per_leaf {
                leaf.api
                    .store()
                    .delete_typed::<Pod>("bulk", &format!("bulk-{p}"))
                    .map_err(|e| anyhow::anyhow!("deleting a bulk pod: {e}"))?;
            }
        }
        Ok(())
    }
}

/// A relaylet replica process.
struct Replica {
    name: String,
    ip: IpAddr,
    pid: u32,
    metrics: SocketAddr,
    child: Child,
}

impl Replica {
    /// Starts replica `i` on 127.0.0.{i+1}; `alone` turns leader election (and so presence)
    /// off, as a one-replica install may.
    async fn spawn(fleet: &Fleet, i: usize, dir: &Path, alone: bool) -> anyhow::Result<Replica> {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1 + i as u8));
        let metrics = SocketAddr::new(ip, relaylet_sim::ports::free_loopback_port()?.port());
        let name = format!("relaylet-{i}");
        if !alone {
            // With leader election a replica counts only as a Running pod of its install.
            let admin =
                crate::sandbox::kube_client(&std::fs::read_to_string(&fleet.kubeconfig)?).await?;
            crate::testkit::replica_pod::running(&admin, NAMESPACE, &name, &ip.to_string()).await?;
        }
        let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
        let child = Command::new(std::env::current_exe()?)
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", &fleet.kubeconfig)
            .env("LEAF_NODE_IP", ip.to_string())
            .env("NODE_SERVER_PORT", fleet.port.to_string())
            .env("AUTH_MODE", "webhook")
            .env("APISERVER_CERT_LOCATION", &fleet.cert)
            .env("APISERVER_KEY_LOCATION", &fleet.key)
            .env("POD_NAME", &name)
            .env("POD_NAMESPACE", NAMESPACE)
            .env("LEADER_ELECT", if alone { "false" } else { "true" })
            .env("METRICS_ADDR", metrics.to_string())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .context("starting relaylet serve")?;
        let pid = child.id().context("relaylet exited at once")?;
        Ok(Replica {
            name,
            ip,
            pid,
            metrics,
            child,
        })
    }

    /// Sessions this replica served (`relaylet_sessions_total`, every kind and leaf).
    async fn sessions(&self) -> anyhow::Result<f64> {
        let got = crate::testkit::metrics::http_get(self.metrics, "/metrics").await;
        let scrape = crate::testkit::metrics::parse(&got.body);
        Ok(crate::testkit::metrics::sum(
            &scrape,
            "relaylet_sessions_total",
            &[],
        ))
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn served_by(node: &Node) -> String {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("relaylet.io/served-by"))
        .cloned()
        .unwrap_or_default()
}

fn first_address(node: &Node) -> Option<String> {
    Some(
        node.status
            .as_ref()?
            .addresses
            .as_ref()?
            .first()?
            .address
            .clone(),
    )
}

fn allocatable_millis(node: &Node) -> Option<i64> {
    let cpu = node.status.as_ref()?.allocatable.as_ref()?.get("cpu")?;
    let text = cpu.0.as_str();
    match text.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => text
            .parse::<f64>()
            .ok()
            .map(|c| (c * 1000.0).round() as i64),
    }
}

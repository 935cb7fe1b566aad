//! Integration tests of the virtual node controller (issue 5) against the sim's root and leaf
//! apiserver stand-ins: the Node appears when a leaf Secret is registered, its capacity follows
//! the leaf without a write storm, its Lease is renewed, its Ready condition follows the leaf
//! apiserver's health, leadership moves to a surviving replica after a crash without the Node
//! going NotReady, and the root apiserver's real address selection dials relaylet.
//!
//! Each test builds its own root and leaf clusters because every test mutates them. Each
//! relaylet replica runs on a runtime of its own, so a crash is simulated honestly: the runtime
//! is shut down, every task of the replica stops at its next await, and nothing runs a release
//! path (unlike a graceful `shutdown.begin`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::AttachParams;
use relaylet::config::Config;
use relaylet::sandbox::kube_client;
use relaylet::shutdown::Shutdown;
use relaylet_sim::apiserver::{ApiServer, ApiServerConfig, Store};
use relaylet_sim::cluster::{Cluster, ClusterOptions, SimContainer, SimPod};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

const NAMESPACE: &str = "relaylet-system";
const LEAF: &str = "leaf-a";
const NODE: &str = "relaylet-leaf-a";

/// Polls `check` every 50 ms until it yields a value or `within` passes; returns the value and
/// how long it took.
async fn wait_for<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> (T, Duration) {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return (value, start.elapsed());
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn node_of(store: &Store) -> Option<Node> {
    store.get_typed::<Node>("", NODE).ok()
}

fn lease_of(store: &Store) -> Option<Lease> {
    store.get_typed::<Lease>("kube-node-lease", NODE).ok()
}

/// The Node's Ready condition as (status, reason).
fn ready(node: &Node) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn is_ready(node: &Node) -> bool {
    ready(node).is_some_and(|(s, _)| s == "True")
}

fn first_address(node: &Node) -> Option<(String, String)> {
    let a = node.status.as_ref()?.addresses.as_ref()?.first()?;
    Some((a.type_.clone(), a.address.clone()))
}

fn allocatable(node: &Node, resource: &str) -> Option<String> {
    Some(
        node.status
            .as_ref()?
            .allocatable
            .as_ref()?
            .get(resource)?
            .0
            .clone(),
    )
}

fn renew_time(lease: &Lease) -> Option<Timestamp> {
    Some(lease.spec.as_ref()?.renew_time.as_ref()?.0)
}

/// Writes of `kind` (`nodes`, `leases`) named `name` into `store` since revision `since`.
fn writes_since(store: &Store, since: u64, resource: &str, name: &str) -> usize {
    let (events, _) = store
        .events_since(since)
        .unwrap_or_else(|e| panic!("history since {since}: {e:?}"));
    events
        .iter()
        .filter(|e| e.key.resource == resource && e.key.name == name)
        .count()
}

/// The Ready conditions other than True written to the Node since revision `since`.
fn not_ready_writes_since(store: &Store, since: u64) -> Vec<String> {
    let (events, _) = store
        .events_since(since)
        .unwrap_or_else(|e| panic!("history since {since}: {e:?}"));
    events
        .iter()
        .filter(|e| e.key.resource == "nodes" && e.key.name == NODE)
        .filter_map(|e| serde_json::from_value::<Node>((*e.object).clone()).ok())
        .filter_map(|n| ready(&n))
        .filter(|(status, _)| status != "True")
        .map(|(status, reason)| format!("{status}/{reason}"))
        .collect()
}

/// A Ready leaf node as a kubelet would have registered it.
fn leaf_node(name: &str, ip: &str, cpu: &str, memory: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name}
            ],
            "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "6.1",
                "osImage": "sim", "containerRuntimeVersion": "sim://1", "kubeletVersion": "v1.35.0",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}
        }
    }))
    .expect("leaf node JSON")
}

/// A Running leaf-local pod (not standing for any root pod) with requests, on `node`.
fn leaf_local_pod(name: &str, node: &str, cpu: &str, memory: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "kube-system", "name": name},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
        ]},
        "status": {"phase": "Running"}
    }))
    .expect("leaf pod JSON")
}

/// A root cluster with the namespace relaylet runs in.
async fn root_cluster(preferred_address_types: Option<&[&str]>) -> Cluster {
    let mut options = ClusterOptions::new("root");
    if let Some(order) = preferred_address_types {
        options.preferred_address_types = order.iter().map(|s| s.to_string()).collect();
    }
    let root = Cluster::start(options).await.expect("root cluster starts");
    root.api
        .store()
        .create_typed(&Namespace {
            metadata: ObjectMeta {
                name: Some(NAMESPACE.to_string()),
                ..Default::default()
            },
            ..Default::default()
        })
        .expect("namespace created");
    root
}

/// The labelled kubeconfig Secret that registers `leaf` with relaylet.
fn leaf_secret(leaf: &Cluster) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(format!("leaf-{LEAF}")),
            namespace: Some(NAMESPACE.to_string()),
            labels: Some(BTreeMap::from([(
                relaylet::config::DEFAULT_LEAF_SECRET_LABEL.to_string(),
                LEAF.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            relaylet::leaf::KUBECONFIG_KEY.to_string(),
            ByteString(
                leaf.admin_kubeconfig()
                    .expect("leaf kubeconfig")
                    .into_bytes(),
            ),
        )])),
        ..Default::default()
    }
}

/// A port number for `NODE_SERVER_PORT`, which must be 1-65535 and which the Node names until
/// the node's own listener is bound (so not port 0): see relaylet_sim::ports.
fn free_port() -> u16 {
    relaylet_sim::ports::free_loopback_port()
        .expect("free port")
        .port()
}

/// One relaylet replica on a runtime of its own.
struct Replica {
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: Shutdown,
    running: relaylet::Running,
}

impl Replica {
    /// Starts relaylet against `root` as pod `pod_name` with pod IP `ip`, serving on `port`.
    async fn start(
        root: &Cluster,
        pod_name: &str,
        ip: &str,
        port: u16,
        extra: &[(&str, &str)],
    ) -> Replica {
        let mut env: BTreeMap<String, String> = BTreeMap::from([
            ("LEAF_NODE_IP".into(), ip.into()),
            ("NODE_SERVER_PORT".into(), port.to_string()),
            // Each replica's own operations port (the default 0.0.0.0:9090 would collide).
            ("METRICS_ADDR".into(), format!("{ip}:0")),
            ("AUTH_MODE".into(), "webhook".into()),
            ("POD_NAME".into(), pod_name.into()),
            ("POD_NAMESPACE".into(), NAMESPACE.into()),
        ]);
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let config = Config::from_lookup(|name| env.get(name).cloned()).expect("config");
        let kubeconfig = root
            .kubeconfig(
                &format!("system:serviceaccount:{NAMESPACE}:{pod_name}"),
                &["system:masters"],
            )
            .expect("root kubeconfig");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("replica runtime");
        let shutdown = Shutdown::default();
        let stop = shutdown.clone();
        let running = runtime
            .spawn(async move {
                let client = kube_client(&kubeconfig).await?;
                relaylet::start(config, client, stop).await
            })
            .await
            .expect("start task")
            .expect("relaylet starts");
        Replica {
            runtime: Some(runtime),
            shutdown,
            running,
        }
    }

    /// Stops like a killed process: every task ends, nothing is released or cleaned up.
    fn crash(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    fn is_leader(&self) -> bool {
        self.running.leadership.is_leader()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.shutdown.begin.cancel();
        self.shutdown.sessions.cancel();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A leaf cluster with one Ready node `a` (no kubelet: these tests need only its API objects).
async fn leaf_with_node() -> Cluster {
    let leaf = Cluster::start(ClusterOptions::new(LEAF))
        .await
        .expect("leaf starts");
    leaf.api
        .store()
        .create_typed(&leaf_node("a", "10.0.0.1", "4", "8Gi"))
        .expect("leaf node");
    leaf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_appears_follows_capacity_quietly_renews_its_lease_and_goes_with_its_secret() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let root = root_cluster(None).await;
        let leaf = leaf_with_node().await;
        let port = free_port();
        let mut replica = Replica::start(&root, "relaylet-0", "127.0.0.1", port, &[]).await;
        wait_for("leadership", Duration::from_secs(5), || {
            replica.is_leader().then_some(())
        })
        .await;
        let store = root.api.store().clone();

        // Registering the leaf: the Node appears within 2 s of the Secret.
        let before_secret = store.revision();
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        let (_, appeared) =
            wait_for("node appears", Duration::from_secs(2), || node_of(&store)).await;
        let (node, ready_after) = wait_for("node Ready", Duration::from_secs(10), || {
            node_of(&store).filter(is_ready)
        })
        .await;
        eprintln!("node appeared {appeared:?} after the Secret, Ready {ready_after:?} later");
        assert_eq!(ready(&node).map(|r| r.1).as_deref(), Some("LeafReady"));
        // The very first status already says Ready: a healthy leaf is not shown NotReady
        // while relaylet's leaf watches are still listing.
        assert_eq!(
            not_ready_writes_since(&store, before_secret),
            Vec::<String>::new()
        );

        // What the root apiserver reads to dial relaylet.
        let status = node.status.clone().expect("status");
        let addresses: Vec<(String, String)> = status
            .addresses
            .iter()
            .flatten()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect();
        assert_eq!(
            addresses,
            [("InternalDNS", "127.0.0.1"), ("InternalIP", "10.0.0.1")]
                .map(|(t, a)| (t.to_string(), a.to_string()))
        );
        // The kubelet port written is the node's own listener (above the shared port), so
        // node-level calls can tell virtual nodes apart; until it is bound, the shared port.
        let port_written = status
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port)
            .expect("a kubelet port");
        assert!(
            (i32::from(port)..=i32::from(port) + 1000).contains(&port_written),
            "{port_written}"
        );
        let (own, _) = wait_for("the node's own port", Duration::from_secs(5), || {
            replica.running.node_ports.addr_of(NODE)
        })
        .await;
        wait_for(
            "the Node names its own port",
            Duration::from_secs(5),
            || {
                node_of(&store)
                    .and_then(|n| n.status?.daemon_endpoints?.kubelet_endpoint)
                    .filter(|e| e.port == i32::from(own.port()))
            },
        )
        .await;
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("relaylet.io/leaf-cluster").map(String::as_str),
            Some(LEAF)
        );
        assert!(!labels.contains_key("kubernetes.io/hostname"));
        assert_eq!(allocatable(&node, "cpu").as_deref(), Some("4"));
        assert_eq!(allocatable(&node, "pods").as_deref(), Some("110"));

        // The node Lease: held for the Node, owned by it, 40 s.
        let (lease, _) = wait_for("node lease", Duration::from_secs(5), || lease_of(&store)).await;
        let spec = lease.spec.clone().expect("lease spec");
        assert_eq!(spec.holder_identity.as_deref(), Some(NODE));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        let owners = lease.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].name.as_str()),
            ("Node", NODE)
        );
        assert_eq!(Some(&owners[0].uid), node.metadata.uid.as_ref());

        // Watch the Lease's renewals while the leaf changes.
        let lease_store = store.clone();
        let renewals = tokio::spawn(async move {
            let mut seen: Vec<Timestamp> = Vec::new();
            let until = Instant::now() + Duration::from_secs(24);
            while Instant::now() < until {
                if let Some(t) = lease_of(&lease_store).as_ref().and_then(renew_time)
                    && seen.last() != Some(&t)
                {
                    seen.push(t);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        });

        // A new leaf node adds its allocatable.
        leaf.api
            .store()
            .create_typed(&leaf_node("b", "10.0.0.2", "2", "4Gi"))
            .expect("second leaf node");
        let (_, took) = wait_for("capacity with node b", Duration::from_secs(10), || {
            node_of(&store).filter(|n| allocatable(n, "cpu").as_deref() == Some("6"))
        })
        .await;
        eprintln!("allocatable followed a new leaf node in {took:?}");
        // A leaf-local pod's requests are taken off.
        leaf.api
            .store()
            .create_typed(&leaf_local_pod("local", "a", "500m", "1Gi"))
            .expect("leaf pod");
        let (node, took) = wait_for("capacity minus the pod", Duration::from_secs(10), || {
            node_of(&store).filter(|n| allocatable(n, "cpu").as_deref() == Some("5500m"))
        })
        .await;
        eprintln!("allocatable followed a leaf-local pod in {took:?}");
        assert_eq!(
            allocatable(&node, "memory"),
            Some((11u64 << 30).to_string())
        );
        assert_eq!(allocatable(&node, "pods").as_deref(), Some("219"));
        let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
        assert_eq!(addresses.len(), 3, "{addresses:?}");

        // The Ready message counts Ready leaf nodes; it catches up at the next health probe.
        wait_for("probe sees both nodes", Duration::from_secs(12), || {
            node_of(&store).filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                    .and_then(|c| c.message.as_deref())
                    .is_some_and(|m| m.contains("2 ready node"))
            })
        })
        .await;
        // No write storm: over a quiet 10 s the Node is written at most once (a heartbeat),
        // and the Lease once per renewal.
        let since = store.revision();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let node_writes = writes_since(&store, since, "nodes", NODE);
        let lease_writes = writes_since(&store, since, "leases", NODE);
        eprintln!("quiet 10 s: {node_writes} node writes, {lease_writes} lease writes");
        assert!(
            node_writes <= 1,
            "{node_writes} node writes in a quiet 10 s"
        );
        assert!(
            (1..=2).contains(&lease_writes),
            "{lease_writes} lease writes in 10 s"
        );

        let seen = renewals.await.expect("lease observer");
        assert!(
            seen.len() >= 3,
            "lease renewed only {} times in 24 s: {seen:?}",
            seen.len()
        );
        for pair in seen.windows(2) {
            let gap = pair[1].duration_since(pair[0]).as_secs_f64();
            assert!(
                (9.0..=11.5).contains(&gap),
                "lease renewal gap {gap}s: {seen:?}"
            );
        }

        // relaylet restarts (a crash, then the pod comes back): the Ready Node is not flipped
        // to NotReady by the new process's first round, and the new process takes over.
        replica.crash();
        let restarted = store.revision();
        let renewed_before = lease_of(&store).as_ref().and_then(renew_time);
        replica = Replica::start(&root, "relaylet-0", "127.0.0.1", port, &[]).await;
        wait_for(
            "the restarted relaylet renews the lease",
            Duration::from_secs(10),
            || (lease_of(&store).as_ref().and_then(renew_time) > renewed_before).then_some(()),
        )
        .await;
        assert_eq!(
            not_ready_writes_since(&store, restarted),
            Vec::<String>::new()
        );

        // Deleting the Secret removes the Node and its Lease.
        store
            .delete_typed::<Secret>(NAMESPACE, &format!("leaf-{LEAF}"))
            .expect("secret deleted");
        let (_, took) = wait_for("node and lease gone", Duration::from_secs(5), || {
            (node_of(&store).is_none() && lease_of(&store).is_none()).then_some(())
        })
        .await;
        eprintln!("node and lease removed {took:?} after the Secret");
        drop(replica);
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaf_outage_makes_the_node_not_ready_until_it_returns_and_shutdown_stops_writes() {
    tokio::time::timeout(Duration::from_secs(110), async {
        let root = root_cluster(None).await;
        let mut leaf = leaf_with_node().await;
        let replica = Replica::start(
            &root,
            "relaylet-0",
            "127.0.0.1",
            free_port(),
            &[("LEADER_ELECT", "false")],
        )
        .await;
        let store = root.api.store().clone();
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        wait_for("node Ready", Duration::from_secs(10), || {
            node_of(&store).filter(is_ready)
        })
        .await;

        // The leaf apiserver goes away.
        let leaf_addr = leaf.api.addr;
        let leaf_store = leaf.api.store().clone();
        let down_at = Timestamp::now();
        leaf.api.stop();
        let (node, not_ready_after) = wait_for("Ready=False", Duration::from_secs(60), || {
            node_of(&store).filter(|n| !is_ready(n))
        })
        .await;
        eprintln!("Ready=False {not_ready_after:?} after the leaf apiserver stopped");
        assert_eq!(
            ready(&node),
            Some(("False".to_string(), "LeafUnreachable".to_string()))
        );
        // relaylet itself is alive, so the node Lease is still renewed during the outage.
        wait_for(
            "lease renewed during the outage",
            Duration::from_secs(12),
            || {
                lease_of(&store)
                    .as_ref()
                    .and_then(renew_time)
                    .filter(|t| *t > down_at)
            },
        )
        .await;

        // It comes back on the same address with its data.
        let mut config = ApiServerConfig::new(LEAF, leaf.ca.clone());
        config.listen = leaf_addr;
        leaf.api = ApiServer::start_with_store(config, leaf_store)
            .await
            .expect("leaf apiserver restarts");
        let (node, ready_after) = wait_for("Ready again", Duration::from_secs(30), || {
            node_of(&store).filter(is_ready)
        })
        .await;
        eprintln!("Ready=True {ready_after:?} after the leaf apiserver returned");
        assert_eq!(ready(&node).map(|r| r.1).as_deref(), Some("LeafReady"));
        // The leaf watches reconnected: a node added after the restart is counted.
        leaf.api
            .store()
            .create_typed(&leaf_node("b", "10.0.0.2", "2", "4Gi"))
            .expect("second leaf node");
        wait_for(
            "capacity after the restart",
            Duration::from_secs(10),
            || node_of(&store).filter(|n| allocatable(n, "cpu").as_deref() == Some("6")),
        )
        .await;

        // A stopped relaylet (here without leader election, so always "leader") writes
        // nothing more: its per-leaf loops end with it.
        replica.shutdown.begin.cancel();
        replica.shutdown.sessions.cancel();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let since = store.revision();
        tokio::time::sleep(Duration::from_secs(12)).await;
        let writes = writes_since(&store, since, "nodes", NODE)
            + writes_since(&store, since, "leases", NODE);
        assert_eq!(
            writes, 0,
            "a stopped relaylet still wrote its Node or Lease"
        );
        drop(replica);
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_is_replaced_without_the_node_going_not_ready() {
    tokio::time::timeout(Duration::from_secs(100), async {
        let root = root_cluster(None).await;
        let leaf = leaf_with_pod(&root).await;
        let port = free_port();
        let a = Replica::start(&root, "relaylet-a", "127.0.0.1", port, &[]).await;
        wait_for("a leads", Duration::from_secs(5), || {
            a.is_leader().then_some(())
        })
        .await;
        let b = Replica::start(&root, "relaylet-b", "127.0.0.2", port, &[]).await;
        let store = root.api.store().clone();
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        wait_for("node Ready", Duration::from_secs(10), || {
            node_of(&store).filter(is_ready)
        })
        .await;

        // Only the leader writes: over a few seconds every version of the Node names a.
        let since = store.revision();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(a.is_leader() && !b.is_leader());
        let (events, _) = store.events_since(since).expect("history");
        for event in events.iter().filter(|e| e.key.resource == "nodes") {
            let node: Node = serde_json::from_value((*event.object).clone()).expect("node");
            assert_eq!(
                first_address(&node),
                Some(("InternalDNS".to_string(), "127.0.0.1".to_string())),
                "a follower wrote the Node"
            );
        }
        let node = node_of(&store).expect("node");
        assert_eq!(
            first_address(&node).map(|a| a.1).as_deref(),
            Some("127.0.0.1")
        );
        // The root apiserver dials a (b listens on the same port, but on 127.0.0.2).
        assert_eq!(
            exec_through_the_root(&root, "a", Duration::from_secs(10)).await,
            "via-a\n"
        );

        // Watch Ready and the node Lease's age through the handover.
        let watch_store = store.clone();
        let stop_watch = tokio_util::sync::CancellationToken::new();
        let stop = stop_watch.clone();
        let watcher = tokio::spawn(async move {
            let mut not_ready = Vec::new();
            let mut oldest_lease = Duration::ZERO;
            while !stop.is_cancelled() {
                if let Some(node) = node_of(&watch_store)
                    && !is_ready(&node)
                {
                    not_ready.push(ready(&node));
                }
                if let Some(renewed) = lease_of(&watch_store).as_ref().and_then(renew_time) {
                    let age = Timestamp::now().duration_since(renewed);
                    let age = Duration::from_secs_f64(age.as_secs_f64().max(0.0));
                    oldest_lease = oldest_lease.max(age);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (not_ready, oldest_lease)
        });

        a.crash();
        let (_, takeover) = wait_for("b rewrites the address", Duration::from_secs(15), || {
            node_of(&store).filter(|n| first_address(n).is_some_and(|(_, ip)| ip == "127.0.0.2"))
        })
        .await;
        eprintln!("b took over the Node address {takeover:?} after a crashed");
        assert!(b.is_leader());
        // b's first round also renews the node Lease; let the watcher see it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop_watch.cancel();
        let (not_ready, oldest_lease) = watcher.await.expect("watcher");
        eprintln!("oldest node Lease during the handover: {oldest_lease:?}");
        assert!(not_ready.is_empty(), "Node went NotReady: {not_ready:?}");
        assert!(
            oldest_lease < Duration::from_secs(40),
            "node Lease aged {oldest_lease:?}"
        );
        let node = node_of(&store).expect("node");
        let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
        assert!(
            !addresses
                .iter()
                .any(|a| a.address == "127.0.0.1" && a.type_ == "InternalDNS"),
            "the dead leader's address stayed: {addresses:?}"
        );
        // The root now dials b: a's listener died with it.
        assert_eq!(
            exec_through_the_root(&root, "b", Duration::from_secs(5)).await,
            "via-b\n"
        );

        // A graceful stop releases leadership at once, so a successor need not wait for the
        // leader Lease to expire.
        let c = Replica::start(&root, "relaylet-c", "127.0.0.3", port, &[]).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(b.is_leader() && !c.is_leader());
        b.shutdown.begin.cancel();
        let (_, handover) = wait_for("c rewrites the address", Duration::from_secs(8), || {
            node_of(&store).filter(|n| first_address(n).is_some_and(|(_, ip)| ip == "127.0.0.3"))
        })
        .await;
        eprintln!("c took over the Node address {handover:?} after b stopped gracefully");
        let node = node_of(&store).expect("node");
        assert!(is_ready(&node));
        assert_eq!(
            exec_through_the_root(&root, "c", Duration::from_secs(5)).await,
            "via-c\n"
        );
        drop(b);
        drop(c);
    })
    .await
    .expect("test timed out");
}

/// A leaf whose node `a` has a real kubelet stand-in running pod `default/work`, which the
/// root shows on the leaf's virtual node (as a multi-cluster scheduler would).
async fn leaf_with_pod(root: &Cluster) -> Cluster {
    let leaf = Cluster::start(ClusterOptions::new(LEAF))
        .await
        .expect("leaf starts");
    leaf.add_node("a").await.expect("leaf node with kubelet");
    let pod = SimPod {
        namespace: "default".to_string(),
        name: "work".to_string(),
        containers: vec![SimContainer {
            name: "main".to_string(),
            command: vec!["sleep".into(), "600".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    relaylet::sandbox::sync_pod(root, NODE, &leaf, "a", &pod)
        .await
        .expect("root pod and its leaf copy");
    leaf
}

/// Runs `echo via-<word>` in `default/work` with kube-rs through the root apiserver, which
/// picks the Node address and dials it. Returns stdout.
async fn try_exec(root: &Cluster, word: &str) -> anyhow::Result<String> {
    let client = kube_client(&root.admin_kubeconfig()?).await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut process = pods
        .exec(
            "work",
            vec!["sh", "-c", "echo via-$0", word],
            &AttachParams::default().stdout(true).stderr(false),
        )
        .await?;
    let mut stdout = process
        .stdout()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let status = process
        .take_status()
        .ok_or_else(|| anyhow::anyhow!("no status"))?;
    let mut out = String::new();
    stdout.read_to_string(&mut out).await?;
    let status = status.await;
    process.join().await?;
    let ok = status.as_ref().and_then(|s| s.status.as_deref()) == Some("Success");
    anyhow::ensure!(ok, "exec ended with {status:?}");
    Ok(out)
}

/// [`try_exec`], retried for up to `within` (the pod index or a new leader may need a moment).
async fn exec_through_the_root(root: &Cluster, word: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        match try_exec(root, word).await {
            Ok(out) => return out,
            Err(err) => {
                assert!(Instant::now() < deadline, "exec through the root: {err:#}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Starts root (with `order`), a leaf with a real kubelet and a pod, and relaylet on 127.0.0.2
/// (the leaf node is on 127.0.0.1, so only relaylet's own address reaches a listener on the
/// port the Node names); execs through the root apiserver.
async fn exec_with_order(order: Option<&[&str]>) {
    let root = root_cluster(order).await;
    let leaf = leaf_with_pod(&root).await;
    let replica = Replica::start(&root, "relaylet-0", "127.0.0.2", free_port(), &[]).await;
    let store = root.api.store().clone();
    store.create_typed(&leaf_secret(&leaf)).expect("secret");
    let (node, _) = wait_for("node Ready", Duration::from_secs(10), || {
        node_of(&store).filter(is_ready)
    })
    .await;
    let addresses = node
        .status
        .clone()
        .and_then(|s| s.addresses)
        .unwrap_or_default();
    assert!(
        !addresses.iter().any(|a| a.type_ == "Hostname"),
        "{addresses:?}"
    );
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert!(!labels.contains_key("kubernetes.io/hostname"), "{labels:?}");
    let out = exec_through_the_root(&root, "relaylet", Duration::from_secs(10)).await;
    assert_eq!(out, "via-relaylet\n");

    // The control: had the Node carried a `kubernetes.io/hostname` label, a Hostname-first
    // root would dial that name instead of relaylet's address.
    if order.is_none() {
        let mut labelled = node_of(&store).expect("node");
        labelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("kubernetes.io/hostname".to_string(), NODE.to_string());
        store.update_typed(&labelled).expect("label added");
        let err = try_exec(&root, "hostname")
            .await
            .expect_err("the root dialled the hostname label, which is no address of relaylet");
        let err = format!("{err:#}");
        assert!(err.contains(&format!("cannot connect to {NODE}:")), "{err}");
    }
    drop(replica);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_with_internal_dns_first_dials_relaylet() {
    tokio::time::timeout(
        Duration::from_secs(60),
        exec_with_order(Some(&[
            "InternalDNS",
            "InternalIP",
            "Hostname",
            "ExternalDNS",
            "ExternalIP",
        ])),
    )
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_with_the_default_hostname_first_order_still_dials_relaylet() {
    assert_eq!(
        relaylet_sim::kubelet_proxy::DEFAULT_PREFERRED_ADDRESS_TYPES.first(),
        Some(&"Hostname")
    );
    tokio::time::timeout(Duration::from_secs(60), exec_with_order(None))
        .await
        .expect("test timed out");
}

/// Reads a counter of `replica`'s metrics (0 when absent).
fn counter(replica: &Replica, name: &str) -> f64 {
    let text = replica.running.metrics.encode().expect("metrics");
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("exposition");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// A second install in another namespace: no leaf of its own (or one whose node name clashes),
/// leading its own election. It must neither delete nor write the first install's Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_installs_share_a_root_cluster_without_touching_each_others_nodes() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let root = root_cluster(None).await;
        let leaf = leaf_with_node().await;
        let store = root.api.store().clone();
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        let first = Replica::start(&root, "relaylet-0", "127.0.0.1", free_port(), &[]).await;
        let (node, _) = wait_for(
            "first install's node Ready",
            Duration::from_secs(15),
            || node_of(&store).filter(is_ready),
        )
        .await;
        let uid = node.metadata.uid.clone();
        assert_eq!(
            node.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("relaylet.io/owner"))
                .map(String::as_str),
            Some(NAMESPACE),
            "the Node names its install"
        );

        // The second install, with no leaves: its orphan check runs as soon as it leads with a
        // listed registry, and must not see the first install's Node as its orphan.
        store
            .create_typed(&Namespace {
                metadata: ObjectMeta {
                    name: Some("second".into()),
                    ..Default::default()
                },
                ..Default::default()
            })
            .expect("namespace second");
        let second = Replica::start(
            &root,
            "relaylet-second-0",
            "127.0.0.2",
            free_port(),
            &[
                ("POD_NAMESPACE", "second"),
                ("LEAF_SECRET_NAMESPACE", "second"),
            ],
        )
        .await;
        wait_for(
            "the second install's orphan check",
            Duration::from_secs(15),
            || (counter(&second, "relaylet_orphan_checks_total") >= 1.0).then_some(()),
        )
        .await;
        // Then a leaf of the same name in the second install: its Node name clashes, and it
        // says so instead of taking the Node over.
        let mut clash = leaf_secret(&leaf);
        clash.metadata.namespace = Some("second".into());
        store.create_typed(&clash).expect("second install's secret");
        wait_for("the clash reported", Duration::from_secs(15), || {
            let refused = second
                .running
                .metrics
                .encode()
                .expect("metrics")
                .contains("relaylet_node_write_errors_total{kind=\"conflict\"} 1");
            refused.then_some(())
        })
        .await;
        let node = node_of(&store).expect("the first install's node is still there");
        assert_eq!(node.metadata.uid, uid, "never deleted and recreated");
        assert_eq!(
            first_address(&node),
            Some(("InternalDNS".to_string(), "127.0.0.1".to_string())),
            "still the first install's address"
        );
        assert!(is_ready(&node));
        assert!(first.is_leader());
    })
    .await
    .expect("test timed out");
}

/// A Node deleted by hand is back at once, from the watch, not at the next heartbeat (60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_virtual_node_is_restored_from_the_watch() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let root = root_cluster(None).await;
        let leaf = leaf_with_node().await;
        let store = root.api.store().clone();
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        let _replica = Replica::start(&root, "relaylet-0", "127.0.0.1", free_port(), &[]).await;
        let (node, _) = wait_for("node Ready", Duration::from_secs(15), || {
            node_of(&store).filter(is_ready)
        })
        .await;
        store.delete_typed::<Node>("", NODE).expect("node deleted");
        let (back, took) = wait_for("node restored", Duration::from_secs(5), || {
            node_of(&store).filter(|n| n.metadata.uid != node.metadata.uid && is_ready(n))
        })
        .await;
        eprintln!("a deleted Node was back and Ready after {took:?}");
        assert_eq!(
            first_address(&back),
            Some(("InternalDNS".to_string(), "127.0.0.1".to_string()))
        );
        // Labels stripped by hand come back too.
        let mut stripped = back.clone();
        stripped
            .metadata
            .labels
            .as_mut()
            .expect("labels")
            .remove("relaylet.io/owner");
        store.update_typed(&stripped).expect("labels stripped");
        wait_for("owner label restored", Duration::from_secs(5), || {
            node_of(&store).filter(|n| {
                n.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("relaylet.io/owner"))
            })
        })
        .await;
    })
    .await
    .expect("test timed out");
}

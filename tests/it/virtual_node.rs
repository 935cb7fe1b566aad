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

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::AttachParams;
use relaylet::config::Config;
use relaylet::ops::Shutdown;
use relaylet_dev::sandbox::kube_client;
use relaylet_dev::testkit::forwarder::Forwarder;
use relaylet_sim::apiserver::{ApiServer, ApiServerConfig, Store};
use relaylet_sim::cluster::{Cluster, ClusterOptions, SimContainer, SimPod};
use serde_json::json;
use tokio::io::AsyncReadExt;

const NAMESPACE: &str = "relaylet-system";
const LEAF: &str = "leaf-a";
const NODE: &str = "relaylet-leaf-a";

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

/// Checks `check` until it yields a value (the store has no per-object notification the
/// tests could wait on); the value. `HANG` only turns a hang into a failure.
async fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let poll = async {
        loop {
            if let Some(value) = check() {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(HANG, poll)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {HANG:?}"))
}

/// The revisions at which object `name` of `resource` was written since revision `since`.
fn write_revisions(store: &Store, since: u64, resource: &str, name: &str) -> Vec<u64> {
    let (events, _) = store
        .events_since(since)
        .unwrap_or_else(|e| panic!("history since {since}: {e:?}"));
    events
        .iter()
        .filter(|e| e.key.resource == resource && e.key.name == name)
        .map(|e| e.rv)
        .collect()
}

/// Every version of `name` of `resource` written since revision `since`, in order.
fn versions_since<K: serde::de::DeserializeOwned>(
    store: &Store,
    since: u64,
    resource: &str,
    name: &str,
) -> Vec<K> {
    let (events, _) = store
        .events_since(since)
        .unwrap_or_else(|e| panic!("history since {since}: {e:?}"));
    events
        .iter()
        .filter(|e| e.key.resource == resource && e.key.name == name)
        .filter_map(|e| serde_json::from_value((*e.object).clone()).ok())
        .collect()
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
    not_ready_writes_of(store, since, NODE)
}

/// The Ready conditions other than True written to Node `node` since revision `since`.
fn not_ready_writes_of(store: &Store, since: u64, node: &str) -> Vec<String> {
    let (events, _) = store
        .events_since(since)
        .unwrap_or_else(|e| panic!("history since {since}: {e:?}"));
    events
        .iter()
        .filter(|e| e.key.resource == "nodes" && e.key.name == node)
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
    leaf_secret_named(leaf, LEAF)
}

/// The Secret registering cluster `leaf` as leaf `name` (virtual node `relaylet-<name>`).
fn leaf_secret_named(leaf: &Cluster, name: &str) -> Secret {
    let kubeconfig = leaf.admin_kubeconfig().expect("leaf kubeconfig");
    relaylet_dev::sandbox::leaf_secret(NAMESPACE, name, &kubeconfig)
}

/// One port number for two replicas on their own IPs, as a Deployment's pods share one (port 0
/// would give each its own): see relaylet_sim::ports.
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
        Replica::start_through(root, pod_name, ip, port, extra, None).await
    }

    /// [`Replica::start`], its root traffic going through `forwarder` when given.
    async fn start_through(
        root: &Cluster,
        pod_name: &str,
        ip: &str,
        port: u16,
        extra: &[(&str, &str)],
        forwarder: Option<&Forwarder>,
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
        let kubeconfig = match forwarder {
            Some(f) => kubeconfig.replace(&root.api.url(), &format!("https://{}", f.addr)),
            None => kubeconfig,
        };
        // Its Pod, as its Deployment would make it: with leader election a replica counts
        // only as a Running pod of its install (found here by the replica's own pod labels).
        if config.leader_elect {
            let admin = kube_client(&root.admin_kubeconfig().expect("admin kubeconfig"))
                .await
                .expect("admin client");
            let namespace = config.pod_namespace.as_deref().unwrap_or(NAMESPACE);
            relaylet_dev::sandbox::replica_pod::running(&admin, namespace, pod_name, ip)
                .await
                .expect("the replica's pod");
        }
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

/// The node lifecycle controller counts a renewal only when `renewTime` moves forward. A node
/// Lease last renewed by a replica whose clock ran 40 s ahead is renewed just past that time,
/// never back to this replica's clock (the Node would go Unknown for 40 s), and every renewal
/// is guarded by the version it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lease_renewed_by_a_clock_ahead_never_moves_back() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let root = root_cluster(None).await;
        let leaf = leaf_with_node().await;
        let store = root.api.store().clone();
        let ahead = Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(40);
        let planted: Lease = serde_json::from_value(json!({
            "metadata": {"namespace": "kube-node-lease", "name": NODE},
            "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40,
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(ahead)},
        }))
        .expect("lease JSON");
        store.create_typed(&planted).expect("lease planted");
        let since = store.revision();
        let replica = Replica::start(&root, "relaylet-0", "127.0.0.1", 0, &[]).await;
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        let renewals = wait_for("two renewals", || {
            let r: Vec<Lease> = versions_since(&store, since, "leases", NODE);
            (r.len() >= 2).then_some(r)
        })
        .await;
        let mut last = ahead;
        for lease in &renewals {
            let renewed = renew_time(lease).expect("renewTime");
            assert!(renewed > last, "renewTime went from {last} to {renewed}");
            last = renewed;
        }
        drop(replica);
    })
    .await
    .expect("within 90 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_appears_follows_capacity_quietly_renews_its_lease_and_goes_with_its_secret() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let root = root_cluster(None).await;
        let leaf = leaf_with_node().await;
        // NODE_SERVER_PORT=0: the port bound is the one the Node names.
        let mut replica = Replica::start(&root, "relaylet-0", "127.0.0.1", 0, &[]).await;
        let port = replica.running.addr.port();
        wait_for("leadership", || replica.is_leader().then_some(())).await;
        let store = root.api.store().clone();

        // Registering the leaf: the Node appears.
        let before_secret = store.revision();
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        wait_for("node appears", || node_of(&store)).await;
        let node = wait_for("node Ready", || node_of(&store).filter(is_ready)).await;
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
        let own = wait_for("the node's own port", || {
            replica.running.node_ports.addr_of(NODE)
        })
        .await;
        wait_for("the Node names its own port", || {
            node_of(&store)
                .and_then(|n| n.status?.daemon_endpoints?.kubelet_endpoint)
                .filter(|e| e.port == i32::from(own.port()))
        })
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
        let lease = wait_for("node lease", || lease_of(&store)).await;
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

        // The Lease's renewals while the leaf changes, read from the root's history.
        let renewals_from = store.revision();

        // A new leaf node adds its allocatable.
        leaf.api
            .store()
            .create_typed(&leaf_node("b", "10.0.0.2", "2", "4Gi"))
            .expect("second leaf node");
        wait_for("capacity with node b", || {
            node_of(&store).filter(|n| allocatable(n, "cpu").as_deref() == Some("6"))
        })
        .await;
        // A leaf-local pod's requests are taken off.
        leaf.api
            .store()
            .create_typed(&leaf_local_pod("local", "a", "500m", "1Gi"))
            .expect("leaf pod");
        let node = wait_for("capacity minus the pod", || {
            node_of(&store).filter(|n| allocatable(n, "cpu").as_deref() == Some("5500m"))
        })
        .await;
        assert_eq!(
            allocatable(&node, "memory"),
            Some((11u64 << 30).to_string())
        );
        assert_eq!(allocatable(&node, "pods").as_deref(), Some("219"));
        let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
        assert_eq!(addresses.len(), 3, "{addresses:?}");

        // Someone else writes the Node (an annotation, which relaylet neither owns nor puts
        // back), so relaylet's next status write carries a resourceVersion that is no longer
        // the Node's: the root refuses it (409), relaylet reads the Node again and writes. The
        // capacity still follows the leaf, the annotation stays, and no write counts as failed.
        let mut edited = node_of(&store).expect("the Node");
        edited
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("example.com/edited-by".into(), "hand".into());
        store.update_typed(&edited).expect("someone else's write");
        leaf.api
            .store()
            .create_typed(&leaf_local_pod("local-2", "a", "500m", "1Gi"))
            .expect("leaf pod");
        let node = wait_for("capacity minus both pods", || {
            node_of(&store).filter(|n| allocatable(n, "cpu").as_deref() == Some("5"))
        })
        .await;
        assert_eq!(
            node.metadata
                .annotations
                .unwrap_or_default()
                .get("example.com/edited-by")
                .map(String::as_str),
            Some("hand")
        );
        let scrape = relaylet_dev::testkit::metrics::parse(
            &replica.running.metrics.encode().expect("metrics"),
        );
        assert!(
            relaylet_dev::testkit::metrics::sum(
                &scrape,
                "relaylet_node_write_conflicts_total",
                &[]
            ) >= 1.0,
            "the stale write was refused and counted"
        );
        assert_eq!(
            relaylet_dev::testkit::metrics::sum(
                &scrape,
                "relaylet_node_write_errors_total",
                &[("kind", "node")]
            ),
            0.0
        );

        // The Ready message counts Ready leaf nodes; it catches up at the next health probe.
        wait_for("probe sees both nodes", || {
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
        // No write storm: between two renewals of the node Lease (a renewal period, 10 s,
        // delimited by relaylet's own writes rather than the test's clock) the Node is written
        // at most once (a heartbeat) and the Lease only by that renewal.
        let since = store.revision();
        let renewals = wait_for("two node Lease renewals", || {
            let r = write_revisions(&store, since, "leases", NODE);
            (r.len() >= 2).then_some(r)
        })
        .await;
        let (first, second) = (renewals[0], renewals[1]);
        let in_window = |resource: &str| {
            write_revisions(&store, first, resource, NODE)
                .into_iter()
                .filter(|rv| *rv <= second)
                .count()
        };
        let node_writes = in_window("nodes");
        assert!(
            node_writes <= 1,
            "{node_writes} node writes between two Lease renewals"
        );
        assert_eq!(in_window("leases"), 1, "the Lease is written only to renew");

        // At least three renewals, each about 10 s after the one before by the renewTimes
        // relaylet itself wrote.
        let seen = wait_for("three node Lease renewals", || {
            let mut seen: Vec<Timestamp> =
                versions_since::<Lease>(&store, renewals_from, "leases", NODE)
                    .iter()
                    .filter_map(renew_time)
                    .collect();
            seen.dedup();
            (seen.len() >= 3).then_some(seen)
        })
        .await;
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
        wait_for("the restarted relaylet renews the lease", || {
            (lease_of(&store).as_ref().and_then(renew_time) > renewed_before).then_some(())
        })
        .await;
        assert_eq!(
            not_ready_writes_since(&store, restarted),
            Vec::<String>::new()
        );

        // Deleting the Secret removes the Node and its Lease.
        store
            .delete_typed::<Secret>(NAMESPACE, &format!("leaf-{LEAF}"))
            .expect("secret deleted");
        wait_for("node and lease gone", || {
            (node_of(&store).is_none() && lease_of(&store).is_none()).then_some(())
        })
        .await;
        drop(replica);
    })
    .await
    .expect("test timed out");
}

/// A replica that crashed and comes back under its old name (a StatefulSet pod, a restarted
/// container) while another replica joins: the Node it wrote before the crash is assigned to the
/// other one, which may not take it while the restarted replica's presence Lease is fresh, so
/// the restarted one must give it up. Which of its two ways does it depends on timing (holding
/// it again in its first rounds, when it sees no peer renewing yet, then handing it over; or
/// handing back a Node that names it without this process ever holding it, `names_me`); this
/// test asserts the outcome, not the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_replica_restarted_under_its_name_gives_up_the_node_assigned_elsewhere() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let root = root_cluster(None).await;
        let leaf = leaf_with_node().await;
        let store = root.api.store().clone();
        // Which of the two names the node is assigned to with both alive: that one is the
        // other replica, the one it is not assigned to is restarted.
        let assignment =
            relaylet::replicas::Assignment::compute([NODE], ["relaylet-0", "relaylet-1"]);
        let other = assignment.replica_of(NODE).expect("assigned").to_string();
        let restarted = if other == "relaylet-0" {
            "relaylet-1"
        } else {
            "relaylet-0"
        };
        let port = free_port();

        // The restarted replica's first incarnation, alone, writes the Node; then it dies.
        let first = Replica::start(&root, restarted, "127.0.0.2", port, &[]).await;
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        wait_for("the first incarnation writes the Node", || {
            node_of(&store).filter(|n| is_ready(n) && served_by(n) == restarted)
        })
        .await;
        first.crash();

        // The other replica joins while the dead one's presence Lease is still fresh: it is
        // assigned the Node but must wait for its holder to hand it over. The restarted one
        // comes back under the same name at once.
        let _other = Replica::start(&root, &other, "127.0.0.3", port, &[]).await;
        let _again = Replica::start(&root, restarted, "127.0.0.2", port, &[]).await;
        // The claim (the annotation) is written before the status with the new address.
        let node = wait_for("the Node moves to the replica it is assigned", || {
            node_of(&store).filter(|n| {
                served_by(n) == other
                    && first_address(n).map(|a| a.1).as_deref() == Some("127.0.0.3")
            })
        })
        .await;
        assert!(is_ready(&node));
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
            0,
            &[("LEADER_ELECT", "false")],
        )
        .await;
        let store = root.api.store().clone();
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        wait_for("node Ready", || node_of(&store).filter(is_ready)).await;

        // The leaf apiserver goes away.
        let leaf_addr = leaf.api.addr;
        let leaf_store = leaf.api.store().clone();
        leaf.api.stop();
        let node = wait_for("Ready=False", || node_of(&store).filter(|n| !is_ready(n))).await;
        assert_eq!(
            ready(&node),
            Some(("False".to_string(), "LeafUnreachable".to_string()))
        );
        // relaylet itself is alive, so the node Lease is still renewed during the outage.
        let outage = store.revision();
        wait_for("lease renewed during the outage", || {
            (!write_revisions(&store, outage, "leases", NODE).is_empty()).then_some(())
        })
        .await;

        // It comes back on the same address with its data.
        let mut config = ApiServerConfig::new(LEAF, leaf.ca.clone());
        config.listen = leaf_addr;
        leaf.api = ApiServer::start_with_store(config, leaf_store)
            .await
            .expect("leaf apiserver restarts");
        let node = wait_for("Ready again", || node_of(&store).filter(is_ready)).await;
        assert_eq!(ready(&node).map(|r| r.1).as_deref(), Some("LeafReady"));
        // The leaf watches reconnected: a node added after the restart is counted.
        leaf.api
            .store()
            .create_typed(&leaf_node("b", "10.0.0.2", "2", "4Gi"))
            .expect("second leaf node");
        wait_for("capacity after the restart", || {
            node_of(&store).filter(|n| allocatable(n, "cpu").as_deref() == Some("6"))
        })
        .await;

        // A stopped relaylet (here without leader election, so always "leader") writes
        // nothing more: its per-leaf loops end with it.
        replica.shutdown.begin.cancel();
        replica.shutdown.sessions.cancel();
        wait_for("the stopped relaylet's server ends", || {
            replica.running.server.is_finished().then_some(())
        })
        .await;
        // Then nothing for longer than a Lease renewal period (10 s) and a status round (2 s):
        // proving an absence takes waiting; nothing is measured against this sleep.
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

/// The replica a Node names as its writer (`relaylet.io/served-by`).
fn served_by(node: &Node) -> String {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("relaylet.io/served-by"))
        .cloned()
        .unwrap_or_default()
}

/// Waits until every one of `nodes` is Ready and written by the replica the assignment over
/// `live` (pod name -> IP) gives it, with that replica's address first: the state the replicas
/// settle in. An even spread alone is not enough: a replica that counted its peers late may
/// hold a Node for a moment that is assigned elsewhere, and hands it back. Each node's replica.
async fn spread_over(
    store: &Store,
    nodes: &[String],
    live: &BTreeMap<&str, &str>,
) -> BTreeMap<String, String> {
    let assignment = relaylet::replicas::Assignment::compute(
        nodes.iter().map(String::as_str),
        live.keys().copied(),
    );
    wait_for("the nodes written by the replicas assigned them", || {
        let mut owners = BTreeMap::new();
        for name in nodes {
            let node = store.get_typed::<Node>("", name).ok()?;
            let owner = served_by(&node);
            (assignment.replica_of(name) == Some(owner.as_str())).then_some(())?;
            let ip = live.get(owner.as_str())?;
            let address = first_address(&node)?.1;
            (is_ready(&node) && address == *ip).then_some(())?;
            owners.insert(name.clone(), owner);
        }
        Some(owners)
    })
    .await
}

/// Asserts that every change of `node`'s first address since `since` was to the address of the
/// replica the same version names as its writer: every status write carries the resourceVersion
/// its writer last saw holding the Node, so a replica that lost the Node (while starved, say)
/// cannot land a write after the new writer's claim.
fn addresses_follow_the_writer(store: &Store, since: u64, node: &str, ips: &BTreeMap<&str, &str>) {
    let versions = versions_since::<Node>(store, since, "nodes", node);
    let history: Vec<(String, Option<String>)> = versions
        .iter()
        .map(|v| (served_by(v), first_address(v).map(|a| a.1)))
        .collect();
    for change in history.windows(2).filter(|p| p[0].1 != p[1].1) {
        let (writer, address) = &change[1];
        let writers_ip = ips.get(writer.as_str()).map(|ip| ip.to_string());
        assert_eq!(
            *address, writers_ip,
            "{node}: an address written while the Node named {writer}: {history:?}"
        );
    }
}

/// Finished sessions of leaf `leaf` that `replica` served.
fn sessions_of(replica: &Replica, leaf: &str) -> f64 {
    let text = replica.running.metrics.encode().expect("metrics");
    relaylet_dev::testkit::metrics::sum(
        &relaylet_dev::testkit::metrics::parse(&text),
        "relaylet_sessions_total",
        &[("leaf", leaf)],
    )
}

/// Execs in every leaf's pod through the root apiserver and waits until each session is
/// counted by the replica its Node names as writer, and by no other. That is the replica
/// `owners` names unless the Node moved since (a replica whose presence Lease went unrenewed
/// for 10 s on a starved machine loses its Nodes, as it should): then the Node's writer when
/// the session was made.
async fn sessions_go_to_their_nodes_replica(
    root: &Cluster,
    replicas: &BTreeMap<&str, Replica>,
    owners: &BTreeMap<String, String>,
) {
    let store = root.api.store();
    let writer = |node: &str| {
        store
            .get_typed::<Node>("", node)
            .map(|n| served_by(&n))
            .unwrap_or_default()
    };
    // A Node can name its replica before that replica serves it: one restarted under its name
    // finds its Nodes still naming it (and its old process's ports) and serves them only once
    // its fresh term counts. Wait until each Node names the port its replica listens on.
    wait_for("each Node names the port its replica listens on", || {
        owners
            .iter()
            .all(|(node, owner)| {
                let listening = replicas[owner.as_str()].running.node_ports.addr_of(node);
                let named = store
                    .get_typed::<Node>("", node)
                    .ok()
                    .and_then(|n| n.status?.daemon_endpoints?.kubelet_endpoint)
                    .map(|e| e.port);
                listening.is_some_and(|a| Some(i32::from(a.port())) == named)
            })
            .then_some(())
    })
    .await;
    for (i, node) in owners.keys().enumerate() {
        let leaf = node.trim_start_matches("relaylet-");
        let before: BTreeMap<&str, f64> = replicas
            .iter()
            .map(|(name, r)| (*name, sessions_of(r, leaf)))
            .collect();
        let pod = format!("work-{}", leaf.trim_start_matches("leaf-"));
        let writer_before = writer(node);
        assert_eq!(
            try_exec_in(root, &pod, "x").await.expect("exec"),
            "via-x\n",
            "{node} #{i}"
        );
        let served = wait_for("the session is counted by the node's replica", || {
            let grew: Vec<&str> = replicas
                .iter()
                .filter(|(name, r)| sessions_of(r, leaf) > before[*name])
                .map(|(name, _)| *name)
                .collect();
            (!grew.is_empty()).then_some(grew)
        })
        .await;
        let writer_after = writer(node);
        if writer_before != owners[node] || writer_after != writer_before {
            eprintln!(
                "{node} moved: {} when spread, {writer_before} before the session, {writer_after} after it",
                owners[node]
            );
        }
        assert_eq!(served.len(), 1, "{node}'s session counted by {served:?}");
        assert!(
            [&writer_before, &writer_after].contains(&&served[0].to_string()),
            "{node}'s session served by {} while the Node named {writer_before} (before) and {writer_after} (after)",
            served[0]
        );
    }
}

/// Three replicas and six leaves (issue 29): each replica writes an even share of the Nodes
/// with its own address first, so each node's sessions go to its replica; a crashed replica's
/// nodes move to the others without going NotReady; a replica shutting down hands its nodes
/// over before it stops accepting, and sessions sent meanwhile are served; a replica that joins
/// takes a fair share while a session already open on a moved node goes on where it is; a
/// replica restarted under its old name as another joins lets go of what is assigned elsewhere.
/// No replica ever writes a Node another holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_nodes_and_hand_them_over_on_crash_and_shutdown() {
    tokio::time::timeout(Duration::from_secs(300), async {
        let root = root_cluster(None).await;
        let store = root.api.store().clone();
        let names: Vec<String> = (0..6).map(|i| format!("leaf-{i}")).collect();
        let mut leaves = Vec::new();
        for (i, name) in names.iter().enumerate() {
            leaves.push(named_leaf_with_pod(&root, name, &format!("work-{i}")).await);
        }
        let nodes: Vec<String> = names.iter().map(|n| format!("relaylet-{n}")).collect();
        let ips: BTreeMap<&str, &str> = BTreeMap::from([
            ("relaylet-0", "127.0.0.1"),
            ("relaylet-1", "127.0.0.2"),
            ("relaylet-2", "127.0.0.3"),
            ("relaylet-3", "127.0.0.4"),
            ("relaylet-4", "127.0.0.5"),
        ]);
        let port = free_port();
        let mut replicas: BTreeMap<&str, Replica> = BTreeMap::new();
        for name in ["relaylet-0", "relaylet-1", "relaylet-2"] {
            replicas.insert(
                name,
                Replica::start(&root, name, ips[name], port, &[]).await,
            );
        }
        let start = store.revision();
        for (leaf, name) in leaves.iter().zip(&names) {
            store
                .create_typed(&leaf_secret_named(leaf, name))
                .expect("secret");
        }
        let live = |names: &[&'static str]| -> BTreeMap<&str, &str> {
            names.iter().map(|n| (*n, ips[n])).collect()
        };

        // Every replica serves: 2-2-2, and each node's sessions reach its replica.
        let owners = spread_over(
            &store,
            &nodes,
            &live(&["relaylet-0", "relaylet-1", "relaylet-2"]),
        )
        .await;
        sessions_go_to_their_nodes_replica(&root, &replicas, &owners).await;

        // A crash: relaylet-0's nodes move to the others, Ready throughout.
        let crashed = store.revision();
        replicas.remove("relaylet-0").expect("relaylet-0").crash();
        let owners = spread_over(&store, &nodes, &live(&["relaylet-1", "relaylet-2"])).await;
        for node in &nodes {
            assert_eq!(
                not_ready_writes_of(&store, crashed, node),
                Vec::<String>::new(),
                "{node} went NotReady"
            );
        }
        sessions_go_to_their_nodes_replica(&root, &replicas, &owners).await;

        // SIGTERM: relaylet-1 hands its nodes to relaylet-2 before it stops accepting; execs
        // on its nodes meanwhile are all served.
        let leaving = &replicas["relaylet-1"];
        let its_pods: Vec<String> = owners
            .iter()
            .filter(|(_, owner)| *owner == "relaylet-1")
            .map(|(node, _)| format!("work-{}", node.trim_start_matches("relaylet-leaf-")))
            .collect();
        let stopped_accepting = tokio::spawn({
            let begin = leaving.shutdown.begin.clone();
            let store = store.clone();
            let nodes = nodes.clone();
            async move {
                begin.cancelled().await;
                nodes
                    .iter()
                    .filter(|n| {
                        store
                            .get_typed::<Node>("", n)
                            .is_ok_and(|node| served_by(&node) == "relaylet-1")
                    })
                    .cloned()
                    .collect::<Vec<_>>()
            }
        });
        let terminate = tokio::spawn({
            let shutdown = leaving.shutdown.clone();
            async move { shutdown.terminate(Duration::from_secs(30)).await }
        });
        let mut served_during_handover = 0;
        while !stopped_accepting.is_finished() {
            for pod in &its_pods {
                try_exec_in(&root, pod, "during")
                    .await
                    .unwrap_or_else(|e| panic!("exec in {pod} while relaylet-1 hands over: {e:#}"));
                served_during_handover += 1;
            }
        }
        assert!(served_during_handover > 0);
        assert_eq!(
            stopped_accepting.await.expect("begin watcher"),
            Vec::<String>::new(),
            "relaylet-1 stopped accepting while Nodes still named it"
        );
        terminate.await.expect("terminate");
        drop(replicas.remove("relaylet-1"));
        let owners = spread_over(&store, &nodes, &live(&["relaylet-2"])).await;
        sessions_go_to_their_nodes_replica(&root, &replicas, &owners).await;

        // A replica joins and takes its share; a session open on a node that moves to it
        // goes on at relaylet-2.
        let after_join = relaylet::replicas::Assignment::compute(
            nodes.iter().map(String::as_str),
            ["relaylet-2", "relaylet-3"],
        );
        let moving = nodes
            .iter()
            .find(|n| after_join.replica_of(n) == Some("relaylet-3"))
            .expect("a node moves to the newcomer");
        let pod = format!("work-{}", moving.trim_start_matches("relaylet-leaf-"));
        let client = kube_client(&root.admin_kubeconfig().expect("kubeconfig"))
            .await
            .expect("client");
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let stayed_before = sessions_of(
            &replicas["relaylet-2"],
            moving.trim_start_matches("relaylet-"),
        );
        let mut open = pods
            .exec(
                &pod,
                vec!["sh", "-c", "read x; echo got-$x"],
                &AttachParams::default()
                    .stdin(true)
                    .stdout(true)
                    .stderr(false),
            )
            .await
            .expect("an exec open across the move");
        replicas.insert(
            "relaylet-3",
            Replica::start(&root, "relaylet-3", ips["relaylet-3"], port, &[]).await,
        );
        let owners = spread_over(&store, &nodes, &live(&["relaylet-2", "relaylet-3"])).await;
        assert_eq!(owners[moving], "relaylet-3");
        let mut stdin = open.stdin().expect("stdin");
        tokio::io::AsyncWriteExt::write_all(&mut stdin, b"later\n")
            .await
            .expect("stdin after the move");
        let mut out = String::new();
        open.stdout()
            .expect("stdout")
            .read_to_string(&mut out)
            .await
            .expect("stdout after the move");
        assert_eq!(out, "got-later\n");
        let status = open.take_status().expect("status").await;
        assert_eq!(status.and_then(|s| s.status).as_deref(), Some("Success"));
        // Counted where it ran, once it has ended there.
        let moved_leaf = moving.trim_start_matches("relaylet-");
        wait_for("the open session is counted by relaylet-2", || {
            (sessions_of(&replicas["relaylet-2"], moved_leaf) > stayed_before).then_some(())
        })
        .await;
        sessions_go_to_their_nodes_replica(&root, &replicas, &owners).await;

        // relaylet-3 restarts under its old name (a StatefulSet pod, a restarted container)
        // just after relaylet-4 joined: of the three Nodes that name relaylet-3, at least one
        // is now assigned elsewhere, and since relaylet-3's presence Lease never lapses no
        // other replica may take it; relaylet-3 hands it back (whether it took it first or
        // already counted relaylet-4 and never held it: which one is up to timing).
        replicas.remove("relaylet-3").expect("relaylet-3").crash();
        for name in ["relaylet-4", "relaylet-3"] {
            replicas.insert(
                name,
                Replica::start(&root, name, ips[name], port, &[]).await,
            );
        }
        let owners = spread_over(
            &store,
            &nodes,
            &live(&["relaylet-2", "relaylet-3", "relaylet-4"]),
        )
        .await;
        sessions_go_to_their_nodes_replica(&root, &replicas, &owners).await;

        for node in &nodes {
            addresses_follow_the_writer(&store, start, node, &ips);
        }
        drop(replicas);
    })
    .await
    .expect("test timed out");
}

/// The watches of `leaf`'s nodes and of all its pods open now at its apiserver (the Node's
/// capacity and health come from them).
fn leaf_watches(leaf: &Cluster) -> (u64, u64) {
    (
        leaf.api.open_watches("/api/v1/nodes"),
        leaf.api.open_watches("/api/v1/pods")
            - leaf.api.open_watches("/api/v1/pods?labelSelector="),
    )
}

/// The watches of the pods relaylet runs in `leaf` (its copies, by their labels) open now.
fn copy_watches(leaf: &Cluster) -> u64 {
    leaf.api
        .open_watches("/api/v1/pods?labelSelector=relaylet.io")
}

/// `relaylet_leaves_served` of `replica`: the leaves it runs.
fn leaves_served(replica: &Replica) -> f64 {
    let text = replica.running.metrics.encode().expect("metrics");
    relaylet_dev::testkit::metrics::sum(
        &relaylet_dev::testkit::metrics::parse(&text),
        "relaylet_leaves_served",
        &[],
    )
}

/// The watches of the root pods on virtual node `node` open now at the root apiserver (the
/// kubelet's own pattern, `spec.nodeName=<node>`).
fn root_pod_watches(root: &Cluster, node: &str) -> u64 {
    root.api
        .open_watches(&format!("/api/v1/pods?fieldSelector=spec.nodeName={node}"))
}

/// Waits until every leaf in `leaves` (leaf, its Node) is watched by exactly one replica: one
/// watch of its nodes and one of its pods more than `baseline` (what the leaf's own kubelet
/// stand-in watches) and one of the pods relaylet runs there, the root pods on its Node by one
/// watch, and each replica of `replicas`
/// runs exactly the leaves whose Nodes `owners` says it serves, and listens on their nodes'
/// ports alone.
async fn each_leaf_watched_once(
    root: &Cluster,
    leaves: &[(&Cluster, String)],
    baseline: &[(u64, u64)],
    replicas: &BTreeMap<&str, Replica>,
    owners: &BTreeMap<String, String>,
) {
    let mut last = String::new();
    let settled = async {
        loop {
            let watches: Vec<(u64, u64)> = leaves.iter().map(|(l, _)| leaf_watches(l)).collect();
            let extra: Vec<(String, i64, i64)> = leaves
                .iter()
                .zip(&watches)
                .zip(baseline)
                .map(|(((_, node), w), b)| {
                    (
                        node.clone(),
                        w.0 as i64 - b.0 as i64,
                        w.1 as i64 - b.1 as i64,
                    )
                })
                .collect();
            let served: BTreeMap<&str, f64> = replicas
                .iter()
                .map(|(name, r)| (*name, leaves_served(r)))
                .collect();
            let mut expected: BTreeMap<&str, f64> =
                replicas.keys().map(|name| (*name, 0.0)).collect();
            for owner in owners.values() {
                *expected.entry(owner.as_str()).or_default() += 1.0;
            }
            let root_watches: Vec<(&str, u64)> = leaves
                .iter()
                .map(|(_, node)| (node.as_str(), root_pod_watches(root, node)))
                .collect();
            // A replica listens only for the nodes it serves (`node_ports`).
            let ports: BTreeMap<&str, Vec<String>> = replicas
                .iter()
                .map(|(name, r)| (*name, r.running.node_ports.all().into_keys().collect()))
                .collect();
            let mut expected_ports: BTreeMap<&str, Vec<String>> =
                replicas.keys().map(|name| (*name, Vec::new())).collect();
            for (node, owner) in owners {
                if let Some(nodes) = expected_ports.get_mut(owner.as_str()) {
                    nodes.push(node.clone());
                }
            }
            // The Node's writer alone runs the leaf's pods: one watch of its copies.
            let copies: Vec<(&str, u64)> = leaves
                .iter()
                .map(|(l, node)| (node.as_str(), copy_watches(l)))
                .collect();
            if extra.iter().all(|(_, n, p)| (*n, *p) == (1, 1))
                && copies.iter().all(|(_, w)| *w == 1)
                && root_watches.iter().all(|(_, w)| *w == 1)
                && served == expected
                && ports == expected_ports
            {
                return;
            }
            last = format!(
                "replica watches per leaf (node, nodes, pods): {extra:?}; watches of its copies: {copies:?}; root pod watches per node: {root_watches:?}; leaves served: {served:?}, expected {expected:?}; node ports: {ports:?}, expected {expected_ports:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if tokio::time::timeout(HANG, settled).await.is_err() {
        panic!("each leaf watched by the one replica serving it: not within {HANG:?}: {last}");
    }
}

/// Issue 39: with three replicas and four leaves, each leaf apiserver is watched (nodes and
/// pods) by one replica only, the one whose Node it is, and so are the root pods on each
/// Node (`spec.nodeName`); when a replica crashes its leaves are
/// started by the replicas taking its Nodes over (the Nodes Ready throughout, sessions served
/// after), and when a replica joins, the leaves whose Nodes it takes stop being watched by
/// their old replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_leaf_is_watched_only_by_the_replica_that_serves_its_node() {
    tokio::time::timeout(Duration::from_secs(300), async {
        let root = root_cluster(None).await;
        let store = root.api.store().clone();
        let names: Vec<String> = (0..4).map(|i| format!("leaf-{i}")).collect();
        let mut leaves = Vec::new();
        for (i, name) in names.iter().enumerate() {
            leaves.push(named_leaf_with_pod(&root, name, &format!("work-{i}")).await);
        }
        let nodes: Vec<String> = names.iter().map(|n| format!("relaylet-{n}")).collect();
        let by_leaf: Vec<(&Cluster, String)> = leaves.iter().zip(nodes.iter().cloned()).collect();
        let ips: BTreeMap<&str, &str> = BTreeMap::from([
            ("relaylet-0", "127.0.0.1"),
            ("relaylet-1", "127.0.0.2"),
            ("relaylet-2", "127.0.0.3"),
            ("relaylet-3", "127.0.0.4"),
            ("relaylet-4", "127.0.0.5"),
            ("relaylet-5", "127.0.0.6"),
        ]);
        // The replica that joins later: one the assignment gives a Node (4 Nodes on 3
        // replicas may be 2-2-0).
        let joiner = ["relaylet-3", "relaylet-4", "relaylet-5"]
            .into_iter()
            .find(|joiner| {
                relaylet::replicas::Assignment::compute(
                    nodes.iter().map(String::as_str),
                    ["relaylet-1", "relaylet-2", joiner],
                )
                .loads()
                .contains_key(joiner)
            })
            .expect("a joining replica that takes a Node");
        let port = free_port();
        let mut replicas: BTreeMap<&str, Replica> = BTreeMap::new();
        for name in ["relaylet-0", "relaylet-1", "relaylet-2"] {
            replicas.insert(
                name,
                Replica::start(&root, name, ips[name], port, &[]).await,
            );
        }
        // What watches each leaf before relaylet knows it (its own kubelet stand-in).
        let baseline: Vec<(u64, u64)> = leaves.iter().map(leaf_watches).collect();
        for (leaf, name) in leaves.iter().zip(&names) {
            store
                .create_typed(&leaf_secret_named(leaf, name))
                .expect("secret");
        }
        let live = |names: &[&'static str]| -> BTreeMap<&str, &str> {
            names.iter().map(|n| (*n, ips[n])).collect()
        };

        let owners = spread_over(
            &store,
            &nodes,
            &live(&["relaylet-0", "relaylet-1", "relaylet-2"]),
        )
        .await;
        each_leaf_watched_once(&root, &by_leaf, &baseline, &replicas, &owners).await;
        sessions_go_to_their_nodes_replica(&root, &replicas, &owners).await;

        // A crash: the replicas taking relaylet-0's Nodes start its leaves; Ready throughout.
        let crashed = store.revision();
        replicas.remove("relaylet-0").expect("relaylet-0").crash();
        let owners = spread_over(&store, &nodes, &live(&["relaylet-1", "relaylet-2"])).await;
        for node in &nodes {
            assert_eq!(
                not_ready_writes_of(&store, crashed, node),
                Vec::<String>::new(),
                "{node} went NotReady"
            );
        }
        each_leaf_watched_once(&root, &by_leaf, &baseline, &replicas, &owners).await;
        sessions_go_to_their_nodes_replica(&root, &replicas, &owners).await;

        // A replica joins: the leaves whose Nodes it takes are no longer watched by the replica
        // that handed them over.
        let joined = store.revision();
        replicas.insert(
            joiner,
            Replica::start(&root, joiner, ips[joiner], port, &[]).await,
        );
        let owners =
            spread_over(&store, &nodes, &live(&["relaylet-1", "relaylet-2", joiner])).await;
        for node in &nodes {
            assert_eq!(
                not_ready_writes_of(&store, joined, node),
                Vec::<String>::new(),
                "{node} went NotReady"
            );
        }
        each_leaf_watched_once(&root, &by_leaf, &baseline, &replicas, &owners).await;
        sessions_go_to_their_nodes_replica(&root, &replicas, &owners).await;
        drop(replicas);
    })
    .await
    .expect("test timed out");
}

/// Issue 39: the replica taking a Node over starts watching its leaf only then. When the leaf
/// cannot be listed yet (its lists stall; `/readyz` answers), the new replica writes the Node's
/// address and kubelet port and leaves the Ready condition and capacity the crashed replica
/// wrote: never NotReady or zero capacity from a cache that has not listed. Only when the leaf
/// still cannot be listed after the grace does the Node say so, and it recovers when the leaf
/// lists again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_before_the_leaf_lists_keeps_the_node_ready_and_its_capacity() {
    tokio::time::timeout(Duration::from_secs(300), async {
        let root = root_cluster(None).await;
        let store = root.api.store().clone();
        let leaf = leaf_with_node().await;
        let ips: BTreeMap<&str, &str> =
            BTreeMap::from([("relaylet-0", "127.0.0.1"), ("relaylet-1", "127.0.0.2")]);
        let port = free_port();
        let mut replicas: BTreeMap<&str, Replica> = BTreeMap::new();
        for (name, ip) in &ips {
            replicas.insert(name, Replica::start(&root, name, ip, port, &[]).await);
        }
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        // Settled: the Node Ready with the leaf's capacity, written by its replica, which
        // alone watches the leaf (the Node may move once while the replicas count each other).
        let (writer, cpu) = wait_for(
            "the Node Ready, its leaf watched by its writer alone",
            || {
                let node = node_of(&store)?;
                let writer = served_by(&node);
                let ip = ips.get(writer.as_str())?;
                (is_ready(&node) && first_address(&node)?.1 == *ip).then_some(())?;
                let watching: Vec<f64> = replicas.values().map(leaves_served).collect();
                (watching.iter().sum::<f64>() == 1.0
                    && leaves_served(&replicas[writer.as_str()]) == 1.0
                    && leaf_watches(&leaf) == (1, 1)
                    && copy_watches(&leaf) == 1)
                    .then_some(())?;
                Some((writer, allocatable(&node, "cpu")?))
            },
        )
        .await;
        assert_eq!(cpu, "4");
        let other = *ips
            .keys()
            .find(|n| **n != writer)
            .expect("the other replica");
        // A replica listens only for the nodes it writes: the writer has the node's port, the
        // other none (it binds one when it takes the Node over).
        assert!(
            replicas[writer.as_str()]
                .running
                .node_ports
                .addr_of(NODE)
                .is_some(),
            "the writer listens for its node"
        );
        wait_for("the other replica without a port for the node", || {
            replicas[other]
                .running
                .node_ports
                .addr_of(NODE)
                .is_none()
                .then_some(())
        })
        .await;

        // The leaf stops answering lists; the writer crashes.
        leaf.api.stall_lists(true);
        let crashed = store.revision();
        replicas
            .remove(writer.as_str())
            .expect("the writer")
            .crash();
        let taken = wait_for("the other replica writes the Node", || {
            let node = node_of(&store)?;
            let endpoint = node.status.as_ref()?.daemon_endpoints.as_ref()?;
            let written_port = endpoint.kubelet_endpoint.as_ref()?.port;
            let other_port = replicas[other].running.node_ports.addr_of(NODE)?.port();
            (served_by(&node) == other
                && first_address(&node)?.1 == ips[other]
                && written_port == i32::from(other_port))
            .then_some(node)
        })
        .await;
        assert!(is_ready(&taken), "{:?}", taken.status);
        assert_eq!(allocatable(&taken, "cpu").as_deref(), Some("4"));
        assert_eq!(
            not_ready_writes_since(&store, crashed),
            Vec::<String>::new(),
            "the Node went NotReady on the takeover"
        );
        // Still not listed after the grace: the Node says so.
        let said = wait_for("the Node says the leaf cannot be listed", || {
            let node = node_of(&store)?;
            (ready(&node)? == ("False".to_string(), "LeafUnreachable".to_string())).then_some(node)
        })
        .await;
        let message = said
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.message)
            .unwrap_or_default();
        assert!(message.contains("not listed"), "{message}");

        // Lists answer again: Ready with the leaf's capacity.
        leaf.api.stall_lists(false);
        wait_for("the Node Ready again", || {
            let node = node_of(&store)?;
            (is_ready(&node) && allocatable(&node, "cpu")? == "4").then_some(())
        })
        .await;
        drop(replicas);
    })
    .await
    .expect("test timed out");
}

/// A leaf whose node `a` has a real kubelet stand-in running pod `default/work`, which the
/// root shows on the leaf's virtual node (as a multi-cluster scheduler would).
async fn leaf_with_pod(root: &Cluster) -> Cluster {
    named_leaf_with_pod(root, LEAF, "work").await
}

/// Leaf `name` with a kubelet on node `a` running pod `default/<pod>`, shown in the root on
/// virtual node `relaylet-<name>`.
async fn named_leaf_with_pod(root: &Cluster, name: &str, pod: &str) -> Cluster {
    let leaf = Cluster::start(ClusterOptions::new(name))
        .await
        .expect("leaf starts");
    leaf.add_node("a").await.expect("leaf node with kubelet");
    let node = format!("relaylet-{name}");
    let pod = SimPod {
        namespace: "default".to_string(),
        name: pod.to_string(),
        containers: vec![SimContainer {
            name: "main".to_string(),
            command: vec!["sleep".into(), "600".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    relaylet_dev::sandbox::sync_pod(root, &node, &leaf, "a", &pod)
        .await
        .expect("root pod and its leaf copy");
    leaf
}

/// Runs `echo via-<word>` in `default/work` with kube-rs through the root apiserver, which
/// picks the Node address and dials it. Returns stdout.
async fn try_exec(root: &Cluster, word: &str) -> anyhow::Result<String> {
    try_exec_in(root, "work", word).await
}

/// [`try_exec`] in pod `default/<pod>`.
async fn try_exec_in(root: &Cluster, pod: &str, word: &str) -> anyhow::Result<String> {
    let client = kube_client(&root.admin_kubeconfig()?).await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut process = pods
        .exec(
            pod,
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

/// [`try_exec`], retried until it succeeds (the pod index or a new leader may need a
/// moment); `HANG` only turns a hang into a failure.
async fn exec_through_the_root(root: &Cluster, word: &str) -> String {
    let mut last = None;
    let tries = async {
        loop {
            match try_exec(root, word).await {
                Ok(out) => return out,
                Err(err) => last = Some(format!("{err:#}")),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    match tokio::time::timeout(HANG, tries).await {
        Ok(out) => out,
        Err(_) => panic!("exec through the root: {last:?}"),
    }
}

/// Starts root (with `order`), a leaf with a real kubelet and a pod, and relaylet on 127.0.0.2
/// (the leaf node is on 127.0.0.1, so only relaylet's own address reaches a listener on the
/// port the Node names); execs through the root apiserver.
async fn exec_with_order(order: Option<&[&str]>) {
    let root = root_cluster(order).await;
    let leaf = leaf_with_pod(&root).await;
    let replica = Replica::start(&root, "relaylet-0", "127.0.0.2", 0, &[]).await;
    let store = root.api.store().clone();
    store.create_typed(&leaf_secret(&leaf)).expect("secret");
    let node = wait_for("node Ready", || node_of(&store).filter(is_ready)).await;
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
    let out = exec_through_the_root(&root, "relaylet").await;
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
        // The root names the host it dialled (its wording depends on whether it translates
        // the call or proxies it: relaylet declares ExtendWebSocketsToKubelet).
        assert!(err.contains(&format!(" {NODE}:")), "{err}");
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
    relaylet_dev::testkit::metrics::sum(&relaylet_dev::testkit::metrics::parse(&text), name, &[])
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
        let first = Replica::start(&root, "relaylet-0", "127.0.0.1", 0, &[]).await;
        let node = wait_for("first install's node Ready", || {
            node_of(&store).filter(is_ready)
        })
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
            0,
            &[
                ("POD_NAMESPACE", "second"),
                ("LEAF_SECRET_NAMESPACE", "second"),
            ],
        )
        .await;
        wait_for("the second install's orphan check", || {
            (counter(&second, "relaylet_orphan_checks_total") >= 1.0).then_some(())
        })
        .await;
        // Then a leaf of the same name in the second install: its Node name clashes, and it
        // says so instead of taking the Node over (its Secret is refused: the Node is another
        // install's).
        let mut clash = leaf_secret(&leaf);
        clash.metadata.namespace = Some("second".into());
        store.create_typed(&clash).expect("second install's secret");
        wait_for("the clash reported", || {
            let refused = second
                .running
                .metrics
                .encode()
                .expect("metrics")
                .contains("relaylet_leaf_secret_refusals_total{reason=\"node_not_owned\"} 1");
            refused.then_some(())
        })
        .await;
        assert!(second.running.registry.snapshot().is_empty());
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

/// A Node deleted by hand is back at once, from the watch, not at the next heartbeat (5 min):
/// before the node Lease's next renewal (every 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_virtual_node_is_restored_from_the_watch() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let root = root_cluster(None).await;
        let leaf = leaf_with_node().await;
        let store = root.api.store().clone();
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        let _replica = Replica::start(&root, "relaylet-0", "127.0.0.1", 0, &[]).await;
        let node = wait_for("node Ready", || node_of(&store).filter(is_ready)).await;
        // Right after a renewal of the node Lease, so the next one is a period away.
        let since = store.revision();
        let renewed = wait_for("a node Lease renewal", || {
            write_revisions(&store, since, "leases", NODE)
                .first()
                .copied()
        })
        .await;
        store.delete_typed::<Node>("", NODE).expect("node deleted");
        let back = wait_for("node restored", || {
            node_of(&store).filter(|n| n.metadata.uid != node.metadata.uid && is_ready(n))
        })
        .await;
        let (events, _) = store.events_since(renewed).expect("history");
        let restored_at = events
            .iter()
            .find(|e| {
                e.key.resource == "nodes"
                    && e.key.name == NODE
                    && e.object["metadata"]["uid"].as_str() != node.metadata.uid.as_deref()
            })
            .map(|e| e.rv)
            .expect("the restored Node's write");
        assert!(
            write_revisions(&store, renewed, "leases", NODE)
                .iter()
                .all(|rv| *rv > restored_at),
            "restored only after another node Lease renewal"
        );
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
        wait_for("owner label restored", || {
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

// ---- Replica identity (issue 37, item 3): Leases only relaylet can claim ----

/// A year: what a Lease writer claims for their ghosts.
const A_YEAR: i32 = 365 * 24 * 3600;

/// Leases written by someone who may write Leases in relaylet's namespace but is not
/// relaylet: each `(name, holder)` claimed for a year, now and then every second, through the
/// root apiserver, until dropped.
struct LeaseWriter(tokio::task::JoinHandle<()>);

impl LeaseWriter {
    async fn renewing(root: &Cluster, claims: Vec<(String, String)>) -> LeaseWriter {
        let leases = lease_api(root).await;
        for (name, holder) in &claims {
            claim(&leases, name, holder).await;
        }
        LeaseWriter(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                for (name, holder) in &claims {
                    claim(&leases, name, holder).await;
                }
            }
        }))
    }
}

impl Drop for LeaseWriter {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The Leases of relaylet's namespace, as an admin of the root sees them.
async fn lease_api(root: &Cluster) -> Api<Lease> {
    let client = kube_client(&root.admin_kubeconfig().expect("kubeconfig"))
        .await
        .expect("admin client");
    Api::namespaced(client, NAMESPACE)
}

/// Writes Lease `name` held by `holder` for a year, renewed now, over whatever it held.
async fn claim(leases: &Api<Lease>, name: &str, holder: &str) {
    let spec = json!({
        "holderIdentity": holder,
        "leaseDurationSeconds": A_YEAR,
        "renewTime": Timestamp::now().to_string(),
    });
    let exists = leases.get_opt(name).await.expect("read lease").is_some();
    if exists {
        leases
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .expect("lease written over");
    } else {
        let lease: Lease = serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": NAMESPACE },
            "spec": spec,
        }))
        .expect("lease");
        leases
            .create(&kube::api::PostParams::default(), &lease)
            .await
            .expect("lease created");
    }
}

/// Leaf `name` with one Ready node `a` (its API objects only).
async fn named_leaf_with_node(name: &str) -> Cluster {
    let leaf = Cluster::start(ClusterOptions::new(name))
        .await
        .expect("leaf starts");
    leaf.api
        .store()
        .create_typed(&leaf_node("a", "10.0.0.1", "4", "8Gi"))
        .expect("leaf node");
    leaf
}

/// Two replicas (`relaylet-0` and `relaylet-1` at `ips`, each test its own so parallel tests
/// never race for one address and port) serving two leaves' Nodes: the root, the leaves (kept
/// alive), the replicas, the replicas' IPs and each Node's replica.
async fn two_replicas_two_nodes(
    ips: [&'static str; 2],
) -> (
    Cluster,
    Vec<Cluster>,
    BTreeMap<&'static str, Replica>,
    BTreeMap<&'static str, &'static str>,
    BTreeMap<String, String>,
) {
    let root = root_cluster(None).await;
    let store = root.api.store().clone();
    let ips = BTreeMap::from([("relaylet-0", ips[0]), ("relaylet-1", ips[1])]);
    let port = free_port();
    let mut replicas = BTreeMap::new();
    for (name, ip) in &ips {
        replicas.insert(*name, Replica::start(&root, name, ip, port, &[]).await);
    }
    let mut leaves = Vec::new();
    let mut nodes = Vec::new();
    for name in ["leaf-0", "leaf-1"] {
        let leaf = named_leaf_with_node(name).await;
        store
            .create_typed(&leaf_secret_named(&leaf, name))
            .expect("secret");
        leaves.push(leaf);
        nodes.push(format!("relaylet-{name}"));
    }
    spread_over(&store, &nodes, &ips).await;
    // The spread may come before the replicas have seen each other renew (a replica counts a
    // peer once it has seen two of its claims, listing every 2 s): a Lease written over before
    // then hides a peer that was never counted, and its Nodes move. Wait until each presence
    // Lease has been renewed four times (6 s: at least two listings of every replica saw it
    // change), then take the spread that stands.
    let seen_from = store.revision();
    wait_for("both replicas renewed four times", || {
        ips.keys()
            .all(|r| {
                writes_since(
                    &store,
                    seen_from,
                    "leases",
                    &format!("relaylet-replica-{r}"),
                ) >= 4
            })
            .then_some(())
    })
    .await;
    let owners = spread_over(&store, &nodes, &ips).await;
    (root, leaves, replicas, ips, owners)
}

/// Asserts that every version of each Node written since revision `since` names the replica
/// `owners` gives it, with that replica's address first: no Node was handed back or taken.
fn nodes_kept_by_their_replicas(
    store: &Store,
    since: u64,
    owners: &BTreeMap<String, String>,
    ips: &BTreeMap<&str, &str>,
) {
    // What the replicas' presence Leases went through meanwhile, for a failure's message.
    let (events, _) = store.events_since(since).expect("history");
    let presence: Vec<String> = events
        .iter()
        .filter(|e| {
            e.key.resource == "leases" && e.key.name.starts_with("relaylet-replica-relaylet-")
        })
        .map(|e| {
            format!(
                "{}@{}={}",
                e.key.name, e.rv, e.object["spec"]["holderIdentity"]
            )
        })
        .collect();
    for (node, owner) in owners {
        let history: Vec<(u64, String, Option<String>)> = events
            .iter()
            .filter(|e| e.key.resource == "nodes" && e.key.name == *node)
            .filter_map(|e| {
                serde_json::from_value::<Node>((*e.object).clone())
                    .ok()
                    .map(|v| (e.rv, v))
            })
            .map(|(rv, v)| (rv, served_by(&v), first_address(&v).map(|a| a.1)))
            .collect();
        for (_, writer, address) in &history {
            assert_eq!(
                writer, owner,
                "{node} changed hands: {history:?}; presence Leases: {presence:?}"
            );
            assert_eq!(
                address.as_deref(),
                Some(ips[owner.as_str()]),
                "{node}'s first address: {history:?}"
            );
        }
        let now = store.get_typed::<Node>("", node).expect("node");
        assert!(is_ready(&now), "{node} Ready");
    }
}

/// Waits until the Lease of each of `nodes` in `kube-node-lease` has been renewed `times`
/// times since revision `since` (a renewal every 10 s: the window the tests watch).
async fn node_leases_renewed(store: &Store, since: u64, nodes: &[&String], times: usize) {
    wait_for("every node Lease renewed meanwhile", || {
        nodes
            .iter()
            .all(|n| write_revisions(store, since, "leases", n).len() >= times)
            .then_some(())
    })
    .await;
}

/// A count of `replica`'s `relaylet_ignored_leases_total` for `reason`.
fn ignored(replica: &Replica, reason: &str) -> f64 {
    let text = replica.running.metrics.encode().expect("metrics");
    relaylet_dev::testkit::metrics::sum(
        &relaylet_dev::testkit::metrics::parse(&text),
        "relaylet_ignored_leases_total",
        &[("reason", reason)],
    )
}

/// Issue 37 item 3: someone who may write Leases in relaylet's namespace writes 20 presence
/// Leases of replicas that do not exist (`relaylet-replica-ghost-N`), claiming a year, and
/// renews them every second. Before, both Nodes were handed back within seconds and their node
/// Leases no longer renewed. Now neither replica gives a Node up: through two renewals of every
/// node Lease, every Node write names its real replica with that replica's address first; the
/// ghosts are counted as ignored by both replicas and told in a `LeaseIgnored` Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ghost_presence_leases_take_no_node_away() {
    tokio::time::timeout(Duration::from_secs(240), async {
        let (root, _leaves, replicas, ips, owners) =
            two_replicas_two_nodes(["127.0.0.12", "127.0.0.13"]).await;
        let store = root.api.store().clone();
        let since = store.revision();
        let ghosts: Vec<(String, String)> = (0..20)
            .map(|i| (format!("relaylet-replica-ghost-{i}"), format!("ghost-{i}")))
            .collect();
        let _writer = LeaseWriter::renewing(&root, ghosts).await;

        let nodes: Vec<&String> = owners.keys().collect();
        node_leases_renewed(&store, since, &nodes, 2).await;
        nodes_kept_by_their_replicas(&store, since, &owners, &ips);
        for (name, replica) in &replicas {
            assert!(
                ignored(replica, "not_a_live_pod") >= 20.0,
                "{name} counts every ghost"
            );
        }
        let events = store
            .list_typed::<k8s_openapi::api::events::v1::Event>(Some(NAMESPACE))
            .expect("events");
        assert!(
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some("LeaseIgnored")
                    && e.regarding
                        .as_ref()
                        .and_then(|r| r.name.as_deref())
                        .is_some_and(|n| n.starts_with("relaylet-replica-ghost-"))
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("not a Running relaylet pod"))),
            "a LeaseIgnored Event names a ghost"
        );
    })
    .await
    .expect("test timed out");
}

/// Issue 37 item 3: the leader Lease and one replica's presence Lease are written over once,
/// each held by a ghost for a year. Before, nobody led for a year and the replica gave up its
/// Nodes until the Leases were deleted. Now the Leases are taken back (the leader by a real
/// replica, the presence by its own replica), and through two renewals of every node Lease
/// each Node stays with its replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hijacked_leader_and_presence_leases_are_taken_back() {
    tokio::time::timeout(Duration::from_secs(240), async {
        let (root, _leaves, replicas, ips, owners) =
            two_replicas_two_nodes(["127.0.0.22", "127.0.0.23"]).await;
        let store = root.api.store().clone();
        wait_for("a leader", || {
            replicas.values().any(Replica::is_leader).then_some(())
        })
        .await;
        let since = store.revision();
        let leases = lease_api(&root).await;
        claim(&leases, relaylet::replicas::LEADER_LEASE, "ghost").await;
        claim(&leases, "relaylet-replica-relaylet-1", "ghost").await;

        let holder = |name: &str| {
            store
                .get_typed::<Lease>(NAMESPACE, name)
                .ok()
                .and_then(|l| l.spec?.holder_identity)
        };
        wait_for("both Leases taken back", || {
            let leader = holder(relaylet::replicas::LEADER_LEASE)?;
            (ips.contains_key(leader.as_str())
                && holder("relaylet-replica-relaylet-1").as_deref() == Some("relaylet-1"))
            .then_some(())
        })
        .await;
        let nodes: Vec<&String> = owners.keys().collect();
        node_leases_renewed(&store, since, &nodes, 2).await;
        nodes_kept_by_their_replicas(&store, since, &owners, &ips);
        assert!(replicas.values().any(Replica::is_leader), "a replica leads");
        assert!(ignored(&replicas["relaylet-1"], "holder_mismatch") >= 1.0);
        assert!(
            replicas
                .values()
                .map(|r| ignored(r, "not_a_live_pod"))
                .sum::<f64>()
                >= 1.0,
            "the ghost leader is counted"
        );
    })
    .await
    .expect("test timed out");
}

/// Each Node's replica as the published assignment (`relaylet-assignment`) gives it, and the
/// replica that wrote it.
fn published(store: &Store) -> Option<(BTreeMap<String, String>, String)> {
    let cm: ConfigMap = store
        .get_typed(NAMESPACE, relaylet::replicas::ASSIGNMENT_CONFIGMAP)
        .ok()?;
    let leader = cm.metadata.annotations?.get("relaylet.io/leader")?.clone();
    let mut nodes = BTreeMap::new();
    for (replica, names) in cm.data.unwrap_or_default() {
        for node in names.lines() {
            nodes.insert(node.to_string(), replica.clone());
        }
    }
    Some((nodes, leader))
}

/// Issue 57: the leader publishes the assignment every replica follows (one view), and a
/// write of it by someone else is written back by the leader at once, moving no Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_publishes_the_assignment_and_a_forged_one_is_written_back() {
    tokio::time::timeout(Duration::from_secs(240), async {
        let (root, _leaves, replicas, ips, owners) =
            two_replicas_two_nodes(["127.0.0.24", "127.0.0.25"]).await;
        let store = root.api.store().clone();
        let leader = wait_for("the Nodes served as published", || {
            let (nodes, leader) = published(&store)?;
            (nodes == owners).then_some(leader)
        })
        .await;
        assert!(
            replicas
                .get(leader.as_str())
                .is_some_and(Replica::is_leader),
            "published by {leader}, the leader"
        );

        // Every Node to the leader, in its name: the other replica would hand its Node back.
        let other = ips.keys().find(|r| **r != leader).expect("another replica");
        let every_node: String = owners.keys().map(|n| format!("{n}\n")).collect();
        let since = store.revision();
        let client = kube_client(&root.admin_kubeconfig().expect("kubeconfig"))
            .await
            .expect("admin client");
        let configmaps: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
        configmaps
            .patch(
                relaylet::replicas::ASSIGNMENT_CONFIGMAP,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({ "data": { leader.as_str(): every_node, *other: null } }),
                ),
            )
            .await
            .expect("assignment written over");
        wait_for("the assignment written back", || {
            let (nodes, by) = published(&store)?;
            let writes = write_revisions(
                &store,
                since,
                "configmaps",
                relaylet::replicas::ASSIGNMENT_CONFIGMAP,
            );
            (nodes == owners && by == leader && writes.len() >= 2).then_some(())
        })
        .await;
        let nodes: Vec<&String> = owners.keys().collect();
        node_leases_renewed(&store, since, &nodes, 2).await;
        nodes_kept_by_their_replicas(&store, since, &owners, &ips);
    })
    .await
    .expect("test timed out");
}

/// Issue 37 item 3: a ghost's presence Lease is renewed every second, and the Node is written
/// over to name the ghost as its writer with a foreign address first. Before, the replica took
/// the Node back only once the ghost stopped renewing (the Node kept the foreign address, where
/// the root apiserver sends its sessions). Now the Node is restored to its replica and address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_handed_to_a_renewing_ghost_is_taken_back() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let root = root_cluster(None).await;
        let leaf = leaf_with_node().await;
        let store = root.api.store().clone();
        store.create_typed(&leaf_secret(&leaf)).expect("secret");
        let _replica = Replica::start(&root, "relaylet-0", "127.0.0.32", 0, &[]).await;
        wait_for("node Ready at relaylet-0", || {
            node_of(&store).filter(|n| {
                is_ready(n)
                    && served_by(n) == "relaylet-0"
                    && first_address(n).is_some_and(|a| a.1 == "127.0.0.32")
            })
        })
        .await;
        let renewing = store.revision();
        let _writer = LeaseWriter::renewing(
            &root,
            vec![("relaylet-replica-ghost".into(), "ghost".into())],
        )
        .await;
        // Renewed several times: relaylet lists the Leases every 2 s, so it has seen the ghost
        // renewing (before, that made it a replica that may still be writing).
        wait_for("the ghost renewed", || {
            (writes_since(&store, renewing, "leases", "relaylet-replica-ghost") >= 5).then_some(())
        })
        .await;

        let since = store.revision();
        let client = kube_client(&root.admin_kubeconfig().expect("kubeconfig"))
            .await
            .expect("admin client");
        let nodes: Api<Node> = Api::all(client);
        let params = kube::api::PatchParams::default();
        nodes
            .patch(
                NODE,
                &params,
                &kube::api::Patch::Merge(
                    json!({ "metadata": { "annotations": { "relaylet.io/served-by": "ghost" } } }),
                ),
            )
            .await
            .expect("served-by written over");
        nodes
            .patch_status(
                NODE,
                &params,
                &kube::api::Patch::Merge(json!({ "status": { "addresses": [
                    { "type": "InternalDNS", "address": "10.99.0.1" }
                ] } })),
            )
            .await
            .expect("address written over");
        wait_for("the Node taken back from the ghost", || {
            node_of(&store).filter(|n| {
                served_by(n) == "relaylet-0"
                    && first_address(n).is_some_and(|a| a.1 == "127.0.0.32")
            })
        })
        .await;
        // The foreign address did land before it was put right.
        assert!(
            versions_since::<Node>(&store, since, "nodes", NODE)
                .iter()
                .any(|n| served_by(n) == "ghost"
                    && first_address(n).is_some_and(|a| a.1 == "10.99.0.1")),
            "the attack landed"
        );
    })
    .await
    .expect("test timed out");
}

/// The leader deletes this install's Nodes whose leaf is not registered (their Secrets went
/// while no relaylet ran), also when they are more than one page of its look (100), and leaves
/// another install's Node alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_nodes_are_collected_page_by_page() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let root = root_cluster(None).await;
        let store = root.api.store().clone();
        let labelled = |name: String, owner: &str| Node {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(BTreeMap::from([
                    (
                        "app.kubernetes.io/managed-by".to_string(),
                        "relaylet".to_string(),
                    ),
                    ("relaylet.io/owner".to_string(), owner.to_string()),
                ])),
                ..Default::default()
            },
            ..Default::default()
        };
        const ORPHANS: usize = 150;
        for i in 0..ORPHANS {
            store
                .create_typed(&labelled(format!("relaylet-gone-{i}"), NAMESPACE))
                .expect("orphan node");
        }
        store
            .create_typed(&labelled("relaylet-theirs".to_string(), "another-install"))
            .expect("another install's node");
        let replica = Replica::start(&root, "relaylet-0", "127.0.0.1", 0, &[]).await;
        // Its first look, all pages of it, deletes every orphan (the next is 30 s later).
        wait_for("the first orphan check", || {
            (counter(&replica, "relaylet_orphan_checks_total") >= 1.0).then_some(())
        })
        .await;
        let names: Vec<String> = store
            .list_typed::<Node>(None)
            .expect("nodes")
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        assert_eq!(names, vec!["relaylet-theirs".to_string()]);
    })
    .await
    .expect("test timed out");
}

/// Two leaves, each with a pod, for two replicas on their own IPs: what the fault tests below
/// start from (their Secrets are created once the replicas run).
struct TwoLeaves {
    root: Cluster,
    leaves: Vec<Cluster>,
    names: [&'static str; 2],
    nodes: Vec<String>,
    ips: BTreeMap<&'static str, &'static str>,
    /// The root apiserver's address, for a forwarder in front of it.
    root_addr: std::net::SocketAddr,
}

async fn two_leaves() -> TwoLeaves {
    let root = root_cluster(None).await;
    let names = ["leaf-0", "leaf-1"];
    let mut leaves = Vec::new();
    for (i, name) in names.iter().enumerate() {
        leaves.push(named_leaf_with_pod(&root, name, &format!("work-{i}")).await);
    }
    let root_addr = root
        .api
        .url()
        .trim_start_matches("https://")
        .parse()
        .expect("root address");
    TwoLeaves {
        root,
        leaves,
        names,
        nodes: names.iter().map(|n| format!("relaylet-{n}")).collect(),
        ips: BTreeMap::from([("relaylet-0", "127.0.0.1"), ("relaylet-1", "127.0.0.2")]),
        root_addr,
    }
}

/// A replica whose root connection is black-holed (no answer, no error: a partition) stops
/// serving its Nodes at its own deadline, its listeners and leaf watches too, before any peer
/// may take them; the peer takes them once its presence expires, and no Node is ever served by
/// both. Once the partition heals, the Nodes go back to where the assignment puts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_from_the_root_lets_go_before_its_nodes_are_taken() {
    tokio::time::timeout(Duration::from_secs(240), async {
        let TwoLeaves {
            root,
            leaves,
            names,
            nodes,
            ips,
            root_addr,
        } = two_leaves().await;
        let store = root.api.store().clone();
        let cut = Forwarder::start(root_addr).await;
        let port = free_port();
        let a = Replica::start_through(
            &root,
            "relaylet-0",
            ips["relaylet-0"],
            port,
            &[],
            Some(&cut),
        )
        .await;
        let b = Replica::start(&root, "relaylet-1", ips["relaylet-1"], port, &[]).await;
        let baseline: Vec<(u64, u64)> = leaves.iter().map(leaf_watches).collect();
        for (leaf, name) in leaves.iter().zip(names) {
            store
                .create_typed(&leaf_secret_named(leaf, name))
                .expect("secret");
        }
        let owners = spread_over(&store, &nodes, &ips).await;
        let node = owners
            .iter()
            .find(|(_, owner)| *owner == "relaylet-0")
            .map(|(node, _)| node.clone())
            .expect("the assignment gives relaylet-0 a Node (2 Nodes, 2 replicas: one each)");

        // From the cut on, each replica's own view: does it hold the Node (its listener open)?
        cut.black_hole(true);
        let mut a_let_go = None;
        let mut b_took = None;
        let mut both = 0;
        let mut samples = 0u64;
        wait_for("relaylet-1 serves the cut replica's Node", || {
            let a_holds = a.running.node_ports.addr_of(&node).is_some();
            let b_holds = b.running.node_ports.addr_of(&node).is_some();
            samples += 1;
            if a_holds && b_holds {
                both += 1;
            }
            if !a_holds && a_let_go.is_none() {
                a_let_go = Some(samples);
            }
            if b_holds && b_took.is_none() {
                b_took = Some(samples);
            }
            let served = store
                .get_typed::<Node>("", &node)
                .ok()
                .filter(|n| served_by(n) == "relaylet-1" && is_ready(n));
            (served.is_some() && b_holds).then_some(())
        })
        .await;
        assert_eq!(
            both, 0,
            "both replicas held {node} at once ({both} of {samples} samples)"
        );
        let (Some(let_go), Some(took)) = (a_let_go, b_took) else {
            panic!("relaylet-0 let go at sample {a_let_go:?}, relaylet-1 took at {b_took:?}");
        };
        assert!(
            let_go < took,
            "relaylet-1 took {node} (sample {took}) before relaylet-0 let go ({let_go})"
        );
        // Nor does the cut replica still watch the leaf it no longer serves.
        let i = names
            .iter()
            .position(|n| format!("relaylet-{n}") == node)
            .expect("leaf");
        // (Its watches close, the taker's open: wait for both.)
        let mut extra = (0, 0);
        let watched = tokio::time::timeout(
            Duration::from_secs(20),
            wait_for("one replica watching the leaf", || {
                let (nodes_watched, pods_watched) = leaf_watches(&leaves[i]);
                extra = (nodes_watched - baseline[i].0, pods_watched - baseline[i].1);
                (extra == (1, 1)).then_some(())
            }),
        )
        .await;
        assert!(
            watched.is_ok(),
            "{node}'s leaf: watches beyond its own {extra:?}, not (1, 1)"
        );

        // Healed: the assignment over both replicas again.
        cut.black_hole(false);
        spread_over(&store, &nodes, &ips).await;
        drop((a, b));
    })
    .await
    .expect("within 240 s");
}

/// After a root apiserver outage longer than a presence Lease's duration (every replica's root
/// traffic black-holed), no Node changes hands, even when the outage ends for one replica
/// first: it does not judge its peer gone for a time no one could renew in, and each replica
/// takes back the Nodes it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_outage_moves_no_node() {
    tokio::time::timeout(Duration::from_secs(240), async {
        let TwoLeaves {
            root,
            leaves,
            names,
            nodes,
            ips,
            root_addr,
        } = two_leaves().await;
        let store = root.api.store().clone();
        let port = free_port();
        let mut replicas = Vec::new();
        for name in ["relaylet-0", "relaylet-1"] {
            let path = Forwarder::start(root_addr).await;
            let replica =
                Replica::start_through(&root, name, ips[name], port, &[], Some(&path)).await;
            replicas.push((replica, path));
        }
        for (leaf, name) in leaves.iter().zip(names) {
            store
                .create_typed(&leaf_secret_named(leaf, name))
                .expect("secret");
        }
        let owners = spread_over(&store, &nodes, &ips).await;
        let since = store.revision();
        for (_, path) in &replicas {
            path.black_hole(true);
        }
        // Both replicas' terms end (7 s after their last renewal) ...
        wait_for("every replica stops serving", || {
            replicas
                .iter()
                .all(|(r, _)| r.running.node_ports.all().is_empty())
                .then_some(())
        })
        .await;
        // ... and their presence Leases go unrenewed past a duration (10 s).
        tokio::time::sleep(Duration::from_secs(12)).await;
        // The outage ends for relaylet-0 first: it is present (after its fresh term's wait)
        // and serves its Node again before relaylet-1 can renew; relaylet-1 then has what is
        // left of a Lease duration from relaylet-0's first listing to renew.
        let (first, first_path) = &replicas[0];
        first_path.black_hole(false);
        wait_for("relaylet-0 serves again", || {
            (!first.running.node_ports.all().is_empty()).then_some(())
        })
        .await;
        replicas[1].1.black_hole(false);
        spread_over(&store, &nodes, &ips).await;
        wait_for("each replica serves its Node again", || {
            replicas
                .iter()
                .zip(["relaylet-0", "relaylet-1"])
                .all(|((r, _), name)| {
                    owners
                        .iter()
                        .filter(|(_, owner)| *owner == name)
                        .all(|(node, _)| r.running.node_ports.addr_of(node).is_some())
                })
                .then_some(())
        })
        .await;
        for node in &nodes {
            let writers: Vec<String> = versions_since::<Node>(&store, since, "nodes", node)
                .iter()
                .map(served_by)
                .collect();
            assert!(
                writers.iter().all(|w| *w == owners[node]),
                "{node} changed hands after the outage: {writers:?}"
            );
        }
        drop(replicas);
    })
    .await
    .expect("within 240 s");
}

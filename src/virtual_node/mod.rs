//! The virtual node controller: one live Node per leaf cluster in the root cluster.
//!
//! For every registered leaf it keeps a Node whose first address is relaylet's own (so the root
//! apiserver sends kubelet calls here), whose kubelet port is `NODE_SERVER_PORT`, whose capacity
//! the scheduler can trust, and whose Ready condition follows the leaf's health; plus a Lease in
//! `kube-node-lease` renewed every 10 s so the root never marks the node NotReady (and evicts its
//! pods) while relaylet is alive. Only the elected leader writes; a new leader rewrites the
//! address with its own IP on its first round.
//!
//! Every Node carries the install that owns it (label `relaylet.io/owner`, the install's
//! namespace): an install writes and deletes only its own Nodes, and one that finds a Node of
//! the same name owned by another install (or a real node) says so loudly and leaves it alone.
//! Each leaf's loop watches its Node, so a deleted or altered Node is put back at once, not at
//! the next heartbeat.

pub mod desired;
pub mod leaf_watch;
pub mod quantity;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeDaemonEndpoints, NodeSpec, NodeStatus, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::Config;
use crate::leader::Leadership;
use crate::leaf::{Leaf, Registry};
use crate::metrics::Metrics;
use crate::node_ports::NodePorts;
use crate::pod_index::PodIndex;
use desired::Health;
use leaf_watch::LeafWatch;

/// How often each leaf's Node is recomputed (written only when it changed).
const RECOMPUTE: Duration = Duration::from_secs(2);
/// How often the leaf's health is probed.
const PROBE_EVERY: Duration = Duration::from_secs(10);
/// Node status is written at least this often, as a heartbeat, even when nothing changed.
const STATUS_HEARTBEAT: Duration = Duration::from_secs(60);
/// Node lease renewal period and duration (the kubelet's defaults).
const LEASE_RENEW: Duration = Duration::from_secs(10);
const NODE_LEASE_SECONDS: i32 = 40;
/// The namespace of node leases.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Label marking Nodes relaylet owns, so it can tidy up after leaves that vanished while it was
/// down.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "relaylet");
/// Label naming the install (its namespace) that owns a Node.
pub const OWNER_LABEL: &str = "relaylet.io/owner";
/// Field manager for relaylet's writes.
const MANAGER: &str = "relaylet";

/// Everything the per-leaf loops share.
pub struct Controller {
    pub config: Arc<Config>,
    pub root: Client,
    pub registry: Registry,
    pub pods: PodIndex,
    pub leadership: Leadership,
    /// Each virtual node's own kubelet port on this replica (written into the Node).
    pub node_ports: NodePorts,
    pub metrics: Metrics,
    /// Readiness hears each leaf probe made here (the one probe of a leaf's health).
    pub health: Arc<crate::health::Health>,
    /// This install's identity on its Nodes (`OWNER_LABEL`): its namespace.
    pub owner: String,
}

/// Whose a Node is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ownership {
    /// Labelled with this install's owner.
    Ours,
    /// relaylet's, from a version that wrote no owner: adopted.
    Unclaimed,
    /// Another relaylet install's (its owner label).
    Install(String),
    /// Not relaylet's at all (a real node, or another tool's).
    Foreign,
}

/// Why a leaf's Node could not be kept.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(
        "node {node} already exists and belongs to {owner}: not touching it (give this leaf another node name with its Secret's relaylet.io/node-name annotation, or remove the other install's leaf)"
    )]
    NotOurs { node: String, owner: String },
}

impl Controller {
    fn ownership(&self, node: &Node) -> Ownership {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        match labels.get(OWNER_LABEL) {
            Some(owner) if *owner == self.owner => Ownership::Ours,
            Some(owner) => Ownership::Install(owner.clone()),
            None if labels.get(MANAGED_BY_LABEL.0).map(String::as_str)
                == Some(MANAGED_BY_LABEL.1) =>
            {
                Ownership::Unclaimed
            }
            None => Ownership::Foreign,
        }
    }

    /// Runs one loop per leaf, following the registry, until dropped.
    pub async fn run(self: Arc<Self>) {
        let mut leaves = self.registry.subscribe();
        let mut leadership = self.leadership.clone();
        let mut loops = Loops::default();
        let mut gc = tokio::time::interval(Duration::from_secs(30));
        // Orphans are looked for as soon as this replica leads with a full registry, then
        // every 30 s.
        let mut checked_since_leading = false;
        loop {
            let current = leaves.borrow_and_update().clone();
            let gone: Vec<String> = loops
                .0
                .iter()
                .filter(|(node, (leaf, _))| {
                    current.get(*node).is_none_or(|l| !Arc::ptr_eq(l, leaf))
                })
                .map(|(node, _)| node.clone())
                .collect();
            for node in gone {
                if let Some((leaf, task)) = loops.0.remove(&node) {
                    task.abort();
                    self.health.leaf_gone(&leaf.name);
                }
                if !current.contains_key(&node) && self.leadership.is_leader() {
                    self.delete_node(&node).await;
                }
            }
            for (node, leaf) in current {
                loops.0.entry(node).or_insert_with(|| {
                    self.health.leaf_registered(&leaf.name);
                    let span = tracing::info_span!("virtual_node", leaf = %leaf.name, node = %leaf.node_name);
                    let task = tokio::spawn(self.clone().run_leaf(leaf.clone()).instrument(span));
                    (leaf, task)
                });
            }
            if !self.leadership.is_leader() {
                checked_since_leading = false;
            } else if !checked_since_leading {
                checked_since_leading = self.collect_orphans().await;
            }
            tokio::select! {
                changed = leaves.changed() => if changed.is_err() { break },
                _ = leadership.changed() => {}
                _ = gc.tick() => { self.collect_orphans().await; }
            }
        }
    }

    /// Deletes this install's Nodes whose leaf is no longer registered (Secret deleted while no
    /// relaylet was running), once the registry has read the Secrets. Whether it looked.
    async fn collect_orphans(&self) -> bool {
        if !self.leadership.is_leader() || !self.registry.synced() {
            return false;
        }
        let api: Api<Node> = Api::all(self.root.clone());
        // Only this install's Nodes: another install's leaves are not in this registry.
        let selector = format!(
            "{}={},{OWNER_LABEL}={}",
            MANAGED_BY_LABEL.0, MANAGED_BY_LABEL.1, self.owner
        );
        let Ok(nodes) = api
            .list_metadata(&ListParams::default().labels(&selector))
            .await
        else {
            return false;
        };
        for node in nodes {
            if let Some(name) = node.metadata.name
                && self.registry.by_node(&name).is_none()
            {
                self.delete_node(&name).await;
            }
        }
        self.metrics.orphan_checks.inc();
        true
    }

    /// Deletes this install's Node `node` and its Lease; anyone else's Node is left alone.
    async fn delete_node(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.root.clone());
        let leases: Api<Lease> = Api::namespaced(self.root.clone(), NODE_LEASE_NAMESPACE);
        let uid = match nodes.get_opt(node).await {
            Ok(Some(found)) if self.ownership(&found) == Ownership::Ours => found.metadata.uid,
            Ok(Some(found)) => {
                tracing::info!(node, owner = ?self.ownership(&found), "not deleting a node this install does not own");
                return;
            }
            Ok(None) => None,
            Err(err) => {
                tracing::warn!(%err, node, "reading virtual node before deleting it");
                return;
            }
        };
        // The uid precondition: never delete a Node someone recreated meanwhile.
        let params = DeleteParams {
            preconditions: uid.map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        for result in [
            nodes.delete(node, &params).await.map(|_| ()),
            leases
                .delete(node, &DeleteParams::default())
                .await
                .map(|_| ()),
        ] {
            match result {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(err) => tracing::warn!(%err, node, "deleting virtual node"),
            }
        }
        tracing::info!(node, "virtual node removed");
    }

    /// Keeps one leaf's Node and Lease up to date.
    async fn run_leaf(self: Arc<Self>, leaf: Arc<Leaf>) {
        let watch = LeafWatch::start(&leaf.client);
        let mut state = LeafLoop {
            health: Health::Unreachable("not probed yet".to_string()),
            probed_at: None,
            version: None,
            written: None,
            lease_renewed: None,
            node_uid: None,
            refused: None,
        };
        let mut tick = tokio::time::interval(RECOMPUTE);
        let mut leadership = self.leadership.clone();
        let mut node_events = self.watch_node(&leaf.node_name);
        loop {
            // Renewal is judged on the tick schedule, not on when the last write finished:
            // otherwise a renewal that took a moment waits a whole extra tick (12 s, not 10 s).
            // A replica that just became leader writes at once, not at the next tick: the
            // takeover after a crash is already the leader Lease's 10 s plus a retry, and the
            // node Lease and address must move well before the root gives up on the Node. The
            // schedule restarts from now, so renewals stay exactly LEASE_RENEW apart.
            let now = tokio::select! {
                now = tick.tick() => now,
                _ = leadership.changed() => {
                    tick.reset_immediately();
                    continue;
                }
                Some(event) = node_events.next() => {
                    // Someone deleted or altered the Node: put it back now, not at the next
                    // heartbeat. Our own writes match what we wrote and change nothing.
                    if self.leadership.is_leader() && state.differs_from(&event, &self) {
                        tracing::info!(node = %leaf.node_name, "virtual node deleted or changed by someone else: restoring it");
                        state.node_uid = None;
                        state.written = None;
                        tick.reset_immediately();
                    }
                    continue;
                }
            };
            if state
                .probed_at
                .is_none_or(|t| now.duration_since(t) >= PROBE_EVERY)
            {
                state.health = leaf_watch::probe(&leaf.client, &watch).await;
                // Not ready (or no Ready node) still means the leaf apiserver answered.
                self.health
                    .leaf_probed(&leaf.name, !matches!(state.health, Health::Unreachable(_)));
                if state.version.is_none() || matches!(state.health, Health::Ready { .. }) {
                    state.version = leaf_watch::version(&leaf.client)
                        .await
                        .or(state.version.take());
                }
                state.probed_at = Some(now);
            }
            if !self.leadership.is_leader() {
                // A future leader term starts from a fresh read of the Node.
                state.written = None;
                state.node_uid = None;
                continue;
            }
            match self.sync_leaf(&leaf, &watch, &mut state, now).await {
                Ok(()) => state.refused = None,
                Err(err @ SyncError::NotOurs { .. }) => {
                    // Said loudly once, not every round; retried in case the other goes.
                    let message = err.to_string();
                    if state.refused.as_deref() != Some(message.as_str()) {
                        tracing::error!(leaf = %leaf.name, node = %leaf.node_name, %err, "virtual node not ours");
                        self.metrics.node_write_error("conflict");
                        state.refused = Some(message);
                    }
                    state.node_uid = None;
                }
                Err(err) => {
                    tracing::warn!(leaf = %leaf.name, node = %leaf.node_name, %err, "updating virtual node");
                    state.node_uid = None;
                }
            }
        }
    }

    async fn sync_leaf(
        &self,
        leaf: &Leaf,
        watch: &LeafWatch,
        state: &mut LeafLoop,
        tick: Instant,
    ) -> Result<(), SyncError> {
        let nodes: Api<Node> = Api::all(self.root.clone());
        let leaf_nodes = watch.node_list();
        let own_pods = self.pods.leaf_pods_on(&leaf.node_name, &leaf.namespaces);
        let now = Time(Timestamp::now());
        let info = desired::node_info(state.version.as_deref(), &leaf_nodes);
        let capacity = desired::capacity(&leaf_nodes, &watch.pod_list(), &own_pods);

        let existing = match state.node_uid {
            Some(_) => None,
            None => Some(self.ensure_node(leaf, &info).await?),
        };
        if let Some(node) = &existing {
            state.node_uid = node.metadata.uid.clone();
            self.keep_labels_and_taints(leaf, node, &info).await?;
        }
        let previous_conditions = existing
            .as_ref()
            .and_then(|n| n.status.as_ref()?.conditions.clone())
            .or_else(|| {
                state
                    .written
                    .as_ref()
                    .map(|(s, _)| s.conditions.clone().unwrap_or_default())
            })
            .unwrap_or_default();
        let status = NodeStatus {
            addresses: Some(desired::addresses(
                &self.config.preferred_address_type,
                self.config.leaf_node_ip,
                &leaf_nodes,
            )),
            allocatable: Some(capacity.clone()),
            capacity: Some(capacity),
            conditions: Some(desired::conditions(
                &state.health,
                &now,
                &previous_conditions,
            )),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    // The node's own listener, so node-level calls (metrics, stats) can tell
                    // virtual nodes apart; the shared port until it is bound.
                    port: i32::from(
                        self.node_ports
                            .addr_of(&leaf.node_name)
                            .map(|a| a.port())
                            .unwrap_or(self.config.node_server_port),
                    ),
                }),
            }),
            node_info: Some(info),
            ..Default::default()
        };
        let changed = state.written.as_ref().is_none_or(|(old, at)| {
            !same_ignoring_heartbeats(old, &status) || at.elapsed() >= STATUS_HEARTBEAT
        });
        if changed {
            // A merge patch replaces lists whole: the address list is written atomically, never
            // merged entry by entry (which breaks dual-stack lists).
            if !self.leadership.is_leader() {
                return Ok(());
            }
            nodes
                .patch_status(
                    &leaf.node_name,
                    &patch_params(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .inspect_err(|_| self.metrics.node_write_error("node"))?;
            tracing::debug!(node = %leaf.node_name, "node status written");
            state.written = Some((status, Instant::now()));
        }
        if state
            .lease_renewed
            .is_none_or(|t| tick.duration_since(t) >= LEASE_RENEW)
        {
            if !self.leadership.is_leader() {
                return Ok(());
            }
            self.renew_lease(&leaf.node_name, state.node_uid.as_deref())
                .await
                .inspect_err(|_| self.metrics.node_write_error("lease"))?;
            state.lease_renewed = Some(tick);
        }
        Ok(())
    }

    /// The watch events of Node `name`: applied (created or changed) or deleted.
    fn watch_node(&self, name: &str) -> BoxStream<'static, NodeEvent> {
        let api: Api<Node> = Api::all(self.root.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        watcher(api, config)
            .default_backoff()
            .filter_map(|event| async move {
                match event {
                    Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                        Some(NodeEvent::Applied(Box::new(node)))
                    }
                    Ok(watcher::Event::Delete(_)) => Some(NodeEvent::Deleted),
                    Ok(_) => None,
                    Err(err) => {
                        tracing::debug!(%err, "watching the virtual node (retrying)");
                        None
                    }
                }
            })
            .boxed()
    }

    /// Gets the Node, creating it when missing.
    async fn ensure_node(
        &self,
        leaf: &Leaf,
        info: &k8s_openapi::api::core::v1::NodeSystemInfo,
    ) -> Result<Node, SyncError> {
        let nodes: Api<Node> = Api::all(self.root.clone());
        if let Some(node) = nodes.get_opt(&leaf.node_name).await? {
            return match self.ownership(&node) {
                Ownership::Ours | Ownership::Unclaimed => Ok(node),
                Ownership::Install(owner) => Err(SyncError::NotOurs {
                    node: leaf.node_name.clone(),
                    owner: format!("the relaylet install in namespace {owner}"),
                }),
                Ownership::Foreign => Err(SyncError::NotOurs {
                    node: leaf.node_name.clone(),
                    owner: "something other than relaylet".to_string(),
                }),
            };
        }
        let labels = self.labels_for(leaf, info);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(leaf.node_name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(self.taints_for(leaf)),
                ..Default::default()
            }),
            status: None,
        };
        tracing::info!(node = %leaf.node_name, leaf = %leaf.name, "creating virtual node");
        match nodes.create(&PostParams::default(), &node).await {
            Ok(node) => Ok(node),
            // Another writer won the race: use its Node if it is ours (checked next round).
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(nodes.get(&leaf.node_name).await?),
            Err(e) => Err(e.into()),
        }
    }

    /// The labels relaylet keeps on a leaf's Node, including the one that marks it as ours.
    fn labels_for(
        &self,
        leaf: &Leaf,
        info: &k8s_openapi::api::core::v1::NodeSystemInfo,
    ) -> BTreeMap<String, String> {
        let mut labels = desired::labels(
            &leaf.node_name,
            &leaf.name,
            &self.config.preferred_address_type,
            info,
            &leaf.node_labels,
        );
        labels.insert(
            MANAGED_BY_LABEL.0.to_string(),
            MANAGED_BY_LABEL.1.to_string(),
        );
        labels.insert(OWNER_LABEL.to_string(), self.owner.clone());
        labels
    }

    fn taints_for(&self, leaf: &Leaf) -> Vec<Taint> {
        leaf.node_taints
            .clone()
            .unwrap_or_else(|| vec![desired::default_taint()])
    }

    /// Puts relaylet's labels and taints on an existing Node without touching anyone else's
    /// (the node lifecycle controller's `unreachable` taint, labels users added).
    async fn keep_labels_and_taints(
        &self,
        leaf: &Leaf,
        node: &Node,
        info: &k8s_openapi::api::core::v1::NodeSystemInfo,
    ) -> Result<(), kube::Error> {
        let labels = self.labels_for(leaf, info);
        let current_labels = node.metadata.labels.clone().unwrap_or_default();
        let labels_ok = labels.iter().all(|(k, v)| current_labels.get(k) == Some(v));

        let ours = self.taints_for(leaf);
        let current_taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let mut wanted: Vec<Taint> = current_taints
            .iter()
            .filter(|t| {
                t.key != desired::default_taint().key && !ours.iter().any(|o| o.key == t.key)
            })
            .cloned()
            .collect();
        wanted.extend(ours);
        let same_taints = |a: &[Taint], b: &[Taint]| {
            let key = |t: &Taint| (t.key.clone(), t.value.clone(), t.effect.clone());
            let mut a: Vec<_> = a.iter().map(key).collect();
            let mut b: Vec<_> = b.iter().map(key).collect();
            a.sort();
            b.sort();
            a == b
        };
        let taints_ok = same_taints(&wanted, &current_taints);
        if labels_ok && taints_ok {
            return Ok(());
        }
        let mut patch = json!({});
        if !labels_ok {
            patch["metadata"] = json!({ "labels": labels });
        }
        if !taints_ok {
            patch["spec"] = json!({ "taints": wanted });
        }
        if !self.leadership.is_leader() {
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.root.clone());
        nodes
            .patch(&leaf.node_name, &patch_params(), &Patch::Merge(patch))
            .await
            .map(|_| ())
    }

    async fn renew_lease(&self, node: &str, node_uid: Option<&str>) -> Result<(), kube::Error> {
        let leases: Api<Lease> = Api::namespaced(self.root.clone(), NODE_LEASE_NAMESPACE);
        let now = MicroTime(Timestamp::now());
        let spec = LeaseSpec {
            holder_identity: Some(node.to_string()),
            lease_duration_seconds: Some(NODE_LEASE_SECONDS),
            renew_time: Some(now),
            ..Default::default()
        };
        match leases
            .patch(
                node,
                &patch_params(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let owner = node_uid.map(|uid| OwnerReference {
                    api_version: "v1".to_string(),
                    kind: "Node".to_string(),
                    name: node.to_string(),
                    uid: uid.to_string(),
                    ..Default::default()
                });
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(node.to_string()),
                        namespace: Some(NODE_LEASE_NAMESPACE.to_string()),
                        owner_references: owner.map(|o| vec![o]),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                match leases.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..Default::default()
    }
}

/// The running per-leaf loops. They are aborted when this is dropped: relaylet stops the
/// controller by dropping its future at shutdown, and a dropped `JoinHandle` alone would leave
/// every loop running (still probing leaves and, without leader election, still writing Nodes
/// and Leases after relaylet said it stopped).
#[derive(Default)]
struct Loops(HashMap<String, (Arc<Leaf>, JoinHandle<()>)>);

impl Drop for Loops {
    fn drop(&mut self) {
        for (_, (_, task)) in self.0.drain() {
            task.abort();
        }
    }
}

/// Per-leaf loop memory.
struct LeafLoop {
    health: Health,
    probed_at: Option<Instant>,
    version: Option<String>,
    /// The status last written and when.
    written: Option<(NodeStatus, Instant)>,
    lease_renewed: Option<Instant>,
    node_uid: Option<String>,
    /// Why the Node was last refused (it is not ours), so that is logged once.
    refused: Option<String>,
}

/// What the watch of a leaf's Node saw.
enum NodeEvent {
    Applied(Box<Node>),
    Deleted,
}

impl LeafLoop {
    /// Whether `event` shows the Node other than this loop left it: gone, replaced, without our
    /// labels, or with other addresses or kubelet port than written.
    fn differs_from(&self, event: &NodeEvent, controller: &Controller) -> bool {
        let NodeEvent::Applied(node) = event else {
            return self.node_uid.is_some();
        };
        if self.node_uid.is_none() {
            // Not written yet (or being restored): the loop's next round reads it anyway.
            return false;
        }
        if node.metadata.uid != self.node_uid || controller.ownership(node) != Ownership::Ours {
            return true;
        }
        let Some((written, _)) = &self.written else {
            return false;
        };
        let status = node.status.as_ref();
        status.and_then(|s| s.addresses.as_ref()) != written.addresses.as_ref()
            || status.and_then(|s| s.daemon_endpoints.as_ref()) != written.daemon_endpoints.as_ref()
    }
}

/// Whether two statuses differ in anything but heartbeat times.
fn same_ignoring_heartbeats(a: &NodeStatus, b: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    };
    strip(a) == strip(b)
}

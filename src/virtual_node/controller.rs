//! The virtual node controller: the set of leaf loops (one per registered leaf, orphans
//! removed), the assignment they follow, and the writes of the Node object they share.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::desired;
use super::node_watch::NodeWatch;
use super::rounds::Grid;
use crate::config::Config;
use crate::kube_client::{continued, page_of, paged};
use crate::leaf::{Leaf, Registry};
use crate::node_server::NodePorts;
use crate::ops::{HANDOVER_LIMIT, HANDOVER_SETTLE, Health, Metrics, Shutdown};
use crate::replicas::served_by;
use crate::replicas::{Assignment, Leadership, Publication, Replicas};
use crate::routing::PodIndex;

// Whose a Node is: one rule, shared with the leaf Secret checks.
use crate::model::node_ownership::{MANAGED_BY_LABEL, OWNER_LABEL, Ownership};
/// Field manager for relaylet's writes.
const MANAGER: &str = "relaylet";
/// How often the leader looks for Nodes of leaves no longer registered.
const ORPHAN_CHECK_EVERY: Duration = Duration::from_secs(30);
/// Nodes per page of that look.
const ORPHAN_PAGE: u32 = 100;

/// Everything the per-leaf loops share.
pub struct Controller {
    pub config: Arc<Config>,
    pub root: Client,
    pub registry: Registry,
    pub pods: PodIndex,
    pub leadership: Leadership,
    /// This replica and the others: whom virtual nodes are spread over.
    pub replicas: Replicas,
    /// The assignment the leader publishes (this replica offers its own, for when it leads).
    pub publication: Publication,
    /// Each virtual node's replica, recomputed when the leaves, the replicas or the published
    /// assignment change.
    pub assignment: watch::Sender<Arc<Assignment>>,
    /// The virtual nodes this replica writes now (their Node names it in `served-by`).
    pub served: watch::Sender<BTreeSet<String>>,
    /// Each virtual node's own kubelet port on this replica (written into the Node).
    pub node_ports: NodePorts,
    pub metrics: Metrics,
    /// Readiness hears each leaf probe made here (the one probe of a leaf's health).
    pub health: Arc<Health>,
    /// This install's identity on its Nodes (`OWNER_LABEL`): its namespace.
    pub owner: String,
    /// The one watch of the root's relaylet Nodes; each leaf's loop hears its own Node's events.
    pub nodes: NodeWatch,
    /// The grid every leaf loop's rounds fall on, so a fleet's loops share wake-ups.
    pub grid: Grid,
    /// Fired when this replica shuts down and hands its Nodes over (its presence released).
    pub handing_over: tokio_util::sync::CancellationToken,
}

/// What the controller is started with.
pub struct Parts {
    pub config: Arc<Config>,
    pub root: Client,
    pub registry: Registry,
    pub pods: PodIndex,
    pub leadership: Leadership,
    pub replicas: Replicas,
    pub publication: Publication,
    pub node_ports: NodePorts,
    pub metrics: Metrics,
    pub health: Arc<Health>,
    /// This install's identity on its Nodes: its namespace.
    pub owner: String,
}

/// Starts the controller: the Nodes' watch and the leaf loops until shutdown begins, and the
/// hand-over of this replica's Nodes when it shuts down.
pub fn start(parts: Parts, shutdown: &Shutdown) -> Arc<Controller> {
    let controller = Arc::new(Controller {
        config: parts.config,
        root: parts.root,
        registry: parts.registry,
        pods: parts.pods,
        leadership: parts.leadership,
        replicas: parts.replicas,
        publication: parts.publication,
        assignment: watch::Sender::new(Default::default()),
        served: watch::Sender::new(Default::default()),
        node_ports: parts.node_ports,
        metrics: parts.metrics,
        health: parts.health,
        owner: parts.owner,
        nodes: NodeWatch::default(),
        grid: Grid::starting_now(),
        handing_over: shutdown.hand_over.clone(),
    });
    let stop = shutdown.begin.clone();
    let nodes = controller.nodes.clone().run(controller.root.clone());
    let loops = controller.clone().run();
    tokio::spawn(async move {
        tokio::select! {
            () = async { tokio::join!(nodes, loops); } => {}
            () = stop.cancelled() => {}
        }
    });
    tokio::spawn(controller.clone().hand_over(shutdown.clone()));
    controller
}

/// Why a leaf's Node could not be kept.
#[derive(Debug, thiserror::Error)]
pub(super) enum SyncError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(
        "node {node} already exists and belongs to {owner}: not touching it (give this leaf another node name with its Secret's relaylet.io/node-name annotation, or remove the other install's leaf)"
    )]
    NotOurs { node: String, owner: String },
    #[error("node {node} has no kubelet port of its own yet (see the node listener's log)")]
    NoPort { node: String },
    /// A write carrying the Node's resourceVersion met a newer Node: read it again (whoever
    /// wrote it may have taken it over).
    #[error("node {node} changed since this replica last read it")]
    Changed { node: String },
}

impl SyncError {
    /// What a failed write of Node `node` that carried its resourceVersion means: a 409 is the
    /// Node changed since it was read ([`SyncError::Changed`]), anything else the API's error.
    pub(super) fn of_guarded_write(node: &str, err: kube::Error) -> SyncError {
        match err {
            kube::Error::Api(e) if e.code == 409 => SyncError::Changed {
                node: node.to_string(),
            },
            err => SyncError::Api(err),
        }
    }
}

impl Controller {
    pub(super) fn ownership(&self, node: &Node) -> Ownership {
        crate::model::node_ownership::ownership(node, &self.owner)
    }

    /// Shutting down: once `hand_over` fires, waits until the other replicas write this one's
    /// virtual nodes (at most `HANDOVER_LIMIT`), then fires `begin` (stop accepting). `begin`
    /// fired by anyone else hands over too.
    async fn hand_over(self: Arc<Self>, shutdown: Shutdown) {
        tokio::select! {
            _ = shutdown.hand_over.cancelled() => {
                match tokio::time::timeout(HANDOVER_LIMIT, self.handed_over()).await {
                    // A request the root apiserver routed by the old address just before the
                    // new writer's update is still on its way here: a moment to arrive.
                    Ok(()) => tokio::time::sleep(HANDOVER_SETTLE).await,
                    Err(_) => tracing::warn!(
                        nodes = self.served.borrow().len(),
                        "no other replica took this one's virtual nodes in time: stopping anyway"
                    ),
                }
            }
            _ = shutdown.begin.cancelled() => {}
        }
        shutdown.hand_over.cancel();
        shutdown.begin.cancel();
    }

    /// Runs one loop per leaf, following the registry, and the leader's look for orphaned
    /// Nodes, until dropped. The look lists every Node of the install (10 pages at 1,000), so
    /// it runs beside the loops' upkeep, not in it: a replica elected leader because a peer
    /// died is about to see that peer gone, and its reassignment (its share of the takeover)
    /// must not wait for the look to finish.
    pub async fn run(self: Arc<Self>) {
        tokio::select! {
            () = self.clone().follow_registry() => {}
            () = self.look_for_orphans() => {}
            () = self.keep_rows() => {}
        }
    }

    /// Keeps one loop per registered leaf and the assignment current, until the registry
    /// closes.
    async fn follow_registry(self: Arc<Self>) {
        let mut leaves = self.registry.subscribe();
        let mut replicas = self.replicas.clone();
        let mut present = self.replicas.present.clone();
        let mut leadership = self.leadership.clone();
        let mut publication = self.publication.clone();
        let mut loops = Loops::default();
        loop {
            let current = leaves.borrow_and_update().clone();
            self.metrics
                .virtual_nodes_registered
                .set(current.len() as i64);
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
                    self.set_served(&node, false);
                }
                if !current.contains_key(&node) {
                    // Replaced (its Secret changed), the node keeps its port for the new loop.
                    self.node_ports.release(&node);
                    if self.leadership.is_leader() {
                        self.delete_node(&node).await;
                    }
                }
            }
            self.reassign(current.keys().map(String::as_str));
            for (node, leaf) in current {
                loops.0.entry(node).or_insert_with(|| {
                    let span = tracing::info_span!("virtual_node", leaf = %leaf.name, node = %leaf.node_name);
                    let task = tokio::spawn(self.clone().run_leaf(leaf.clone()).instrument(span));
                    (leaf, task)
                });
            }
            tokio::select! {
                changed = leaves.changed() => if changed.is_err() { break },
                _ = replicas.changed() => {}
                _ = present.changed() => {}
                _ = leadership.changed() => {}
                _ = publication.changed() => {}
            }
        }
    }

    /// While this replica leads: looks for orphaned Nodes as soon as it leads with a full
    /// registry, then every 30 s.
    async fn look_for_orphans(&self) {
        let mut leaves = self.registry.subscribe();
        let mut leadership = self.leadership.clone();
        let mut gc = tokio::time::interval(ORPHAN_CHECK_EVERY);
        let mut checked_since_leading = false;
        loop {
            if !self.leadership.is_leader() {
                checked_since_leading = false;
            } else if !checked_since_leading {
                checked_since_leading = self.collect_orphans().await;
            }
            tokio::select! {
                changed = leaves.changed() => if changed.is_err() { return },
                _ = leadership.changed() => {}
                _ = gc.tick() => { self.collect_orphans().await; }
            }
        }
    }

    /// Recomputes which replica serves each of `nodes`: the published assignment where it is
    /// followed, this replica's own answer from the replicas seen now elsewhere. The leader
    /// offers its own answer for publishing once every leaf Secret was read (before, it would
    /// publish a part of the Nodes, spread as if there were no others).
    fn reassign<'a>(&self, nodes: impl IntoIterator<Item = &'a str>) {
        let peers = self.replicas.peers();
        let me = &*self.replicas.me;
        let present = self.replicas.present.is_leader();
        let leading = self.leadership.is_leader();
        let local = Assignment::compute(nodes, peers.candidates(me, present));
        if leading && self.registry.synced() {
            self.publication.offer(&local);
        }
        let published = self.publication.current();
        let assignment = crate::replicas::effective(published.as_deref(), &local, me, &peers);
        self.assignment.send_if_modified(|old| {
            let changed = **old != assignment;
            if changed {
                *old = Arc::new(assignment);
            }
            changed
        });
    }

    /// Whether this replica should write `node` now: it is present and `node` is assigned to it.
    pub(super) fn assigned(&self, node: &str) -> bool {
        self.replicas.present.is_leader()
            && self.assignment.borrow().replica_of(node) == Some(&*self.replicas.me)
    }

    /// Records whether this replica writes `node` (the served-nodes gauge and the hand-over
    /// wait follow it).
    pub(super) fn set_served(&self, node: &str, served: bool) {
        self.served.send_if_modified(|set| {
            if served {
                set.insert(node.to_string())
            } else {
                set.remove(node)
            }
        });
        self.metrics
            .virtual_nodes_served
            .set(self.served.borrow().len() as i64);
    }

    /// Resolves once this replica, shutting down, need not wait any longer before it stops
    /// accepting: every Node it wrote is now written by another replica, or there is no other
    /// replica to hand them to.
    pub async fn handed_over(&self) {
        let mut served = self.served.subscribe();
        let mut replicas = self.replicas.clone();
        loop {
            if served.borrow_and_update().is_empty()
                || !self.replicas.peers().others_renewing(&self.replicas.me)
            {
                return;
            }
            tokio::select! {
                _ = served.changed() => {}
                _ = replicas.changed() => {}
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
        // In pages: at 1,000 leaves one answer of every Node's metadata (managed fields
        // included) is several MiB, read every 30 s.
        let params = ListParams::default().labels(&selector).limit(ORPHAN_PAGE);
        // Only the orphans' names are kept of each page.
        let orphans = paged(|token| {
            let params = continued(&params, token);
            let api = api.clone();
            async move {
                let (nodes, next) = page_of(api.list_metadata(&params).await?);
                let names = nodes
                    .into_iter()
                    .filter_map(|node| node.metadata.name)
                    .filter(|name| self.registry.by_node(name).is_none())
                    .collect();
                Ok::<_, kube::Error>((names, next))
            }
        })
        .await;
        let Ok(orphans) = orphans else {
            return false;
        };
        for name in orphans {
            // Registered meanwhile (the loops' upkeep runs beside this look): not an orphan.
            if self.registry.by_node(&name).is_none() {
                self.delete_node(&name).await;
            }
        }
        self.metrics.orphan_checks.inc();
        true
    }

    /// Deletes this install's Node `node` and its Lease; anyone else's Node is left alone.
    async fn delete_node(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.root.clone());
        let leases = self.node_leases();
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

    /// Gets the Node, creating it when missing.
    pub(super) async fn ensure_node(
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
                // Created by the replica that will write it.
                annotations: Some(BTreeMap::from([(
                    served_by::SERVED_BY.to_string(),
                    self.replicas.me.to_string(),
                )])),
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
    /// (the node lifecycle controller's `unreachable` taint, labels users added); the Node as
    /// written, if it was. The write carries `node`'s resourceVersion.
    pub(super) async fn keep_labels_and_taints(
        &self,
        leaf: &Leaf,
        node: &Node,
        info: &k8s_openapi::api::core::v1::NodeSystemInfo,
    ) -> Result<Option<Node>, SyncError> {
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
            return Ok(None);
        }
        let mut patch =
            json!({ "metadata": { "resourceVersion": node.metadata.resource_version } });
        if !labels_ok {
            patch["metadata"]["labels"] = json!(labels);
        }
        if !taints_ok {
            patch["spec"] = json!({ "taints": wanted });
        }
        if !self.assigned(&leaf.node_name) {
            return Ok(None);
        }
        let nodes: Api<Node> = Api::all(self.root.clone());
        nodes
            .patch(&leaf.node_name, &patch_params(), &Patch::Merge(patch))
            .await
            .map(Some)
            .map_err(|err| SyncError::of_guarded_write(&leaf.node_name, err))
    }
}

pub(super) fn patch_params() -> PatchParams {
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

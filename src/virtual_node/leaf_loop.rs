//! One leaf's loop: probes the leaf, recomputes its Node every few seconds and, on the replica
//! the Node is assigned to, writes the Node (when it changed, and as a heartbeat) and renews its
//! Lease; its Node's events put it back at once when someone else deletes or alters it.
//!
//! Every replica runs this loop for every leaf, but between terms it only waits: for the Node to
//! be assigned here (the assignment, this replica's presence) or to name this replica (its
//! events from the replica's one watch of the Nodes, `node_watch`). A term keeps the Node while
//! it is assigned here, written by this replica or names it, and ends when none holds. The
//! leaf side, the watches of the leaf's nodes and pods, its probes and
//! the root watch of the pods on its Node ([`LeafSide`]), runs only on the replica that
//! serves the Node, is assigned it, or is still handing it over: each leaf is watched by one
//! replica, and a leaf handed away is forgotten once the Node names its new replica. A replica
//! that starts a leaf (a takeover) does not know it yet: until its watches have listed, it
//! writes the Node's addresses (so the leaf's sessions come to it) and leaves the status the
//! previous replica wrote (conditions, capacity, node info) as it is.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{DaemonEndpoint, Node, NodeDaemonEndpoints, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::Patch;
use serde_json::json;
use tokio::time::Instant;

use super::desired::{self, LeafHealth};
use super::leaf_watch::{self, LeafWatch};
use super::node_lease::{LEASE_RENEW, LeaseMark};
use super::node_watch::NodeEvent;
use super::rounds::Rounds;
use super::{Controller, Ownership, SyncError, patch_params, served_by};
use crate::leaf::Leaf;
use crate::model::counterpart::LeafPodMatch;
use crate::pod_sync::{self, LeafPodSync};
use crate::routing::NodePods;

/// How many of the Node's own recent versions a loop remembers (a claim, labels, a status
/// write: the events of one round's writes).
const KNOWN_VERSIONS: usize = 4;
/// How often each leaf's Node is recomputed (written only when it changed).
const RECOMPUTE: Duration = Duration::from_secs(2);
/// How often the leaf's health is probed.
const PROBE_EVERY: Duration = Duration::from_secs(10);
/// Node status is written at least this often, as a heartbeat, even when nothing changed: the
/// kubelet's `nodeStatusReportFrequency` (5 minutes). The node Lease, renewed every 10 s, is
/// what the node lifecycle controller watches for liveness; a status write each minute (as
/// before) cost the root 7.0 writes per leaf per minute where a kubelet costs 6.2.
const STATUS_HEARTBEAT: Duration = Duration::from_secs(300);
/// How often a Ready leaf's version is read again (it changes only when the leaf is upgraded);
/// reading it on every probe doubled the calls an idle leaf costs.
const VERSION_EVERY: Duration = Duration::from_secs(300);
/// How long a leaf just started here is given to list its nodes and pods before its new Node
/// is written without them (addresses only): long enough for any leaf that answers. A Node
/// taken over is not held back by it: its addresses move at once, its status stays.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(1);
/// How long a Node keeps the status its previous replica wrote while this replica's watches of
/// the leaf have not listed yet; after it, the leaf is judged by its probe (NotReady when it
/// still cannot be listed).
const COLD_GRACE: Duration = Duration::from_secs(30);

/// The leaf side of one leaf's loop, run while this replica serves the leaf's Node (or is
/// assigned it, or hands it over): the watches of the leaf's nodes and pods. Dropping it
/// closes them and frees what they kept.
struct LeafSide {
    watch: LeafWatch,
    /// The watch of the root pods on the leaf's Node (routing, and which leaf pods stand for
    /// root pods in the Node's capacity).
    pods: NodePods,
    started: Instant,
    /// The leaf's watches and the root pod watch have listed once since `started`.
    listed: bool,
    /// `relaylet_leaves_served`, counted while this lives.
    served: prometheus_client::metrics::gauge::Gauge,
    /// The leaf's pods, run while this replica writes the Node (`LEAF_POD_SYNC`).
    pods_run: Option<LeafPodSync>,
}

impl LeafSide {
    /// Whether the watches have not listed yet and the Node's previous status is kept.
    fn cold(&self) -> bool {
        !self.listed && self.started.elapsed() < COLD_GRACE
    }
}

impl Drop for LeafSide {
    fn drop(&mut self) {
        self.served.dec();
    }
}
/// What a loop knows of its Node from the last event, carried between its terms.
#[derive(Clone, Copy, Default)]
struct Seen {
    /// The Node names this replica as its writer (held by this process or not).
    names_me: bool,
    /// The Node exists.
    node_exists: bool,
}

impl Seen {
    fn of(event: &NodeEvent, me: &str) -> Seen {
        Seen {
            names_me: matches!(event, NodeEvent::Applied(node) if served_by::served_by(node) == me),
            node_exists: matches!(event, NodeEvent::Applied(_)),
        }
    }
}

impl Controller {
    /// Keeps one leaf's Node and Lease up to date. A term ([`Controller::keep_leaf`]) runs
    /// while the Node is assigned to this replica, is written by it or names it; between terms
    /// the loop only waits for that to change: a few hundred bytes and no rounds, where a term
    /// is a boxed future of about 1.4 KiB woken every 2 s (at 1,000 leaves on three replicas,
    /// two thirds of each replica's loops are between terms).
    pub(super) async fn run_leaf(self: Arc<Self>, leaf: Arc<Leaf>) {
        let mut assignment = self.assignment.subscribe();
        let mut replicas = self.replicas.clone();
        // Whether this replica may serve at all: a term starts only while it may.
        let mut present = self.replicas.present.clone();
        let node_events = self.nodes.subscribe(&leaf.node_name);
        Box::pin(node_events.prime(&self.root)).await;
        let mut seen = Seen::default();
        loop {
            if seen.names_me || self.assigned(&leaf.node_name) {
                let term =
                    self.keep_leaf(&leaf, &mut assignment, &mut replicas, &node_events, seen);
                match Box::pin(term).await {
                    Some(after) => seen = after,
                    None => return,
                }
                continue;
            }
            tokio::select! {
                changed = assignment.changed() => if changed.is_err() { return },
                _ = replicas.changed() => {}
                _ = present.changed() => {}
                event = node_events.next() => seen = Seen::of(&event, &self.replicas.me),
            }
        }
    }

    /// One term of a leaf's loop: until the Node is neither assigned here, nor written by this
    /// replica, nor names it. What the Node's events said at its end (`None`: the controller
    /// is gone). Each round: the leaf watched or not, a wait for the next round or event, the
    /// leaf's first listing and probe, then either the Node handed back (assigned elsewhere)
    /// or written.
    async fn keep_leaf(
        &self,
        leaf: &Arc<Leaf>,
        assignment: &mut tokio::sync::watch::Receiver<Arc<crate::replicas::Assignment>>,
        replicas: &mut crate::replicas::Replicas,
        node_events: &super::node_watch::Subscription,
        seen: Seen,
    ) -> Option<Seen> {
        let mut leaf_side: Option<LeafSide> = None;
        let mut state = LeafLoop::new(seen);
        let mut tick = Rounds::every(RECOMPUTE, self.grid);
        // This Node's replica in the assignment as last seen: the assignment changes with
        // every leaf registered or replica seen, and only a change of this Node's replica is
        // this loop's business.
        let mut replica = assignment
            .borrow_and_update()
            .replica_of(&leaf.node_name)
            .map(str::to_string);
        loop {
            // The leaf is watched only while this replica serves its Node, is assigned it or
            // still hands it over.
            let wanted = state.held || self.assigned(&leaf.node_name);
            if wanted && leaf_side.is_none() {
                leaf_side = Some(self.start_leaf(leaf));
                state.probed_at = None;
                state.version_read = None;
            } else if !wanted && leaf_side.is_some() {
                leaf_side = None;
                self.stop_leaf(leaf, &mut state);
            }
            self.follow_pods(leaf, leaf_side.as_mut(), state.held);
            // Renewal is judged on the tick schedule, not on when the last write finished:
            // otherwise a renewal that took a moment waits a whole extra tick (12 s, not 10 s).
            // A replica just assigned the node (or whose peers changed, so the node's holder
            // may be gone) acts at once, not at the next tick: the takeover after a crash is
            // already the presence Lease's 10 s plus a retry, and the node Lease and address
            // must move well before the root gives up on the Node. Regular rounds carry on a
            // period after it (on the grid), so renewals come LEASE_RENEW to LEASE_RENEW plus
            // one round apart.
            let now = tokio::select! {
                now = tick.next() => now,
                changed = assignment.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    let seen = assignment.borrow_and_update();
                    let now = seen.replica_of(&leaf.node_name);
                    if now != replica.as_deref() {
                        replica = now.map(str::to_string);
                        tick.now();
                    }
                    continue;
                }
                _ = replicas.changed() => {
                    if !state.held && self.assigned(&leaf.node_name) {
                        tick.now();
                    }
                    continue;
                }
                event = node_events.next() => {
                    if self.on_node_event(leaf, &mut state, &event) {
                        tick.now();
                    }
                    continue;
                }
            };
            let cold = match leaf_side.as_mut() {
                Some(side) => Box::pin(self.first_listing(side, &state)).await,
                None => false,
            };
            if let Some(side) = leaf_side.as_ref().filter(|_| !cold) {
                Box::pin(self.probe_if_due(leaf, side, &mut state, now)).await;
            }
            if !self.assigned(&leaf.node_name) {
                if let Some(end) = Box::pin(self.hand_back_round(leaf, &mut state)).await {
                    if leaf_side.take().is_some() {
                        self.stop_leaf(leaf, &mut state);
                    }
                    return Some(end);
                }
                continue;
            }
            let Some(side) = leaf_side.as_ref() else {
                // Assigned a moment ago: the next round starts the leaf.
                tick.now();
                continue;
            };
            let sync = Box::pin(self.sync_leaf(leaf, &side.watch, cold, &mut state, now));
            let Some(result) = self.while_present(sync).await else {
                // Its term ended under a write that hangs: the next round lets go at once.
                tick.now();
                continue;
            };
            if self.after_sync(leaf, &mut state, result) {
                tick.now();
            }
            self.follow_pods(leaf, leaf_side.as_mut(), state.held);
        }
    }

    /// What an event of the Node means for this term; whether to act at once (not at the next
    /// round).
    fn on_node_event(&self, leaf: &Leaf, state: &mut LeafLoop, event: &NodeEvent) -> bool {
        state.seen = Seen::of(event, &self.replicas.me);
        let assigned = self.assigned(&leaf.node_name);
        // Handed back by its last writer (named no one) while assigned here: take it now, not at
        // the next round (a replica joining, or the assignment moving).
        if !state.held
            && assigned
            && matches!(event, NodeEvent::Applied(node) if served_by::served_by(node).is_empty() && self.ownership(node) == Ownership::Ours)
        {
            return true;
        }
        if state.held && state.taken_away(event, &self.replicas.me, self.config.leaf_node_ip) {
            // Another replica writes the Node now: when this one is not assigned it (it is
            // handing over), that is the hand-over done; when it is, the event may be older than
            // this replica's own claim, so the next round reads the Node to know.
            if assigned {
                state.node_uid = None;
                return true;
            }
            tracing::info!(node = %leaf.node_name, "virtual node handed over");
            state.let_go(self, &leaf.node_name);
            return false;
        }
        // Someone deleted or altered the Node: put it back now, not at the next heartbeat. Our
        // own writes match what we wrote and change nothing.
        if state.held && assigned && state.differs_from(event, self) {
            tracing::info!(node = %leaf.node_name, "virtual node deleted or changed by someone else: restoring it");
            state.node_uid = None;
            state.written = None;
            return true;
        }
        false
    }

    /// Until the leaf's watches and the root pod watch have listed once: whether the Node keeps
    /// its previous status (`cold`). The first round of a Node not there yet waits a moment for
    /// the first listing, so the Node is created with its status; a Node taken over keeps its
    /// status anyway, so that round writes its addresses at once. Later rounds only look.
    async fn first_listing(&self, side: &mut LeafSide, state: &LeafLoop) -> bool {
        if side.listed {
            return false;
        }
        let wait = if state.probed_at.is_none()
            && !state.seen.node_exists
            && side.started.elapsed() < FIRST_LIST_WAIT
        {
            FIRST_LIST_WAIT
        } else {
            Duration::ZERO
        };
        let (leaf, root) = tokio::join!(
            side.watch.settled_within(wait),
            side.pods.listed_within(wait)
        );
        side.listed = leaf && root;
        side.cold()
    }

    /// Probes the leaf's health when a probe is due, and reads its version when unknown or
    /// stale.
    async fn probe_if_due(&self, leaf: &Leaf, side: &LeafSide, state: &mut LeafLoop, now: Instant) {
        if state
            .probed_at
            .is_some_and(|t| now.duration_since(t) < PROBE_EVERY)
        {
            return;
        }
        state.health = Box::pin(leaf_watch::probe(&leaf.client(), &side.watch)).await;
        // Not ready (or no Ready node) still means the leaf apiserver answered.
        self.health.leaf_probed(
            &leaf.name,
            !matches!(state.health, LeafHealth::Unreachable(_)),
        );
        let stale = state
            .version_read
            .is_none_or(|t| now.duration_since(t) >= VERSION_EVERY);
        if state.version.is_none() || (stale && matches!(state.health, LeafHealth::Ready { .. })) {
            state.version = Box::pin(leaf_watch::version(&leaf.client()))
                .await
                .or(state.version.take());
            state.version_read = Some(now);
        }
        state.probed_at = Some(now);
    }

    /// A round while the Node is assigned to another replica: hands the Node back (while
    /// present; a replica shutting down just stops writing, its peers take its Nodes once its
    /// presence Lease is released). The Node may name this replica without this process
    /// holding it: a replica restarted under the same name (a StatefulSet pod, a restarted
    /// container). Ends the term (what the events said) once nothing of the Node is this
    /// replica's any more; a future term starts from a fresh read of the Node.
    async fn hand_back_round(&self, leaf: &Leaf, state: &mut LeafLoop) -> Option<Seen> {
        let facts = served_by::Facts {
            present: self.replicas.present.is_leader(),
            assigned: false,
            held: state.held,
            // Held, it names this replica unless someone took it: `hand_back` reads it to know.
            names_me: state.held || state.seen.names_me,
            holder_gone: false,
        };
        match served_by::choose(facts) {
            // Shutting down, its presence released: it keeps serving what it holds until a
            // peer writes the Node (that event lets go), so sessions the root sends meanwhile
            // still land; the hand-over waits for that.
            served_by::Choice::LetGo if self.handing_over.is_cancelled() => {}
            served_by::Choice::LetGo => {
                // Past its own deadline (its presence not renewed in time): it stops acting at
                // once, its watches and its port too, and writes nothing (no write could be
                // known to land in time). The Node still names it; peers take it once its
                // presence expires for them, which is later.
                tracing::info!(node = %leaf.node_name, "presence not renewed in time: no longer serving the virtual node");
                state.let_go(self, &leaf.node_name);
            }
            served_by::Choice::HandBack => match self
                .while_present(Box::pin(self.hand_back(&leaf.node_name)))
                .await
            {
                // Its term ended meanwhile: nothing more it may write.
                None => {}
                Some(Ok(true)) => {
                    state.seen.names_me = false;
                    state.let_go(self, &leaf.node_name);
                }
                // Changed meanwhile: tried again next round.
                Some(Ok(false)) => {}
                Some(Err(err)) => {
                    tracing::warn!(node = %leaf.node_name, %err, "handing the virtual node back")
                }
            },
            _ => {}
        }
        if !state.held {
            // A port claimed by a write that never made the Node this replica's.
            self.node_ports.release(&leaf.node_name);
            if !state.seen.names_me {
                return Some(state.seen);
            }
        }
        state.written = None;
        state.node_uid = None;
        None
    }

    /// What a round's write of the Node taught; whether to act again at once.
    fn after_sync(&self, leaf: &Leaf, state: &mut LeafLoop, result: Result<(), SyncError>) -> bool {
        match result {
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
            Err(SyncError::Changed { .. }) => {
                // Someone wrote the Node since this replica last did (a label, a taint, another
                // replica's claim): read it again now and look who holds it.
                tracing::debug!(node = %leaf.node_name, "virtual node changed since last written: reading it again");
                self.metrics.node_write_conflict();
                state.node_uid = None;
                state.node_version = None;
                return true;
            }
            Err(err @ SyncError::NoPort { .. }) => {
                // node_ports says why, once; this retries every round until it is bound.
                tracing::debug!(leaf = %leaf.name, %err, "virtual node not written yet");
            }
            Err(err) => {
                tracing::warn!(leaf = %leaf.name, node = %leaf.node_name, %err, "updating virtual node");
                state.node_uid = None;
            }
        }
        false
    }

    /// Starts watching `leaf` here (its nodes and pods).
    fn start_leaf(&self, leaf: &Leaf) -> LeafSide {
        tracing::debug!(leaf = %leaf.name, "watching the leaf: this replica serves its node");
        self.health.leaf_registered(&leaf.name);
        let served = self.metrics.leaves_served.clone();
        served.inc();
        LeafSide {
            watch: LeafWatch::start(
                &leaf.name,
                &leaf.client(),
                self.config.leaf_bounds,
                &self.metrics,
            ),
            pods: self.pods.watch(&leaf.node_name),
            started: Instant::now(),
            listed: false,
            served,
            pods_run: None,
        }
    }

    /// Runs the leaf's pods while this replica writes its Node, and only then: a replica that
    /// is taking the Node over or handing it back runs none, so two never run one pod.
    fn follow_pods(&self, leaf: &Arc<Leaf>, side: Option<&mut LeafSide>, held: bool) {
        let Some(side) = side else { return };
        let wanted = held && self.config.leaf_pod_sync;
        if wanted && side.pods_run.is_none() {
            let marker = match &self.config.leaf_pod_match {
                LeafPodMatch::RootUid { key } => key.clone(),
                // Refused with pod sync on (config): another syncer marks the copies.
                _ => return,
            };
            tracing::debug!(leaf = %leaf.name, "running the leaf's pods: this replica writes its node");
            let root_pods = side.pods.changes();
            side.pods_run = Some(LeafPodSync::start(
                pod_sync::Context {
                    root: self.root.clone(),
                    leaf: leaf.clone(),
                    node_taints: leaf
                        .node_taints
                        .clone()
                        .unwrap_or_else(|| vec![desired::default_taint()]),
                    owner: self.owner.clone(),
                    marker,
                    host_ip: self.config.leaf_node_ip.to_string(),
                    root_apiserver: self.config.leaf_pod_root_apiserver.clone(),
                    metrics: self.metrics.clone(),
                },
                root_pods,
            ));
        } else if !wanted && side.pods_run.is_some() {
            side.pods_run = None;
        }
    }

    /// Forgets `leaf` here once another replica serves its Node: its probes' verdict leaves
    /// readiness (this replica no longer answers for it), the next term probes afresh, and
    /// its clients (connections, TLS state) are dropped, as a leaf this replica never served
    /// has none.
    fn stop_leaf(&self, leaf: &Leaf, state: &mut LeafLoop) {
        tracing::debug!(leaf = %leaf.name, "no longer watching the leaf: another replica serves its node");
        leaf.release_clients();
        self.health.leaf_gone(&leaf.name);
        state.health = LeafHealth::Unreachable("not probed yet".to_string());
        state.probed_at = None;
    }

    /// Computes and writes `leaf`'s Node and renews its Lease. While `cold` (the leaf's
    /// watches have not listed yet) only the Node's addresses and kubelet port are written:
    /// the merge patch leaves the conditions, capacity and node info the previous writer
    /// left, never zero capacity or NotReady from an empty cache.
    async fn sync_leaf(
        &self,
        leaf: &Leaf,
        watch: &LeafWatch,
        cold: bool,
        state: &mut LeafLoop,
        tick: Instant,
    ) -> Result<(), SyncError> {
        // The Node names this node's own kubelet port, never the shared one: the root
        // apiserver's node proxy calls whatever port a Node names with its own identity, and
        // the shared port serves every node's pods. Without one, the Node is not written.
        let own_port = match self.node_ports.claim(&leaf.node_name).await {
            Ok(addr) => addr.port(),
            Err(_) => {
                return Err(SyncError::NoPort {
                    node: leaf.node_name.clone(),
                });
            }
        };
        let nodes: Api<Node> = Api::all(self.root.clone());
        let leaf_nodes = watch.node_list();
        let own_pods = self.pods.leaf_pods_on(&leaf.node_name, &leaf.namespaces);
        let now = Time(Timestamp::now());
        let info = desired::node_info(state.version.as_deref(), &leaf_nodes);
        let capacity = watch
            .pods
            .read(|pods| desired::capacity(&leaf_nodes, pods, &own_pods));

        let existing = match state.node_uid {
            Some(_) if state.held => None,
            _ => Some(self.ensure_node(leaf, &info).await?),
        };
        if let Some(node) = &existing {
            let Some(held) = self.take(node, state).await? else {
                return Ok(());
            };
            state.node_uid = node.metadata.uid.clone();
            // The labels follow the leaf's nodes too: not from an empty cache.
            let kept = if cold {
                None
            } else {
                self.keep_labels_and_taints(leaf, &held, &info).await?
            };
            state.known(match kept {
                Some(written) => written.metadata.resource_version,
                None => held.metadata.resource_version.clone(),
            });
        }
        let previous_conditions = existing
            .as_ref()
            .and_then(|n| n.status.as_ref()?.conditions.clone())
            .or_else(|| {
                state
                    .written
                    .as_deref()
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
                    // The node's own listener: node-level calls (metrics, stats) can tell
                    // virtual nodes apart, and its pod calls reach only its pods.
                    port: i32::from(own_port),
                }),
            }),
            node_info: Some(info),
            declared_features: Some(desired::declared_features(
                self.config.extend_websockets_to_kubelet,
                state.version.as_deref(),
            )),
            ..Default::default()
        };
        let status = if cold {
            NodeStatus {
                addresses: status.addresses,
                daemon_endpoints: status.daemon_endpoints,
                ..Default::default()
            }
        } else {
            status
        };
        let changed = state.written.as_deref().is_none_or(|(old, at)| {
            if cold {
                // Only what a cold write says can have changed.
                old.addresses != status.addresses || old.daemon_endpoints != status.daemon_endpoints
            } else {
                !same_ignoring_heartbeats(old, &status) || at.elapsed() >= STATUS_HEARTBEAT
            }
        });
        if changed {
            // A merge patch replaces lists whole: the address list is written atomically, never
            // merged entry by entry (which breaks dual-stack lists).
            if !self.assigned(&leaf.node_name) {
                return Ok(());
            }
            let version = state
                .node_version
                .clone()
                .ok_or_else(|| SyncError::Changed {
                    node: leaf.node_name.clone(),
                })?;
            let patch = json!({ "metadata": { "resourceVersion": version }, "status": status });
            let written = nodes
                .patch_status(&leaf.node_name, &patch_params(), &Patch::Merge(patch))
                .await
                .map_err(|err| SyncError::of_guarded_write(&leaf.node_name, err))
                .inspect_err(|err| {
                    if let SyncError::Api(_) = err {
                        self.metrics.node_write_error("node");
                    }
                })?;
            tracing::debug!(node = %leaf.node_name, "node status written");
            state.known(written.metadata.resource_version);
            let mut recorded = status;
            if cold {
                // The conditions left as they were: the next full write keeps their
                // transition times.
                recorded.conditions = written.status.and_then(|s| s.conditions);
            }
            state.written = Some(Box::new((recorded, Instant::now())));
        }
        if state
            .lease_renewed
            .is_none_or(|t| tick.duration_since(t) >= LEASE_RENEW)
        {
            if !self.assigned(&leaf.node_name) {
                return Ok(());
            }
            self.renew_lease(
                &leaf.node_name,
                state.node_uid.as_deref(),
                &mut state.lease_mark,
            )
            .await
            .inspect_err(|_| self.metrics.node_write_error("lease"))?;
            state.lease_renewed = Some(tick);
        }
        if !cold && let (Some(secret), Some((status, _))) = (&leaf.secret, state.written.as_deref())
        {
            let refused = self.registry.refusal(&secret.name).filter(|r| r.kept);
            let row = super::leaf_rows::served_status(
                leaf,
                status,
                &self.replicas.me,
                own_pods.len(),
                refused.as_ref(),
            );
            self.keep_row(secret, row, &mut state.row).await;
        }
        Ok(())
    }

    /// Makes this replica `node`'s writer if it may be (`served_by::may_take`); the Node as
    /// this replica holds it, or `None` when it does not.
    async fn take<'n>(
        &self,
        node: &'n Node,
        state: &mut LeafLoop,
    ) -> Result<Option<Cow<'n, Node>>, SyncError> {
        let me = &*self.replicas.me;
        let holder = served_by::served_by(node);
        let peers = self.replicas.peers();
        let mut holder_gone = served_by::may_take(holder, me, &peers, Instant::now());
        if holder_gone && peers.unconfirmed(holder) && self.replicas.runs_now(holder).await {
            tracing::info!(
                holder,
                "the virtual node's writer runs, though this replica's cache of relaylet pods does not show it yet: not taking it"
            );
            holder_gone = false;
        }
        let mut facts = served_by::Facts {
            present: true,
            assigned: true,
            held: state.held,
            names_me: holder == me,
            holder_gone,
        };
        let held = loop {
            match served_by::choose(facts) {
                served_by::Choice::Serve => break Cow::Borrowed(node),
                served_by::Choice::LetGo => {
                    tracing::info!(node = ?node.metadata.name, by = %holder, "another replica took the virtual node");
                    state.let_go(self, node.metadata.name.as_deref().unwrap_or(""));
                    facts.held = false;
                }
                served_by::Choice::Take => {
                    // Someone wrote the Node since it was read (its holder handing it back,
                    // another replica's claim): read it again at once, not at the next round.
                    let Some(taken) = self.write_served_by(node, me).await? else {
                        return Err(SyncError::Changed {
                            node: node.metadata.name.clone().unwrap_or_default(),
                        });
                    };
                    tracing::info!(node = ?node.metadata.name, from = %holder, "took the virtual node");
                    self.metrics.virtual_node_takeovers.inc();
                    // Written at once (with this replica's address): the replica handing the
                    // Node over waits for that before it stops accepting.
                    state.written = None;
                    state.lease_renewed = None;
                    state.lease_mark = None;
                    break Cow::Owned(taken);
                }
                // Its writer is alive: it hands the Node back when it sees the assignment.
                _ => return Ok(None),
            }
        };
        if !state.held {
            state.held = true;
            self.set_served(node.metadata.name.as_deref().unwrap_or(""), true);
        }
        Ok(Some(held))
    }

    /// Runs `work` (root calls) while this replica is present, and only then: a call that
    /// hangs past its term's end (a black-holed root connection answers nothing) is dropped
    /// at that end, so the loop can let go at once. `None`: not present, or no longer.
    async fn while_present<T>(&self, work: impl std::future::Future<Output = T>) -> Option<T> {
        let mut present = self.replicas.present.clone();
        if !present.is_leader() {
            return None;
        }
        tokio::select! {
            out = work => Some(out),
            () = async { while present.changed().await {} } => None,
        }
    }

    /// Writes `node`'s writer empty if it still names this replica; whether the Node no longer
    /// names it (`false`: it changed meanwhile, try again).
    async fn hand_back(&self, node: &str) -> Result<bool, kube::Error> {
        let nodes: Api<Node> = Api::all(self.root.clone());
        let Some(current) = nodes.get_opt(node).await? else {
            return Ok(true);
        };
        if served_by::served_by(&current) != &*self.replicas.me {
            return Ok(true);
        }
        if self.write_served_by(&current, "").await?.is_none() {
            return Ok(false);
        }
        tracing::info!(node, "handed the virtual node back for another replica");
        Ok(true)
    }
}

/// Per-leaf loop memory.
struct LeafLoop {
    health: LeafHealth,
    probed_at: Option<Instant>,
    version: Option<String>,
    /// When `version` was last read from the leaf.
    version_read: Option<Instant>,
    /// The status last written and when (boxed: it is large, and a term that only hands the
    /// Node back never writes it).
    written: Option<Box<(NodeStatus, Instant)>>,
    lease_renewed: Option<Instant>,
    /// What this term last wrote to (or read of) the node Lease; `None`: read it first.
    lease_mark: Option<LeaseMark>,
    node_uid: Option<String>,
    /// The Node's resourceVersion as this replica last read or wrote it while holding it. Every
    /// write carries it, so none lands on a Node changed since (taken by another replica while
    /// this one was starved, say): the apiserver answers 409 and the Node is read again.
    node_version: Option<String>,
    /// The Node's last few resourceVersions this loop wrote or acted on in this term: their
    /// events arrive after the loop has moved on, and are nobody else's change.
    known_versions: VecDeque<String>,
    /// Whether this replica writes the Node (its `served-by` names it).
    held: bool,
    /// What the Node's last event said (whether it exists and names this replica).
    seen: Seen,
    /// Why the Node was last refused (it is not ours), so that is logged once.
    refused: Option<String>,
    /// The leaf's row as this term last applied it.
    row: super::leaf_rows::Applied,
}

impl Controller {
    /// Writes `to` as `node`'s writer if the Node is still as read (its resourceVersion); the
    /// Node as written (`None`: someone changed it meanwhile, read it again).
    async fn write_served_by(&self, node: &Node, to: &str) -> Result<Option<Node>, kube::Error> {
        let (Some(name), Some(version)) = (
            node.metadata.name.as_deref(),
            node.metadata.resource_version.as_deref(),
        ) else {
            return Ok(None);
        };
        let nodes: Api<Node> = Api::all(self.root.clone());
        let patch = json!({
            "metadata": {
                "resourceVersion": version,
                "annotations": { served_by::SERVED_BY: to },
            }
        });
        match nodes
            .patch(name, &patch_params(), &Patch::Merge(patch))
            .await
        {
            Ok(written) => Ok(Some(written)),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl LeafLoop {
    /// A term's memory at its start, knowing what the Node's events said.
    fn new(seen: Seen) -> LeafLoop {
        LeafLoop {
            health: LeafHealth::Unreachable("not probed yet".to_string()),
            probed_at: None,
            version: None,
            version_read: None,
            written: None,
            lease_renewed: None,
            lease_mark: None,
            node_uid: None,
            node_version: None,
            known_versions: VecDeque::new(),
            held: false,
            seen,
            refused: None,
            row: None,
        }
    }

    /// Whether `event` shows the Node written by another replica: its annotation and its first
    /// address (where the root apiserver sends new sessions) no longer this replica's.
    fn taken_away(&self, event: &NodeEvent, me: &str, my_ip: std::net::IpAddr) -> bool {
        let NodeEvent::Applied(node) = event else {
            return false;
        };
        let first_address = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref()?.first())
            .map(|a| a.address.as_str());
        served_by::served_by(node) != me && first_address != Some(my_ip.to_string().as_str())
    }

    /// Records the Node's version as this loop just wrote (or read and acted on) it: the
    /// version its next write is guarded by, and one whose event is no news.
    fn known(&mut self, version: Option<String>) {
        if let Some(version) = &version {
            if self.known_versions.len() >= KNOWN_VERSIONS {
                self.known_versions.pop_front();
            }
            self.known_versions.push_back(version.clone());
        }
        self.node_version = version;
    }

    /// Stops writing the Node: another replica does (or will).
    fn let_go(&mut self, controller: &Controller, node: &str) {
        self.held = false;
        self.written = None;
        self.node_uid = None;
        self.node_version = None;
        self.known_versions.clear();
        self.lease_renewed = None;
        self.lease_mark = None;
        controller.set_served(node, false);
        controller.node_ports.release(node);
    }

    /// Whether `event` shows the Node other than this loop left it: gone, replaced, without our
    /// labels, or with other addresses or kubelet port than written.
    fn differs_from(&self, event: &NodeEvent, controller: &Controller) -> bool {
        let NodeEvent::Applied(node) = event else {
            return self.node_uid.is_some();
        };
        // The late event of this loop's own write (a claim, then its status written before
        // the claim's event came): not a change by someone else.
        if node
            .metadata
            .resource_version
            .as_ref()
            .is_some_and(|v| self.known_versions.contains(v))
        {
            return false;
        }
        if self.node_uid.is_none() {
            // Not written yet (or being restored): the loop's next round reads it anyway.
            return false;
        }
        if node.metadata.uid != self.node_uid || controller.ownership(node) != Ownership::Ours {
            return true;
        }
        let Some((written, _)) = self.written.as_deref() else {
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

//! One leaf's loop: probes the leaf, recomputes its Node every few seconds and, on the leader,
//! writes the Node (when it changed, and as a heartbeat) and renews its Lease; a watch of the
//! Node puts it back at once when someone else deletes or alters it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{DaemonEndpoint, Node, NodeDaemonEndpoints, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::Patch;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::time::Instant;

use super::desired::{self, Health};
use super::leaf_watch::{self, LeafWatch};
use super::node_lease::LEASE_RENEW;
use super::{Controller, Ownership, SyncError, patch_params};
use crate::leaf::Leaf;

/// How often each leaf's Node is recomputed (written only when it changed).
const RECOMPUTE: Duration = Duration::from_secs(2);
/// How often the leaf's health is probed.
const PROBE_EVERY: Duration = Duration::from_secs(10);
/// Node status is written at least this often, as a heartbeat, even when nothing changed.
const STATUS_HEARTBEAT: Duration = Duration::from_secs(60);
impl Controller {
    /// Keeps one leaf's Node and Lease up to date.
    pub(super) async fn run_leaf(self: Arc<Self>, leaf: Arc<Leaf>) {
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
                Err(err @ SyncError::NoPort { .. }) => {
                    // node_ports says why, once; this retries every round until it is bound.
                    tracing::debug!(leaf = %leaf.name, %err, "virtual node not written yet");
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
        // The Node names this node's own kubelet port, never the shared one: the root
        // apiserver's node proxy calls whatever port a Node names with its own identity, and
        // the shared port serves every node's pods. Until the port is bound (moments after the
        // leaf registers), the Node is not written.
        let Some(own_port) = self.node_ports.addr_of(&leaf.node_name).map(|a| a.port()) else {
            return Err(SyncError::NoPort {
                node: leaf.node_name.clone(),
            });
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

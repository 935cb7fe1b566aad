//! What every request handler of the kubelet API needs: the caps, the authenticator, the leaf
//! registry, the pod index, the relay and the node this listener serves.

use std::sync::Arc;

use crate::leaf::Registry;
use crate::model::counterpart::LeafPodMatch;
use crate::node_server::auth::Authenticator;
use crate::node_server::resource_metrics::NodeStats;
use crate::ops::limits::Gate;
use crate::ops::metrics::Metrics;
use crate::relay::Relay;
use crate::routing::pod_index::PodIndex;

/// Everything a request handler needs.
pub struct NodeServer {
    pub gate: Arc<Gate>,
    pub auth: Arc<Authenticator>,
    pub registry: Registry,
    pub pods: PodIndex,
    pub relay: Relay,
    pub metrics: Metrics,
    pub stats: Arc<NodeStats>,
    /// The virtual node this listener is dedicated to (see `node_ports`); `None` on the
    /// shared port, which serves every virtual node's pods.
    pub node: Option<String>,
    /// `NODE_NAME_PREFIX`: a pod on a node with this prefix but no leaf has lost its leaf.
    pub node_name_prefix: String,
    /// What proves a leaf pod to be a root pod's counterpart (`LEAF_POD_MATCH`).
    pub leaf_pod_match: LeafPodMatch,
}

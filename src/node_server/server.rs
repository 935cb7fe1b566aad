//! What every request handler of the kubelet API needs: the caps, the authenticator, the leaf
//! registry, the pod index and the relay (one for every listener), and the node a request's
//! listener serves ([`ThisNode`], on the request).

use std::sync::Arc;

use crate::caps::Gate;
use crate::leaf::Registry;
use crate::model::counterpart::LeafPodMatch;
use crate::node_server::auth::Authenticator;
use crate::node_server::resource_metrics::NodeStats;
use crate::ops::Metrics;
use crate::relay::Relay;
use crate::routing::PodIndex;

/// Everything a request handler needs.
pub struct NodeServer {
    pub gate: Arc<Gate>,
    pub auth: Arc<Authenticator>,
    pub registry: Registry,
    pub pods: PodIndex,
    pub relay: Relay,
    pub metrics: Metrics,
    pub stats: Arc<NodeStats>,
    /// `NODE_NAME_PREFIX`: a pod on a node with this prefix but no leaf has lost its leaf.
    pub node_name_prefix: String,
    /// What proves a leaf pod to be a root pod's counterpart (`LEAF_POD_MATCH`).
    pub leaf_pod_match: LeafPodMatch,
}

/// The virtual node a request's listener is dedicated to (see `node_ports`); `None` on the
/// shared port, which serves every virtual node's pods. Put on each request by its connection
/// (`connection`): the routes are built once and shared by every listener, and a replica listens
/// on a port for each virtual node of the fleet.
#[derive(Clone, Debug, Default)]
pub struct ThisNode(pub Option<Arc<str>>);

impl ThisNode {
    /// The node's name, if the listener is a node's own.
    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// The node a caller is authorized against for what this listener serves: its node, or on
    /// the shared port every node (an empty name), whatever the registry holds, so the answer
    /// to a caller without rights does not depend on how many nodes there are.
    pub fn to_authorize(&self) -> &str {
        self.name().unwrap_or("")
    }

    /// The node of `extensions`' request. A request that did not come through a connection
    /// (none does) is refused rather than served as the shared port's.
    pub fn of(extensions: &http::Extensions) -> Result<&ThisNode, crate::model::status::Refusal> {
        extensions.get::<ThisNode>().ok_or_else(|| {
            crate::model::status::Refusal::new(
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "a request reached the routes without its listener's node",
            )
        })
    }
}

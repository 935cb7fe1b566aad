//! A live view of one leaf cluster's nodes and pods, plus its health and version, from which its
//! virtual Node is computed. Only what the Node needs is kept: leaf nodes without their image
//! lists, annotations and managed fields (a real node's image list alone can be tens of KiB),
//! leaf pods as [`PodFacts`](super::leaf_pods::PodFacts); and no more of either than
//! `LEAF_MAX_NODES` and `LEAF_MAX_PODS` (`leaf_objects`). Text the leaf sends (its `/readyz`
//! answer, its errors) is quoted short before it goes anywhere.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::desired::{LeafHealth, schedulable_and_ready};
use super::leaf_objects::{Bound, Kept, LeafObjects, WatchState};
use super::leaf_pods::LeafPods;
use crate::config::LeafBounds;
use crate::kube_client::Calls;
use crate::ops::Metrics;

/// How long a health probe of the leaf apiserver may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The stripped nodes of a leaf and the compact record of its pods, each within its bound;
/// both watches stop when this is dropped.
pub struct LeafWatch {
    nodes: LeafObjects<LeafNodes>,
    pub pods: LeafPods,
}

impl LeafWatch {
    /// Starts watching leaf `leaf`'s nodes and pods through `client`, within `bounds`; overflows
    /// are counted in `metrics`.
    pub fn start(leaf: &str, client: &Calls, bounds: LeafBounds, metrics: &Metrics) -> LeafWatch {
        let bound = |max| Bound {
            leaf: leaf.to_string(),
            max,
            metrics: metrics.clone(),
        };
        LeafWatch {
            nodes: LeafObjects::start(client.clone(), bound(bounds.max_nodes)),
            pods: LeafPods::start(client, bound(bounds.max_pods)),
        }
    }

    /// Whether both watches have listed once (or been dropped for a bound, which is a verdict
    /// too) within `wait`: until then the records are empty and say nothing about the leaf.
    pub async fn settled_within(&self, wait: Duration) -> bool {
        let settled = async { (self.nodes.settled().await, self.pods.settled().await) };
        tokio::time::timeout(wait, settled).await.is_ok()
    }

    /// The leaf's nodes by name: in a fixed order, so the Node's address list (and node info,
    /// taken from the first node) does not change order between rounds or replicas and get
    /// rewritten for nothing.
    pub fn node_list(&self) -> Vec<Node> {
        self.nodes
            .read(|nodes| nodes.0.values().map(|n| (**n).clone()).collect())
    }
}

/// A leaf's nodes, stripped, by name. Boxed: a map's node holds eleven entries inline, and a
/// `Node` inline is about a KiB, so a leaf of one node held 11 KiB in the map alone.
#[derive(Default)]
pub struct LeafNodes(BTreeMap<String, Box<Node>>);

impl Kept for LeafNodes {
    type Object = Node;
    const WHAT: &'static str = "nodes";
    const BOUND_VAR: &'static str = "LEAF_MAX_NODES";
    /// A node is 5-30 KiB of JSON (the kubelet reports at most 50 images; managedFields): a
    /// page of 50 is at most about 1.5 MiB, a tenth of `MAX_BODY`. 5,000 nodes are 100 pages.
    const PAGE_SIZE: u32 = 50;

    fn count(&self) -> usize {
        self.0.len()
    }

    fn apply(&mut self, node: &Node) {
        if let Some(name) = &node.metadata.name {
            self.0
                .insert(name.clone(), Box::new(stripped(node.clone())));
        }
    }

    fn delete(&mut self, node: &Node) {
        if let Some(name) = &node.metadata.name {
            self.0.remove(name);
        }
    }
}

/// What the virtual Node needs of a leaf node: its name, whether it is cordoned, its addresses,
/// allocatable, Ready condition and node info.
fn stripped(node: Node) -> Node {
    let status = node.status.map(|s| NodeStatus {
        addresses: s.addresses,
        allocatable: s.allocatable,
        conditions: s.conditions.map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| NodeCondition {
                    type_: c.type_,
                    status: c.status,
                    ..Default::default()
                })
                .collect()
        }),
        node_info: s.node_info,
        ..Default::default()
    });
    Node {
        metadata: ObjectMeta {
            name: node.metadata.name,
            ..Default::default()
        },
        spec: node.spec.map(|s| NodeSpec {
            unschedulable: s.unschedulable,
            ..Default::default()
        }),
        status,
    }
}

/// Probes the leaf apiserver's `/readyz` and counts Ready, schedulable nodes.
pub async fn probe(client: &Calls, watch: &LeafWatch) -> LeafHealth {
    let request = match http::Request::get("/readyz").body(Vec::new()) {
        Ok(r) => r,
        Err(err) => return LeafHealth::Unreachable(err.to_string()),
    };
    match tokio::time::timeout(PROBE_TIMEOUT, client.request_text(request)).await {
        Err(_) => {
            return LeafHealth::Unreachable(format!(
                "/readyz did not answer within {PROBE_TIMEOUT:?}"
            ));
        }
        // hyper's own message ("client error (Connect)") leaves the cause out; `chain` quotes
        // what the leaf said, short and once.
        Ok(Err(err)) => {
            return LeafHealth::Unreachable(format!("/readyz: {}", crate::leaf::error_chain(&err)));
        }
        Ok(Ok(_)) => {}
    }
    // Until the watches have listed once, the records are empty: counting now would report a
    // healthy leaf as having no Ready node (and flip an existing Ready Node to NotReady on every
    // relaylet start or new leaf), and its capacity as zero. A watch dropped for going past a
    // bound says why.
    let settled = async { (watch.nodes.settled().await, watch.pods.settled().await) };
    match tokio::time::timeout(PROBE_TIMEOUT, settled).await {
        Ok((WatchState::Dropped(why), _) | (_, WatchState::Dropped(why))) => {
            return LeafHealth::TooLarge(why);
        }
        Ok(_) => {}
        Err(_) => {
            return LeafHealth::Unreachable(format!(
                "leaf nodes and pods were not listed within {PROBE_TIMEOUT:?}"
            ));
        }
    }
    let ready_nodes = watch.nodes.read(|nodes| {
        nodes
            .0
            .values()
            .filter(|n| schedulable_and_ready(n))
            .count()
    });
    if ready_nodes == 0 {
        LeafHealth::NoReadyNode
    } else {
        LeafHealth::Ready { ready_nodes }
    }
}

/// The leaf's Kubernetes version (`v1.34.2`), if it answers.
pub async fn version(client: &Calls) -> Option<String> {
    match tokio::time::timeout(PROBE_TIMEOUT, client.version()).await {
        Ok(Ok(info)) => Some(info.git_version),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_leaf_node_keeps_only_what_the_virtual_node_needs() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": "leaf-node-1",
                "labels": {"kubernetes.io/hostname": "leaf-node-1"},
                "annotations": {"example.com/big": "x".repeat(64 * 1024)},
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24"},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
                "allocatable": {"cpu": "4"},
                "capacity": {"cpu": "4"},
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady",
                     "message": "kubelet is posting ready status"},
                    {"type": "MemoryPressure", "status": "False"},
                ],
                "images": [{"names": ["registry.example.com/big:1"], "sizeBytes": 1}],
                "nodeInfo": {"kubeletVersion": "v1.35.4", "architecture": "amd64",
                    "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "",
                    "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux",
                    "osImage": "", "systemUUID": ""},
            },
        }))
        .unwrap();
        let kept = stripped(node.clone());
        let expected: Node = serde_json::from_value(json!({
            "metadata": {"name": "leaf-node-1"},
            "spec": {"unschedulable": true},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
                "allocatable": {"cpu": "4"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": node.status.as_ref().unwrap().node_info,
            },
        }))
        .unwrap();
        assert_eq!(kept, expected);
        assert!(schedulable_and_ready(&Node { spec: None, ..kept }));
    }
}

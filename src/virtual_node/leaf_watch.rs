//! A live view of one leaf cluster's nodes and pods, plus its health and version, from which its
//! virtual Node is computed. Only what the Node needs is kept: leaf nodes without their image
//! lists, annotations and managed fields (a real node's image list alone can be tens of KiB),
//! leaf pods as [`PodFacts`](super::leaf_pods::PodFacts).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use super::desired::{Health, schedulable_and_ready};
use super::leaf_pods::LeafPods;

/// How long a health probe of the leaf apiserver may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A reflector over a leaf's nodes and the compact record of its pods; stopped when dropped.
pub struct LeafWatch {
    pub nodes: Store<Node>,
    pub pods: LeafPods,
    task: JoinHandle<()>,
}

impl LeafWatch {
    pub fn start(client: &Client) -> LeafWatch {
        let (nodes, task) = reflect_nodes(Api::all(client.clone()));
        LeafWatch {
            nodes,
            pods: LeafPods::start(client),
            task,
        }
    }

    /// The leaf's nodes by name. The reflector's store is a hash map: without a fixed order the
    /// Node's address list (and node info, taken from the first node) could change order between
    /// rounds or replicas and be rewritten for nothing.
    pub fn node_list(&self) -> Vec<Node> {
        let mut nodes: Vec<Node> = self.nodes.state().iter().map(|n| (**n).clone()).collect();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        nodes
    }
}

impl Drop for LeafWatch {
    fn drop(&mut self) {
        self.task.abort();
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

fn reflect_nodes(api: Api<Node>) -> (Store<Node>, JoinHandle<()>) {
    let (reader, writer) = reflector::store();
    let nodes = watcher(api, watcher::Config::default())
        .modify(|node| *node = stripped(std::mem::take(node)));
    let stream = reflector::reflector(writer, nodes).default_backoff();
    let task = tokio::spawn(async move {
        stream
            .for_each(|event| async move {
                if let Err(err) = event {
                    tracing::debug!(%err, "leaf watch error (retrying)");
                }
            })
            .await;
    });
    (reader, task)
}

/// Probes the leaf apiserver's `/readyz` and counts Ready, schedulable nodes.
pub async fn probe(client: &Client, watch: &LeafWatch) -> Health {
    let request = match http::Request::get("/readyz").body(Vec::new()) {
        Ok(r) => r,
        Err(err) => return Health::Unreachable(err.to_string()),
    };
    match tokio::time::timeout(PROBE_TIMEOUT, client.request_text(request)).await {
        Err(_) => {
            return Health::Unreachable(format!("/readyz did not answer within {PROBE_TIMEOUT:?}"));
        }
        // hyper's own message ("client error (Connect)") leaves the cause out.
        Ok(Err(err)) => {
            return Health::Unreachable(format!("/readyz: {}", crate::leaf::proxy::chain(&err)));
        }
        Ok(Ok(_)) => {}
    }
    // Until the watches have listed once, the stores are empty: counting now would report a
    // healthy leaf as having no Ready node (and flip an existing Ready Node to NotReady on every
    // relaylet start or new leaf), and its capacity as zero.
    let listed = async {
        watch.nodes.wait_until_ready().await?;
        Ok::<bool, kube::runtime::reflector::store::WriterDropped>(watch.pods.listed().await)
    };
    match tokio::time::timeout(PROBE_TIMEOUT, listed).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => return Health::Unreachable("leaf pod watch stopped".to_string()),
        Ok(Err(err)) => return Health::Unreachable(format!("leaf watch stopped: {err}")),
        Err(_) => {
            return Health::Unreachable(format!(
                "leaf nodes and pods were not listed within {PROBE_TIMEOUT:?}"
            ));
        }
    }
    let ready_nodes = watch
        .nodes
        .state()
        .iter()
        .filter(|n| schedulable_and_ready(n))
        .count();
    if ready_nodes == 0 {
        Health::NoReadyNode
    } else {
        Health::Ready { ready_nodes }
    }
}

/// The leaf's Kubernetes version (`v1.34.2`), if it answers.
pub async fn version(client: &Client) -> Option<String> {
    match tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await {
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

//! A live view of one leaf cluster's nodes and pods (reflectors), plus its health and version,
//! from which its virtual Node is computed.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use super::desired::{Health, schedulable_and_ready};

/// How long a health probe of the leaf apiserver may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Reflectors over a leaf's nodes and pods; stopped when dropped.
pub struct LeafWatch {
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    tasks: Vec<JoinHandle<()>>,
}

impl LeafWatch {
    pub fn start(client: &Client) -> LeafWatch {
        let (nodes, nodes_task) = reflect::<Node>(Api::all(client.clone()));
        let (pods, pods_task) = reflect::<Pod>(Api::all(client.clone()));
        LeafWatch {
            nodes,
            pods,
            tasks: vec![nodes_task, pods_task],
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

    pub fn pod_list(&self) -> Vec<Pod> {
        self.pods.state().iter().map(|p| (**p).clone()).collect()
    }
}

impl Drop for LeafWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn reflect<K>(api: Api<K>) -> (Store<K>, JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream =
        reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
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
        Ok(Err(err)) => return Health::Unreachable(format!("/readyz: {err}")),
        Ok(Ok(_)) => {}
    }
    // Until the watches have listed once, the stores are empty: counting now would report a
    // healthy leaf as having no Ready node (and flip an existing Ready Node to NotReady on every
    // relaylet start or new leaf), and its capacity as zero.
    let listed = async {
        watch.nodes.wait_until_ready().await?;
        watch.pods.wait_until_ready().await
    };
    match tokio::time::timeout(PROBE_TIMEOUT, listed).await {
        Ok(Ok(())) => {}
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

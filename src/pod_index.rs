//! Which root pod sits on which virtual node, kept by watches so routing costs no API call.
//!
//! The root apiserver dials relaylet for every virtual node (they all share relaylet's address),
//! and a kubelet path names only namespace and pod. So relaylet finds the pod's node here, and
//! from the node the leaf. One watch per virtual node (`spec.nodeName=<node>`), started and
//! stopped as leaves come and go; a pod too fresh to be in the index costs one GET.
//!
//! Only what the root apiserver decides is kept (node, UID): which leaf pod stands for a root
//! pod is `counterpart`'s business, and never read from the pod's own annotations.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use crate::counterpart::NamespaceMap;
use crate::leaf::Registry;

/// Where a root pod's requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRoute {
    pub node_name: String,
    pub uid: Option<String>,
}

/// Why a pod cannot be routed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("pod {namespace}/{pod} not found in the root cluster")]
    NotFound { namespace: String, pod: String },
    #[error(
        "pod {namespace}/{pod} is not on a virtual node served by relaylet (it is on node {node:?})"
    )]
    NotOnVirtualNode {
        namespace: String,
        pod: String,
        node: String,
    },
    #[error("looking up pod {namespace}/{pod} in the root cluster: {source}")]
    Root {
        namespace: String,
        pod: String,
        #[source]
        source: kube::Error,
    },
}

type Key = (String, String);

/// The index. Cheap to clone.
#[derive(Clone)]
pub struct PodIndex {
    root: Client,
    registry: Registry,
    routes: Arc<RwLock<HashMap<Key, PodRoute>>>,
}

impl PodIndex {
    pub fn new(root: Client, registry: Registry) -> PodIndex {
        PodIndex {
            root,
            registry,
            routes: Arc::default(),
        }
    }

    /// Where requests for root pod `namespace/pod` go.
    pub async fn route(&self, namespace: &str, pod: &str) -> Result<PodRoute, RouteError> {
        let key = (namespace.to_string(), pod.to_string());
        let cached = read(&self.routes).get(&key).cloned();
        if let Some(route) = cached
            && self.registry.by_node(&route.node_name).is_some()
        {
            return Ok(route);
        }
        // Not indexed yet (the watch lags a fresh pod by a moment): ask once.
        let api: Api<Pod> = Api::namespaced(self.root.clone(), namespace);
        let found = api.get_opt(pod).await.map_err(|source| RouteError::Root {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            source,
        })?;
        let found = found.ok_or_else(|| RouteError::NotFound {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
        })?;
        let node = found
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if self.registry.by_node(&node).is_none() {
            return Err(RouteError::NotOnVirtualNode {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                node,
            });
        }
        route_of(&found).ok_or_else(|| RouteError::NotFound {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
        })
    }

    /// The leaf pods (leaf namespace, leaf name) that stand for root pods on virtual node `node`,
    /// whose leaf maps namespaces with `namespaces`.
    pub fn leaf_pods_on(&self, node: &str, namespaces: &NamespaceMap) -> HashSet<(String, String)> {
        read(&self.routes)
            .iter()
            .filter(|(_, r)| r.node_name == node)
            .filter_map(|((ns, name), _)| {
                Some((namespaces.leaf_namespace(ns)?.to_string(), name.clone()))
            })
            .collect()
    }

    /// Keeps one pod watch per virtual node, following the registry, until dropped.
    pub async fn run(self) {
        let mut leaves = self.registry.subscribe();
        let mut watches: HashMap<String, JoinHandle<()>> = HashMap::new();
        loop {
            let nodes: HashSet<String> = leaves.borrow_and_update().keys().cloned().collect();
            watches.retain(|node, task| {
                let keep = nodes.contains(node);
                if !keep {
                    task.abort();
                    write(&self.routes).retain(|_, r| &r.node_name != node);
                }
                keep
            });
            for node in nodes {
                if let std::collections::hash_map::Entry::Vacant(slot) = watches.entry(node) {
                    let task = tokio::spawn(self.clone().watch_node(slot.key().clone()));
                    slot.insert(task);
                }
            }
            if leaves.changed().await.is_err() {
                break;
            }
        }
        for task in watches.into_values() {
            task.abort();
        }
    }

    async fn watch_node(self, node: String) {
        let api: Api<Pod> = Api::all(self.root.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let mut events = watcher(api, config).default_backoff().boxed();
        let mut seen: HashSet<Key> = HashSet::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => seen.clear(),
                Ok(watcher::Event::InitApply(pod)) => {
                    if let Some(key) = self.upsert(&pod) {
                        seen.insert(key);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    write(&self.routes).retain(|key, r| r.node_name != node || seen.contains(key));
                }
                Ok(watcher::Event::Apply(pod)) => {
                    self.upsert(&pod);
                }
                Ok(watcher::Event::Delete(pod)) => {
                    if let Some(key) = key_of(&pod) {
                        write(&self.routes).remove(&key);
                    }
                }
                Err(err) => tracing::warn!(%err, node = %node, "watching root pods"),
            }
        }
    }

    fn upsert(&self, pod: &Pod) -> Option<Key> {
        let key = key_of(pod)?;
        let route = route_of(pod)?;
        write(&self.routes).insert(key.clone(), route);
        Some(key)
    }
}

fn key_of(pod: &Pod) -> Option<Key> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

fn route_of(pod: &Pod) -> Option<PodRoute> {
    let node_name = pod.spec.as_ref()?.node_name.clone()?;
    Some(PodRoute {
        node_name,
        uid: pod.metadata.uid.clone(),
    })
}

// A poisoned lock only means another task panicked mid-update of a plain map; the map is
// still usable, so recover it rather than spreading the panic.
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_route_is_the_node_and_uid_whatever_the_annotations_say() {
        let p = pod(serde_json::json!({
            "metadata": {"namespace": "default", "name": "web", "uid": "u1",
                "annotations": {"relaylet.io/leaf-namespace": "kube-system",
                    "relaylet.io/leaf-pod": "secret-pod"}},
            "spec": {"nodeName": "relaylet-leaf-1", "containers": []}
        }));
        assert_eq!(
            route_of(&p).unwrap(),
            PodRoute {
                node_name: "relaylet-leaf-1".into(),
                uid: Some("u1".into()),
            }
        );
    }

    #[test]
    fn unbound_pods_have_no_route() {
        let p = pod(serde_json::json!({
            "metadata": {"namespace": "default", "name": "web"},
            "spec": {"containers": []}
        }));
        assert!(route_of(&p).is_none());
    }
}

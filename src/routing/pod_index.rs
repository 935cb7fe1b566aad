//! Which root pod sits on which virtual node, kept by watches so routing costs no API call.
//!
//! The root apiserver dials relaylet for every virtual node (they all share relaylet's address),
//! and a kubelet path names only namespace and pod. So relaylet finds the pod's node here, and
//! from the node the leaf. One watch per virtual node this replica serves (`spec.nodeName=<node>`,
//! the kubelet's own pattern), held by the node's leaf loop as long as it serves the node
//! ([`NodePods`]), so the root connections and memory follow the leaves served, not the fleet;
//! a pod too fresh to be in the index costs one GET.
//!
//! Only what the root apiserver decides is kept (node, UID): which leaf pod stands for a root
//! pod is `counterpart`'s business, and never read from the pod's own annotations.
//! The watches decode pods as [`SlimPod`]s: a pod's annotations, env or volumes are never
//! allocated, even while its event is read.
//!
//! A lookup must not let callers make the root apiserver work for them: on a node's own port
//! ([`PodIndex::route_on_node`]) the node's watch is the truth once it has listed, and a pod not
//! in it is waited for briefly (the watch lags a fresh pod by a moment), never fetched; on the
//! shared port ([`PodIndex::route`]) an unindexed pod costs one GET, but answers are remembered
//! for a few seconds (a miss too) and such GETs have a budget.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::kube_client::Calls;
use crate::kube_client::LeanWatch;
use crate::leaf::Registry;
use crate::model::counterpart::NamespaceMap;
use crate::model::slim_pod::SlimPod;
use crate::model::uid::Uid;

/// Where a root pod's requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRoute {
    pub node_name: String,
    pub uid: Option<Uid>,
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
    #[error(
        "pod {namespace}/{pod} is not indexed yet and too many unindexed pods were looked up; try again"
    )]
    Busy { namespace: String, pod: String },
}

/// Pods per LIST page of a Node's pods (client-go's and kube's default).
const PAGE_SIZE: u32 = 500;
/// How long a lookup on a node's port waits for the node's watch to show a pod it lacks.
const INDEX_LAG: Duration = Duration::from_secs(3);
/// How long the shared port remembers a GET's answer for a pod not in the index.
const LOOKUP_TTL: Duration = Duration::from_secs(5);
/// Most remembered GET answers; past it they are forgotten at once.
const LOOKUP_LIMIT: usize = 4096;
/// GETs of unindexed pods: a burst of this many, then this many a second. Only direct callers
/// of the shared port (which no Node names) cause them; this bounds what they can make the root
/// apiserver do, well above what a person or a test suite asks.
const LOOKUP_BURST: f64 = 100.0;
const LOOKUPS_PER_SECOND: f64 = 50.0;

type Key = (String, String);

/// What a GET said of a pod the index lacked (its node, "" while unbound; `None` when there was
/// no such pod), and when that was learned.
type LookedUp = (Option<PodRoute>, Instant);

/// The index. Cheap to clone.
#[derive(Clone)]
pub struct PodIndex {
    root: Client,
    registry: Registry,
    routes: Arc<RwLock<HashMap<Key, PodRoute>>>,
    /// Woken whenever a pod is indexed.
    indexed: Arc<tokio::sync::Notify>,
    /// Virtual nodes whose pod watch has listed: their pods are all in `routes`.
    listed: Arc<RwLock<HashSet<String>>>,
    /// How many [`NodePods`] of each node are open here.
    watchers: Arc<Mutex<HashMap<String, usize>>>,
    /// Who hears which pods of a node changed ([`NodePods::changes`]).
    subscribers: Arc<Mutex<HashMap<String, Vec<mpsc::UnboundedSender<Key>>>>>,
    /// The shared port's recent GETs of unindexed pods.
    looked_up: Arc<Mutex<HashMap<Key, LookedUp>>>,
    lookups: Arc<Mutex<crate::caps::TokenBucket>>,
}

impl PodIndex {
    pub fn new(root: Client, registry: Registry) -> PodIndex {
        PodIndex {
            root,
            registry,
            routes: Arc::default(),
            indexed: Arc::default(),
            listed: Arc::default(),
            watchers: Arc::default(),
            subscribers: Arc::default(),
            looked_up: Arc::default(),
            lookups: Arc::new(Mutex::new(crate::caps::TokenBucket::full(LOOKUP_BURST))),
        }
    }

    /// Where requests for root pod `namespace/pod` go, from the index, else (a pod too fresh
    /// for the watch, or on no virtual node) from one remembered and budgeted GET.
    pub async fn route(&self, namespace: &str, pod: &str) -> Result<PodRoute, RouteError> {
        let key = (namespace.to_string(), pod.to_string());
        if let Some(route) = self.indexed_route(&key) {
            return Ok(route);
        }
        let route = self
            .look_up(&key)
            .await?
            .ok_or_else(|| RouteError::NotFound {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
            })?;
        if self.registry.by_node(&route.node_name).is_none() {
            return Err(RouteError::NotOnVirtualNode {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                node: route.node_name,
            });
        }
        Ok(route)
    }

    /// Where requests for root pod `namespace/pod` go if it is on virtual node `node`: from the
    /// node's watch alone, waiting a moment for a pod it does not show yet. Costs the root
    /// apiserver nothing, except while the node's watch has not listed yet (just after start).
    pub async fn route_on_node(
        &self,
        namespace: &str,
        pod: &str,
        node: &str,
    ) -> Result<Option<PodRoute>, RouteError> {
        let key = (namespace.to_string(), pod.to_string());
        let deadline = tokio::time::Instant::now() + INDEX_LAG;
        loop {
            // Registered before the look, so an upsert in between is not missed.
            let indexed = self.indexed.notified();
            if let Some(route) = self.indexed_route(&key) {
                return Ok((route.node_name == node).then_some(route));
            }
            if !read(&self.listed).contains(node) {
                let route = self.route(namespace, pod).await;
                return match route {
                    Ok(route) => Ok((route.node_name == node).then_some(route)),
                    Err(RouteError::NotFound { .. } | RouteError::NotOnVirtualNode { .. }) => {
                        Ok(None)
                    }
                    Err(err) => Err(err),
                };
            }
            if tokio::time::timeout_at(deadline, indexed).await.is_err() {
                return Ok(None);
            }
        }
    }

    fn indexed_route(&self, key: &Key) -> Option<PodRoute> {
        read(&self.routes)
            .get(key)
            .filter(|route| self.registry.by_node(&route.node_name).is_some())
            .cloned()
    }

    /// The node and UID of a pod the index lacks (`None` when there is no such pod), from a GET
    /// remembered for [`LOOKUP_TTL`] and drawn from a budget.
    async fn look_up(&self, key: &Key) -> Result<Option<PodRoute>, RouteError> {
        let now = Instant::now();
        {
            let mut looked_up = self.looked_up.lock().unwrap_or_else(|e| e.into_inner());
            looked_up.retain(|_, (_, at)| now.duration_since(*at) < LOOKUP_TTL);
            if let Some((route, _)) = looked_up.get(key) {
                return Ok(route.clone());
            }
        }
        let (namespace, pod) = key;
        let allowed = self
            .lookups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(LOOKUPS_PER_SECOND, LOOKUP_BURST);
        if !allowed {
            return Err(RouteError::Busy {
                namespace: namespace.clone(),
                pod: pod.clone(),
            });
        }
        let api: Api<SlimPod> = Api::namespaced(self.root.clone(), namespace);
        let found = api.get_opt(pod).await.map_err(|source| RouteError::Root {
            namespace: namespace.clone(),
            pod: pod.clone(),
            source,
        })?;
        let answer = found.map(|p| PodRoute {
            node_name: p.node_name().unwrap_or_default().to_string(),
            uid: p.metadata.uid.as_deref().map(Uid::new),
        });
        let mut looked_up = self.looked_up.lock().unwrap_or_else(|e| e.into_inner());
        if looked_up.len() >= LOOKUP_LIMIT {
            looked_up.clear();
        }
        looked_up.insert(key.clone(), (answer.clone(), now));
        Ok(answer)
    }

    /// The leaf pods (leaf namespace, leaf name) that stand for root pods on virtual node `node`,
    /// whose leaf maps namespaces with `namespaces`. Keyed as the leaf's pod records are (`virtual_node::leaf_pods::PodKey`), so capacity
    /// looks each leaf pod up without making strings.
    pub fn leaf_pods_on(
        &self,
        node: &str,
        namespaces: &NamespaceMap,
    ) -> HashSet<(Box<str>, Box<str>)> {
        read(&self.routes)
            .iter()
            .filter(|(_, r)| r.node_name == node)
            .filter_map(|((ns, name), _)| {
                Some((namespaces.leaf_namespace(ns)?.into(), name.as_str().into()))
            })
            .collect()
    }

    /// Starts watching the root pods on virtual node `node`; the watch lasts as long as the
    /// returned [`NodePods`]. Only the replica that serves a node (or takes it over, or hands it
    /// over) watches its pods: on every other replica the node's pods are not indexed, and the
    /// rare call that reaches it for them (one in flight while the Node moved) costs a GET.
    pub fn watch(&self, node: &str) -> NodePods {
        *lock(&self.watchers).entry(node.to_string()).or_default() += 1;
        NodePods {
            index: self.clone(),
            node: node.to_string(),
            task: tokio::spawn(self.clone().watch_node(node.to_string())),
        }
    }

    /// Whether `node`'s pod watch has listed, waiting up to `wait` for it.
    async fn listed_within(&self, node: &str, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before the look, so a listing in between is not missed.
            let indexed = self.indexed.notified();
            if read(&self.listed).contains(node) {
                return true;
            }
            if tokio::time::timeout_at(deadline, indexed).await.is_err() {
                return false;
            }
        }
    }

    async fn watch_node(self, node: String) {
        let fields = Some(format!("spec.nodeName={node}"));
        let mut events =
            LeanWatch::<SlimPod>::new(Calls::of_client(self.root.clone()), fields, PAGE_SIZE);
        let mut seen: HashSet<Key> = HashSet::new();
        loop {
            match events.next().await {
                Ok(watcher::Event::Init) => seen.clear(),
                Ok(watcher::Event::InitApply(pod)) => {
                    if let Some(key) = self.upsert(&pod) {
                        self.changed(&node, &key);
                        seen.insert(key);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    write(&self.routes).retain(|key, r| r.node_name != node || seen.contains(key));
                    write(&self.listed).insert(node.clone());
                    self.indexed.notify_waiters();
                }
                Ok(watcher::Event::Apply(pod)) => {
                    if let Some(key) = self.upsert(&pod) {
                        self.changed(&node, &key);
                    }
                }
                Ok(watcher::Event::Delete(pod)) => {
                    if let Some(key) = key_of(&pod) {
                        write(&self.routes).remove(&key);
                        self.changed(&node, &key);
                    }
                }
                Err(err) => tracing::warn!(%err, node = %node, "watching root pods"),
            }
        }
    }

    /// Tells `node`'s subscribers that pod `key` changed (forgetting those gone).
    fn changed(&self, node: &str, key: &Key) {
        if let Some(subscribers) = lock(&self.subscribers).get_mut(node) {
            subscribers.retain(|s| s.send(key.clone()).is_ok());
        }
    }

    fn upsert(&self, pod: &SlimPod) -> Option<Key> {
        let key = key_of(pod)?;
        let route = route_of(pod)?;
        write(&self.routes).insert(key.clone(), route);
        self.indexed.notify_waiters();
        Some(key)
    }
}

/// The root pod watch of one virtual node ([`PodIndex::watch`]): dropping it ends the watch
/// and, unless another is open for the same node (a leaf's loop restarting), forgets the
/// node's pods.
pub struct NodePods {
    index: PodIndex,
    node: String,
    task: JoinHandle<()>,
}

impl NodePods {
    /// Whether the watch has listed the node's pods, waiting up to `wait` for it.
    pub async fn listed_within(&self, wait: Duration) -> bool {
        self.index.listed_within(&self.node, wait).await
    }

    /// The node's pods as they change: every pod indexed now, then each pod the watch shows
    /// changed or gone (each relist shows them all again).
    pub fn changes(&self) -> NodePodChanges {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut subscribers = lock(&self.index.subscribers);
        for (key, route) in read(&self.index.routes).iter() {
            if route.node_name == self.node {
                let _ = tx.send(key.clone());
            }
        }
        subscribers.entry(self.node.clone()).or_default().push(tx);
        NodePodChanges {
            changes: rx,
            index: self.index.clone(),
            node: self.node.clone(),
        }
    }
}

/// The changes of one node's root pods ([`NodePods::changes`]), as (namespace, name).
pub struct NodePodChanges {
    changes: mpsc::UnboundedReceiver<Key>,
    index: PodIndex,
    node: String,
}

impl NodePodChanges {
    /// The next pod that changed; `None` once the node's watch is gone.
    pub async fn next(&mut self) -> Option<(String, String)> {
        self.changes.recv().await
    }

    /// A handle that waits for the node's watch to have listed.
    pub fn listing(&self) -> NodeListing {
        NodeListing {
            index: self.index.clone(),
            node: self.node.clone(),
        }
    }
}

/// Whether one node's pod watch has listed ([`NodePodChanges::listing`]).
pub struct NodeListing {
    index: PodIndex,
    node: String,
}

impl NodeListing {
    /// Waits until the node's watch has listed its pods once.
    pub async fn wait(&self) {
        while !self
            .index
            .listed_within(&self.node, Duration::from_secs(3600))
            .await
        {}
    }
}

impl Drop for NodePods {
    fn drop(&mut self) {
        self.task.abort();
        let index = &self.index;
        let mut watchers = lock(&index.watchers);
        let Some(count) = watchers.get_mut(&self.node) else {
            return;
        };
        *count = count.saturating_sub(1);
        if *count == 0 {
            watchers.remove(&self.node);
            lock(&index.subscribers).remove(&self.node);
            write(&index.listed).remove(&self.node);
            write(&index.routes).retain(|_, r| r.node_name != self.node);
        }
    }
}

fn key_of(pod: &SlimPod) -> Option<Key> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

fn route_of(pod: &SlimPod) -> Option<PodRoute> {
    let node_name = pod.node_name()?.to_string();
    Some(PodRoute {
        node_name,
        uid: pod.metadata.uid.as_deref().map(Uid::new),
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> SlimPod {
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
                uid: Some(Uid::new("u1")),
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

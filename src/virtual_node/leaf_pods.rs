//! What relaylet keeps of a leaf cluster's pods: for each, only what the virtual Node's capacity
//! needs (its node, whether it still holds resources, its effective requests), never the pod
//! itself. A leaf of 10,000 pods with large annotations, env or volumes costs what 10,000 small
//! records cost, and the memory goes when the pods do.
//!
//! Kept from one watch of the leaf's pods, decoded as [`SlimPod`]s (the rest of each pod's JSON
//! is skipped while it is read); each is reduced to its [`PodFacts`] as it arrives. At most
//! `LEAF_MAX_PODS` are kept: past that the watch is dropped and retried later
//! (`leaf_objects`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::leaf_objects::{Bound, Kept, LeafObjects, WatchState};
use crate::kube_client::Calls;
use crate::model::quantity::Milli;
use crate::model::slim_pod::SlimPod;

/// A leaf pod's namespace and name.
pub type PodKey = (Box<str>, Box<str>);

/// What capacity needs of one leaf pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// The leaf node it is bound to (shared between the pods of one node).
    pub node: Option<Arc<str>>,
    /// Not finished (neither Succeeded nor Failed): it still holds its requests.
    pub active: bool,
    /// Its effective requests as the scheduler counts them (resource names shared).
    pub requests: Box<[(Arc<str>, Milli)]>,
}

/// A live, compact view of one leaf's pods, at most `LEAF_MAX_PODS` of them; its watch stops
/// when this is dropped.
pub struct LeafPods(LeafObjects<Facts>);

/// The map, and the strings its records share.
#[derive(Default)]
pub struct Facts {
    pods: HashMap<PodKey, PodFacts>,
    names: HashSet<Arc<str>>,
}

impl Facts {
    /// `name` as a shared string: every pod of a node, every `cpu` request, is one allocation.
    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(known) = self.names.get(name) {
            return known.clone();
        }
        let name: Arc<str> = Arc::from(name);
        self.names.insert(name.clone());
        name
    }

    /// What capacity needs of `pod`, its strings shared with the other records.
    fn facts_of(&mut self, pod: &SlimPod) -> PodFacts {
        let node = pod.node_name().map(|n| self.intern(n));
        let requests = pod_requests(pod)
            .into_iter()
            .map(|(resource, value)| (self.intern(&resource), value))
            .collect();
        PodFacts {
            node,
            active: is_active(pod),
            requests,
        }
    }

    /// Lets go of memory once most of it is unused (a leaf whose pods went), and of shared
    /// strings no record uses any more.
    fn tidy(&mut self) {
        let sparse = self.pods.capacity() > 64 && self.pods.len() < self.pods.capacity() / 4;
        if sparse || self.pods.is_empty() {
            self.pods.shrink_to_fit();
            self.names.retain(|name| Arc::strong_count(name) > 1);
            self.names.shrink_to_fit();
        }
    }
}

/// Pods that hold resources: not yet finished.
pub fn is_active(pod: &SlimPod) -> bool {
    !matches!(pod.phase(), Some("Succeeded" | "Failed"))
}

/// A pod's effective requests as the scheduler counts them: the larger of the sum over its
/// containers and the largest init container, plus pod overhead.
pub fn pod_requests(pod: &SlimPod) -> BTreeMap<String, Milli> {
    let mut sum: BTreeMap<String, Milli> = BTreeMap::new();
    for (resource, q) in pod.containers().flat_map(|c| c.requests()) {
        if let Ok(v) = Milli::parse(&q.0) {
            *sum.entry(resource.clone()).or_default() += v;
        }
    }
    for (resource, q) in pod.init_containers().flat_map(|c| c.requests()) {
        if let Ok(v) = Milli::parse(&q.0) {
            let slot = sum.entry(resource.clone()).or_default();
            if v > *slot {
                *slot = v;
            }
        }
    }
    for (resource, q) in pod.overhead() {
        if let Ok(v) = Milli::parse(&q.0) {
            *sum.entry(resource.clone()).or_default() += v;
        }
    }
    sum
}

fn key_of(pod: &SlimPod) -> Option<PodKey> {
    Some((
        pod.metadata.namespace.as_deref()?.into(),
        pod.metadata.name.as_deref()?.into(),
    ))
}

impl Kept for Facts {
    type Object = SlimPod;
    const WHAT: &'static str = "pods";
    const BOUND_VAR: &'static str = "LEAF_MAX_PODS";
    /// A pod is a few KiB of JSON (its spec, status and managedFields; up to ~10 KiB with many
    /// containers or env): a page of 200 is 0.5-2 MiB, an eighth of `MAX_BODY` at most, and a
    /// page that reached `MAX_BODY` would need pods of 80 KiB on average. 150,000 pods are 750
    /// pages.
    const PAGE_SIZE: u32 = 200;

    fn count(&self) -> usize {
        self.pods.len()
    }

    fn apply(&mut self, pod: &SlimPod) {
        if let Some(key) = key_of(pod) {
            let record = self.facts_of(pod);
            self.pods.insert(key, record);
        }
    }

    fn delete(&mut self, pod: &SlimPod) {
        if let Some(key) = key_of(pod) {
            self.pods.remove(&key);
        }
    }

    fn tidy(&mut self) {
        Facts::tidy(self);
    }
}

impl LeafPods {
    /// Starts watching the pods of the leaf `client` reaches, keeping at most `bound.max`.
    pub fn start(client: &Calls, bound: Bound) -> LeafPods {
        LeafPods(LeafObjects::start(client.clone(), bound))
    }

    /// Waits until the pods have been listed once, or the watch was dropped; the state then.
    pub async fn settled(&self) -> WatchState {
        self.0.settled().await
    }

    /// `f` of the pods kept now, keyed by namespace and name (read under a lock: keep `f`
    /// short).
    pub fn read<T>(&self, f: impl FnOnce(&HashMap<PodKey, PodFacts>) -> T) -> T {
        self.0.read(|facts| f(&facts.pods))
    }
}

impl PodFacts {
    /// `pod`'s facts with strings of their own (tests and one-off callers; the watch shares
    /// strings between records).
    pub fn of(pod: &SlimPod) -> PodFacts {
        Facts::default().facts_of(pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotation_bytes: usize) -> SlimPod {
        serde_json::from_value(json!({
            "metadata": {
                "namespace": "default",
                "name": "web",
                "annotations": {"example.com/big": "x".repeat(annotation_bytes)},
                "labels": {"app": "web"},
            },
            "spec": {
                "nodeName": "leaf-node-1",
                "containers": [{
                    "name": "main",
                    "image": "registry.example.com/web:1",
                    "env": [{"name": "BIG", "value": "y".repeat(annotation_bytes)}],
                    "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}},
                }],
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
            "status": {"phase": "Running", "podIP": "10.0.0.7"},
        }))
        .unwrap()
    }

    /// What a record holds on the heap besides its fixed size: its strings and requests.
    fn heap_bytes(facts: &PodFacts) -> usize {
        facts.node.as_ref().map_or(0, |n| n.len())
            + facts.requests.len() * std::mem::size_of::<(Arc<str>, Milli)>()
            + facts.requests.iter().map(|(r, _)| r.len()).sum::<usize>()
    }

    #[test]
    fn a_pod_with_a_64_kib_annotation_costs_what_a_small_pod_costs() {
        let small = PodFacts::of(&pod(0));
        let big = PodFacts::of(&pod(64 * 1024));
        assert_eq!(big, small, "only what capacity needs is kept");
        assert_eq!(heap_bytes(&big), heap_bytes(&small));
        // The whole record, key strings included, is far below the 1 KiB design figure.
        let key: PodKey = ("default".into(), "web".into());
        let total = std::mem::size_of::<(PodKey, PodFacts)>()
            + key.0.len()
            + key.1.len()
            + heap_bytes(&big);
        assert!(total < 256, "{total} bytes per pod");
        assert_eq!(big.node.as_deref(), Some("leaf-node-1"));
        assert!(big.active);
        assert_eq!(
            big.requests
                .iter()
                .map(|(r, v)| (r.to_string(), *v))
                .collect::<Vec<_>>(),
            [
                ("cpu".to_string(), Milli(250)),
                ("memory".to_string(), Milli(64 * 1024 * 1024 * 1000)),
            ]
        );
    }

    #[test]
    fn init_containers_and_overhead_count_like_the_scheduler() {
        let pod: SlimPod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "100m"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "200m"}}}
                ],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}],
                "overhead": {"cpu": "50m"}
            }
        }))
        .unwrap();
        let r = pod_requests(&pod);
        assert_eq!(r["cpu"], Milli(1050));
        assert_eq!(r["memory"], Milli::parse("64Mi").unwrap());
    }

    #[test]
    fn records_share_node_and_resource_names_and_give_memory_back() {
        let mut facts = Facts::default();
        for i in 0..1000 {
            let mut p = pod(0);
            p.metadata.name = Some(format!("web-{i}"));
            let record = facts.facts_of(&p);
            facts.pods.insert(key_of(&p).unwrap(), record);
        }
        // One node name and two resource names, however many pods.
        assert_eq!(facts.names.len(), 3);
        let grown = facts.pods.capacity();
        for i in 0..1000 {
            facts
                .pods
                .remove(&("default".into(), format!("web-{i}").into()));
            facts.tidy();
        }
        assert!(
            facts.pods.capacity() < grown / 4,
            "{} of {grown}",
            facts.pods.capacity()
        );
        assert!(facts.names.is_empty(), "names no record uses are let go");
    }
}

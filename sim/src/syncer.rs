//! What a multi-cluster syncer (the Kosmos clustertree pod controller's role) does for pods
//! already placed: the ephemeral containers `kubectl debug` adds to a root pod are added to its
//! leaf copy (same namespace and name), and the leaf's `ephemeralContainerStatuses` are copied
//! up to the root pod, so kubectl sees the container start and attaches to it through the
//! root apiserver and relaylet. Used by the sandbox; it only syncs, never creates pods.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::apiserver::{Store, kinds};

/// One leaf: the root's virtual node that shows it, and its store.
pub struct Leaf {
    pub virtual_node: String,
    pub store: Store,
}

/// Syncs until `stop`.
pub fn watch(root: Store, leaves: Vec<Leaf>, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut changes: Vec<_> = std::iter::once(root.subscribe())
            .chain(leaves.iter().map(|l| l.store.subscribe()))
            .collect();
        loop {
            let any_change =
                futures::future::select_all(changes.iter_mut().map(|c| Box::pin(c.changed())));
            tokio::select! {
                _ = stop.cancelled() => return,
                (result, _, _) = any_change => if result.is_err() { return },
            }
            sync_once(&root, &leaves);
        }
    });
}

fn sync_once(root: &Store, leaves: &[Leaf]) {
    let Some(kind) = kinds::lookup("", "v1", "pods") else {
        return;
    };
    for pod in root.list_typed::<Pod>(None).unwrap_or_default() {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let Some(leaf) = leaves
            .iter()
            .find(|l| Some(l.virtual_node.as_str()) == node)
        else {
            continue;
        };
        let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            continue;
        };
        let Ok(root_pod) = root.get(kind, namespace, name) else {
            continue;
        };
        let Ok(leaf_pod) = leaf.store.get(kind, namespace, name) else {
            continue;
        };
        // Down: the leaf copy gets the root pod's ephemeral containers (writes only changes:
        // every write wakes this loop again).
        let wanted = &root_pod["spec"]["ephemeralContainers"];
        if wanted.as_array().is_some_and(|l| !l.is_empty())
            && leaf_pod["spec"]["ephemeralContainers"] != *wanted
        {
            let _ = leaf.store.modify(kind, namespace, name, |live| {
                let mut next = live.clone();
                next["spec"]["ephemeralContainers"] = wanted.clone();
                Ok(next)
            });
        }
        // Up: the leaf kubelet's report of them.
        let statuses = &leaf_pod["status"]["ephemeralContainerStatuses"];
        if !statuses.is_null() && root_pod["status"]["ephemeralContainerStatuses"] != *statuses {
            let _ = root.modify(kind, namespace, name, |live| {
                let mut next: Value = live.clone();
                next["status"]["ephemeralContainerStatuses"] = statuses.clone();
                Ok(next)
            });
        }
    }
}

//! What makes a leaf pod relaylet's, and which root pods relaylet runs.
//!
//! A leaf copy carries three marks: the owner label (this install, its namespace, as on its
//! Nodes), the node label (the virtual node whose pod it stands for, so one leaf registered
//! under two names keeps two sets of copies apart) and the counterpart marker (the root pod's
//! UID, the proof `routing` checks before relaying a session). relaylet changes or deletes a
//! leaf pod only when it carries the first two; a leaf pod of the same name without them is a
//! tenant's and is never touched. Root pods whose author set these keys get them overwritten
//! on the copy: the author does not choose which leaf pod is relaylet's.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use crate::model::node_ownership::OWNER_LABEL;

/// The label naming the virtual node a leaf copy stands for.
pub const NODE_LABEL: &str = "relaylet.io/node";

/// The root pod annotation that lets relaylet run a DaemonSet's pod (`"true"`).
pub const RUN_DAEMONSET_ANNOTATION: &str = "relaylet.io/run-daemonset-pod";

/// The kubelet's mirror-pod annotation: a static pod's shadow in the apiserver.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whose leaf copies to look for: this install's, for this virtual node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marks {
    /// This install's namespace (`OWNER_LABEL`).
    pub owner: String,
    /// The virtual node (`NODE_LABEL`).
    pub node: String,
    /// The counterpart marker's key (`LEAF_POD_MARKER`, default `relaylet.io/root-pod-uid`).
    pub marker: String,
}

impl Marks {
    /// The label selector of this install's copies on this node.
    pub fn selector(&self) -> String {
        format!("{OWNER_LABEL}={},{NODE_LABEL}={}", self.owner, self.node)
    }

    /// Whether `leaf` carries this install's and this node's labels (relaylet may change it).
    pub fn ours(&self, leaf: &ObjectMeta) -> bool {
        let label = |key: &str| leaf.labels.as_ref().and_then(|l| l.get(key));
        label(OWNER_LABEL) == Some(&self.owner) && label(NODE_LABEL) == Some(&self.node)
    }

    /// The root pod UID a copy of ours stands for, from its marker.
    pub fn root_uid<'a>(&self, leaf: &'a ObjectMeta) -> Option<&'a str> {
        leaf.annotations
            .as_ref()
            .and_then(|a| a.get(&self.marker))
            .map(String::as_str)
    }

    /// Puts the marks on a leaf copy of root pod `uid`.
    pub fn put_on(&self, leaf: &mut ObjectMeta, uid: &str) {
        let labels = leaf.labels.get_or_insert_with(Default::default);
        labels.insert(OWNER_LABEL.to_string(), self.owner.clone());
        labels.insert(NODE_LABEL.to_string(), self.node.clone());
        let annotations = leaf.annotations.get_or_insert_with(Default::default);
        annotations.insert(self.marker.clone(), uid.to_string());
    }
}

/// Why relaylet does not run a root pod bound to its Node; said in the pod's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRun {
    /// A DaemonSet's pod: one per node is meant for real nodes (log shippers, CNI agents), and
    /// the DaemonSet controller would replace a failed one at once.
    DaemonSet,
    /// A mirror pod: the shadow of a static pod on a real node, never run by anyone else.
    Mirror,
    /// A pod in relaylet's own namespace: its own pods and Secrets live there.
    OwnNamespace,
}

impl NotRun {
    /// The reason written into the root pod's status.
    pub fn reason(self) -> &'static str {
        match self {
            NotRun::DaemonSet => "DaemonSetPodNotRun",
            NotRun::Mirror => "MirrorPodNotRun",
            NotRun::OwnNamespace => "RelayletNamespaceNotRun",
        }
    }

    /// The message written beside it.
    pub fn message(self) -> String {
        match self {
            NotRun::DaemonSet => format!(
                "relaylet does not run DaemonSet pods in leaf clusters; annotate the pod template {RUN_DAEMONSET_ANNOTATION}=true to run it"
            ),
            NotRun::Mirror => {
                "a mirror pod stands for a static pod of a real node; relaylet does not run it"
                    .to_string()
            }
            NotRun::OwnNamespace => {
                "relaylet does not run pods of its own namespace in leaf clusters".to_string()
            }
        }
    }
}

/// Whether relaylet runs root pod `pod` bound to one of its Nodes (`own_namespace`: relaylet's).
pub fn runs(pod: &Pod, own_namespace: &str) -> Result<(), NotRun> {
    let meta = &pod.metadata;
    let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key));
    if annotation(MIRROR_ANNOTATION).is_some() {
        return Err(NotRun::Mirror);
    }
    if meta.namespace.as_deref() == Some(own_namespace) {
        return Err(NotRun::OwnNamespace);
    }
    let daemonset = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    if daemonset && annotation(RUN_DAEMONSET_ANNOTATION).map(String::as_str) != Some("true") {
        return Err(NotRun::DaemonSet);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(meta: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": meta, "spec": {"containers": []}})).unwrap()
    }

    fn marks() -> Marks {
        Marks {
            owner: "relaylet".into(),
            node: "relaylet-leaf-1".into(),
            marker: "relaylet.io/root-pod-uid".into(),
        }
    }

    #[test]
    fn which_root_pods_run() {
        let ds = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d", "controller": true}]);
        let cases = [
            (json!({"namespace": "default", "name": "web"}), Ok(())),
            (
                json!({"namespace": "default", "name": "a", "ownerReferences": ds}),
                Err(NotRun::DaemonSet),
            ),
            (
                json!({"namespace": "default", "name": "a", "ownerReferences": ds,
                    "annotations": {RUN_DAEMONSET_ANNOTATION: "true"}}),
                Ok(()),
            ),
            // Owned but not controlled by a DaemonSet: an ordinary pod.
            (
                json!({"namespace": "default", "name": "a", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "d"}]}),
                Ok(()),
            ),
            (
                json!({"namespace": "default", "name": "etcd", "annotations": {"kubernetes.io/config.mirror": "abc"}}),
                Err(NotRun::Mirror),
            ),
            (
                json!({"namespace": "relaylet", "name": "x"}),
                Err(NotRun::OwnNamespace),
            ),
        ];
        for (meta, want) in cases {
            assert_eq!(runs(&pod(meta.clone()), "relaylet"), want, "{meta}");
        }
    }

    #[test]
    fn marks_make_a_pod_ours_and_name_its_root_pod() {
        let m = marks();
        let mut meta = ObjectMeta::default();
        assert!(!m.ours(&meta));
        m.put_on(&mut meta, "uid-1");
        assert!(m.ours(&meta));
        assert_eq!(m.root_uid(&meta), Some("uid-1"));
        // Another install's copy, or this install's copy for another node, is not ours.
        for (key, value) in [(OWNER_LABEL, "other"), (NODE_LABEL, "relaylet-leaf-2")] {
            let mut other = meta.clone();
            other
                .labels
                .as_mut()
                .unwrap()
                .insert(key.to_string(), value.to_string());
            assert!(!m.ours(&other), "{key}={value}");
        }
        assert_eq!(
            m.selector(),
            "relaylet.io/owner=relaylet,relaylet.io/node=relaylet-leaf-1"
        );
    }
}

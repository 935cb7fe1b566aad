//! What to do about one pod, as a pure function of its root pod and its leaf pod as they are
//! now: the kubelet's part of a pod's life, said for a leaf copy.
//!
//! - A root pod bound to the virtual Node gets its leaf copy (unless relaylet does not run it,
//!   or it is refused: the root pod says why), and its status mirrors the copy's.
//! - A root pod being deleted gets its copy deleted with the grace left; once the copy is gone
//!   the root pod is deleted (grace 0, its UID as precondition), as a kubelet does once its
//!   containers stopped. A pod that never got a copy finishes deleting at once.
//! - A copy that vanishes while its root pod runs (evicted, deleted in the leaf, its leaf node
//!   lost) fails the root pod with the leaf's reason; it is never made again, so the pod's
//!   controller replaces it. A root pod that finished is never run again.
//! - A copy whose root pod is gone, or stands for an earlier root pod of the same name, is
//!   deleted; a leaf pod without relaylet's marks is never touched.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::leaf_copy::{CopyRules, leaf_copy, update};
use super::marks;
use super::root_status::{self, Restarts};

/// The reason of a root pod whose copy vanished when the leaf said nothing about why.
pub const LEAF_POD_GONE: &str = "LeafPodGone";
/// The reason of a root pod whose leaf pod name is taken by a pod that is not relaylet's.
pub const NAME_TAKEN: &str = "LeafPodNameTaken";

/// What to do in the leaf.
#[derive(Debug, Clone, PartialEq)]
pub enum LeafAction {
    Create(Box<Pod>),
    /// A strategic merge patch of the mutable fields.
    Patch(Value),
    /// The root pod's ephemeral containers (`kubectl debug`), through their subresource: they
    /// can only be added.
    EphemeralContainers(Value),
    /// Delete copy `uid` (precondition), with `grace` seconds (the pod's own when `None`).
    Delete {
        uid: String,
        grace: Option<i64>,
    },
}

/// What to do in the root.
#[derive(Debug, Clone, PartialEq)]
pub enum RootAction {
    /// Write the status (with the root pod's resourceVersion).
    Status(Box<PodStatus>),
    /// Delete root pod `uid` with grace 0: its copy is gone.
    Delete { uid: String },
}

/// The actions for one pod; either may be empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub leaf: Option<LeafAction>,
    pub root: Option<RootAction>,
}

/// What the decision knows besides the two pods.
pub struct Facts<'a> {
    pub rules: &'a CopyRules,
    /// The virtual node's address (the pods' `hostIP`).
    pub host_ip: &'a str,
    /// relaylet's own namespace (its pods are not run).
    pub own_namespace: &'a str,
    /// Why the pod's copy went, if the leaf said so when it was last seen.
    pub leaf_reason: Option<&'a (String, String)>,
    pub now: Timestamp,
}

/// The plan for root pod `root` (`None`: there is none) and leaf pod `leaf` of the same name
/// in the mapped namespace (`None`: there is none); `restarts` is the pod's restart memory.
pub fn decide(
    root: Option<&Pod>,
    leaf: Option<&Pod>,
    facts: &Facts,
    restarts: &mut Restarts,
) -> Plan {
    let marks = &facts.rules.marks;
    let ours = leaf.filter(|l| marks.ours(&l.metadata));
    let Some(root) = root else {
        // The root pod is gone: so goes its copy.
        return Plan {
            leaf: ours.and_then(|l| delete_leaf(l, None)),
            root: None,
        };
    };
    let root_uid = root.metadata.uid.as_deref();
    let (copy, stale) = match ours {
        Some(l) if marks.root_uid(&l.metadata) == root_uid && root_uid.is_some() => (Some(l), None),
        Some(l) => (None, Some(l)),
        None => (None, None),
    };
    let mut plan = Plan {
        // A copy of an earlier root pod of this name goes first.
        leaf: stale.and_then(|l| delete_leaf(l, None)),
        root: None,
    };
    let now = Time(facts.now);
    let phase = root.status.as_ref().and_then(|s| s.phase.as_deref());
    if root.metadata.deletion_timestamp.is_some() {
        match copy {
            Some(l) => {
                plan.leaf = delete_leaf(l, Some(grace_left(root, facts.now)));
                plan.root = status_of(root, l, facts, restarts);
            }
            None if stale.is_none() => {
                plan.root = root_uid.map(|uid| RootAction::Delete {
                    uid: uid.to_string(),
                });
            }
            None => {}
        }
        return plan;
    }
    if root_status::terminal(phase) {
        return plan;
    }
    if let Err(why) = marks::runs(root, facts.own_namespace) {
        plan.root = write_if_new(
            root,
            root_status::not_run(root, why.reason(), &why.message()),
        );
        return plan;
    }
    match copy {
        Some(l) => {
            if let Ok(wanted) = leaf_copy(root, facts.rules) {
                plan.leaf = update(&wanted, l)
                    .map(LeafAction::Patch)
                    .or_else(|| ephemeral(root, l).map(LeafAction::EphemeralContainers));
            }
            plan.root = status_of(root, l, facts, restarts);
        }
        None if leaf.is_some() && ours.is_none() => {
            let message = format!(
                "a pod named {} that relaylet did not make exists in the leaf's namespace {}; relaylet never changes it",
                root.metadata.name.as_deref().unwrap_or(""),
                facts.rules.leaf_namespace
            );
            plan.root = write_if_new(root, root_status::not_run(root, NAME_TAKEN, &message));
        }
        // Waiting for the earlier copy to go.
        None if stale.is_some() => {}
        None if ran(root) => {
            let (reason, message) = match facts.leaf_reason {
                Some((reason, message)) => (reason.as_str(), message.clone()),
                None => (
                    LEAF_POD_GONE,
                    "the pod's copy in the leaf cluster is gone (deleted or evicted there, or its leaf node lost)".to_string(),
                ),
            };
            plan.root = root_status::failed(root, reason, &message, &now)
                .map(|s| RootAction::Status(Box::new(s)));
        }
        None => match leaf_copy(root, facts.rules) {
            Ok(copy) => plan.leaf = Some(LeafAction::Create(Box::new(copy))),
            Err(refused) => {
                plan.root = root_status::failed(root, refused.reason(), &refused.to_string(), &now)
                    .map(|s| RootAction::Status(Box::new(s)));
            }
        },
    }
    plan
}

/// The ephemeral containers patch that adds the root pod's new ones to its copy, if any.
fn ephemeral(root: &Pod, leaf: &Pod) -> Option<Value> {
    let wanted = root.spec.as_ref()?.ephemeral_containers.as_ref()?;
    let have: Vec<&str> = leaf
        .spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    let new: Vec<_> = wanted
        .iter()
        .filter(|c| !have.contains(&c.name.as_str()))
        .collect();
    (!new.is_empty()).then(|| serde_json::json!({"spec": {"ephemeralContainers": new}}))
}

/// Whether a kubelet has reported for the root pod (a `hostIP`): its copy existed, so a copy
/// missing now went away.
fn ran(root: &Pod) -> bool {
    root.status
        .as_ref()
        .and_then(|s| s.host_ip.as_ref())
        .is_some()
}

/// Deleting copy `leaf` unless it is being deleted already.
fn delete_leaf(leaf: &Pod, grace: Option<i64>) -> Option<LeafAction> {
    if leaf.metadata.deletion_timestamp.is_some() {
        return None;
    }
    Some(LeafAction::Delete {
        uid: leaf.metadata.uid.clone()?,
        grace,
    })
}

/// The seconds left of a deleted root pod's grace period (0 once it is over).
fn grace_left(root: &Pod, now: Timestamp) -> i64 {
    root.metadata
        .deletion_timestamp
        .as_ref()
        .map(|deadline| deadline.0.as_second() - now.as_second())
        .unwrap_or(0)
        .max(0)
}

fn status_of(root: &Pod, leaf: &Pod, facts: &Facts, restarts: &mut Restarts) -> Option<RootAction> {
    write_if_new(
        root,
        root_status::mirrored(root, leaf, facts.host_ip, restarts)?,
    )
}

/// `status`, if it says something the root pod does not.
fn write_if_new(root: &Pod, status: PodStatus) -> Option<RootAction> {
    root_status::differs(root.status.as_ref(), &status)
        .then(|| RootAction::Status(Box::new(status)))
}

/// What a leaf pod said of itself when it was last seen, to fail its root pod with: its
/// reason and message (an eviction's), quoted.
pub fn leaf_reason(leaf: &Pod) -> Option<(String, String)> {
    let status = leaf.status.as_ref()?;
    let reason = status.reason.as_deref()?;
    Some((
        crate::model::quote::quote(reason),
        crate::model::quote::quote(status.message.as_deref().unwrap_or("")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_sync::marks::Marks;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn rules() -> CopyRules {
        CopyRules {
            marks: Marks {
                owner: "relaylet".into(),
                node: "relaylet-leaf-1".into(),
                marker: "relaylet.io/root-pod-uid".into(),
            },
            leaf_namespace: "team".into(),
            root_apiserver: None,
            node_taints: vec![],
            node_label_keys: CopyRules::node_label_keys(&BTreeMap::new()),
            host_access: false,
        }
    }

    /// A root pod: `uid`, its phase, whether a kubelet reported for it (`hostIP`), whether it
    /// is being deleted (grace ending 30 s after "now").
    fn root(uid: &str, phase: &str, reported: bool, deleting: bool) -> Pod {
        let mut status = json!({"phase": phase});
        if reported {
            status["hostIP"] = json!("10.0.0.9");
        }
        let mut meta = json!({"name": "web", "namespace": "team", "uid": uid});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:30Z");
        }
        serde_json::from_value(json!({
            "metadata": meta,
            "spec": {"nodeName": "relaylet-leaf-1", "containers": [{"name": "main", "image": "busybox"}]},
            "status": status
        }))
        .unwrap()
    }

    /// A leaf pod: ours (marked for root pod `marker`) or a tenant's (`None`), being deleted or not.
    fn leaf(marker: Option<&str>, deleting: bool) -> Pod {
        let mut meta = json!({"name": "web", "namespace": "team", "uid": "leaf-uid"});
        if let Some(uid) = marker {
            meta["labels"] =
                json!({"relaylet.io/owner": "relaylet", "relaylet.io/node": "relaylet-leaf-1"});
            meta["annotations"] = json!({"relaylet.io/root-pod-uid": uid});
        }
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:30Z");
        }
        serde_json::from_value(json!({
            "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    /// What a plan does, in words, for the table.
    fn said(plan: &Plan) -> (String, String) {
        let leaf = match &plan.leaf {
            None => "-".to_string(),
            Some(LeafAction::Create(_)) => "create".to_string(),
            Some(LeafAction::Patch(_)) => "patch".to_string(),
            Some(LeafAction::EphemeralContainers(_)) => "debug".to_string(),
            Some(LeafAction::Delete { grace, .. }) => format!("delete grace {grace:?}"),
        };
        let root = match &plan.root {
            None => "-".to_string(),
            Some(RootAction::Delete { .. }) => "delete".to_string(),
            Some(RootAction::Status(s)) => format!(
                "status {} {}",
                s.phase.as_deref().unwrap_or(""),
                s.reason.as_deref().unwrap_or("")
            ),
        };
        (leaf, root)
    }

    #[test]
    fn every_case_of_a_pods_life() {
        let now: Timestamp = "2026-01-01T00:00:10Z".parse().unwrap();
        let r = rules();
        let gone = (
            "Evicted".to_string(),
            "The node was low on memory.".to_string(),
        );
        // (case, root, leaf, the leaf's last word, what happens in the leaf, what happens in the root)
        type Case<'a> = (
            &'a str,
            Option<Pod>,
            Option<Pod>,
            Option<&'a (String, String)>,
            &'a str,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            (
                "a new pod gets its copy",
                Some(root("r1", "Pending", false, false)),
                None,
                None,
                "create",
                "-",
            ),
            (
                "its copy's status goes up",
                Some(root("r1", "Pending", false, false)),
                Some(leaf(Some("r1"), false)),
                None,
                "-",
                "status Running ",
            ),
            ("no news, no write", None, None, None, "-", "-"),
            (
                "a copy that vanished fails the pod with the leaf's reason",
                Some(root("r1", "Running", true, false)),
                None,
                Some(&gone),
                "-",
                "status Failed Evicted",
            ),
            (
                "... or a reason of relaylet's",
                Some(root("r1", "Running", true, false)),
                None,
                None,
                "-",
                "status Failed LeafPodGone",
            ),
            (
                "a finished pod is never run again",
                Some(root("r1", "Succeeded", true, false)),
                None,
                None,
                "-",
                "-",
            ),
            (
                "a finished pod keeps its copy until deleted",
                Some(root("r1", "Failed", true, false)),
                Some(leaf(Some("r1"), false)),
                None,
                "-",
                "-",
            ),
            (
                "a deleted pod's copy goes with the grace left",
                Some(root("r1", "Running", true, true)),
                Some(leaf(Some("r1"), false)),
                None,
                "delete grace Some(20)",
                "status Running ",
            ),
            (
                "... once the copy is going, wait",
                Some(root("r1", "Running", true, true)),
                Some(leaf(Some("r1"), true)),
                None,
                "-",
                "status Running ",
            ),
            (
                "... once it is gone, the root pod goes",
                Some(root("r1", "Running", true, true)),
                None,
                None,
                "-",
                "delete",
            ),
            (
                "a pod that never started finishes deleting",
                Some(root("r1", "Pending", false, true)),
                None,
                None,
                "-",
                "delete",
            ),
            (
                "a copy whose root pod is gone goes",
                None,
                Some(leaf(Some("r1"), false)),
                None,
                "delete grace None",
                "-",
            ),
            (
                "a tenant's pod is never touched",
                None,
                Some(leaf(None, false)),
                None,
                "-",
                "-",
            ),
            (
                "... and the root pod says the name is taken",
                Some(root("r1", "Pending", false, false)),
                Some(leaf(None, false)),
                None,
                "-",
                "status Pending LeafPodNameTaken",
            ),
            (
                "an earlier pod's copy goes first",
                Some(root("r2", "Pending", false, false)),
                Some(leaf(Some("r1"), false)),
                None,
                "delete grace None",
                "-",
            ),
            (
                "... and a deleted pod does not wait for it",
                Some(root("r2", "Pending", false, true)),
                Some(leaf(Some("r1"), true)),
                None,
                "-",
                "-",
            ),
        ];
        for (case, root, leaf, reason, want_leaf, want_root) in cases {
            let facts = Facts {
                rules: &r,
                host_ip: "10.0.0.9",
                own_namespace: "relaylet",
                leaf_reason: reason,
                now,
            };
            let plan = decide(
                root.as_ref(),
                leaf.as_ref(),
                &facts,
                &mut Restarts::default(),
            );
            assert_eq!(
                said(&plan),
                (want_leaf.to_string(), want_root.to_string()),
                "{case}"
            );
        }
    }

    #[test]
    fn pods_relaylet_does_not_run_say_why_and_stay_pending() {
        let now = Timestamp::now();
        let r = rules();
        let facts = Facts {
            rules: &r,
            host_ip: "h",
            own_namespace: "relaylet",
            leaf_reason: None,
            now,
        };
        let mut ds = root("r1", "Pending", false, false);
        ds.metadata.owner_references = Some(vec![serde_json::from_value(json!(
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d", "controller": true}
        )).unwrap()]);
        let plan = decide(Some(&ds), None, &facts, &mut Restarts::default());
        assert_eq!(
            said(&plan),
            ("-".into(), "status Pending DaemonSetPodNotRun".into())
        );
        // Said once: the same status again is no news.
        let mut said_once = ds.clone();
        if let Some(RootAction::Status(s)) = plan.root {
            said_once.status = Some(*s);
        }
        assert_eq!(
            decide(Some(&said_once), None, &facts, &mut Restarts::default()),
            Plan::default()
        );
    }

    #[test]
    fn a_refused_pod_fails_with_the_reason() {
        let now = Timestamp::now();
        let r = rules();
        let facts = Facts {
            rules: &r,
            host_ip: "h",
            own_namespace: "relaylet",
            leaf_reason: None,
            now,
        };
        let mut pod = root("r1", "Pending", false, false);
        pod.spec.as_mut().unwrap().host_network = Some(true);
        let plan = decide(Some(&pod), None, &facts, &mut Restarts::default());
        assert_eq!(
            said(&plan),
            ("-".into(), "status Failed HostAccessNotAllowed".into())
        );
    }

    #[test]
    fn kubectl_debug_reaches_the_copy() {
        let now = Timestamp::now();
        let r = rules();
        let facts = Facts {
            rules: &r,
            host_ip: "h",
            own_namespace: "relaylet",
            leaf_reason: None,
            now,
        };
        let mut pod = root("r1", "Running", true, false);
        let debug = json!({"name": "debugger-x", "image": "busybox", "targetContainerName": "main", "stdin": true, "tty": true});
        pod.spec.as_mut().unwrap().ephemeral_containers =
            Some(vec![serde_json::from_value(debug.clone()).unwrap()]);
        let copy = leaf(Some("r1"), false);
        let plan = decide(Some(&pod), Some(&copy), &facts, &mut Restarts::default());
        assert_eq!(
            plan.leaf,
            Some(LeafAction::EphemeralContainers(
                json!({"spec": {"ephemeralContainers": [debug]}})
            ))
        );
        // Once the copy has it, nothing more.
        let mut has = copy.clone();
        has.spec.as_mut().unwrap().ephemeral_containers =
            pod.spec.as_ref().unwrap().ephemeral_containers.clone();
        assert_eq!(
            decide(Some(&pod), Some(&has), &facts, &mut Restarts::default()).leaf,
            None
        );
    }

    #[test]
    fn a_changed_image_is_patched_into_the_copy() {
        let now = Timestamp::now();
        let r = rules();
        let facts = Facts {
            rules: &r,
            host_ip: "h",
            own_namespace: "relaylet",
            leaf_reason: None,
            now,
        };
        let mut pod = root("r1", "Running", true, false);
        pod.spec.as_mut().unwrap().containers[0].image = Some("busybox:2".into());
        let plan = decide(
            Some(&pod),
            Some(&leaf(Some("r1"), false)),
            &facts,
            &mut Restarts::default(),
        );
        assert_eq!(
            plan.leaf,
            Some(LeafAction::Patch(
                json!({"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}})
            ))
        );
    }
}

//! A root pod's leaf copy, as a pure function of the root pod: what is kept, what is cleared,
//! what is refused, and what may change later.
//!
//! Kept: the pod's containers, volumes, security settings, restart policy, the scheduling
//! terms that mean something in the leaf (affinities, topology spread, tolerations of the
//! leaf's taints), labels and annotations. Cleared: what the root's apiserver, scheduler and
//! admission wrote (UID, resourceVersion, owners, finalizers, status, `nodeName`, priority and
//! overhead values, the scheduler's name) and what only the root can satisfy (readiness gates,
//! a non-system priority class, scheduling gates). Dropped: the toleration of the virtual
//! Node's taints and the scheduling terms aimed at the virtual Node (its labels, its name).
//! Refused: host access (host namespaces, privileged containers, hostPath volumes) unless the
//! leaf's Secret allows it, so a root pod's author gains nothing on a leaf's hosts through
//! relaylet that the leaf's own admission would not grant them. With `LEAF_POD_ROOT_APISERVER`
//! the pod's tokens are the root's (`tokens`).
//!
//! After creation only what a pod allows to change is updated: container images, labels,
//! annotations and `activeDeadlineSeconds` (ephemeral containers go through their own
//! subresource).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Affinity, NodeSelector, NodeSelectorTerm, Pod, PodSpec, PreferredSchedulingTerm, Taint,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use super::marks::Marks;
use super::tokens;
use crate::config::PodApiserver;

/// The virtual Node labels that only the root's scheduler means: terms on them are dropped.
const NODE_ONLY_LABELS: [&str; 4] = [
    "type",
    "kubernetes.io/role",
    "kubernetes.io/hostname",
    "relaylet.io/leaf-cluster",
];

/// How one leaf's copies are made.
#[derive(Debug, Clone)]
pub struct CopyRules {
    pub marks: Marks,
    /// The leaf namespace of the root pod's namespace (`namespaceMap`).
    pub leaf_namespace: String,
    /// The virtual Node's taints (their tolerations are dropped).
    pub node_taints: Vec<Taint>,
    /// The label keys of the virtual Node that only it carries: relaylet's and the leaf
    /// Secret's extra labels (terms on them are dropped).
    pub node_label_keys: BTreeSet<String>,
    /// The leaf Secret allows host access (`leaf::HOST_ACCESS_ANNOTATION`).
    pub host_access: bool,
    /// Where the copies reach the root apiserver with the root's tokens
    /// (`LEAF_POD_ROOT_APISERVER`, see `tokens`); `None`: the leaf's own service accounts.
    pub root_apiserver: Option<PodApiserver>,
}

impl CopyRules {
    /// The keys of `extra` (a leaf Secret's node labels) and relaylet's own.
    pub fn node_label_keys(extra: &BTreeMap<String, String>) -> BTreeSet<String> {
        NODE_ONLY_LABELS
            .iter()
            .map(|k| k.to_string())
            .chain(extra.keys().cloned())
            .collect()
    }
}

/// Why a root pod gets no leaf copy; its root pod fails with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "the pod asks for host access ({what}), which this leaf cluster's Secret does not allow (relaylet.io/allow-host-access)"
    )]
    HostAccess { what: String },
    #[error("the pod has no UID")]
    NoUid,
}

impl Refused {
    /// The reason written into the root pod's status.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::HostAccess { .. } => "HostAccessNotAllowed",
            Refused::NoUid => "InvalidPod",
        }
    }
}

/// The leaf copy of `root`.
pub fn leaf_copy(root: &Pod, rules: &CopyRules) -> Result<Pod, Refused> {
    let uid = root.metadata.uid.as_deref().ok_or(Refused::NoUid)?;
    let mut spec = root.spec.clone().unwrap_or_default();
    if !rules.host_access
        && let Some(what) = host_access(&spec)
    {
        return Err(Refused::HostAccess { what });
    }
    spec.node_name = None;
    spec.scheduler_name = None;
    spec.priority = None;
    spec.preemption_policy = None;
    if spec
        .priority_class_name
        .as_deref()
        .is_some_and(|c| !c.starts_with("system-"))
    {
        spec.priority_class_name = None;
    }
    spec.overhead = None;
    spec.readiness_gates = None;
    spec.scheduling_gates = None;
    spec.ephemeral_containers = None;
    spec.workload_ref = None;
    spec.tolerations = kept_tolerations(spec.tolerations.take(), &rules.node_taints);
    spec.node_selector = spec.node_selector.take().and_then(|selector| {
        let kept: BTreeMap<_, _> = selector
            .into_iter()
            .filter(|(k, _)| !rules.node_label_keys.contains(k))
            .collect();
        (!kept.is_empty()).then_some(kept)
    });
    spec.affinity = spec
        .affinity
        .take()
        .and_then(|a| kept_affinity(a, &rules.node_label_keys));
    if let Some(apiserver) = &rules.root_apiserver {
        tokens::rewrite(&mut spec, &tokens::secret_name(uid), apiserver);
    }
    let mut metadata = ObjectMeta {
        name: root.metadata.name.clone(),
        namespace: Some(rules.leaf_namespace.clone()),
        labels: root.metadata.labels.clone(),
        annotations: root.metadata.annotations.clone(),
        ..ObjectMeta::default()
    };
    rules.marks.put_on(&mut metadata, uid);
    Ok(Pod {
        metadata,
        spec: Some(spec),
        status: None,
    })
}

/// What in `spec` asks for the leaf host, if anything.
fn host_access(spec: &PodSpec) -> Option<String> {
    let mut asked = Vec::new();
    for (field, on) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if on == Some(true) {
            asked.push(field.to_string());
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        if c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
        {
            asked.push(format!("privileged container {}", c.name));
        }
    }
    for v in spec.volumes.iter().flatten() {
        if v.host_path.is_some() {
            asked.push(format!("hostPath volume {}", v.name));
        }
    }
    (!asked.is_empty()).then(|| asked.join(", "))
}

/// `tolerations` without those of the virtual Node's taints.
fn kept_tolerations(
    tolerations: Option<Vec<Toleration>>,
    taints: &[Taint],
) -> Option<Vec<Toleration>> {
    let kept: Vec<Toleration> = tolerations
        .into_iter()
        .flatten()
        .filter(|t| {
            !taints
                .iter()
                .any(|taint| t.key.as_deref() == Some(taint.key.as_str()))
        })
        .collect();
    (!kept.is_empty()).then_some(kept)
}

/// `affinity` without the node-affinity terms aimed at the virtual Node.
fn kept_affinity(mut affinity: Affinity, node_keys: &BTreeSet<String>) -> Option<Affinity> {
    if let Some(mut node) = affinity.node_affinity.take() {
        node.required_during_scheduling_ignored_during_execution = node
            .required_during_scheduling_ignored_during_execution
            .and_then(|s| {
                let terms: Vec<NodeSelectorTerm> = s
                    .node_selector_terms
                    .into_iter()
                    .filter_map(|t| kept_term(t, node_keys))
                    .collect();
                (!terms.is_empty()).then_some(NodeSelector {
                    node_selector_terms: terms,
                })
            });
        let preferred: Vec<PreferredSchedulingTerm> = node
            .preferred_during_scheduling_ignored_during_execution
            .take()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some(PreferredSchedulingTerm {
                    preference: kept_term(p.preference, node_keys)?,
                    weight: p.weight,
                })
            })
            .collect();
        node.preferred_during_scheduling_ignored_during_execution =
            (!preferred.is_empty()).then_some(preferred);
        if node
            .required_during_scheduling_ignored_during_execution
            .is_some()
            || node
                .preferred_during_scheduling_ignored_during_execution
                .is_some()
        {
            affinity.node_affinity = Some(node);
        }
    }
    let empty = affinity.node_affinity.is_none()
        && affinity.pod_affinity.is_none()
        && affinity.pod_anti_affinity.is_none();
    (!empty).then_some(affinity)
}

/// A node selector term without its requirements on virtual Node labels or the Node's name;
/// `None` when nothing is left (the term selected the virtual Node only).
fn kept_term(mut term: NodeSelectorTerm, node_keys: &BTreeSet<String>) -> Option<NodeSelectorTerm> {
    term.match_expressions = term.match_expressions.and_then(|e| {
        let kept: Vec<_> = e
            .into_iter()
            .filter(|r| !node_keys.contains(&r.key))
            .collect();
        (!kept.is_empty()).then_some(kept)
    });
    term.match_fields = term.match_fields.and_then(|f| {
        let kept: Vec<_> = f.into_iter().filter(|r| r.key != "metadata.name").collect();
        (!kept.is_empty()).then_some(kept)
    });
    (term.match_expressions.is_some() || term.match_fields.is_some()).then_some(term)
}

/// The strategic merge patch that brings leaf copy `leaf` in line with the mutable fields of
/// `root`'s copy (`wanted`, from [`leaf_copy`]), or `None` when they agree. Containers merge
/// by name, so only their images are written.
pub fn update(wanted: &Pod, leaf: &Pod) -> Option<Value> {
    let mut patch = serde_json::Map::new();
    let mut metadata = serde_json::Map::new();
    for (field, want, have) in [
        ("labels", &wanted.metadata.labels, &leaf.metadata.labels),
        (
            "annotations",
            &wanted.metadata.annotations,
            &leaf.metadata.annotations,
        ),
    ] {
        if let Some(changes) = map_patch(want.as_ref(), have.as_ref()) {
            metadata.insert(field.to_string(), changes);
        }
    }
    if !metadata.is_empty() {
        patch.insert("metadata".to_string(), Value::Object(metadata));
    }
    let (want, have) = (
        wanted.spec.clone().unwrap_or_default(),
        leaf.spec.clone().unwrap_or_default(),
    );
    let mut spec = serde_json::Map::new();
    if want.active_deadline_seconds != have.active_deadline_seconds {
        spec.insert(
            "activeDeadlineSeconds".to_string(),
            json!(want.active_deadline_seconds),
        );
    }
    for (field, want, have) in [
        ("containers", &want.containers, &have.containers),
        (
            "initContainers",
            &want.init_containers.clone().unwrap_or_default(),
            &have.init_containers.clone().unwrap_or_default(),
        ),
    ] {
        let changed = want.len() == have.len()
            && want
                .iter()
                .zip(have)
                .any(|(w, h)| w.name == h.name && w.image != h.image);
        if changed {
            let images: Vec<Value> = want
                .iter()
                .map(|c| json!({"name": c.name, "image": c.image}))
                .collect();
            spec.insert(field.to_string(), Value::Array(images));
        }
    }
    if !spec.is_empty() {
        patch.insert("spec".to_string(), Value::Object(spec));
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// The merge-patch entries that turn `have` into `want`: changed and new keys, and `null` for
/// keys `want` lacks.
fn map_patch(
    want: Option<&BTreeMap<String, String>>,
    have: Option<&BTreeMap<String, String>>,
) -> Option<Value> {
    let empty = BTreeMap::new();
    let (want, have) = (want.unwrap_or(&empty), have.unwrap_or(&empty));
    let mut changes = serde_json::Map::new();
    for (k, v) in want {
        if have.get(k) != Some(v) {
            changes.insert(k.clone(), json!(v));
        }
    }
    for k in have.keys() {
        if !want.contains_key(k) {
            changes.insert(k.clone(), Value::Null);
        }
    }
    (!changes.is_empty()).then_some(Value::Object(changes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(host_access: bool) -> CopyRules {
        CopyRules {
            marks: Marks {
                owner: "relaylet".into(),
                node: "relaylet-leaf-1".into(),
                marker: "relaylet.io/root-pod-uid".into(),
            },
            root_apiserver: None,
            leaf_namespace: "leaf-team".into(),
            node_taints: vec![Taint {
                key: "virtual-kubelet.io/provider".into(),
                value: Some("relaylet".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }],
            node_label_keys: CopyRules::node_label_keys(&BTreeMap::from([(
                "zone.example/pool".to_string(),
                "gold".to_string(),
            )])),
            host_access,
        }
    }

    /// A root pod as the root's apiserver, admission and scheduler leave it.
    fn root_pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-1", "namespace": "team", "uid": "root-uid-1",
                "resourceVersion": "42", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app": "web", "relaylet.io/owner": "forged"},
                "annotations": {"note": "kept", "relaylet.io/root-pod-uid": "forged"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": true}],
                "finalizers": ["example.com/hold"],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}]
            },
            "spec": {
                "nodeName": "relaylet-leaf-1",
                "schedulerName": "my-scheduler",
                "priority": 1000, "priorityClassName": "team-high", "preemptionPolicy": "PreemptLowerPriority",
                "overhead": {"cpu": "10m"},
                "readinessGates": [{"conditionType": "example.com/ready"}],
                "restartPolicy": "Always",
                "serviceAccountName": "web",
                "containers": [{"name": "main", "image": "busybox:1", "command": ["sleep", "1d"]}],
                "initContainers": [{"name": "init", "image": "busybox:1"}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "nodeSelector": {"type": "virtual-kubelet", "zone.example/pool": "gold", "disk": "ssd"},
                "tolerations": [
                    {"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
                ],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "type", "operator": "In", "values": ["virtual-kubelet"]}]},
                            {"matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["relaylet-leaf-1"]},
                                {"key": "disk", "operator": "In", "values": ["ssd"]}
                            ]},
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["relaylet-leaf-1"]}]}
                        ]},
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 10, "preference": {"matchExpressions": [{"key": "relaylet.io/leaf-cluster", "operator": "In", "values": ["leaf-1"]}]}}
                        ]
                    },
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}
                    ]}
                }
            },
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_copy_keeps_the_pod_and_clears_what_the_root_wrote() {
        let copy = leaf_copy(&root_pod(), &rules(false)).unwrap();
        let got = serde_json::to_value(&copy).unwrap();
        let want_meta = json!({
            "name": "web-1", "namespace": "leaf-team",
            "labels": {"app": "web", "relaylet.io/owner": "relaylet", "relaylet.io/node": "relaylet-leaf-1"},
            "annotations": {"note": "kept", "relaylet.io/root-pod-uid": "root-uid-1"}
        });
        assert_eq!(
            got["metadata"], want_meta,
            "uid, resourceVersion, owners, finalizers, managedFields cleared; marks put on"
        );
        assert!(got.get("status").is_none(), "status cleared");
        let spec = &got["spec"];
        // (field, what the copy holds): every rule of the conversion.
        let table: Vec<(&str, serde_json::Value)> = vec![
            ("nodeName", json!(null)),
            ("schedulerName", json!(null)),
            ("priority", json!(null)),
            ("preemptionPolicy", json!(null)),
            ("priorityClassName", json!(null)),
            ("overhead", json!(null)),
            ("readinessGates", json!(null)),
            ("restartPolicy", json!("Always")),
            ("serviceAccountName", json!("web")),
            (
                "containers",
                json!([{"name": "main", "image": "busybox:1", "command": ["sleep", "1d"]}]),
            ),
            (
                "initContainers",
                json!([{"name": "init", "image": "busybox:1"}]),
            ),
            ("volumes", json!([{"name": "data", "emptyDir": {}}])),
            ("nodeSelector", json!({"disk": "ssd"})),
            (
                "tolerations",
                json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]),
            ),
            (
                "affinity",
                json!({
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}
                    ]}},
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}
                    ]}
                }),
            ),
        ];
        for (field, want) in table {
            let have = spec.get(field).cloned().unwrap_or(json!(null));
            assert_eq!(have, want, "spec.{field}");
        }
    }

    #[test]
    fn a_system_priority_class_is_kept_and_a_selector_on_the_node_alone_goes() {
        let mut pod = root_pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.priority_class_name = Some("system-node-critical".into());
        spec.node_selector = Some(BTreeMap::from([("type".into(), "virtual-kubelet".into())]));
        spec.affinity = None;
        let copy = leaf_copy(&pod, &rules(false)).unwrap();
        let spec = copy.spec.unwrap();
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        assert_eq!(spec.node_selector, None);
        assert_eq!(spec.affinity, None);
    }

    #[test]
    fn host_access_is_refused_unless_the_leaf_allows_it() {
        let cases: Vec<(&str, serde_json::Value, &str)> = vec![
            ("hostNetwork", json!({"hostNetwork": true}), "hostNetwork"),
            ("hostPID", json!({"hostPID": true}), "hostPID"),
            ("hostIPC", json!({"hostIPC": true}), "hostIPC"),
            (
                "privileged",
                json!({"containers": [{"name": "main", "image": "x", "securityContext": {"privileged": true}}]}),
                "privileged container main",
            ),
            (
                "privileged init",
                json!({"initContainers": [{"name": "setup", "image": "x", "securityContext": {"privileged": true}}]}),
                "privileged container setup",
            ),
            (
                "hostPath",
                json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
                "hostPath volume root",
            ),
        ];
        for (what, patch, said) in cases {
            let mut value = serde_json::to_value(root_pod()).unwrap();
            for (k, v) in patch.as_object().unwrap() {
                value["spec"][k] = v.clone();
            }
            let pod: Pod = serde_json::from_value(value).unwrap();
            let err = leaf_copy(&pod, &rules(false)).unwrap_err();
            assert!(err.to_string().contains(said), "{what}: {err}");
            assert_eq!(err.reason(), "HostAccessNotAllowed");
            assert!(
                leaf_copy(&pod, &rules(true)).is_ok(),
                "{what} with the leaf's consent"
            );
        }
        // Unprivileged is not host access.
        let mut pod = root_pod();
        pod.spec.as_mut().unwrap().containers[0].security_context =
            Some(serde_json::from_value(json!({"privileged": false})).unwrap());
        assert!(leaf_copy(&pod, &rules(false)).is_ok());
    }

    #[test]
    fn only_mutable_fields_are_updated_later() {
        let r = rules(false);
        let copy = leaf_copy(&root_pod(), &r).unwrap();
        assert_eq!(update(&copy, &copy), None, "nothing to change");
        let mut root = root_pod();
        root.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "front".into());
        root.metadata.labels.as_mut().unwrap().remove("app");
        root.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("note".into(), "changed".into());
        let spec = root.spec.as_mut().unwrap();
        spec.containers[0].image = Some("busybox:2".into());
        spec.active_deadline_seconds = Some(60);
        // Not mutable: ignored.
        spec.restart_policy = Some("Never".into());
        let wanted = leaf_copy(&root, &r).unwrap();
        let patch = update(&wanted, &copy).unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": {"labels": {"tier": "front", "app": null}, "annotations": {"note": "changed"}},
                "spec": {"activeDeadlineSeconds": 60, "containers": [{"name": "main", "image": "busybox:2"}]}
            })
        );
    }

    #[test]
    fn a_pod_without_uid_is_refused() {
        let mut pod = root_pod();
        pod.metadata.uid = None;
        assert_eq!(leaf_copy(&pod, &rules(false)), Err(Refused::NoUid));
    }
}

//! A root pod's status, as a pure function of its leaf copy's: what the leaf's kubelet reports,
//! said as the virtual node's kubelet.
//!
//! The phase, the kubelet's conditions, the container statuses (init, app and ephemeral), the
//! start time, the QoS class and the leaf pod's IPs come from the leaf; `hostIP` is the virtual
//! node's address (where the root apiserver reaches the pod's kubelet: relaylet); the
//! conditions other parties own (the scheduler's `PodScheduled`, `DisruptionTarget`, readiness
//! gates) stay as the root has them, and `Ready` waits for the root's readiness gates. Text
//! from the leaf (reasons, messages) is quoted short. Restart counts never go down: a leaf copy
//! made again for the same root pod starts from zero, and its restarts add to the earlier
//! ones. A root pod in a terminal phase is never written again.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, HostIP, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::model::quote::quote;
use crate::model::uid::Uid;

/// The condition types the kubelet owns (taken from the leaf); the root keeps every other.
const KUBELET_CONDITIONS: [&str; 6] = [
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodReadyToStartContainers",
    "PodResizePending",
    "PodResizeInProgress",
];

/// What a pod's restarts have added up to over its leaf copies, kept while relaylet serves the
/// pod (a new replica starts from the root's counts, which never go down either way).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restarts {
    /// The leaf copy the counts are of.
    leaf_uid: Option<Uid>,
    /// Per container, the restarts of the earlier copies (the copy's own count adds to it).
    earlier: BTreeMap<String, i32>,
}

/// Whether `phase` is one a pod never leaves.
pub fn terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The status root pod `root` should have, its leaf copy being `leaf`, the virtual node's
/// address `host_ip`; `None` when the root pod's status is to stay as it is (terminal).
pub fn mirrored(
    root: &Pod,
    leaf: &Pod,
    host_ip: &str,
    restarts: &mut Restarts,
) -> Option<PodStatus> {
    let old = root.status.clone().unwrap_or_default();
    if terminal(old.phase.as_deref()) {
        return None;
    }
    let from = leaf.status.clone().unwrap_or_default();
    restarts.follow(leaf.metadata.uid.as_deref(), &old);
    let counted = |statuses: Option<Vec<ContainerStatus>>,
                   before: &Option<Vec<ContainerStatus>>| {
        statuses.map(|list| {
            list.into_iter()
                .map(|mut s| {
                    let earlier = restarts.earlier.get(&s.name).copied().unwrap_or(0);
                    let shown = before
                        .iter()
                        .flatten()
                        .find(|b| b.name == s.name)
                        .map_or(0, |b| b.restart_count);
                    s.restart_count = (s.restart_count + earlier).max(shown);
                    quote_states(&mut s);
                    s
                })
                .collect()
        })
    };
    Some(PodStatus {
        // A copy the leaf has not looked at yet is pending, as the apiserver makes every pod.
        phase: Some(from.phase.clone().unwrap_or_else(|| "Pending".to_string())),
        conditions: Some(conditions(root, &old, &from)),
        container_statuses: counted(from.container_statuses, &old.container_statuses),
        init_container_statuses: counted(
            from.init_container_statuses,
            &old.init_container_statuses,
        ),
        ephemeral_container_statuses: counted(
            from.ephemeral_container_statuses,
            &old.ephemeral_container_statuses,
        ),
        host_ip: Some(host_ip.to_string()),
        host_ips: Some(vec![HostIP {
            ip: host_ip.to_string(),
        }]),
        pod_ip: from.pod_ip,
        pod_ips: from.pod_ips,
        start_time: from.start_time,
        qos_class: from.qos_class.or(old.qos_class),
        reason: from.reason.as_deref().map(quote),
        message: from.message.as_deref().map(quote),
        nominated_node_name: old.nominated_node_name,
        allocated_resources: from.allocated_resources,
        resources: from.resources,
        resize: from.resize,
        ..PodStatus::default()
    })
}

/// The status of a root pod whose leaf copy is gone, or that is refused: `Failed` with `reason`
/// and `message`, every container that was not done terminated as lost (what the kubelet
/// writes for a container it can no longer find), `Ready` false. `None` when already terminal.
pub fn failed(root: &Pod, reason: &str, message: &str, now: &Time) -> Option<PodStatus> {
    let mut status = root.status.clone().unwrap_or_default();
    if terminal(status.phase.as_deref()) {
        return None;
    }
    status.phase = Some("Failed".to_string());
    status.reason = Some(reason.to_string());
    status.message = Some(quote(message));
    let lost = |list: &mut Option<Vec<ContainerStatus>>| {
        for s in list.iter_mut().flatten() {
            if s.state.as_ref().is_some_and(|st| st.terminated.is_some()) {
                continue;
            }
            s.ready = false;
            s.started = Some(false);
            s.last_state = s.state.take();
            s.state = Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("ContainerStatusUnknown".to_string()),
                    message: Some(
                        "The container could not be located when the pod was terminated"
                            .to_string(),
                    ),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            });
        }
    };
    lost(&mut status.container_statuses);
    lost(&mut status.init_container_statuses);
    lost(&mut status.ephemeral_container_statuses);
    set_condition(&mut status, "Ready", "False", Some("PodFailed"), now);
    set_condition(
        &mut status,
        "ContainersReady",
        "False",
        Some("PodFailed"),
        now,
    );
    Some(status)
}

/// The status of a root pod relaylet does not run (it stays `Pending`): `reason` and
/// `message` said, everything else as it was.
pub fn not_run(root: &Pod, reason: &str, message: &str) -> PodStatus {
    let mut status = root.status.clone().unwrap_or_default();
    status.phase = Some(status.phase.unwrap_or_else(|| "Pending".to_string()));
    status.reason = Some(reason.to_string());
    status.message = Some(message.to_string());
    status
}

/// Whether writing `new` would change what the root shows: conditions compared without their
/// probe and transition times (a leaf that only rewrote a time is no news).
pub fn differs(old: Option<&PodStatus>, new: &PodStatus) -> bool {
    let strip = |s: &PodStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_probe_time = None;
        }
        s
    };
    old.map(strip) != Some(strip(new))
}

impl Restarts {
    /// Notes the leaf copy the status comes from: a copy other than the last one seen starts
    /// its count after the earlier copies' restarts (and the copy's replacement counts as one).
    fn follow(&mut self, leaf_uid: Option<&str>, old: &PodStatus) {
        let Some(uid) = leaf_uid else { return };
        match &self.leaf_uid {
            Some(seen) if !seen.is(uid) => {
                let all = old
                    .container_statuses
                    .iter()
                    .chain(old.init_container_statuses.iter())
                    .flatten();
                self.earlier = all.map(|s| (s.name.clone(), s.restart_count + 1)).collect();
            }
            _ => {}
        }
        if !self.leaf_uid.as_ref().is_some_and(|seen| seen.is(uid)) {
            self.leaf_uid = Some(Uid::new(uid));
        }
    }
}

/// The root's conditions that others own, and the leaf's kubelet conditions; `Ready` false
/// while a readiness gate of the root pod is not true.
fn conditions(root: &Pod, old: &PodStatus, from: &PodStatus) -> Vec<PodCondition> {
    let kubelet = |c: &PodCondition| KUBELET_CONDITIONS.contains(&c.type_.as_str());
    let mut out: Vec<PodCondition> = old
        .conditions
        .iter()
        .flatten()
        .filter(|c| !kubelet(c))
        .cloned()
        .collect();
    let gates: Vec<&str> = root
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .map(|g| g.condition_type.as_str())
        .collect();
    let gates_open = gates
        .iter()
        .all(|gate| out.iter().any(|c| c.type_ == *gate && c.status == "True"));
    for c in from.conditions.iter().flatten().filter(|c| kubelet(c)) {
        let mut c = c.clone();
        c.reason = c.reason.as_deref().map(quote);
        c.message = c.message.as_deref().map(quote);
        if c.type_ == "Ready" && c.status == "True" && !gates_open {
            c.status = "False".to_string();
            c.reason = Some("ReadinessGatesNotReady".to_string());
            c.message = Some(format!(
                "the pod's readiness gates are not all true: {}",
                gates.join(", ")
            ));
        }
        out.push(c);
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// A container status's state reasons and messages, quoted short.
fn quote_states(s: &mut ContainerStatus) {
    for state in [s.state.as_mut(), s.last_state.as_mut()]
        .into_iter()
        .flatten()
    {
        if let Some(w) = state.waiting.as_mut() {
            w.message = w.message.as_deref().map(quote);
        }
        if let Some(t) = state.terminated.as_mut() {
            t.message = t.message.as_deref().map(quote);
        }
    }
}

/// Sets condition `type_` to `status`, its transition time moving only when it changes.
fn set_condition(status: &mut PodStatus, type_: &str, to: &str, reason: Option<&str>, now: &Time) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != to {
                c.last_transition_time = Some(now.clone());
            }
            c.status = to.to_string();
            c.reason = reason.map(str::to_string);
        }
        None => conditions.push(PodCondition {
            type_: type_.to_string(),
            status: to.to_string(),
            reason: reason.map(str::to_string),
            last_transition_time: Some(now.clone()),
            ..PodCondition::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn root(status: serde_json::Value) -> Pod {
        pod(json!({
            "metadata": {"name": "web", "namespace": "team", "uid": "r1"},
            "spec": {"nodeName": "relaylet-leaf-1", "containers": [{"name": "main"}]},
            "status": status
        }))
    }

    fn leaf(uid: &str, status: serde_json::Value) -> Pod {
        pod(json!({
            "metadata": {"name": "web", "namespace": "leaf-team", "uid": uid},
            "spec": {"nodeName": "leaf-node-3", "containers": [{"name": "main"}]},
            "status": status
        }))
    }

    fn running(restarts: i32) -> serde_json::Value {
        json!({
            "phase": "Running",
            "hostIP": "10.1.0.3", "hostIPs": [{"ip": "10.1.0.3"}],
            "podIP": "10.244.1.7", "podIPs": [{"ip": "10.244.1.7"}],
            "startTime": "2026-01-01T00:00:01Z",
            "qosClass": "Burstable",
            "observedGeneration": 1,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"}
            ],
            "containerStatuses": [{"name": "main", "ready": true, "restartCount": restarts,
                "image": "busybox:1", "imageID": "sha", "containerID": "containerd://c",
                "state": {"running": {"startedAt": "2026-01-01T00:00:02Z"}}}]
        })
    }

    #[test]
    fn the_status_is_the_leafs_said_as_the_virtual_nodes() {
        let r = root(
            json!({"phase": "Pending", "nominatedNodeName": "x", "conditions": [
                {"type": "PodScheduled", "status": "True", "reason": "root-scheduler"},
                {"type": "DisruptionTarget", "status": "True", "reason": "root-controller"}
            ]}),
        );
        let l = leaf("l1", running(0));
        let got = mirrored(&r, &l, "10.0.0.9", &mut Restarts::default()).unwrap();
        let got = serde_json::to_value(got).unwrap();
        // (field, what the root shows): every rule of the mapping.
        let table = [
            ("phase", json!("Running")),
            ("hostIP", json!("10.0.0.9")),
            ("hostIPs", json!([{"ip": "10.0.0.9"}])),
            ("podIP", json!("10.244.1.7")),
            ("podIPs", json!([{"ip": "10.244.1.7"}])),
            ("startTime", json!("2026-01-01T00:00:01Z")),
            ("qosClass", json!("Burstable")),
            ("nominatedNodeName", json!("x")),
            ("observedGeneration", json!(null)),
            (
                "conditions",
                json!([
                    {"type": "ContainersReady", "status": "True"},
                    {"type": "DisruptionTarget", "status": "True", "reason": "root-controller"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "PodScheduled", "status": "True", "reason": "root-scheduler"},
                    {"type": "Ready", "status": "True"}
                ]),
            ),
            ("containerStatuses", running(0)["containerStatuses"].clone()),
        ];
        for (field, want) in table {
            assert_eq!(
                got.get(field).cloned().unwrap_or(json!(null)),
                want,
                "status.{field}"
            );
        }
    }

    #[test]
    fn a_copy_not_looked_at_yet_is_pending_and_leaf_text_is_quoted() {
        let r = root(json!({"phase": "Pending"}));
        let mut l = leaf("l1", json!({}));
        let got = mirrored(&r, &l, "10.0.0.9", &mut Restarts::default()).unwrap();
        assert_eq!(got.phase.as_deref(), Some("Pending"));
        let long = "x\n".repeat(400);
        l.status = Some(
            serde_json::from_value(
                json!({"phase": "Failed", "reason": "Evicted", "message": long}),
            )
            .unwrap(),
        );
        let got = mirrored(&r, &l, "10.0.0.9", &mut Restarts::default()).unwrap();
        let message = got.message.unwrap();
        assert!(message.len() < 300 && !message.contains('\n'), "{message}");
    }

    #[test]
    fn readiness_gates_hold_ready_back() {
        let mut r = root(
            json!({"phase": "Running", "conditions": [{"type": "example.com/lb", "status": "False"}]}),
        );
        r.spec.as_mut().unwrap().readiness_gates = Some(vec![
            serde_json::from_value(json!({"conditionType": "example.com/lb"})).unwrap(),
        ]);
        let got = mirrored(
            &r,
            &leaf("l1", running(0)),
            "10.0.0.9",
            &mut Restarts::default(),
        )
        .unwrap();
        let ready = got
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("ReadinessGatesNotReady"))
        );
    }

    #[test]
    fn restart_counts_never_go_down_and_a_new_copy_adds_to_them() {
        let mut restarts = Restarts::default();
        let count = |s: &PodStatus| s.container_statuses.as_ref().unwrap()[0].restart_count;
        let r = root(running(0));
        let first = mirrored(&r, &leaf("l1", running(2)), "h", &mut restarts).unwrap();
        assert_eq!(count(&first), 2);
        // The root already shows more (a replica that served it before this one): kept.
        let r = root(running(5));
        let got = mirrored(&r, &leaf("l1", running(2)), "h", &mut restarts).unwrap();
        assert_eq!(count(&got), 5);
        // The copy made again: its restarts add to the earlier ones, the replacement counting one.
        let r = root(running(2));
        let got = mirrored(&r, &leaf("l2", running(0)), "h", &mut restarts).unwrap();
        assert_eq!(count(&got), 3);
        let got = mirrored(&r, &leaf("l2", running(4)), "h", &mut restarts).unwrap();
        assert_eq!(count(&got), 7);
    }

    #[test]
    fn a_terminal_pod_is_never_written_again() {
        for phase in ["Succeeded", "Failed"] {
            let r = root(json!({"phase": phase}));
            assert_eq!(
                mirrored(&r, &leaf("l1", running(0)), "h", &mut Restarts::default()),
                None,
                "{phase}"
            );
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            assert_eq!(failed(&r, "LeafPodGone", "gone", &now), None, "{phase}");
        }
    }

    #[test]
    fn a_lost_copy_fails_the_pod_with_its_containers_terminated() {
        let r = root(running(1));
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let got = failed(&r, "Evicted", "The node was low on resource: memory.", &now).unwrap();
        assert_eq!(got.phase.as_deref(), Some("Failed"));
        assert_eq!(got.reason.as_deref(), Some("Evicted"));
        let c = &got.container_statuses.unwrap()[0];
        assert!(!c.ready);
        assert_eq!(c.restart_count, 1);
        let terminated = c.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (terminated.exit_code, terminated.reason.as_deref()),
            (137, Some("ContainerStatusUnknown"))
        );
        assert!(c.last_state.as_ref().unwrap().running.is_some());
        let ready = got
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "False");
    }

    #[test]
    fn only_news_is_written() {
        let r = root(json!({"phase": "Pending"}));
        let status = mirrored(&r, &leaf("l1", running(0)), "h", &mut Restarts::default()).unwrap();
        assert!(differs(r.status.as_ref(), &status));
        let mut again = status.clone();
        for c in again.conditions.iter_mut().flatten() {
            c.last_probe_time = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        }
        assert!(
            !differs(Some(&status), &again),
            "a probe time alone is no news"
        );
    }
}

//! What a leaf's virtual Node should say: addresses, capacity, conditions, node info, declared
//! features, labels and taints. Pure functions of the leaf's state, so every rule is unit-tested.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSystemInfo, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::leaf_pods::{PodFacts, PodKey};
use crate::config::ADDRESS_TYPES;
use crate::model::node_ownership::LEAF_LABEL;
use crate::model::quantity::Milli;

/// The taint every virtual node carries unless its leaf Secret says otherwise: only pods that
/// tolerate it (the multi-cluster scheduler's) land there.
pub fn default_taint() -> Taint {
    Taint {
        key: "virtual-kubelet.io/provider".to_string(),
        value: Some("relaylet".to_string()),
        effect: "NoSchedule".to_string(),
        time_added: None,
    }
}

/// The Node addresses: relaylet's own first (the one the root apiserver must dial), then the
/// leaf nodes' InternalIPs of the root's IP family, then of the other family, then the leaf's
/// other addresses, without duplicates.
///
/// Leaf addresses of a type that kube-apiserver's default preference order puts *before* the
/// preferred type are left out: under that order they would win over relaylet's address and
/// the root apiserver would dial a leaf node directly.
pub fn addresses(preferred_type: &str, own_ip: IpAddr, leaf_nodes: &[Node]) -> Vec<NodeAddress> {
    let mut out = vec![NodeAddress {
        type_: preferred_type.to_string(),
        address: own_ip.to_string(),
    }];
    let preferred_rank = ADDRESS_TYPES
        .iter()
        .position(|t| *t == preferred_type)
        .unwrap_or(0);
    let hijacks = |t: &str| {
        ADDRESS_TYPES
            .iter()
            .position(|known| *known == t)
            .is_some_and(|rank| rank < preferred_rank)
    };
    let leaf_addresses: Vec<&NodeAddress> = leaf_nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.addresses.as_ref())
        .flatten()
        .collect();
    let same_family = |a: &NodeAddress| {
        a.address
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_ipv4() == own_ip.is_ipv4())
    };
    let internal = |a: &&NodeAddress| a.type_ == "InternalIP";
    let ordered = leaf_addresses
        .iter()
        .filter(|a| internal(a) && same_family(a))
        .chain(
            leaf_addresses
                .iter()
                .filter(|a| internal(a) && !same_family(a)),
        )
        .chain(leaf_addresses.iter().filter(|a| !internal(a)));
    for addr in ordered {
        if hijacks(&addr.type_) {
            continue;
        }
        if !out
            .iter()
            .any(|o| o.type_ == addr.type_ && o.address == addr.address)
        {
            out.push((*addr).clone());
        }
    }
    out
}

/// Whether a leaf node can take pods: Ready and not cordoned.
pub fn schedulable_and_ready(node: &Node) -> bool {
    let unschedulable = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    !unschedulable && is_ready(node)
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Capacity for the virtual node: the summed allocatable of the leaf's Ready, schedulable nodes,
/// minus what the leaf's own running workloads request. Leaf pods that stand for root pods on
/// this virtual node (`own_pods`, leaf namespace/name) are not subtracted: the root scheduler
/// already counts them against this node.
pub fn capacity<'a>(
    leaf_nodes: &[Node],
    leaf_pods: impl IntoIterator<Item = (&'a PodKey, &'a PodFacts)>,
    own_pods: &HashSet<PodKey>,
) -> BTreeMap<String, Quantity> {
    let usable: HashSet<&str> = leaf_nodes
        .iter()
        .filter(|n| schedulable_and_ready(n))
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    let mut total: BTreeMap<String, Milli> = BTreeMap::new();
    for node in leaf_nodes.iter().filter(|n| schedulable_and_ready(n)) {
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        for (resource, quantity) in allocatable.into_iter().flatten() {
            if let Ok(value) = Milli::parse(&quantity.0) {
                *total.entry(resource.clone()).or_default() += value;
            }
        }
    }
    for (key, pod) in leaf_pods {
        let on_usable_node = pod.node.as_deref().is_some_and(|n| usable.contains(n));
        if !on_usable_node || !pod.active || own_pods.contains(key) {
            continue;
        }
        for (resource, request) in pod.requests.iter() {
            if let Some(slot) = total.get_mut(&**resource) {
                *slot = slot.saturating_sub(*request);
            }
        }
        if let Some(slot) = total.get_mut("pods") {
            *slot = slot.saturating_sub(Milli(1000));
        }
    }
    total
        .into_iter()
        .map(|(k, v)| (k, Quantity(v.to_string())))
        .collect()
}

/// What relaylet knows about a leaf's health right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafHealth {
    /// `/readyz` answered ok and at least one node is Ready.
    Ready { ready_nodes: usize },
    /// The leaf apiserver could not be reached or is not ready (why: leaf text in it quoted
    /// short, see `leaf::error_chain`).
    Unreachable(String),
    /// The apiserver is fine but no node is Ready and schedulable.
    NoReadyNode,
    /// The leaf holds more pods or nodes than relaylet keeps, or sent an answer past relaylet's
    /// read limits: its watch was dropped and is retried later (why, in a few words).
    TooLarge(String),
}

/// The Node conditions for `health`, keeping transition times of conditions that did not
/// change so `kubectl describe node` shows honest history.
pub fn conditions(
    health: &LeafHealth,
    now: &Time,
    previous: &[NodeCondition],
) -> Vec<NodeCondition> {
    let (ready, reason, message) = match health {
        LeafHealth::Ready { ready_nodes } => (
            "True",
            "LeafReady",
            format!("leaf cluster is reachable and has {ready_nodes} ready node(s)"),
        ),
        LeafHealth::Unreachable(why) => (
            "False",
            "LeafUnreachable",
            format!("leaf cluster apiserver is not reachable or not ready: {why}"),
        ),
        LeafHealth::NoReadyNode => (
            "False",
            "LeafNoReadyNode",
            "leaf cluster has no Ready, schedulable node".to_string(),
        ),
        LeafHealth::TooLarge(why) => ("False", "LeafTooLarge", why.clone()),
    };
    let mut out = vec![condition("Ready", ready, reason, &message, now, previous)];
    for (type_, reason, message) in [
        (
            "MemoryPressure",
            "LeafHasSufficientMemory",
            "relaylet virtual node: memory pressure is the leaf's concern",
        ),
        (
            "DiskPressure",
            "LeafHasNoDiskPressure",
            "relaylet virtual node: disk pressure is the leaf's concern",
        ),
        (
            "PIDPressure",
            "LeafHasSufficientPID",
            "relaylet virtual node: PID pressure is the leaf's concern",
        ),
    ] {
        out.push(condition(type_, "False", reason, message, now, previous));
    }
    out
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: &Time,
    previous: &[NodeCondition],
) -> NodeCondition {
    let transition = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(transition),
    }
}

/// Node info: the leaf's Kubernetes version as the kubelet version, OS and architecture from
/// its first node.
pub fn node_info(leaf_version: Option<&str>, leaf_nodes: &[Node]) -> NodeSystemInfo {
    let first = leaf_nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.node_info.as_ref())
        .next();
    let version = leaf_version.unwrap_or("").to_string();
    NodeSystemInfo {
        architecture: first
            .map(|i| i.architecture.clone())
            .unwrap_or_else(|| "amd64".into()),
        operating_system: first
            .map(|i| i.operating_system.clone())
            .unwrap_or_else(|| "linux".into()),
        kernel_version: first.map(|i| i.kernel_version.clone()).unwrap_or_default(),
        os_image: first.map(|i| i.os_image.clone()).unwrap_or_default(),
        container_runtime_version: first
            .map(|i| i.container_runtime_version.clone())
            .unwrap_or_default(),
        kubelet_version: version.clone(),
        kube_proxy_version: String::new(),
        ..Default::default()
    }
}

/// The node feature that tells a 1.36+ root apiserver to proxy WebSocket exec/attach
/// (`v5.channel.k8s.io`) and the WebSocket port-forward tunnel to the node unchanged instead of
/// translating them to SPDY (`pkg/registry/core/pod/rest/subresources.go`).
pub const EXTEND_WEBSOCKETS_TO_KUBELET: &str = "ExtendWebSocketsToKubelet";

/// `status.declaredFeatures`, sorted as the apiserver requires. relaylet relays every upgrade
/// to the leaf apiserver unchanged (`relay`), so it serves the WebSocket calls exactly when
/// the leaf apiserver does: v5 exec/attach since 1.30 (`TranslateStreamCloseWebsocketRequests`
/// beta) and the port-forward tunnel since 1.31 (`PortForwardWebsockets` beta). A leaf whose
/// version is older or not known yet gets no declaration (the root then translates, as
/// before), and neither does any leaf when `enabled` is off. Always a list, never absent: a
/// merge patch without the field would keep an earlier declaration.
pub fn declared_features(enabled: bool, leaf_version: Option<&str>) -> Vec<String> {
    match leaf_version.and_then(minor_of) {
        Some(minor) if enabled && minor >= 31 => vec![EXTEND_WEBSOCKETS_TO_KUBELET.to_string()],
        _ => Vec::new(),
    }
}

/// The minor of a Kubernetes 1.x version (`v1.31.2-gke.100` is 31).
fn minor_of(version: &str) -> Option<u32> {
    let rest = version
        .strip_prefix('v')
        .unwrap_or(version)
        .strip_prefix("1.")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The labels relaylet puts on a virtual node, then the leaf Secret's extra labels.
///
/// `kubernetes.io/hostname` is set only when the preferred address type is `Hostname`: with
/// any other type, kube-apiserver's default preference order (`Hostname` first) would dial the
/// label's value when the Node has no `Hostname` address, instead of relaylet's address. Leaving
/// it off lets relaylet work with the apiserver's default flags.
pub fn labels(
    node_name: &str,
    leaf_name: &str,
    preferred_type: &str,
    info: &NodeSystemInfo,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("type".to_string(), "virtual-kubelet".to_string()),
        ("kubernetes.io/role".to_string(), "agent".to_string()),
        (LEAF_LABEL.to_string(), leaf_name.to_string()),
        (
            "kubernetes.io/os".to_string(),
            info.operating_system.clone(),
        ),
        ("kubernetes.io/arch".to_string(), info.architecture.clone()),
    ]);
    if preferred_type == "Hostname" {
        labels.insert("kubernetes.io/hostname".to_string(), node_name.to_string());
    }
    labels.extend(extra.clone());
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    fn leaf_node(
        name: &str,
        addresses: serde_json::Value,
        allocatable: serde_json::Value,
        ready: bool,
    ) -> Node {
        node(json!({
            "metadata": {"name": name},
            "status": {
                "addresses": addresses,
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                "nodeInfo": {"architecture": "arm64", "operatingSystem": "linux", "kernelVersion": "6.1",
                    "osImage": "Debian", "containerRuntimeVersion": "containerd://2.0", "kubeletVersion": "v1.33.1",
                    "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""}
            }
        }))
    }

    fn pairs(addrs: &[NodeAddress]) -> Vec<(String, String)> {
        addrs
            .iter()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect()
    }

    #[test]
    fn own_address_first_then_same_family_internal_ips() {
        let nodes = [
            leaf_node(
                "a",
                json!([
                    {"type": "InternalIP", "address": "fd00::1"},
                    {"type": "InternalIP", "address": "10.0.0.1"},
                    {"type": "Hostname", "address": "leaf-a"},
                    {"type": "ExternalIP", "address": "203.0.113.5"}
                ]),
                json!({}),
                true,
            ),
            leaf_node(
                "b",
                json!([
                    {"type": "InternalIP", "address": "10.0.0.2"},
                    {"type": "InternalIP", "address": "10.0.0.1"}
                ]),
                json!({}),
                true,
            ),
        ];
        let got = addresses("InternalDNS", "10.9.9.9".parse().unwrap(), &nodes);
        assert_eq!(
            pairs(&got),
            [
                ("InternalDNS", "10.9.9.9"),
                ("InternalIP", "10.0.0.1"),
                ("InternalIP", "10.0.0.2"),
                ("InternalIP", "fd00::1"),
                ("ExternalIP", "203.0.113.5"),
            ]
            .map(|(t, a)| (t.to_string(), a.to_string()))
        );
        // An IPv6 root orders IPv6 leaf addresses first.
        let got = addresses("InternalIP", "fd00::99".parse().unwrap(), &nodes);
        assert_eq!(got[0].address, "fd00::99");
        assert_eq!(got[1].address, "fd00::1");
        assert_eq!(got[2].address, "10.0.0.1");
    }

    #[test]
    fn no_duplicate_pairs_and_no_hijacking_types() {
        let nodes = [leaf_node(
            "a",
            json!([
                {"type": "InternalIP", "address": "10.9.9.9"},
                {"type": "InternalDNS", "address": "a.leaf.local"},
                {"type": "Hostname", "address": "a"}
            ]),
            json!({}),
            true,
        )];
        // Preferred InternalIP: our own InternalIP is first and the same pair from the leaf is
        // not repeated; Hostname and InternalDNS would beat InternalIP in the default order.
        let got = addresses("InternalIP", "10.9.9.9".parse().unwrap(), &nodes);
        assert_eq!(
            pairs(&got),
            [("InternalIP".to_string(), "10.9.9.9".to_string())]
        );
        // Preferred Hostname: nothing outranks it, everything else is kept.
        let got = addresses("Hostname", "10.9.9.9".parse().unwrap(), &nodes);
        assert_eq!(got.len(), 4);
        // A leaf without addresses still yields our own.
        let bare = [node(json!({"metadata": {"name": "x"}}))];
        assert_eq!(
            addresses("InternalDNS", "10.1.1.1".parse().unwrap(), &bare).len(),
            1
        );
    }

    fn pairs_of(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(t, a)| (t.to_string(), a.to_string()))
            .collect()
    }

    #[test]
    fn dual_stack_leaves_order_by_the_family_of_relaylets_own_ip() {
        let nodes = [
            leaf_node(
                "a",
                json!([
                    {"type": "InternalIP", "address": "10.0.0.1"},
                    {"type": "InternalIP", "address": "fd00::1"},
                    {"type": "ExternalIP", "address": "2001:db8::1"},
                    {"type": "ExternalIP", "address": "203.0.113.1"}
                ]),
                json!({}),
                true,
            ),
            leaf_node(
                "b",
                json!([
                    {"type": "InternalIP", "address": "fd00::2"},
                    {"type": "InternalIP", "address": "10.0.0.2"},
                    {"type": "ExternalIP", "address": "203.0.113.1"}
                ]),
                json!({}),
                true,
            ),
        ];
        // IPv4 pod IP: IPv4 InternalIPs of all nodes, then IPv6 ones, then the rest in leaf
        // order; the ExternalIP both nodes report appears once.
        let v4 = addresses("InternalDNS", "10.9.9.9".parse().unwrap(), &nodes);
        assert_eq!(
            pairs(&v4),
            pairs_of(&[
                ("InternalDNS", "10.9.9.9"),
                ("InternalIP", "10.0.0.1"),
                ("InternalIP", "10.0.0.2"),
                ("InternalIP", "fd00::1"),
                ("InternalIP", "fd00::2"),
                ("ExternalIP", "2001:db8::1"),
                ("ExternalIP", "203.0.113.1"),
            ])
        );
        // IPv6 pod IP in a dual-stack root: the IPv6 ones first.
        let v6 = addresses("InternalDNS", "fd00::99".parse().unwrap(), &nodes);
        assert_eq!(
            pairs(&v6),
            pairs_of(&[
                ("InternalDNS", "fd00::99"),
                ("InternalIP", "fd00::1"),
                ("InternalIP", "fd00::2"),
                ("InternalIP", "10.0.0.1"),
                ("InternalIP", "10.0.0.2"),
                ("ExternalIP", "2001:db8::1"),
                ("ExternalIP", "203.0.113.1"),
            ])
        );
        // The same address under another type is a different pair and is kept; under the
        // same type it is not repeated.
        let own_too = addresses("InternalIP", "fd00::2".parse().unwrap(), &nodes);
        assert_eq!(own_too[0].address, "fd00::2");
        assert_eq!(
            own_too
                .iter()
                .filter(|a| a.address == "fd00::2" && a.type_ == "InternalIP")
                .count(),
            1
        );
    }

    #[test]
    fn leaves_missing_address_types_still_yield_relaylets_address_first() {
        // No InternalIP at all: only names and external addresses.
        let nodes = [
            leaf_node(
                "a",
                json!([
                    {"type": "Hostname", "address": "leaf-a"},
                    {"type": "ExternalDNS", "address": "a.example.com"},
                    {"type": "ExternalIP", "address": "203.0.113.7"}
                ]),
                json!({}),
                true,
            ),
            // Status without addresses, and no status at all.
            node(json!({"metadata": {"name": "b"}, "status": {}})),
            node(json!({"metadata": {"name": "c"}})),
        ];
        let got = addresses("InternalDNS", "10.1.1.1".parse().unwrap(), &nodes);
        assert_eq!(
            pairs(&got),
            pairs_of(&[
                ("InternalDNS", "10.1.1.1"),
                ("ExternalDNS", "a.example.com"),
                ("ExternalIP", "203.0.113.7"),
            ])
        );
        // With the last type preferred, every other known type would win: only relaylet's
        // own address and leaf ExternalIPs remain.
        let got = addresses("ExternalIP", "10.1.1.1".parse().unwrap(), &nodes);
        assert_eq!(
            pairs(&got),
            pairs_of(&[("ExternalIP", "10.1.1.1"), ("ExternalIP", "203.0.113.7")])
        );
        // No leaf nodes at all.
        let got = addresses("InternalDNS", "fd00::5".parse().unwrap(), &[]);
        assert_eq!(pairs(&got), pairs_of(&[("InternalDNS", "fd00::5")]));
    }

    /// [`capacity`] of whole pods, reduced to what relaylet keeps of them.
    fn capacity_of_pods(
        nodes: &[Node],
        pods: &[Pod],
        own: &HashSet<PodKey>,
    ) -> BTreeMap<String, Quantity> {
        let kept: Vec<(PodKey, PodFacts)> = pods
            .iter()
            .map(|p| {
                let key = (
                    p.metadata.namespace.as_deref().unwrap_or_default().into(),
                    p.metadata.name.as_deref().unwrap_or_default().into(),
                );
                // As the watch reads it: through the JSON, into a SlimPod.
                let slim = serde_json::to_value(p)
                    .and_then(serde_json::from_value)
                    .expect("a pod reads as a SlimPod");
                (key, PodFacts::of(&slim))
            })
            .collect();
        capacity(nodes, kept.iter().map(|(k, f)| (k, f)), own)
    }

    #[test]
    fn capacity_handles_missing_partial_and_malformed_resources() {
        let mut cordoned = leaf_node("cordoned", json!([]), json!({"cpu": "32"}), true);
        cordoned.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        let nodes = [
            leaf_node(
                "gpu",
                json!([]),
                json!({"cpu": "8", "nvidia.com/gpu": "2", "pods": "1", "memory": "lots"}),
                true,
            ),
            leaf_node("plain", json!([]), json!({"cpu": "500m"}), true),
            node(json!({"metadata": {"name": "bare"}, "status": {
                "conditions": [{"type": "Ready", "status": "True"}]}})),
            cordoned,
        ];
        let pod = |name: &str, node: Option<&str>, requests: serde_json::Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": name},
                "spec": {"nodeName": node, "containers": [
                    {"name": "c", "resources": {"requests": requests}}
                ]},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        };
        let pods = [
            // Requests a resource the leaf does not offer, and more pods than fit.
            pod(
                "a",
                Some("gpu"),
                json!({"cpu": "1", "example.com/fpga": "1"}),
            ),
            pod("b", Some("gpu"), json!({"nvidia.com/gpu": "1"})),
            // Not bound yet, on an unknown node, on a cordoned node: not counted.
            pod("pending", None, json!({"cpu": "4"})),
            pod("elsewhere", Some("gone"), json!({"cpu": "4"})),
            pod("cordoned", Some("cordoned"), json!({"cpu": "4"})),
            // An unparsable request is ignored, not a panic.
            pod("odd", Some("plain"), json!({"cpu": "a lot"})),
        ];
        let cap = capacity_of_pods(&nodes, &pods, &HashSet::new());
        assert_eq!(cap["cpu"].0, "7500m");
        assert_eq!(cap["nvidia.com/gpu"].0, "1");
        // Three pods on a leaf with room for one: never below zero.
        assert_eq!(cap["pods"].0, "0");
        assert!(!cap.contains_key("memory"), "{cap:?}");
        assert!(!cap.contains_key("example.com/fpga"), "{cap:?}");
        // Nothing Ready: nothing offered.
        assert!(capacity_of_pods(&[], &pods, &HashSet::new()).is_empty());
    }

    #[test]
    fn capacity_sums_ready_nodes_and_subtracts_leaf_local_pods() {
        let nodes = [
            leaf_node(
                "a",
                json!([]),
                json!({"cpu": "4", "memory": "8Gi", "pods": "110"}),
                true,
            ),
            leaf_node(
                "b",
                json!([]),
                json!({"cpu": "3800m", "memory": "4Gi", "pods": "110"}),
                true,
            ),
            leaf_node(
                "c",
                json!([]),
                json!({"cpu": "64", "memory": "1Ti", "pods": "110"}),
                false,
            ),
        ];
        let pod = |ns: &str, name: &str, node: &str, cpu: &str, phase: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"namespace": ns, "name": name},
                "spec": {"nodeName": node, "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}
                ]},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        let pods = [
            pod("kube-system", "local", "a", "500m", "Running"),
            pod("default", "mirrored", "a", "1", "Running"),
            pod("default", "done", "b", "2", "Succeeded"),
            pod("default", "on-broken-node", "c", "2", "Running"),
        ];
        let own = HashSet::from([("default".into(), "mirrored".into())]);
        let cap = capacity_of_pods(&nodes, &pods, &own);
        assert_eq!(cap["cpu"].0, "7300m");
        assert_eq!(cap["memory"].0, (11u64 << 30).to_string());
        assert_eq!(cap["pods"].0, "219");
    }

    #[test]
    fn conditions_keep_transition_time_while_unchanged() {
        let t0 = Time("2026-11-21T10:00:00Z".parse().unwrap());
        let t1 = Time("2026-11-21T10:01:00Z".parse().unwrap());
        let first = conditions(&LeafHealth::Ready { ready_nodes: 2 }, &t0, &[]);
        assert_eq!(first[0].status, "True");
        let again = conditions(&LeafHealth::Ready { ready_nodes: 2 }, &t1, &first);
        assert_eq!(again[0].last_transition_time, Some(t0.clone()));
        assert_eq!(again[0].last_heartbeat_time, Some(t1.clone()));
        let down = conditions(
            &LeafHealth::Unreachable("connection refused".into()),
            &t1,
            &again,
        );
        assert_eq!(down[0].status, "False");
        assert_eq!(down[0].reason.as_deref(), Some("LeafUnreachable"));
        assert!(
            down[0]
                .message
                .as_deref()
                .unwrap()
                .contains("connection refused")
        );
        assert_eq!(down[0].last_transition_time, Some(t1));
        assert!(down[1..].iter().all(|c| c.status == "False"));
    }

    #[test]
    fn labels_and_info_come_from_the_leaf() {
        let nodes = [leaf_node("a", json!([]), json!({}), true)];
        let info = node_info(Some("v1.34.2"), &nodes);
        assert_eq!(info.kubelet_version, "v1.34.2");
        assert_eq!(info.architecture, "arm64");
        let with_hostname = labels(
            "relaylet-leaf-1",
            "leaf-1",
            "Hostname",
            &info,
            &BTreeMap::new(),
        );
        assert_eq!(with_hostname["kubernetes.io/hostname"], "relaylet-leaf-1");
        let l = labels(
            "relaylet-leaf-1",
            "leaf-1",
            "InternalDNS",
            &info,
            &BTreeMap::from([("zone".into(), "a".into())]),
        );
        assert_eq!(l["type"], "virtual-kubelet");
        assert_eq!(l["relaylet.io/leaf-cluster"], "leaf-1");
        assert_eq!(l["kubernetes.io/arch"], "arm64");
        assert_eq!(l["zone"], "a");
        assert!(!l.contains_key("kubernetes.io/hostname"));
    }

    #[test]
    fn websockets_are_declared_for_leaves_that_take_them() {
        let declared = |enabled, version| declared_features(enabled, version);
        let on = vec![EXTEND_WEBSOCKETS_TO_KUBELET.to_string()];
        assert_eq!(declared(true, Some("v1.31.0")), on);
        assert_eq!(declared(true, Some("v1.37.2")), on);
        assert_eq!(declared(true, Some("v1.35.4-gke.1200")), on);
        assert_eq!(declared(true, Some("v1.33.1+k3s1")), on);
        assert!(declared(true, Some("v1.30.14")).is_empty());
        assert!(declared(true, Some("v1.9.0")).is_empty());
        assert!(declared(true, Some("garbage")).is_empty());
        assert!(declared(true, None).is_empty());
        assert!(declared(false, Some("v1.37.2")).is_empty());
    }
}

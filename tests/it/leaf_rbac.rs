//! The leaf-side RBAC relaylet ships (`deploy/leaf-rbac.yaml`) is sufficient and minimal: the
//! sandbox's leaves enforce exactly its ClusterRole (so every other end-to-end test proves it
//! sufficient: relaylet runs the sandbox's pods with it), and removing any relay rule makes the
//! matching kubectl call fail with the leaf's clear 403, passed through relaylet unchanged. The
//! exec-only variant (`deploy/leaf-rbac-exec-only.yaml`, for another syncer) grants the relay
//! alone. The namespaced variant (`deploy/leaf-rbac-namespaced.yaml`) grants the same calls but
//! namespaces, with the streams and the pod writes split off into a role that only
//! RoleBindings name; `tests/real/k8s_leaf_policy.rs` proves it on a real leaf
//! apiserver (streams in a bound namespace work, elsewhere the leaf's 403).

use relaylet_dev::testkit as support;

use std::time::Duration;

use k8s_openapi::api::rbac::v1::PolicyRule;
use relaylet_dev::sandbox::{RELAYLET_LEAF_USER, Sandbox, Settings, leaf_rbac_rules};
use support::{RT, Run, describe, text};

/// Starts a sandbox whose leaves lack the rule granting `resource`.
fn sandbox_without(resource: &str) -> (Sandbox, std::path::PathBuf) {
    let rules: Vec<PolicyRule> = leaf_rbac_rules()
        .unwrap()
        .into_iter()
        .filter(|r| {
            !r.resources
                .as_ref()
                .is_some_and(|rs| rs.iter().any(|x| x == resource))
        })
        .collect();
    assert!(
        rules.len() < leaf_rbac_rules().unwrap().len(),
        "{resource} is granted by the manifest"
    );
    RT.block_on(async {
        let sandbox = Sandbox::start(Settings {
            leaf_rules: Some(rules),
            ..Settings::default()
        })
        .await
        .expect("sandbox starts");
        let kubeconfig = sandbox.files().join("kubeconfig");
        sandbox.write_kubeconfig(&kubeconfig).unwrap();
        (sandbox, kubeconfig)
    })
}

#[test]
fn the_manifest_grants_exactly_what_relaylet_uses() {
    let rules = leaf_rbac_rules().unwrap();
    let mut grants: Vec<String> = rules
        .iter()
        .flat_map(|r| {
            let group = r.api_groups.clone().unwrap_or_default().join(",");
            r.resources
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(move |res| {
                    let mut verbs = r.verbs.clone();
                    verbs.sort();
                    format!("{group}/{res}:{}", verbs.join(","))
                })
        })
        .collect();
    grants.sort();
    assert_eq!(
        grants,
        [
            // Running the root pods' copies: their namespaces and service accounts made when
            // missing, the pods created, updated and deleted, kubectl debug's containers added,
            // the ConfigMaps and Secrets they name copied beside them and cleaned up.
            "/configmaps:create,delete,get,list,patch",
            "/events:list,watch",
            "/namespaces:create,get",
            "/nodes:get,list,watch",
            "/pods/attach:create,get",
            "/pods/ephemeralcontainers:patch",
            "/pods/exec:create,get",
            "/pods/log:get",
            "/pods/portforward:create,get",
            "/pods:create,delete,get,list,patch,watch",
            "/secrets:create,delete,get,list,patch",
            "/serviceaccounts:create,get",
            "metrics.k8s.io/pods:get,list",
        ]
    );
    // With another syncer (LEAF_POD_SYNC=false): the relay's reads and streams, no writes.
    let exec_only = std::fs::read_to_string(
        relaylet_dev::workspace_root().join("deploy/leaf-rbac-exec-only.yaml"),
    )
    .unwrap();
    assert_eq!(
        grants_of(&cluster_role_rules(&exec_only)),
        [
            "/nodes:get,list,watch",
            "/pods/attach:create,get",
            "/pods/exec:create,get",
            "/pods/log:get",
            "/pods/portforward:create,get",
            "/pods:get,list,watch",
            "metrics.k8s.io/pods:get,list",
        ]
    );
}

/// The rules of the ClusterRoles in manifest `text`.
fn cluster_role_rules(text: &str) -> Vec<PolicyRule> {
    let mut rules = Vec::new();
    for document in text.split("\n---\n") {
        let value: serde_json::Value = serde_saphyr::from_str(document).unwrap();
        if value["kind"].as_str() == Some("ClusterRole") {
            let role: k8s_openapi::api::rbac::v1::ClusterRole =
                serde_json::from_value(value).unwrap();
            rules.extend(role.rules.unwrap_or_default());
        }
    }
    rules
}

/// Each resource's verbs, whichever rules grant them.
fn verbs_by_resource(
    rules: &[PolicyRule],
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut out: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for r in rules {
        let group = r.api_groups.clone().unwrap_or_default().join(",");
        for res in r.resources.clone().unwrap_or_default() {
            out.entry(format!("{group}/{res}"))
                .or_default()
                .extend(r.verbs.iter().cloned());
        }
    }
    out
}

#[test]
fn without_pods_exec_kubectl_exec_gets_the_leafs_403() {
    let (sandbox, kubeconfig) = sandbox_without("pods/exec");
    let k = relaylet_sim::tools::kubectl("1.35").unwrap();
    for spdy in [false, true] {
        let mut run = Run::new(&k, &kubeconfig, &["exec", "demo-1", "--", "true"]);
        run.timeout = Duration::from_secs(30);
        let out = if spdy { run.spdy_only() } else { run }.output();
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{}", describe(&k, &out));
        assert!(
            err.contains(RELAYLET_LEAF_USER)
                && err.contains("pods/exec")
                && err.contains("forbidden"),
            "spdy={spdy}: {}",
            describe(&k, &out)
        );
    }
    // Logs still work: only the one rule is missing.
    let out = Run::new(&k, &kubeconfig, &["logs", "--tail=1", "demo-1"]).output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    drop(sandbox);
}

#[test]
fn without_pods_log_kubectl_logs_gets_the_leafs_403() {
    let (sandbox, kubeconfig) = sandbox_without("pods/log");
    let k = relaylet_sim::tools::kubectl("1.35").unwrap();
    let out = Run::new(&k, &kubeconfig, &["logs", "demo-2"]).output();
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        err.contains(RELAYLET_LEAF_USER) && err.contains("pods/log"),
        "{}",
        describe(&k, &out)
    );
    let out = Run::new(&k, &kubeconfig, &["exec", "demo-2", "--", "true"]).output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    drop(sandbox);
}

/// A grant as `group/resource:verbs`, verbs sorted.
fn grants_of(rules: &[PolicyRule]) -> Vec<String> {
    let mut grants: Vec<String> = rules
        .iter()
        .flat_map(|r| {
            let group = r.api_groups.clone().unwrap_or_default().join(",");
            r.resources
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(move |res| {
                    let mut verbs = r.verbs.clone();
                    verbs.sort();
                    format!("{group}/{res}:{}", verbs.join(","))
                })
        })
        .collect();
    grants.sort();
    grants
}

#[test]
fn the_namespaced_manifest_grants_the_same_calls_with_streams_only_per_namespace() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let text = std::fs::read_to_string(
        relaylet_dev::workspace_root().join("deploy/leaf-rbac-namespaced.yaml"),
    )
    .unwrap();
    let mut roles = Vec::new();
    let mut bindings = Vec::new();
    for document in text.split("\n---\n") {
        let value: serde_json::Value = serde_saphyr::from_str(document).unwrap();
        match value["kind"].as_str() {
            Some("ClusterRole") => {
                roles.push(serde_json::from_value::<ClusterRole>(value).unwrap())
            }
            Some("ClusterRoleBinding") => {
                bindings.push(serde_json::from_value::<ClusterRoleBinding>(value).unwrap())
            }
            // relaylet's own token renewal, in its own namespace (tests/it/chart.rs checks it
            // in the other manifests): the one Role of the file.
            Some("Role" | "RoleBinding")
                if value["metadata"]["name"] == "relaylet-leaf-token"
                    && value["metadata"]["namespace"] == "relaylet" => {}
            Some("Role" | "RoleBinding") => {
                panic!("namespaces are the administrator's: {document}")
            }
            _ => {}
        }
    }
    let role = |name: &str| {
        roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .and_then(|r| r.rules.clone())
            .unwrap_or_else(|| panic!("ClusterRole {name}"))
    };
    // Together, what the cluster-wide manifest grants but namespaces (the administrator makes
    // them): nothing else lost, nothing added.
    let mut all = role("relaylet-leaf-read");
    all.extend(role("relaylet-leaf-streams"));
    let mut cluster_wide = verbs_by_resource(&leaf_rbac_rules().unwrap());
    cluster_wide.remove("/namespaces");
    assert_eq!(verbs_by_resource(&all), cluster_wide);
    assert_eq!(roles.len(), 2);
    // Cluster-wide: the reads only; the streams role is left to per-namespace RoleBindings.
    assert_eq!(
        grants_of(&role("relaylet-leaf-read")),
        [
            "/events:list,watch",
            "/nodes:get,list,watch",
            "/pods:get,list,watch",
            "metrics.k8s.io/pods:get,list",
        ]
    );
    assert_eq!(
        grants_of(&role("relaylet-leaf-streams")),
        [
            "/configmaps:create,delete,get,list,patch",
            "/pods/attach:create,get",
            "/pods/ephemeralcontainers:patch",
            "/pods/exec:create,get",
            "/pods/log:get",
            "/pods/portforward:create,get",
            "/pods:create,delete,patch",
            "/secrets:create,delete,get,list,patch",
            "/serviceaccounts:create,get",
        ]
    );
    let bound: Vec<&str> = bindings.iter().map(|b| b.role_ref.name.as_str()).collect();
    assert_eq!(bound, ["relaylet-leaf-read"]);
    let subject = &bindings[0].subjects.as_ref().unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", "relaylet-leaf", Some("relaylet"))
    );
    // The instructions at the top name the role and the ServiceAccount the RoleBindings need.
    assert!(
        text.contains(
            "--clusterrole=relaylet-leaf-streams --serviceaccount=relaylet:relaylet-leaf"
        )
    );
}

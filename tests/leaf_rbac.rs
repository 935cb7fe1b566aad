//! The leaf-side RBAC relaylet ships (`deploy/leaf-rbac.yaml`) is sufficient and minimal: the
//! sandbox's leaves enforce exactly its ClusterRole (so every other end-to-end test proves it
//! sufficient), and removing any relay rule makes the matching kubectl call fail with the leaf's
//! clear 403, passed through relaylet unchanged.

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

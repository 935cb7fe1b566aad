//! The threat: a root user who may create pods and exec in their own namespace uses relaylet's
//! leaf credentials (which may exec into every leaf pod) to reach a leaf pod that is not their
//! pod's counterpart. Every way tried here (annotations naming another leaf pod, same-name pods
//! in other leaf namespaces, pods created straight in the leaf, renamed pods, a stale leaf copy
//! of a deleted root pod, a namespace the administrator did not map) is refused before any byte
//! reaches the leaf pod, with real kubectl through the root apiserver; the legitimate
//! counterpart still works.
//!
//! Each leaf pod prints who it is (`WHO=<namespace>/<name>`), so a test sees which pod a command
//! really ran in.

use relaylet_dev::testkit as support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use relaylet_dev::sandbox::Settings;
use relaylet_sim::apiserver::Rule;
use relaylet_sim::cluster::{SimContainer, SimPod};
use support::{Env, RT, Run, describe, text, wait_until};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

const ATTACKER: &str = "mallory";
const TEAM: &str = "team-a";

fn settings() -> Settings {
    Settings {
        root_rules: vec![
            // Create, annotate and exec into pods of their own namespace: nothing more.
            Rule::user(ATTACKER)
                .verbs(&[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ])
                .api_groups(&[""])
                .resources(&[
                    "pods",
                    "pods/exec",
                    "pods/attach",
                    "pods/log",
                    "pods/portforward",
                ])
                .namespaces(&[TEAM]),
        ],
        // The proof holds whoever syncs: here the test plays the syncer (`sandbox::sync_pod`),
        // so it decides which leaf pods exist.
        env: BTreeMap::from([("LEAF_POD_SYNC".to_string(), "false".to_string())]),
        ..Settings::default()
    }
}

fn env() -> &'static Env {
    support::env(settings)
}

/// The attacker's kubeconfig (a client certificate for `mallory`, no groups).
fn attacker_kubeconfig(e: &Env) -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let path = e.sandbox.files().join("mallory.kubeconfig");
        let yaml = e
            .sandbox
            .root
            .kubeconfig(ATTACKER, &[])
            .expect("attacker kubeconfig");
        std::fs::write(&path, yaml).expect("kubeconfig written");
        path
    })
    .clone()
}

/// A pod whose container prints `WHO=<namespace>/<name>` on `echo $WHO`.
fn pod(namespace: &str, name: &str) -> SimPod {
    SimPod {
        namespace: namespace.into(),
        name: name.into(),
        containers: vec![SimContainer {
            name: "main".into(),
            command: vec!["sleep".into(), "600".into()],
            env: vec![("WHO".into(), format!("{namespace}/{name}"))],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Creates the namespaces in the root and in `leaf` (idempotent).
async fn namespaces(e: &Env, leaf: &str, names: &[&str]) {
    let clients = [
        support_client(&e.sandbox.root).await,
        support_client(&e.sandbox.leaves[leaf]).await,
    ];
    for client in clients {
        let api: Api<Namespace> = Api::all(client);
        for name in names {
            let ns: Namespace = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name}
            }))
            .unwrap();
            match api.create(&PostParams::default(), &ns).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(err) => panic!("creating namespace {name}: {err}"),
            }
        }
    }
}

async fn support_client(cluster: &relaylet_sim::cluster::Cluster) -> kube::Client {
    relaylet_dev::sandbox::kube_client(&cluster.admin_kubeconfig().unwrap())
        .await
        .unwrap()
}

/// The attacker creates root pod `name` in their namespace on `node`, with `annotations`.
fn attacker_creates(e: &Env, name: &str, node: &str, annotations: &[(&str, &str)]) {
    let annotations: BTreeMap<_, _> = annotations.iter().cloned().collect();
    let manifest = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox"}],
        },
    });
    let k = support::kubectl("1.33");
    let kubeconfig = attacker_kubeconfig(e);
    let out = Run::new(&k, &kubeconfig, &["create", "-f", "-"])
        .stdin(manifest.to_string().as_bytes())
        .output();
    assert!(out.status.success(), "{}", describe(&k, &out));
}

/// Runs `kubectl exec <pod> -- sh -c 'echo WHO=$WHO'` as the attacker.
fn attacker_execs(e: &Env, version: &str, pod: &str) -> (bool, String, String) {
    let k = support::kubectl(version);
    let kubeconfig = attacker_kubeconfig(e);
    let mut run = Run::new(
        &k,
        &kubeconfig,
        &["exec", "-n", TEAM, pod, "--", "sh", "-c", "echo WHO=$WHO"],
    );
    run.timeout = Duration::from_secs(60);
    let out = run.output();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Runs `kubectl logs <pod>` as the attacker.
fn attacker_reads_logs(e: &Env, pod: &str) -> (bool, String, String) {
    let k = support::kubectl("1.35");
    let kubeconfig = attacker_kubeconfig(e);
    let out = Run::new(&k, &kubeconfig, &["logs", "-n", TEAM, pod]).output();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Why relaylet refuses the attacker's calls to root pod `team-a/<pod>` on leaf-1.
enum Refusal<'a> {
    /// 404: no leaf pod of that name in the leaf namespace.
    Missing,
    /// 403: a leaf pod of that name that is not the root pod's counterpart, and why.
    NotCounterpart(&'a str),
}

/// Asserts the attacker's exec (with SPDY-only kubectl 1.27 and WebSocket kubectl 1.35) and
/// logs of root pod `pod` are refused with exactly relaylet's message, as each kubectl prints
/// it, and nothing ran. The root apiserver passes a kubelet's 403 message on for logs, but
/// answers a 404 with its own generic text (upstream `NewGenericServerResponse`).
fn assert_refused(e: &Env, pod: &str, refusal: Refusal<'_>) {
    let (reason, message) = match refusal {
        Refusal::Missing => (
            "NotFound",
            format!(
                "pod {TEAM}/{pod} has no counterpart in leaf cluster leaf-1: no pod {TEAM}/{pod} there"
            ),
        ),
        Refusal::NotCounterpart(why) => (
            "Forbidden",
            format!(
                "pod {TEAM}/{pod} in leaf cluster leaf-1 is not the counterpart of root pod {TEAM}/{pod}: {why}"
            ),
        ),
    };
    for version in ["1.27", "1.35"] {
        let (ok, stdout, stderr) = attacker_execs(e, version, pod);
        assert!(
            !ok && !stdout.contains("WHO="),
            "kubectl {version} exec {pod} must be refused: stdout {stdout:?} stderr {stderr:?}"
        );
        // Both read the Status of the refused upgrade: 1.27's SPDY upgrade and, since relaylet
        // declares ExtendWebSocketsToKubelet, 1.35's WebSocket upgrade, which the root then
        // proxies to relaylet instead of translating (a translated one shows the message alone).
        let expected = format!("Error from server ({reason}): {message}\n");
        assert_eq!(stderr, expected, "kubectl {version} exec {pod}");
    }
    let (ok, stdout, stderr) = attacker_reads_logs(e, pod);
    let logs_expected = match reason {
        "Forbidden" => format!("Error from server (Forbidden): {message} ( pods/log {pod})\n"),
        _ => format!(
            "Error from server (NotFound): the server could not find the requested resource ( pods/log {pod})\n"
        ),
    };
    assert!(!ok && stdout.is_empty(), "kubectl logs {pod}: {stdout:?}");
    assert_eq!(stderr, logs_expected, "kubectl logs {pod}");
}

#[test]
fn the_attackers_own_synced_pod_works() {
    let e = env();
    RT.block_on(async {
        namespaces(e, "leaf-1", &[TEAM]).await;
        e.sandbox
            .add_pod("leaf-1", &pod(TEAM, "mine"))
            .await
            .unwrap();
    });
    for version in ["1.27", "1.35"] {
        let (ok, stdout, stderr) = attacker_execs(e, version, "mine");
        assert!(ok, "kubectl {version}: {stderr}");
        assert_eq!(stdout.trim(), format!("WHO={TEAM}/mine"), "{stderr}");
    }
}

#[test]
fn annotations_naming_another_leaf_pod_are_ignored() {
    let e = env();
    RT.block_on(async {
        namespaces(e, "leaf-1", &[TEAM, "kube-system"]).await;
        // The target: a leaf pod in the leaf's kube-system, which no root user may reach.
        e.sandbox.leaves["leaf-1"]
            .add_pod("leaf-1-node", &pod("kube-system", "secret-pod"))
            .await
            .unwrap();
    });
    attacker_creates(
        e,
        "evil",
        "relaylet-leaf-1",
        &[
            ("relaylet.io/leaf-namespace", "kube-system"),
            ("relaylet.io/leaf-pod", "secret-pod"),
        ],
    );
    assert_refused(e, "evil", Refusal::Missing);
}

#[test]
fn annotating_an_existing_pod_changes_nothing() {
    let e = env();
    RT.block_on(async {
        namespaces(e, "leaf-1", &[TEAM]).await;
        e.sandbox
            .add_pod("leaf-1", &pod(TEAM, "annotated"))
            .await
            .unwrap();
        e.sandbox.leaves["leaf-1"]
            .add_pod("leaf-1-node", &pod("default", "victim"))
            .await
            .unwrap();
    });
    let k = support::kubectl("1.33");
    let kubeconfig = attacker_kubeconfig(e);
    let out = Run::new(
        &k,
        &kubeconfig,
        &[
            "annotate",
            "-n",
            TEAM,
            "pod/annotated",
            "relaylet.io/leaf-namespace=default",
            "relaylet.io/leaf-pod=victim",
        ],
    )
    .output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    // Still the pod's own counterpart, not the annotated one.
    let (ok, stdout, stderr) = attacker_execs(e, "1.27", "annotated");
    assert!(ok, "{stderr}");
    assert_eq!(stdout.trim(), format!("WHO={TEAM}/annotated"));
}

#[test]
fn a_same_name_pod_in_another_leaf_namespace_is_out_of_reach() {
    let e = env();
    RT.block_on(async {
        namespaces(e, "leaf-1", &[TEAM, "team-b"]).await;
        // team-b's legitimately synced pod.
        e.sandbox
            .add_pod("leaf-1", &pod("team-b", "shared"))
            .await
            .unwrap();
    });
    attacker_creates(
        e,
        "shared",
        "relaylet-leaf-1",
        &[("relaylet.io/leaf-namespace", "team-b")],
    );
    assert_refused(e, "shared", Refusal::Missing);
}

#[test]
fn a_pod_created_straight_in_the_leaf_is_no_ones_counterpart() {
    let e = env();
    RT.block_on(async {
        namespaces(e, "leaf-1", &[TEAM]).await;
        e.sandbox.leaves["leaf-1"]
            .add_pod("leaf-1-node", &pod(TEAM, "direct"))
            .await
            .unwrap();
    });
    attacker_creates(e, "direct", "relaylet-leaf-1", &[]);
    assert_refused(
        e,
        "direct",
        Refusal::NotCounterpart("it carries no relaylet.io/root-pod-uid marker"),
    );
}

#[test]
fn a_renamed_pod_reaches_only_its_own_name() {
    let e = env();
    RT.block_on(async {
        namespaces(e, "leaf-1", &[TEAM]).await;
        e.sandbox
            .add_pod("leaf-1", &pod(TEAM, "colleague"))
            .await
            .unwrap();
    });
    attacker_creates(
        e,
        "copycat",
        "relaylet-leaf-1",
        &[("relaylet.io/leaf-pod", "colleague")],
    );
    assert_refused(e, "copycat", Refusal::Missing);
}

#[test]
fn a_stale_leaf_copy_is_not_the_counterpart_of_a_new_pod_of_the_same_name() {
    let e = env();
    let (pods, old_uid) = RT.block_on(async {
        namespaces(e, "leaf-1", &[TEAM]).await;
        e.sandbox
            .add_pod("leaf-1", &pod(TEAM, "old"))
            .await
            .unwrap();
        // The root pod goes; its leaf copy stays behind (a syncer that lags or failed).
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(support_client(&e.sandbox.root).await, TEAM);
        let old_uid = pods
            .get("old")
            .await
            .expect("the root pod")
            .metadata
            .uid
            .expect("its UID");
        pods.delete("old", &DeleteParams::default().grace_period(0))
            .await
            .expect("delete the root pod");
        (pods, old_uid)
    });
    wait_until("the root pod is deleted", HANG, || {
        RT.block_on(pods.get_opt("old"))
            .expect("get the root pod")
            .is_none()
    });
    attacker_creates(e, "old", "relaylet-leaf-1", &[]);
    assert_refused(
        e,
        "old",
        Refusal::NotCounterpart(&format!(
            "its relaylet.io/root-pod-uid marker names another root pod ({old_uid})"
        )),
    );
}

#[test]
fn a_namespace_map_is_the_administrators_and_unmapped_namespaces_are_refused() {
    let e = env();
    RT.block_on(async {
        namespaces(e, "leaf-2", &[TEAM, "tenant-a"]).await;
        // The administrator maps team-a to tenant-a in leaf-2's Secret.
        let secrets: Api<Secret> = Api::namespaced(
            support_client(&e.sandbox.root).await,
            relaylet_dev::sandbox::RELAYLET_NAMESPACE,
        );
        let patch = serde_json::json!({"metadata": {"annotations": {
            "relaylet.io/namespace-map": "team-a=tenant-a"
        }}});
        secrets
            .patch(
                "leaf-leaf-2",
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
        // A syncer honouring the map: the root pod in team-a, its copy in tenant-a.
        let root_pod = e
            .sandbox
            .root
            .add_pod("relaylet-leaf-2", &pod(TEAM, "mapped"))
            .await
            .unwrap();
        let mut copy = pod("tenant-a", "mapped");
        copy.annotations.insert(
            "relaylet.io/root-pod-uid".into(),
            root_pod.metadata.uid.unwrap(),
        );
        e.sandbox.leaves["leaf-2"]
            .add_pod("leaf-2-node", &copy)
            .await
            .unwrap();
        // An unmapped root namespace's pod, with a same-name pod in the leaf.
        namespaces(e, "leaf-2", &["team-c"]).await;
        e.sandbox
            .add_pod("leaf-2", &pod("team-c", "unmapped"))
            .await
            .unwrap();
    });
    // The Secret is watched: wait until the map is in force.
    let mut last = (false, String::new(), String::new());
    wait_until("the mapped pod becomes reachable", HANG, || {
        last = attacker_execs(e, "1.35", "mapped");
        last.0
    });
    assert_eq!(last.1.trim(), "WHO=tenant-a/mapped", "{}", last.2);

    let admin = &e.kubeconfig;
    let k = support::kubectl("1.27");
    let out = Run::new(
        &k,
        admin,
        &[
            "exec",
            "-n",
            "team-c",
            "unmapped",
            "--",
            "sh",
            "-c",
            "echo WHO=$WHO",
        ],
    )
    .output();
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && !text(&out.stdout).contains("WHO="),
        "{}",
        describe(&k, &out)
    );
    assert_eq!(
        stderr,
        "Error from server (NotFound): pod team-c/unmapped: namespace team-c is not mapped to leaf cluster leaf-2 (its Secret's relaylet.io/namespace-map)\n"
    );
}

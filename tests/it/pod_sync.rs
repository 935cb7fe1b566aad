//! Pods that run, through the sandbox as a user meets them: a pod created in the root on a
//! virtual node runs in its leaf (its copy made by relaylet, marked as relaylet's), its status
//! comes up, and `kubectl exec` and `logs` reach it; deleting it stops the copy with its grace
//! period before the root pod goes; a copy deleted in the leaf fails its root pod, which is
//! never run again; host access is refused; restarts, completion and pods relaylet does not
//! run say so in the root; a status written over by someone else is restored.

use relaylet_dev::testkit as support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use relaylet_dev::sandbox::Settings;
use serde_json::json;
use support::{Env, RT, Run, describe, env, text};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);
const NODE: &str = "relaylet-leaf-1";

fn sandbox() -> &'static Env {
    env(Settings::default)
}

async fn root_pods(e: &Env) -> Api<Pod> {
    Api::namespaced(e.root_client().await, "default")
}

async fn leaf_pods(e: &Env) -> Api<Pod> {
    let kubeconfig = e.sandbox.leaves["leaf-1"].admin_kubeconfig().unwrap();
    let client = relaylet_dev::sandbox::kube_client(&kubeconfig)
        .await
        .unwrap();
    Api::namespaced(client, "default")
}

/// A root pod `name` on the virtual node of leaf-1, its one container running `script`.
fn pod(name: &str, script: &str, spec: serde_json::Value) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 10,
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script]}]
        }
    });
    for (k, v) in spec.as_object().unwrap() {
        pod["spec"][k] = v.clone();
    }
    serde_json::from_value(pod).unwrap()
}

/// Polls `get` until `done` holds for what it returns; `what` names the wait.
async fn until<T: std::fmt::Debug>(
    what: &str,
    mut get: impl AsyncFnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let got = get().await;
        if done(&got) {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {HANG:?}; last {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn phase(p: &Option<Pod>) -> Option<&str> {
    p.as_ref()?.status.as_ref()?.phase.as_deref()
}

fn reason(p: &Option<Pod>) -> Option<&str> {
    p.as_ref()?.status.as_ref()?.reason.as_deref()
}

fn ready(p: &Option<Pod>) -> bool {
    p.as_ref()
        .and_then(|p| p.status.as_ref()?.conditions.clone())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[test]
fn a_pod_created_in_the_root_runs_in_its_leaf_and_kubectl_reaches_it() {
    let e = sandbox();
    RT.block_on(async {
        let roots = root_pods(e).await;
        let created = roots
            .create(
                &PostParams::default(),
                &pod(
                    "runs",
                    "echo started; while true; do sleep 1; done",
                    json!({}),
                ),
            )
            .await
            .unwrap();
        let uid = created.metadata.uid.unwrap();
        let running = until(
            "the root pod Running and Ready",
            async || roots.get_opt("runs").await.unwrap(),
            |p| phase(p) == Some("Running") && ready(p),
        )
        .await
        .unwrap();
        let status = running.status.unwrap();
        assert_eq!(
            status.host_ip.as_deref(),
            Some("127.0.0.1"),
            "the virtual node's address"
        );
        assert!(status.pod_ip.is_some(), "the leaf pod's IP");
        assert!(status.start_time.is_some());
        // The copy in the leaf: same name and namespace, marked as relaylet's and as this pod's.
        let copy = leaf_pods(e).await.get("runs").await.unwrap();
        let labels = copy.metadata.labels.unwrap();
        assert_eq!(labels["relaylet.io/owner"], "relaylet");
        assert_eq!(labels["relaylet.io/node"], NODE);
        assert_eq!(labels["app"], "runs", "the pod's own labels are kept");
        assert_eq!(
            copy.metadata.annotations.unwrap()["relaylet.io/root-pod-uid"],
            uid
        );
        assert_eq!(
            copy.spec.unwrap().node_name.as_deref(),
            Some("leaf-1-node"),
            "scheduled in the leaf, not on the virtual node"
        );
    });
    // kubectl reaches it through the root apiserver and relaylet.
    let k = support::kubectl("1.35");
    let out = Run::new(
        &k,
        &e.kubeconfig,
        &["exec", "runs", "--", "echo", "hello from the leaf"],
    )
    .output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(text(&out.stdout), "hello from the leaf\n");
    let out = Run::new(&k, &e.kubeconfig, &["logs", "runs"]).output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert!(
        text(&out.stdout).starts_with("started"),
        "{}",
        describe(&k, &out)
    );
}

#[test]
fn kubectl_delete_stops_the_copy_in_its_grace_period_then_removes_the_root_pod() {
    let e = sandbox();
    let marker = std::env::temp_dir().join(format!("relaylet-term-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let script = format!(
        "trap 'echo terminated > {}; exit 0' TERM; while true; do sleep 0.1; done",
        marker.display()
    );
    RT.block_on(async {
        let roots = root_pods(e).await;
        roots
            .create(&PostParams::default(), &pod("stops", &script, json!({})))
            .await
            .unwrap();
        until(
            "the root pod Running",
            async || roots.get_opt("stops").await.unwrap(),
            |p| phase(p) == Some("Running"),
        )
        .await;
    });
    let k = support::kubectl("1.35");
    let mut run = Run::new(
        &k,
        &e.kubeconfig,
        &["delete", "pod", "stops", "--wait=true"],
    );
    run.timeout = HANG;
    let out = run.output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "terminated\n",
        "the container got SIGTERM and handled it within its grace"
    );
    RT.block_on(async {
        assert!(root_pods(e).await.get_opt("stops").await.unwrap().is_none());
        assert!(
            leaf_pods(e).await.get_opt("stops").await.unwrap().is_none(),
            "the root pod went only after its copy"
        );
    });
    let _ = std::fs::remove_file(&marker);
}

#[test]
fn a_copy_deleted_in_the_leaf_fails_its_root_pod_which_is_not_run_again() {
    let e = sandbox();
    RT.block_on(async {
        let roots = root_pods(e).await;
        let leaves = leaf_pods(e).await;
        roots
            .create(&PostParams::default(), &pod("lost", "sleep 600", json!({})))
            .await
            .unwrap();
        until(
            "the root pod Running",
            async || roots.get_opt("lost").await.unwrap(),
            |p| phase(p) == Some("Running"),
        )
        .await;
        leaves
            .delete("lost", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        let failed = until(
            "the root pod Failed",
            async || roots.get_opt("lost").await.unwrap(),
            |p| phase(p) == Some("Failed"),
        )
        .await;
        assert_eq!(reason(&failed), Some("LeafPodGone"), "{failed:?}");
        // Never made again: its controller replaces it.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(leaves.get_opt("lost").await.unwrap().is_none());
        roots
            .delete("lost", &DeleteParams::default())
            .await
            .unwrap();
    });
}

#[test]
fn host_access_is_refused_with_a_reason() {
    let e = sandbox();
    RT.block_on(async {
        let roots = root_pods(e).await;
        roots
            .create(
                &PostParams::default(),
                &pod("hostnet", "sleep 600", json!({"hostNetwork": true})),
            )
            .await
            .unwrap();
        let refused = until(
            "the root pod Failed",
            async || roots.get_opt("hostnet").await.unwrap(),
            |p| phase(p) == Some("Failed"),
        )
        .await;
        assert_eq!(reason(&refused), Some("HostAccessNotAllowed"));
        let message = refused.unwrap().status.unwrap().message.unwrap();
        assert!(message.contains("hostNetwork"), "{message}");
        assert!(
            leaf_pods(e)
                .await
                .get_opt("hostnet")
                .await
                .unwrap()
                .is_none()
        );
    });
}

#[test]
fn restarts_completion_and_pods_relaylet_does_not_run_show_in_the_root() {
    let e = sandbox();
    RT.block_on(async {
        let roots = root_pods(e).await;
        let leaves = leaf_pods(e).await;
        roots
            .create(&PostParams::default(), &pod("crashes", "sleep 0.2; exit 3", json!({})))
            .await
            .unwrap();
        roots
            .create(
                &PostParams::default(),
                &pod("job", "echo done", json!({"restartPolicy": "Never"})),
            )
            .await
            .unwrap();
        let mut ds = pod("agent", "sleep 600", json!({}));
        ds.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                "name": "agent", "uid": "6a1c0000-0000-0000-0000-000000000001", "controller": true}))
            .unwrap(),
        ]);
        roots.create(&PostParams::default(), &ds).await.unwrap();
        let restarts = |p: &Option<Pod>| {
            p.as_ref()
                .and_then(|p| p.status.as_ref()?.container_statuses.clone())
                .and_then(|s| s.first().map(|c| c.restart_count))
                .unwrap_or(0)
        };
        until(
            "the crashing container's restarts counted in the root",
            async || roots.get_opt("crashes").await.unwrap(),
            |p| restarts(p) >= 2,
        )
        .await;
        until(
            "the finished pod Succeeded",
            async || roots.get_opt("job").await.unwrap(),
            |p| phase(p) == Some("Succeeded"),
        )
        .await;
        let not_run = until(
            "the DaemonSet's pod saying why it does not run",
            async || roots.get_opt("agent").await.unwrap(),
            |p| reason(p).is_some(),
        )
        .await;
        assert_eq!(reason(&not_run), Some("DaemonSetPodNotRun"));
        assert_eq!(phase(&not_run), Some("Pending"));
        assert!(leaves.get_opt("agent").await.unwrap().is_none());
        // A finished pod keeps its copy until it is deleted, then both go.
        assert!(leaves.get_opt("job").await.unwrap().is_some());
        roots.delete("job", &DeleteParams::default()).await.unwrap();
        until(
            "the finished pod and its copy gone",
            async || (roots.get_opt("job").await.unwrap(), leaves.get_opt("job").await.unwrap()),
            |(r, l)| r.is_none() && l.is_none(),
        )
        .await;
        for name in ["crashes", "agent"] {
            roots
                .delete(name, &DeleteParams::default().grace_period(0))
                .await
                .unwrap();
        }
    });
}

#[test]
fn a_status_written_over_is_restored_and_a_recreated_pod_gets_a_new_copy() {
    let e = sandbox();
    RT.block_on(async {
        let roots = root_pods(e).await;
        let leaves = leaf_pods(e).await;
        roots
            .create(
                &PostParams::default(),
                &pod("again", "sleep 600", json!({})),
            )
            .await
            .unwrap();
        until(
            "the root pod Ready",
            async || roots.get_opt("again").await.unwrap(),
            ready,
        )
        .await;
        // As the node lifecycle controller marks the pods of a node it thinks lost.
        let overwrite = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "NodeLost"}
        ]}});
        roots
            .patch_status("again", &PatchParams::default(), &Patch::Merge(overwrite))
            .await
            .unwrap();
        until(
            "the root pod Ready again",
            async || roots.get_opt("again").await.unwrap(),
            ready,
        )
        .await;
        // Deleted and made again under the same name: a new copy, for the new pod.
        let old_uid = leaves.get("again").await.unwrap().metadata.uid;
        roots
            .delete("again", &DeleteParams::default())
            .await
            .unwrap();
        until(
            "the first pod gone",
            async || roots.get_opt("again").await.unwrap(),
            Option::is_none,
        )
        .await;
        let second = roots
            .create(
                &PostParams::default(),
                &pod("again", "sleep 600", json!({})),
            )
            .await
            .unwrap();
        let copy = until(
            "the second pod's copy",
            async || leaves.get_opt("again").await.unwrap(),
            |c| {
                c.as_ref()
                    .and_then(|c| c.metadata.annotations.as_ref())
                    .and_then(|a| a.get("relaylet.io/root-pod-uid"))
                    == second.metadata.uid.as_ref()
            },
        )
        .await
        .unwrap();
        assert_ne!(copy.metadata.uid, old_uid);
        roots
            .delete("again", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    });
}

/// The README's first pod, created with its exact command line (kubectl 1.35 as `kubectl`),
/// runs in the leaf and `kubectl exec` reaches it.
#[test]
fn the_readmes_first_pod_runs_in_the_leaf() {
    let e = sandbox();
    let readme = std::fs::read_to_string(relaylet_dev::workspace_root().join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("kubectl run web "))
        .expect("the README creates a pod with kubectl run");
    let k = support::kubectl("1.35");
    let bin = std::env::temp_dir().join(format!("relaylet-readme-{}", std::process::id()));
    std::fs::create_dir_all(&bin).unwrap();
    let _ = std::fs::remove_file(bin.join("kubectl"));
    std::os::unix::fs::symlink(&k.path, bin.join("kubectl")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("sh")
        .args(["-c", line])
        .env("PATH", path)
        .env("KUBECONFIG", &e.kubeconfig)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&bin);
    assert!(out.status.success(), "{line}: {}", text(&out.stderr));
    RT.block_on(async {
        let roots = root_pods(e).await;
        until(
            "the README's pod Running",
            async || roots.get_opt("web").await.unwrap(),
            |p| phase(p) == Some("Running"),
        )
        .await;
    });
    let out = Run::new(
        &k,
        &e.kubeconfig,
        &["exec", "web", "--", "sh", "-c", "echo in the leaf"],
    )
    .output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(text(&out.stdout), "in the leaf\n");
}

#[test]
fn the_config_maps_and_secrets_a_pod_names_are_copied_kept_in_step_and_cleaned_up() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let e = sandbox();
    RT.block_on(async {
        let root = e.root_client().await;
        let kubeconfig = e.sandbox.leaves["leaf-1"].admin_kubeconfig().unwrap();
        let leaf = relaylet_dev::sandbox::kube_client(&kubeconfig)
            .await
            .unwrap();
        let root_cms: Api<ConfigMap> = Api::namespaced(root.clone(), "default");
        let root_secrets: Api<Secret> = Api::namespaced(root.clone(), "default");
        let leaf_cms: Api<ConfigMap> = Api::namespaced(leaf.clone(), "default");
        let leaf_secrets: Api<Secret> = Api::namespaced(leaf.clone(), "default");
        let pp = PostParams::default();
        let cm = |name: &str, value: &str| -> ConfigMap {
            serde_json::from_value(json!({"metadata": {"name": name}, "data": {"greeting": value}}))
                .unwrap()
        };
        root_cms.create(&pp, &cm("copied-config", "hello")).await.unwrap();
        root_secrets
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": "copied-secret"},
                    "type": "Opaque", "stringData": {"password": "s3cret"}}))
                .unwrap(),
            )
            .await
            .unwrap();
        // The leaf has its own object of a name the pod uses too: it is the leaf's, not ours.
        root_cms.create(&pp, &cm("leaf-owned", "from the root")).await.unwrap();
        leaf_cms.create(&pp, &cm("leaf-owned", "the leaf's own")).await.unwrap();
        let spec = json!({
            "volumes": [
                {"name": "config", "configMap": {"name": "copied-config"}},
                {"name": "theirs", "configMap": {"name": "leaf-owned"}}
            ],
            "containers": [{"name": "main", "image": "busybox:1.36",
                "command": ["sh", "-c", "echo \"$GREETING $PASSWORD\"; sleep 600"],
                "env": [
                    {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "copied-config", "key": "greeting"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "copied-secret", "key": "password"}}}
                ]}]
        });
        let roots = root_pods(e).await;
        roots.create(&pp, &pod("configured", "", spec)).await.unwrap();
        until(
            "the root pod Running",
            async || roots.get_opt("configured").await.unwrap(),
            |p| phase(p) == Some("Running"),
        )
        .await;
        // The container saw the values from the copies, made before it started.
        let leaves = leaf_pods(e).await;
        let logs = until(
            "the container's first line",
            async || leaves.logs("configured", &Default::default()).await.unwrap_or_default(),
            |l| l.contains('\n'),
        )
        .await;
        assert_eq!(logs, "hello s3cret\n");
        let copy = leaf_cms.get("copied-config").await.unwrap();
        let labels = copy.metadata.labels.unwrap();
        assert_eq!(labels["relaylet.io/owner"], "relaylet");
        assert_eq!(labels["relaylet.io/node"], NODE);
        assert_eq!(
            leaf_cms.get("leaf-owned").await.unwrap().data.unwrap()["greeting"],
            "the leaf's own",
            "a leaf object that is not relaylet's is left alone"
        );
        // A change in the root reaches the copy.
        root_cms
            .patch(
                "copied-config",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"greeting": "changed"}})),
            )
            .await
            .unwrap();
        until(
            "the changed ConfigMap in the leaf",
            async || leaf_cms.get("copied-config").await.unwrap().data.unwrap_or_default(),
            |d| d.get("greeting").map(String::as_str) == Some("changed"),
        )
        .await;
        // The pod gone, the copies go with it; the root objects and the leaf's own stay.
        roots
            .delete("configured", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        until(
            "the copies deleted",
            async || {
                (
                    leaf_cms.get_opt("copied-config").await.unwrap().is_some(),
                    leaf_secrets.get_opt("copied-secret").await.unwrap().is_some(),
                )
            },
            |copies| *copies == (false, false),
        )
        .await;
        assert!(leaf_cms.get_opt("leaf-owned").await.unwrap().is_some());
        assert!(root_cms.get_opt("copied-config").await.unwrap().is_some());
        assert!(root_secrets.get_opt("copied-secret").await.unwrap().is_some());
    });
}

/// The counter `relaylet_pod_sync_actions_total{action}` as the sandbox's relaylet serves it.
async fn actions(e: &Env, action: &str) -> f64 {
    let got = support::metrics::http_get(e.sandbox.relaylet.metrics_addr, "/metrics").await;
    let scrape = support::metrics::parse(&got.body);
    support::metrics::value(
        &scrape,
        "relaylet_pod_sync_actions_total",
        &[("action", action)],
    )
    .unwrap_or(0.0)
}

#[test]
fn the_leafs_events_about_a_copy_are_told_on_its_root_pod_and_a_flood_is_cut() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    let e = sandbox();
    RT.block_on(async {
        let roots = root_pods(e).await;
        let leaves = leaf_pods(e).await;
        let kubeconfig = e.sandbox.leaves["leaf-1"].admin_kubeconfig().unwrap();
        let leaf = relaylet_dev::sandbox::kube_client(&kubeconfig)
            .await
            .unwrap();
        let leaf_events: Api<CoreEvent> = Api::namespaced(leaf, "default");
        let root_events: Api<Event> = Api::namespaced(e.root_client().await, "default");
        let pp = PostParams::default();
        let root_uid = roots
            .create(&pp, &pod("eventful", "sleep 600", json!({})))
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap();
        let copy = until(
            "the copy",
            async || leaves.get_opt("eventful").await.unwrap(),
            Option::is_some,
        )
        .await
        .unwrap();
        // A leaf pod that is not relaylet's, in the same namespace.
        let native: Pod = serde_json::from_value(json!({
            "metadata": {"name": "native"},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "600"]}]}
        }))
        .unwrap();
        let native = leaves.create(&pp, &native).await.unwrap();
        // As the leaf's kubelet writes them (core/v1, with a source).
        let leaf_event = |name: &str, about: &Pod, reason: &str| -> CoreEvent {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": "default",
                    "name": about.metadata.name, "uid": about.metadata.uid,
                    "fieldPath": "spec.containers{main}"},
                "type": "Normal", "reason": reason, "message": format!("{reason} in the leaf"),
                "source": {"component": "kubelet", "host": "leaf-1-node"},
                "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z",
                "count": 1
            }))
            .unwrap()
        };
        leaf_events
            .create(&pp, &leaf_event("native.1", &native, "NotOurs"))
            .await
            .unwrap();
        leaf_events
            .create(&pp, &leaf_event("eventful.1", &copy, "Pulled"))
            .await
            .unwrap();
        let about_the_pod = async || {
            root_events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|ev| {
                    ev.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(root_uid.as_str())
                })
                .collect::<Vec<_>>()
        };
        let told = until("the leaf's Event told on the root pod", about_the_pod, |evs| {
            !evs.is_empty()
        })
        .await;
        assert_eq!(told.len(), 1, "{told:?}");
        let told = &told[0];
        assert_eq!(told.reason.as_deref(), Some("Pulled"));
        assert_eq!(told.note.as_deref(), Some("Pulled in the leaf"));
        assert_eq!(told.reporting_controller.as_deref(), Some("relaylet"));
        assert_eq!(told.reporting_instance.as_deref(), Some("leaf-1"));
        let regarding = told.regarding.as_ref().unwrap();
        assert_eq!(regarding.name.as_deref(), Some("eventful"));
        assert_eq!(regarding.field_path.as_deref(), Some("spec.containers{main}"));
        // The Event about the leaf's own pod, written before, was not told.
        let all = root_events.list(&Default::default()).await.unwrap().items;
        assert!(
            all.iter().all(|ev| ev.reason.as_deref() != Some("NotOurs")),
            "{all:?}"
        );

        // A flood from the leaf is cut to the budget; what was not told is counted.
        let before = (actions(e, "root_event").await, actions(e, "root_event_dropped").await);
        const FLOOD: usize = 300;
        for i in 0..FLOOD {
            leaf_events
                .create(&pp, &leaf_event(&format!("eventful.flood-{i}"), &copy, "Flood"))
                .await
                .unwrap();
        }
        let (told, dropped) = until(
            "every flooded Event told or counted as dropped",
            async || {
                (
                    actions(e, "root_event").await - before.0,
                    actions(e, "root_event_dropped").await - before.1,
                )
            },
            |(t, d)| (t + d) as usize >= FLOOD,
        )
        .await;
        assert!(dropped >= 1.0 && told < FLOOD as f64, "told {told}, dropped {dropped}");
        roots
            .delete("eventful", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        leaves
            .delete("native", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    });
}

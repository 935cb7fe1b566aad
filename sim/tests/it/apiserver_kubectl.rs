//! Real kubectl binaries (1.27, 1.29, 1.30, 1.32, 1.33: both sides of the SPDY/WebSocket,
//! aggregated-discovery and protobuf changes) against the API server stand-in: get/describe of
//! pods and nodes, wide and all-namespace output, selectors, apply (client- and server-side),
//! create generators, label, delete, server-side dry run, top (metrics API), auth can-i and
//! whoami, get -w, and the 401/403 answers for missing credentials and denied requests.

use crate::support;

use std::sync::Arc;

use relaylet_sim::apiserver::{ApiServer, ApiServerConfig, Policy, Rule};
use relaylet_sim::tls::Ca;
use serde_json::json;
use support::{Scratch, kubectl, kubectl_versions};

async fn server() -> ApiServer {
    let ca = Arc::new(Ca::new("sim-root").unwrap());
    let mut cfg = ApiServerConfig::new("sim-root", ca);
    cfg.policy = Policy::new(vec![
        Rule::user("viewer")
            .verbs(&["get", "list", "watch"])
            .api_groups(&[""])
            .resources(&["pods", "nodes", "events"]),
    ]);
    let api = ApiServer::start(cfg).await.unwrap();
    let store = api.store();
    let kind = |r: &str| relaylet_sim::apiserver::kinds::by_resource("", r).unwrap();
    store
        .create(
            kind("nodes"),
            "",
            json!({
                "metadata": {"name": "leaf-1", "labels": {"node-role.kubernetes.io/virtual": ""}},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
                                    "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                    "addresses": [{"type": "InternalIP", "address": "10.9.8.7"}, {"type": "Hostname", "address": "leaf-1"}],
                    "nodeInfo": {"kubeletVersion": "v1.35.0-relaylet", "osImage": "Sim OS", "kernelVersion": "6.1",
                                 "containerRuntimeVersion": "sim://1", "architecture": "amd64", "operatingSystem": "linux",
                                 "machineID": "m", "systemUUID": "s", "bootID": "b", "kubeProxyVersion": ""},
                    "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
                    "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}
                }
            }),
        )
        .unwrap();
    store
        .create(
            kind("pods"),
            "default",
            json!({
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {"nodeName": "leaf-1", "containers": [{"name": "main", "image": "busybox"}]},
                "status": {"phase": "Running", "podIP": "10.244.0.5", "hostIP": "10.9.8.7",
                           "startTime": "2026-01-01T00:00:00Z",
                           "conditions": [{"type": "Ready", "status": "True"}],
                           "containerStatuses": [{"name": "main", "ready": true, "restartCount": 1, "image": "busybox",
                                                  "imageID": "", "started": true,
                                                  "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
            }),
        )
        .unwrap();
    let metrics = relaylet_sim::apiserver::kinds::by_resource("metrics.k8s.io", "pods").unwrap();
    store
        .create(
            metrics,
            "default",
            json!({
                "metadata": {"name": "web"},
                "timestamp": "2026-01-01T00:00:00Z",
                "window": "30s",
                "containers": [{"name": "main", "usage": {"cpu": "5m", "memory": "10Mi"}}]
            }),
        )
        .unwrap();
    api
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_versions_work_against_the_stand_in() {
    let versions = kubectl_versions(&[27, 29, 30, 32, 33]);
    if versions.is_empty() {
        eprintln!("!!!!! NO kubectl BINARY FOUND: skipping the kubectl test !!!!!");
        return;
    }
    let api = server().await;
    for (minor, bin) in versions {
        let scratch = Scratch::new(&format!("kubectl-1-{minor}"));
        let admin = scratch.write(
            "admin.yaml",
            &api.kubeconfig("admin", &["system:masters"]).unwrap(),
        );
        let viewer = scratch.write("viewer.yaml", &api.kubeconfig("viewer", &[]).unwrap());
        let run = |kc: std::path::PathBuf, args: Vec<&'static str>| {
            let bin = bin.clone();
            let scratch = &scratch;
            async move { kubectl(&bin, scratch, &kc, &args).await }
        };
        let ctx = format!("kubectl 1.{minor}");

        let pods = run(admin.clone(), vec!["get", "pods"]).await;
        assert!(pods.ok, "{ctx} get pods: {}", pods.stderr);
        let header: Vec<&str> = pods
            .stdout
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            header,
            ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
            "{ctx}: {}",
            pods.stdout
        );
        let row: Vec<&str> = pods
            .stdout
            .lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            &row[..4],
            ["web", "1/1", "Running", "1"],
            "{ctx}: {}",
            pods.stdout
        );

        let wide = run(admin.clone(), vec!["get", "pods", "-o", "wide"]).await;
        assert!(wide.ok, "{ctx}: {}", wide.stderr);
        assert!(
            wide.stdout.contains("10.244.0.5") && wide.stdout.contains("leaf-1"),
            "{ctx}: {}",
            wide.stdout
        );

        let all = run(admin.clone(), vec!["get", "pods", "-A", "-l", "app=web"]).await;
        assert!(all.ok, "{ctx}: {}", all.stderr);
        let header: Vec<&str> = all
            .stdout
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(header[..2], ["NAMESPACE", "NAME"], "{ctx}: {}", all.stdout);
        assert_eq!(all.stdout.lines().count(), 2, "{ctx}: {}", all.stdout);
        let none = run(
            admin.clone(),
            vec!["get", "pods", "--field-selector", "spec.nodeName=elsewhere"],
        )
        .await;
        assert!(
            none.ok && none.stdout.is_empty(),
            "{ctx}: {} {}",
            none.stdout,
            none.stderr
        );
        assert!(
            none.stderr.contains("No resources found"),
            "{ctx}: {}",
            none.stderr
        );

        let nodes = run(admin.clone(), vec!["get", "nodes", "-o", "wide"]).await;
        assert!(nodes.ok, "{ctx}: {}", nodes.stderr);
        let row: Vec<&str> = nodes
            .stdout
            .lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            &row[..3],
            ["leaf-1", "Ready", "virtual"],
            "{ctx}: {}",
            nodes.stdout
        );
        assert!(
            nodes.stdout.contains("10.9.8.7") && nodes.stdout.contains("v1.35.0-relaylet"),
            "{ctx}: {}",
            nodes.stdout
        );

        let describe = run(admin.clone(), vec!["describe", "pod", "web"]).await;
        assert!(describe.ok, "{ctx} describe pod: {}", describe.stderr);
        assert!(
            describe.stdout.contains("Node:") && describe.stdout.contains("leaf-1/10.9.8.7"),
            "{ctx}: {}",
            describe.stdout
        );
        let describe = run(admin.clone(), vec!["describe", "node", "leaf-1"]).await;
        assert!(describe.ok, "{ctx} describe node: {}", describe.stderr);
        assert!(
            describe.stdout.contains("InternalIP:  10.9.8.7"),
            "{ctx}: {}",
            describe.stdout
        );

        let json_out = run(admin.clone(), vec!["get", "pod", "web", "-o", "json"]).await;
        assert!(json_out.ok, "{ctx}: {}", json_out.stderr);
        let pod: serde_json::Value = serde_json::from_str(&json_out.stdout).unwrap();
        assert_eq!(pod["spec"]["nodeName"], "leaf-1");

        let manifest = scratch.write(
            "cm.yaml",
            &format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings-{minor}\ndata:\n  mode: fast\n"),
        );
        let manifest = manifest.to_str().unwrap().to_string();
        let manifest: &'static str = Box::leak(manifest.into_boxed_str());
        let applied = run(admin.clone(), vec!["apply", "-f", manifest]).await;
        assert!(applied.ok, "{ctx} apply: {}", applied.stderr);
        assert!(
            applied.stdout.contains("created"),
            "{ctx}: {}",
            applied.stdout
        );
        let kind = relaylet_sim::apiserver::kinds::by_resource("", "configmaps").unwrap();
        let stored = api
            .store()
            .get(kind, "default", &format!("settings-{minor}"))
            .unwrap();
        assert_eq!(stored["data"]["mode"], "fast");
        // A second apply with a change patches the stored object.
        std::fs::write(
            manifest,
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings-{minor}\ndata:\n  mode: slow\n"),
        )
        .unwrap();
        let reapplied = run(admin.clone(), vec!["apply", "-f", manifest]).await;
        assert!(reapplied.ok, "{ctx} re-apply: {}", reapplied.stderr);
        assert!(
            reapplied.stdout.contains("configured"),
            "{ctx}: {}",
            reapplied.stdout
        );
        let stored = api
            .store()
            .get(kind, "default", &format!("settings-{minor}"))
            .unwrap();
        assert_eq!(stored["data"]["mode"], "slow");
        let ssa = run(
            admin.clone(),
            vec!["apply", "--server-side", "-f", manifest],
        )
        .await;
        assert!(ssa.ok, "{ctx} server-side apply: {}", ssa.stderr);
        let deleted = run(admin.clone(), vec!["delete", "-f", manifest]).await;
        assert!(deleted.ok, "{ctx} delete: {}", deleted.stderr);
        assert!(
            api.store()
                .get(kind, "default", &format!("settings-{minor}"))
                .is_err()
        );

        // Server-side dry run checks and answers but stores nothing.
        // Generators (protobuf bodies from kubectl 1.32 on): a leaf-cluster Secret the way an
        // operator adds one, a ConfigMap and a Namespace.
        let ns: &'static str = Box::leak(format!("team-{minor}").into_boxed_str());
        let created = run(admin.clone(), vec!["create", "namespace", ns]).await;
        assert!(created.ok, "{ctx} create namespace: {}", created.stderr);
        let created = run(
            admin.clone(),
            vec![
                "create",
                "secret",
                "generic",
                "leaf-east",
                "-n",
                ns,
                "--from-literal=kubeconfig=apiVersion: v1",
            ],
        )
        .await;
        assert!(created.ok, "{ctx} create secret: {}", created.stderr);
        let labelled = run(
            admin.clone(),
            vec![
                "label",
                "secret",
                "leaf-east",
                "-n",
                ns,
                "relaylet.io/leaf-cluster=east",
            ],
        )
        .await;
        assert!(labelled.ok, "{ctx} label: {}", labelled.stderr);
        let secrets = relaylet_sim::apiserver::kinds::by_resource("", "secrets").unwrap();
        let secret = api.store().get(secrets, ns, "leaf-east").unwrap();
        assert_eq!(
            secret["data"]["kubeconfig"], "YXBpVmVyc2lvbjogdjE=",
            "{ctx}"
        );
        assert_eq!(secret["type"], "Opaque", "{ctx}");
        assert_eq!(
            secret["metadata"]["labels"]["relaylet.io/leaf-cluster"], "east",
            "{ctx}"
        );
        let created = run(
            admin.clone(),
            vec!["create", "configmap", "gen", "-n", ns, "--from-literal=a=b"],
        )
        .await;
        assert!(created.ok, "{ctx} create configmap: {}", created.stderr);
        assert_eq!(
            api.store().get(kind, ns, "gen").unwrap()["data"]["a"],
            "b",
            "{ctx}"
        );

        let dry = run(
            admin.clone(),
            vec!["apply", "--dry-run=server", "-f", manifest, "-o", "name"],
        )
        .await;
        assert!(dry.ok, "{ctx} dry run: {}", dry.stderr);
        assert_eq!(
            dry.stdout.trim(),
            format!("configmap/settings-{minor}"),
            "{ctx}"
        );
        assert!(
            api.store()
                .get(kind, "default", &format!("settings-{minor}"))
                .is_err(),
            "{ctx}: dry run stored"
        );

        let top = run(admin.clone(), vec!["top", "pod", "web"]).await;
        assert!(top.ok, "{ctx} top: {}", top.stderr);
        let row: Vec<&str> = top
            .stdout
            .lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(row, ["web", "5m", "10Mi"], "{ctx}: {}", top.stdout);

        if minor >= 30 {
            // SelfSubjectReview (authentication.k8s.io/v1 from 1.28, GA in 1.30).
            let whoami = run(viewer.clone(), vec!["auth", "whoami"]).await;
            assert!(whoami.ok, "{ctx} whoami: {}", whoami.stderr);
            assert!(
                whoami.stdout.contains("viewer") && whoami.stdout.contains("system:authenticated"),
                "{ctx}: {}",
                whoami.stdout
            );
        }

        let can = run(viewer.clone(), vec!["auth", "can-i", "get", "pods"]).await;
        assert_eq!(
            can.stdout.trim(),
            "yes",
            "{ctx}: {} {}",
            can.stdout,
            can.stderr
        );
        let cannot = run(viewer.clone(), vec!["auth", "can-i", "create", "pods/exec"]).await;
        assert_eq!(
            cannot.stdout.trim(),
            "no",
            "{ctx}: {} {}",
            cannot.stdout,
            cannot.stderr
        );

        let denied = run(viewer.clone(), vec!["delete", "pod", "web"]).await;
        assert!(!denied.ok, "{ctx}: viewer deleted a pod");
        assert!(
            denied.stderr.contains("pods \"web\" is forbidden: User \"viewer\" cannot delete resource \"pods\" in API group \"\" in the namespace \"default\""),
            "{ctx}: {}",
            denied.stderr
        );

        let anonymous = scratch.write(
            "anon.yaml",
            &api.kubeconfig_with_token("nobody", "no-such-token"),
        );
        let unauthorized = run(anonymous, vec!["get", "pods"]).await;
        assert!(!unauthorized.ok, "{ctx}: anonymous listed pods");
        assert!(
            unauthorized.stderr.contains("Unauthorized"),
            "{ctx}: {}",
            unauthorized.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_prints_new_pods() {
    use tokio::io::AsyncBufReadExt;

    let versions = kubectl_versions(&[27, 33]);
    if versions.is_empty() {
        eprintln!("!!!!! NO kubectl BINARY FOUND: skipping the kubectl watch test !!!!!");
        return;
    }
    let api = server().await;
    let pods = relaylet_sim::apiserver::kinds::by_resource("", "pods").unwrap();
    for (minor, bin) in versions {
        let scratch = Scratch::new(&format!("kubectl-watch-1-{minor}"));
        let admin = scratch.write(
            "admin.yaml",
            &api.kubeconfig("admin", &["system:masters"]).unwrap(),
        );
        let mut child = tokio::process::Command::new(&bin)
            .arg("--kubeconfig")
            .arg(&admin)
            .arg("--cache-dir")
            .arg(scratch.0.join("cache"))
            .args(["get", "pods", "-w"])
            .env("HOME", &scratch.0)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let name = format!("late-{minor}");
        let seen = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            let mut created = false;
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.starts_with("web ") && !created {
                    // The initial list is printed: now a pod appears.
                    api.store()
                        .create(
                            pods,
                            "default",
                            json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]},
                                   "status": {"phase": "Pending"}}),
                        )
                        .unwrap();
                    created = true;
                }
                if line.starts_with(&format!("{name} ")) {
                    return line;
                }
            }
            String::new()
        })
        .await
        .unwrap_or_else(|_| panic!("kubectl 1.{minor} get -w never printed {name}"));
        assert!(
            seen.contains("0/1") && seen.contains("Pending"),
            "kubectl 1.{minor}: {seen}"
        );
        child.kill().await.unwrap();
    }
}

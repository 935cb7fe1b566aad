//! The API server's kubelet routes end to end: real kubectl (1.27 over SPDY, 1.33 over
//! WebSocket v5 translated to SPDY) and kube-rs' AttachedProcess run `exec` and `logs` through the stand-in API server into
//! the kubelet stand-in, which runs real processes. Also the failures upstream reports before
//! dialling: missing pod (404), an unbound pod's empty log, node proxy, and the 1.35 rule that exec needs
//! `create` on `pods/exec` even for a WebSocket GET.

use crate::support;

use std::sync::Arc;

use relaylet_sim::apiserver::{ApiServer, ApiServerConfig, Policy, Rule, kinds};
use relaylet_sim::kubelet::{ContainerRun, Kubelet, KubeletConfig, PodRun};
use relaylet_sim::kubelet_proxy::KubeletClient;
use relaylet_sim::tls::Ca;
use serde_json::json;
use support::{Scratch, kubectl, kubectl_versions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_and_logs_reach_the_kubelet_through_the_api_server() {
    let versions = kubectl_versions(&[27, 33]);
    if versions.is_empty() {
        eprintln!(
            "!!!!! NO kubectl BINARY FOUND: only kube-rs runs in the kubelet-proxy test !!!!!"
        );
    }
    let scratch = Scratch::new("apiserver-proxy");
    let ca = Arc::new(Ca::new("sim-cluster").unwrap());

    let kubelet_tls = ca
        .server_config_requiring_clients(&ca.issue_server(&["127.0.0.1"]).unwrap())
        .unwrap();
    let kubelet = Kubelet::start(KubeletConfig::new(
        "leaf-1",
        kubelet_tls,
        "127.0.0.1:0".parse().unwrap(),
        scratch.0.join("kubelet"),
    ))
    .await
    .unwrap();
    kubelet
        .run_pod(PodRun {
            namespace: "default".into(),
            name: "web".into(),
            uid: "uid-web".into(),
            containers: vec![ContainerRun {
                name: "main".into(),
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    "echo started-main; exec sleep 600".into(),
                ],
                env: vec![],
                stdin: false,
                tty: false,
                ports: vec![],
            }],
        })
        .await
        .unwrap();

    let apiserver_client = ca
        .issue_client("kube-apiserver-kubelet-client", &["system:masters"])
        .unwrap();
    let mut cfg = ApiServerConfig::new("sim-cluster", ca.clone());
    cfg.kubelet = Some(KubeletClient::new(
        ca.client_config(Some(&apiserver_client)).unwrap(),
    ));
    cfg.policy = Policy::new(vec![
        Rule::user("reader")
            .verbs(&["get", "list"])
            .api_groups(&[""])
            .resources(&["pods", "pods/exec", "pods/log"]),
    ]);
    let api = ApiServer::start(cfg).await.unwrap();
    let store = api.store();
    let kind = |r: &str| kinds::by_resource("", r).unwrap();
    store
        .create(
            kind("nodes"),
            "",
            json!({"metadata": {"name": "leaf-1"}, "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet.addr.port()}}
            }}),
        )
        .unwrap();
    for (name, node) in [("web", Some("leaf-1")), ("pending", None)] {
        let mut spec = json!({"containers": [{"name": "main", "image": "busybox"}]});
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        store
            .create(
                kind("pods"),
                "default",
                json!({"metadata": {"name": name, "uid": "uid-web"}, "spec": spec, "status": {"phase": "Running"}}),
            )
            .unwrap();
    }

    let admin = scratch.write(
        "admin.yaml",
        &api.kubeconfig("admin", &["system:masters"]).unwrap(),
    );
    let reader = scratch.write("reader.yaml", &api.kubeconfig("reader", &[]).unwrap());
    for (minor, bin) in versions {
        let ctx = format!("kubectl 1.{minor}");
        let exec = kubectl(
            &bin,
            &scratch,
            &admin,
            &[
                "exec",
                "web",
                "--",
                "sh",
                "-c",
                "echo out-$((6*7)); echo err >&2",
            ],
        )
        .await;
        assert!(exec.ok, "{ctx} exec: {}", exec.stderr);
        assert_eq!(exec.stdout, "out-42\n", "{ctx}");
        assert_eq!(exec.stderr, "err\n", "{ctx}");

        let failing = kubectl(
            &bin,
            &scratch,
            &admin,
            &["exec", "web", "--", "sh", "-c", "exit 3"],
        )
        .await;
        assert!(!failing.ok, "{ctx}: a failing command looked successful");
        assert!(
            failing.stderr.contains("exit code 3"),
            "{ctx}: {}",
            failing.stderr
        );

        let logs = kubectl(&bin, &scratch, &admin, &["logs", "web"]).await;
        assert!(logs.ok, "{ctx} logs: {}", logs.stderr);
        assert_eq!(logs.stdout, "started-main\n", "{ctx}");

        let missing = kubectl(&bin, &scratch, &admin, &["exec", "ghost", "--", "true"]).await;
        assert!(
            missing.stderr.contains("pods \"ghost\" not found"),
            "{ctx}: {}",
            missing.stderr
        );

        let pending = kubectl(&bin, &scratch, &admin, &["logs", "pending"]).await;
        assert!(
            pending.ok && pending.stdout.is_empty(),
            "{ctx}: {} {}",
            pending.stdout,
            pending.stderr
        );

        // reader may `get pods/exec` but not `create` it: a WebSocket GET is not enough.
        let denied = kubectl(&bin, &scratch, &reader, &["exec", "web", "--", "true"]).await;
        assert!(!denied.ok, "{ctx}: reader could exec");
        assert!(
            denied.stderr.contains("cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\""),
            "{ctx}: {}",
            denied.stderr
        );
        let reader_logs = kubectl(&bin, &scratch, &reader, &["logs", "web"]).await;
        assert!(reader_logs.ok, "{ctx}: {}", reader_logs.stderr);

        // nodes/proxy reaches the kubelet's own routes.
        let raw = kubectl(
            &bin,
            &scratch,
            &admin,
            &[
                "get",
                "--raw",
                "/api/v1/nodes/leaf-1/proxy/containerLogs/default/web/main",
            ],
        )
        .await;
        assert!(raw.ok, "{ctx} node proxy: {}", raw.stderr);
        assert_eq!(raw.stdout, "started-main\n", "{ctx}");
        let denied = kubectl(
            &bin,
            &scratch,
            &reader,
            &["get", "--raw", "/api/v1/nodes/leaf-1/proxy/healthz"],
        )
        .await;
        assert!(
            denied
                .stderr
                .contains("cannot get resource \"nodes/proxy\""),
            "{ctx}: {}",
            denied.stderr
        );
    }

    // kube-rs' AttachedProcess (WebSocket) through the same route.
    let yaml = api.kubeconfig("admin", &["system:masters"]).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&yaml).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    let mut attached = pods
        .exec(
            "web",
            ["sh", "-c", "printf from-kube-rs"],
            &kube::api::AttachParams::default().stderr(false),
        )
        .await
        .unwrap();
    let mut stdout = attached.stdout().unwrap();
    let mut out = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut out),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(out, "from-kube-rs");
    let status = attached.take_status().unwrap().await.unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));
    kubelet.stop();
}

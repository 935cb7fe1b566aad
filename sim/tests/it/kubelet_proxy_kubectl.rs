//! Real kubectl binaries through the proxy to the kubelet stand-in.
//!
//! kubectl 1.27 speaks SPDY only (passed through to the kubelet); kubectl 1.30+ tries WebSocket
//! v5 first (translated to SPDY by the proxy) and, for port-forward from 1.31, tunnels SPDY in a
//! WebSocket. A minimal apiserver route serves what kubectl reads first (discovery and the pod).
//!
//! The binaries come from the machine image (the Google Cloud SDK keeps `kubectl.1.27` ...
//! beside its `kubectl` dispatcher), found by `relaylet_sim::tools`.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use http::{Request, StatusCode, header};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeStatus,
    Pod, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use relaylet_sim::kubelet::{ContainerRun, Kubelet, KubeletConfig, PodRun};
use relaylet_sim::kubelet_proxy::{KubeletClient, PodSubresource};
use relaylet_sim::serve::{Served, serve_tls};
use relaylet_sim::tls::Ca;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::time::timeout;

use crate::proxy_support as support;

const T: Duration = Duration::from_secs(30);

/// The versioned kubectl binary (the machine's 1.27-1.33, or installed on demand).
fn kubectl(version: &str) -> PathBuf {
    relaylet_sim::tools::kubectl(version)
        .unwrap_or_else(|| panic!("kubectl {version} is not available: run tests/tools/install.sh"))
        .path
}

struct Env {
    kubelet: Kubelet,
    _apiserver: Served,
    dir: PathBuf,
    kubeconfig: PathBuf,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.kubelet.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Clone)]
struct Api {
    client: KubeletClient,
    node: Arc<Node>,
    seen: Arc<Mutex<Vec<String>>>,
}

fn pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("uid-web".into()),
            resource_version: Some("1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("sim/local".into()),
                ports: Some(vec![ContainerPort {
                    container_port: 8080,
                    ..ContainerPort::default()
                }]),
                ..Container::default()
            }],
            node_name: Some("node-a".into()),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..PodStatus::default()
        }),
    }
}

fn json_response(value: serde_json::Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

async fn record(State(api): State<Api>, req: Request<Body>) -> Response {
    let line = format!("{} {}", req.method(), req.uri());
    api.seen.lock().expect("lock").push(line.clone());
    StatusCode::NOT_FOUND.into_response()
}

async fn discovery_api() -> Response {
    json_response(
        json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
    )
}

async fn discovery_apis() -> Response {
    json_response(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}))
}

async fn discovery_v1() -> Response {
    json_response(json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
             "verbs": ["get", "list"], "shortNames": ["po"]},
            {"name": "pods/attach", "singularName": "", "namespaced": true, "kind": "PodAttachOptions", "verbs": ["create", "get"]},
            {"name": "pods/exec", "singularName": "", "namespaced": true, "kind": "PodExecOptions", "verbs": ["create", "get"]},
            {"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]},
            {"name": "pods/portforward", "singularName": "", "namespaced": true, "kind": "PodPortForwardOptions", "verbs": ["create", "get"]}
        ]
    }))
}

async fn get_pod(State(api): State<Api>, req: Request<Body>) -> Response {
    api.seen
        .lock()
        .expect("lock")
        .push(format!("{} {}", req.method(), req.uri()));
    let mut value = serde_json::to_value(pod()).unwrap_or_default();
    value["kind"] = json!("Pod");
    value["apiVersion"] = json!("v1");
    json_response(value)
}

async fn api_pod(
    State(api): State<Api>,
    Path((_ns, _name, sub)): Path<(String, String, String)>,
    req: Request<Body>,
) -> Response {
    api.seen.lock().expect("lock").push(format!(
        "{} {} {:?}",
        req.method(),
        req.uri(),
        req.headers().get(header::UPGRADE)
    ));
    let Some(sub) = PodSubresource::from_name(&sub) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    api.client.proxy_pod(req, &pod(), &api.node, sub).await
}

async fn env(test: &str) -> Env {
    let ca = Ca::new("kubectl-e2e-ca").expect("ca");
    let dir = std::env::temp_dir().join(format!(
        "relaylet-proxy-kubectl-{test}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let kubelet_id = ca.issue_server(&["127.0.0.1"]).expect("cert");
    let kubelet = Kubelet::start(KubeletConfig::new(
        "node-a",
        ca.server_config_requiring_clients(&kubelet_id)
            .expect("tls"),
        "127.0.0.1:0".parse().expect("addr"),
        dir.join("kubelet"),
    ))
    .await
    .expect("kubelet");
    let echo = support::echo_server().await;
    kubelet
        .run_pod(PodRun {
            namespace: "default".into(),
            name: "web".into(),
            uid: "uid-web".into(),
            containers: vec![ContainerRun {
                name: "main".into(),
                command: vec!["sh".into(), "-c".into(), "echo started; sleep 3600".into()],
                env: Vec::new(),
                stdin: false,
                tty: false,
                ports: vec![(8080, echo)],
            }],
        })
        .await
        .expect("pod");
    let node = Node {
        metadata: ObjectMeta {
            name: Some("node-a".into()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: "127.0.0.1".into(),
            }]),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(kubelet.addr.port()),
                }),
            }),
            ..NodeStatus::default()
        }),
    };
    let apiserver_client = ca
        .issue_client("system:kube-apiserver", &["system:masters"])
        .expect("client cert");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let api = Api {
        client: KubeletClient::new(ca.client_config(Some(&apiserver_client)).expect("tls")),
        node: Arc::new(node),
        seen: seen.clone(),
    };
    let api_id = ca.issue_server(&["127.0.0.1"]).expect("cert");
    let apiserver = serve_tls(
        TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        ca.server_config_optional_clients(&api_id).expect("tls"),
        Router::new()
            .route("/api", get(discovery_api))
            .route("/apis", get(discovery_apis))
            .route("/api/v1", get(discovery_v1))
            .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod))
            .route("/api/v1/namespaces/{ns}/pods/{name}/{sub}", any(api_pod))
            .fallback(record)
            .with_state(api),
    );
    let user = ca.issue_client("alice", &[]).expect("user");
    let kubeconfig = dir.join("kubeconfig");
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let ca_file = write("ca.crt", &ca.cert_pem());
    let cert_file = write("user.crt", &user.cert_pem);
    let key_file = write("user.key", &user.key_pem);
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {ca_file}\nusers:\n- name: alice\n  user:\n    client-certificate: {cert_file}\n    client-key: {key_file}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: alice\n    namespace: default\ncurrent-context: sim\n",
            port = apiserver.addr.port()
        ),
    )
    .expect("kubeconfig");
    Env {
        kubelet,
        _apiserver: apiserver,
        dir,
        kubeconfig,
        seen,
    }
}

impl Env {
    fn kubectl(&self, version: &str) -> Command {
        let mut cmd = Command::new(kubectl(version));
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.dir)
            .env_remove("KUBECTL_REMOTE_COMMAND_WEBSOCKETS")
            .env_remove("KUBECTL_PORT_FORWARD_WEBSOCKETS")
            .arg(format!("--cache-dir={}", self.dir.join("cache").display()))
            .kill_on_drop(true);
        cmd
    }

    async fn exec(&self, version: &str, stdin: &[u8], args: &[&str]) -> (i32, String, String) {
        let mut cmd = self.kubectl(version);
        cmd.args(["exec", "-i", "web", "-c", "main", "--"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl");
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(stdin).await.expect("stdin");
        drop(input);
        let output = timeout(T, child.wait_with_output())
            .await
            .expect("kubectl finished in time")
            .expect("output");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("lock").clone()
    }
}

#[tokio::test]
async fn kubectl_127_exec_over_spdy_passthrough() {
    let e = env("127").await;
    let (code, out, err) = e
        .exec("1.27", b"abc\n", &["sh", "-c", "cat; echo err >&2; exit 4"])
        .await;
    assert_eq!(out, "abc\n", "stderr: {err}; requests: {:?}", e.seen());
    assert!(err.contains("err\n"), "{err}");
    assert_eq!(
        code, 4,
        "kubectl exits with the command's code; stderr: {err}"
    );
    let exec: Vec<String> = e
        .seen()
        .into_iter()
        .filter(|l| l.contains("/exec?"))
        .collect();
    assert_eq!(exec.len(), 1, "{exec:?}");
    assert!(
        exec[0].starts_with("POST ") && exec[0].contains("SPDY/3.1"),
        "{exec:?}"
    );
}

#[tokio::test]
async fn kubectl_133_exec_over_websocket_v5_translation() {
    let e = env("133").await;
    let (code, out, err) = e
        .exec(
            "1.33",
            b"hello\n",
            &["sh", "-c", "cat; echo err >&2; exit 3"],
        )
        .await;
    assert_eq!(out, "hello\n", "stderr: {err}; requests: {:?}", e.seen());
    assert!(err.contains("err\n"), "{err}");
    assert_eq!(code, 3, "stderr: {err}");
    let exec: Vec<String> = e
        .seen()
        .into_iter()
        .filter(|l| l.contains("/exec?"))
        .collect();
    assert_eq!(exec.len(), 1, "no SPDY fallback was needed: {exec:?}");
    assert!(
        exec[0].starts_with("GET ") && exec[0].contains("websocket"),
        "{exec:?}"
    );
}

async fn port_forward_echo(e: &Env, version: &str) {
    let mut child = e
        .kubectl(version)
        .args(["port-forward", "web", ":8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let local = timeout(T, async {
        while let Ok(Some(line)) = lines.next_line().await {
            // "Forwarding from 127.0.0.1:PORT -> 8080"
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                return rest.split(' ').next().and_then(|p| p.parse::<u16>().ok());
            }
        }
        None
    })
    .await
    .expect("kubectl started forwarding in time")
    .expect("a local port");
    for round in 0..2 {
        // Each local connection is its own stream pair on the one session.
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", local))
            .await
            .expect("connect");
        let message = format!("through kubectl {version} #{round}");
        conn.write_all(message.as_bytes()).await.expect("write");
        let mut back = vec![0u8; message.len()];
        timeout(T, conn.read_exact(&mut back))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(back, message.as_bytes());
    }
    let _ = child.kill().await;
}

#[tokio::test]
async fn kubectl_133_port_forward_through_the_tunnel() {
    let e = env("pf133").await;
    port_forward_echo(&e, "1.33").await;
    let pf: Vec<String> = e
        .seen()
        .into_iter()
        .filter(|l| l.contains("/portforward"))
        .collect();
    assert!(
        pf.iter().any(|l| l.contains("websocket")),
        "kubectl 1.33 tunnels port-forward in a WebSocket: {pf:?}"
    );
}

#[tokio::test]
async fn kubectl_127_port_forward_over_spdy_passthrough() {
    let e = env("pf127").await;
    port_forward_echo(&e, "1.27").await;
    let pf: Vec<String> = e
        .seen()
        .into_iter()
        .filter(|l| l.contains("/portforward"))
        .collect();
    assert!(
        !pf.is_empty()
            && pf
                .iter()
                .all(|l| l.starts_with("POST ") && l.contains("SPDY/3.1")),
        "{pf:?}"
    );
}

#[tokio::test]
async fn kubectl_logs_through_the_proxy() {
    let e = env("logs").await;
    // The container printed "started" when it began; wait until the kubelet has logged it.
    let output = timeout(T, async {
        loop {
            let output = e
                .kubectl("1.33")
                .args(["logs", "web", "-c", "main", "--tail=1"])
                .output()
                .await
                .expect("kubectl logs");
            if output.status.success() && !output.stdout.is_empty() {
                return output;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("log in time");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "started\n");
    let logs: Vec<String> = e
        .seen()
        .into_iter()
        .filter(|l| l.contains("/log?"))
        .collect();
    assert!(logs.iter().any(|l| l.contains("tailLines=1")), "{logs:?}");
}

//! relaylet against real Kubernetes: a root cluster (etcd, kube-apiserver with Node,RBAC, the
//! front-proxy CA and a kubelet client certificate, kube-controller-manager) and a leaf cluster
//! (etcd, kube-apiserver, a leafkubelet node), all built from their Go modules at the pinned
//! versions (`tests/tools/build-k8s.sh`). relaylet is installed as a user installs it: the
//! chart's ServiceAccount and RBAC applied to the real root apiserver (and its env taken from the
//! rendered chart), the leaf reached through `deploy/leaf-rbac.yaml` and a Secret made by
//! `deploy/make-leaf-secret.sh`. Real kubectl binaries then go through the real root apiserver.

#[path = "realk8s/harness.rs"]
mod harness;
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use harness::{ControlPlane, Options};
use relaylet_sim::tools::Kubectl;
use support::{Run, describe, text};

const LEAF: &str = "leaf-1";
const LEAF_NODE: &str = "leaf-1-node";
const VIRTUAL_NODE: &str = "relaylet-leaf-1";
const RELAYLET_NAMESPACE: &str = "relaylet";

/// The clusters and relaylet, started once per test binary.
struct World {
    root: ControlPlane,
    leaf: ControlPlane,
    relaylet: relaylet::Running,
    _runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(start)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kubectl(version: &str) -> Kubectl {
    relaylet_sim::tools::kubectl(version)
        .unwrap_or_else(|| panic!("kubectl {version} is not available: run tests/tools/install.sh"))
}

fn start() -> World {
    let dir = tempfile::Builder::new()
        .prefix("relaylet-real-k8s-")
        .tempdir()
        .expect("temp dir");
    // The root dials the first InternalDNS address (relaylet's), Kosmos-style.
    let root = ControlPlane::start(
        dir.path(),
        Options {
            name: "root".into(),
            preferred_address_types: "InternalDNS,Hostname,InternalIP,ExternalDNS,ExternalIP"
                .into(),
            controller_manager: true,
        },
    );
    let mut leaf = ControlPlane::start(
        dir.path(),
        Options {
            name: LEAF.into(),
            preferred_address_types: "InternalIP,Hostname".into(),
            controller_manager: false,
        },
    );
    leaf.add_kubelet(LEAF_NODE);

    // The root: relaylet's namespace, ServiceAccount and RBAC exactly as the chart renders them.
    root.kubectl_ok(&["create", "namespace", RELAYLET_NAMESPACE]);
    let rendered = helm_template(&[
        "--show-only",
        "templates/serviceaccount.yaml",
        "--show-only",
        "templates/rbac.yaml",
    ]);
    root.kubectl_stdin_ok(&["apply", "-f", "-"], Some(&rendered));

    // The leaf: deploy/leaf-rbac.yaml, a bounded token for its ServiceAccount, and the Secret
    // made by deploy/make-leaf-secret.sh in the root.
    leaf.kubectl_ok(&[
        "apply",
        "-f",
        &repo().join("deploy/leaf-rbac.yaml").display().to_string(),
    ]);
    let token = leaf.kubectl_ok(&[
        "create",
        "token",
        "relaylet-leaf",
        "-n",
        "relaylet",
        "--duration=24h",
    ]);
    let token_file = dir.path().join("leaf-token");
    std::fs::write(&token_file, token.trim()).expect("token file");
    let kubeconfigs = format!(
        "{}:{}",
        root.admin_kubeconfig.display(),
        leaf.admin_kubeconfig.display()
    );
    let out = Command::new("bash")
        .arg(repo().join("deploy/make-leaf-secret.sh"))
        .args([
            "--leaf-context",
            LEAF,
            "--name",
            LEAF,
            "--root-context",
            "root",
        ])
        .args(["--namespace", RELAYLET_NAMESPACE])
        .arg("--token-file")
        .arg(&token_file)
        .env("KUBECONFIG", &kubeconfigs)
        .env("KUBECTL", harness::kubectl_path())
        .output()
        .expect("make-leaf-secret.sh runs");
    assert!(
        out.status.success(),
        "make-leaf-secret.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // relaylet's env from the rendered chart; what the downward API and the pod network give
    // a pod is given here, and its ports are free loopback ports.
    let mut env = chart_env();
    env.insert("LEAF_NODE_IP".into(), "127.0.0.1".into());
    env.insert("POD_NAME".into(), "relaylet-0".into());
    env.insert("POD_NAMESPACE".into(), RELAYLET_NAMESPACE.into());
    env.insert("NODE_SERVER_PORT".into(), harness::free_port().to_string());
    env.insert(
        "METRICS_ADDR".into(),
        format!("127.0.0.1:{}", harness::free_port()),
    );
    let config = relaylet::config::Config::from_lookup(|name| env.get(name).cloned())
        .expect("the chart's env is a valid configuration");
    // relaylet's root identity: the chart's ServiceAccount.
    let sa_token = root.kubectl_ok(&[
        "create",
        "token",
        "relaylet",
        "-n",
        RELAYLET_NAMESPACE,
        "--duration=24h",
    ]);
    let root_kubeconfig = token_kubeconfig(&root, sa_token.trim());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let relaylet = runtime.block_on(async {
        let client = relaylet::sandbox::kube_client(&root_kubeconfig)
            .await
            .expect("root client");
        relaylet::start(config, client, relaylet::shutdown::Shutdown::default())
            .await
            .expect("relaylet starts")
    });

    let world = World {
        root,
        leaf,
        relaylet,
        _runtime: runtime,
        _dir: dir,
    };
    world.wait_for_node_ready();
    world.sync_pod("default", "demo");
    world
}

/// `helm template` of the chart with its default values, release relaylet in namespace relaylet.
fn helm_template(extra: &[&str]) -> String {
    let helm = relaylet_sim::tools::helm().expect("helm: run tests/tools/install.sh");
    let out = Command::new(helm)
        .args(["template", "relaylet"])
        .arg(repo().join("charts/relaylet"))
        .args(["--namespace", RELAYLET_NAMESPACE])
        .args(extra)
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("helm output")
}

/// The literal env values of the rendered chart's relaylet container.
fn chart_env() -> BTreeMap<String, String> {
    let yaml = helm_template(&["--show-only", "templates/deployment.yaml"]);
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        serde_saphyr::from_str(&yaml).expect("the rendered Deployment");
    deployment
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|c| c.env.unwrap_or_default())
        .filter_map(|e| Some((e.name, e.value?)))
        .collect()
}

/// A kubeconfig for the root with a bearer token.
fn token_kubeconfig(root: &ControlPlane, token: &str) -> String {
    use base64::Engine;
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: root\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: root\n  context:\n    cluster: root\n    user: sa\ncurrent-context: root\n",
        root.url,
        base64::engine::general_purpose::STANDARD.encode(root.ca.cert_pem())
    )
}

impl World {
    fn wait_for_node_ready(&self) {
        for _ in 0..600 {
            let out = Command::new(harness::kubectl_path())
                .args([
                    "get",
                    "node",
                    VIRTUAL_NODE,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ])
                .env("KUBECONFIG", &self.root.admin_kubeconfig)
                .output()
                .expect("kubectl");
            if String::from_utf8_lossy(&out.stdout) == "True" {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("virtual node {VIRTUAL_NODE} never became Ready in the real root");
    }

    /// What a syncer does: the root pod on the virtual node, then its leaf copy on the leaf
    /// node marked with the root pod's UID. The container serves HTTP on port 8080 (its local
    /// port in PORT_8080) and logs a line a second.
    fn sync_pod(&self, namespace: &str, name: &str) {
        let app = "import http.server, os, sys, time, threading\n\
class H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        body = b'hello from ' + os.environ.get('POD', '?').encode() + b'\\n'\n        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n    def log_message(self, *a): pass\n\
s = http.server.ThreadingHTTPServer(('127.0.0.1', int(os.environ.get('PORT_8080', '0'))), H)\n\
threading.Thread(target=s.serve_forever, daemon=True).start()\n\
n = 0\nwhile True:\n    print('tick %d' % n, flush=True); n += 1; time.sleep(1)\n";
        let manifest = |node: &str, annotations: serde_json::Value| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
                "spec": {
                    "nodeName": node,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{
                        "name": "main", "image": "local/python:3",
                        "command": ["python3", "-u", "-c", app],
                        "env": [{"name": "POD", "value": format!("{namespace}/{name}")}],
                        "ports": [{"containerPort": 8080}],
                        "stdin": true,
                    }],
                },
            })
            .to_string()
        };
        self.root.kubectl_stdin_ok(
            &["create", "-f", "-"],
            Some(&manifest(VIRTUAL_NODE, serde_json::json!({}))),
        );
        let uid = self.root.kubectl_ok(&[
            "get",
            "pod",
            name,
            "-n",
            namespace,
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        self.leaf.kubectl_stdin_ok(
            &["create", "-f", "-"],
            Some(&manifest(
                LEAF_NODE,
                serde_json::json!({"relaylet.io/root-pod-uid": uid.trim()}),
            )),
        );
        // Running in the leaf once its first line is logged; then the syncer copies the leaf
        // pod's status up to the root pod (kubectl port-forward wants a Running pod).
        self.wait_for_log_lines(namespace, name, 1);
        let status = self.leaf.kubectl_ok(&[
            "get",
            "pod",
            name,
            "-n",
            namespace,
            "-o",
            "jsonpath={.status}",
        ]);
        let patch = format!("{{\"status\":{status}}}");
        self.root.kubectl_ok(&[
            "patch",
            "pod",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ]);
    }

    /// Waits until leaf pod `namespace/name` has logged at least `lines` lines.
    fn wait_for_log_lines(&self, namespace: &str, name: &str, lines: usize) {
        for _ in 0..300 {
            let out = Command::new(harness::kubectl_path())
                .args(["logs", name, "-n", namespace])
                .env("KUBECONFIG", &self.leaf.admin_kubeconfig)
                .output()
                .expect("kubectl");
            if String::from_utf8_lossy(&out.stdout).matches("tick").count() >= lines {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("leaf pod {namespace}/{name} never logged {lines} lines");
    }

    fn root_kubeconfig(&self) -> &Path {
        &self.root.admin_kubeconfig
    }
}

/// kubectl exec through the real root apiserver: argv, stdin, stdout, stderr and the exit
/// code, with SPDY-only kubectl 1.27 and WebSocket-first 1.33 and 1.35 (and 1.35 forced to
/// SPDY).
#[test]
fn exec_argv_stdin_stderr_and_exit_codes_with_every_kubectl() {
    let w = world();
    for (version, spdy) in [
        ("1.27", false),
        ("1.33", false),
        ("1.35", false),
        ("1.35", true),
    ] {
        let k = kubectl(version);
        let mut run = Run::new(
            &k,
            w.root_kubeconfig(),
            &[
                "exec",
                "-i",
                "demo",
                "--",
                "sh",
                "-c",
                "cat; echo \"argv: $0 $1\" >&2; exit 3",
                "two words",
                "x",
            ],
        )
        .stdin(b"from stdin\n");
        if spdy {
            run = run.spdy_only();
        }
        let out = run.output();
        assert_eq!(out.status.code(), Some(3), "{}", describe(&k, &out));
        assert_eq!(text(&out.stdout), "from stdin\n", "{}", describe(&k, &out));
        assert!(
            text(&out.stderr).contains("argv: two words x"),
            "{}",
            describe(&k, &out)
        );
    }
}

/// A binary that does not exist: kubectl reports the runtime's error and fails.
#[test]
fn exec_of_a_missing_binary_fails_with_the_kubelets_error() {
    let w = world();
    let k = kubectl("1.35");
    let out = Run::new(
        &k,
        w.root_kubeconfig(),
        &["exec", "demo", "--", "no-such-binary"],
    )
    .output();
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        text(&out.stderr).contains("no-such-binary"),
        "{}",
        describe(&k, &out)
    );
}

/// Logs with options through the real root apiserver, and the leaf's refusal as a message.
#[test]
fn logs_with_options_and_errors() {
    let w = world();
    w.wait_for_log_lines("default", "demo", 3);
    for version in ["1.27", "1.35"] {
        let k = kubectl(version);
        let out = Run::new(&k, w.root_kubeconfig(), &["logs", "demo", "--tail=2"]).output();
        assert!(out.status.success(), "{}", describe(&k, &out));
        let lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
        assert_eq!(lines.len(), 2, "{}", describe(&k, &out));
        assert!(lines.iter().all(|l| l.starts_with("tick ")), "{lines:?}");
        let out = Run::new(
            &k,
            w.root_kubeconfig(),
            &["logs", "demo", "--timestamps", "--limit-bytes=40"],
        )
        .output();
        assert!(out.status.success(), "{}", describe(&k, &out));
        assert_eq!(out.stdout.len(), 40, "{}", describe(&k, &out));
        let out = Run::new(&k, w.root_kubeconfig(), &["logs", "demo", "--previous"]).output();
        assert!(!out.status.success());
        assert_eq!(
            text(&out.stderr).trim_end(),
            "Error from server (BadRequest): previous terminated container \"main\" in pod \"demo\" not found",
            "{}",
            describe(&k, &out)
        );
    }
}

/// kubectl port-forward (SPDY with 1.27, WebSocket-tunnelled with 1.35) to the pod's HTTP port,
/// two connections each.
#[test]
fn port_forward_with_both_protocols() {
    let w = world();
    for version in ["1.27", "1.35"] {
        let k = kubectl(version);
        let local = harness::free_port();
        let mut child = Run::new(
            &k,
            w.root_kubeconfig(),
            &["port-forward", "pod/demo", &format!("{local}:8080")],
        )
        .command()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward");
        let mut answers = Vec::new();
        for _ in 0..2 {
            let mut answer = None;
            for _ in 0..200 {
                if let Ok(body) = http_get(local) {
                    answer = Some(body);
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            answers.push(answer.unwrap_or_default());
        }
        let _ = child.kill();
        let _ = child.wait();
        for body in answers {
            assert!(
                body.ends_with("hello from default/demo\n"),
                "kubectl {version}: {body:?}"
            );
        }
    }
}

fn http_get(port: u16) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    if out.is_empty() {
        return Err(std::io::Error::other("empty answer"));
    }
    Ok(out)
}

/// The virtual Node and its Lease as the real apiserver validated and stored them, with the
/// address the root dials first.
#[test]
fn the_real_apiserver_stores_the_virtual_node_and_lease() {
    let w = world();
    let node: serde_json::Value =
        serde_json::from_str(
            &w.root
                .kubectl_ok(&["get", "node", VIRTUAL_NODE, "-o", "json"]),
        )
        .expect("node json");
    assert_eq!(node["status"]["addresses"][0]["type"], "InternalDNS");
    assert_eq!(node["status"]["addresses"][0]["address"], "127.0.0.1");
    assert_eq!(
        node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
            .as_u64()
            .map(|p| p > 0),
        Some(true)
    );
    assert_eq!(
        node["metadata"]["labels"]["relaylet.io/owner"],
        RELAYLET_NAMESPACE
    );
    let lease: serde_json::Value = serde_json::from_str(&w.root.kubectl_ok(&[
        "get",
        "lease",
        VIRTUAL_NODE,
        "-n",
        "kube-node-lease",
        "-o",
        "json",
    ]))
    .expect("lease json");
    assert_eq!(lease["spec"]["holderIdentity"], VIRTUAL_NODE);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
}

/// Authorization by the real apiserver: a user with only `get nodes/proxy` cannot exec on
/// relaylet's port (a WebSocket exec is a GET, but needs `create`); the root's own kubelet
/// client identity can.
#[test]
fn get_nodes_proxy_is_not_enough_to_exec_on_relaylets_port() {
    let w = world();
    w.root.kubectl_ok(&[
        "create",
        "clusterrole",
        "node-proxy-reader",
        "--verb=get",
        "--resource=nodes/proxy",
    ]);
    w.root.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "viewer-node-proxy",
        "--clusterrole=node-proxy-reader",
        "--user=viewer",
    ]);
    let viewer = w.root.user_kubeconfig("viewer", &[]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = relaylet_client(w, &viewer).await;
        let exec = http::Request::get("/exec/default/demo/main?command=true&output=1")
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
            .body(Vec::new())
            .unwrap();
        match client.request_text(exec).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 403, "{status:?}");
                assert!(
                    status
                        .message
                        .contains("cannot create resource \"nodes/proxy\""),
                    "{status:?}"
                );
            }
            other => panic!("exec by a get-only user: {other:?}"),
        }
        // Logs are a GET: allowed.
        let logs = http::Request::get("/containerLogs/default/demo/main?tailLines=1")
            .body(Vec::new())
            .unwrap();
        let body = client.request_text(logs).await.expect("logs");
        assert!(body.starts_with("tick "), "{body}");
    });
}

/// A kube client of relaylet's kubelet port with the credentials of `kubeconfig`.
async fn relaylet_client(w: &World, kubeconfig: &Path) -> kube::Client {
    let yaml = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let yaml = yaml.replace(&w.root.url, &format!("https://{}", w.relaylet.addr));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    // relaylet's certificate is self-signed (servingCert.mode=generate).
    config.accept_invalid_certs = true;
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

//! Starts what the benchmark measures, all on loopback: a simulated root cluster and leaf
//! cluster (apiserver + kubelet stand-in running real processes), relaylet as its own process
//! (`relaylet serve`, configured by env vars and a root kubeconfig file exactly as in a real
//! install), the reference relay as its own process (`relaylet-dev bench-relay`), and the hold
//! endpoint that backs the idle-session memory figure.
//!
//! relaylet is given two leaves through labelled kubeconfig Secrets: `leaf` (the real
//! simulated leaf) and `hold` (the hold endpoint). The bench pod runs in `leaf` and is shown in
//! the root on relaylet's virtual node, as a multi-cluster scheduler would place it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use relaylet_sim::cluster::{Cluster, ClusterOptions, SimContainer, SimPod};
use relaylet_sim::serve::Served;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::client::{PodRef, Route, Target};
use super::reference_relay::{READY_PREFIX, RelayArgs};

const NAMESPACE: &str = "relaylet-system";
/// The container port of the bench pod's bulk sender (port-forward figure).
pub const SENDER_PORT: u16 = 8080;
/// The identity relaylet uses in both clusters. It is a cluster admin here: the benchmark
/// measures the data path, not RBAC, and relaylet's own requests are the same either way.
const RELAYLET_USER: &str = "relaylet-bench";

/// The bench pod's sender: for each connection, reads a decimal byte count and a newline,
/// sends that many zero bytes, then closes.
const SENDER: &str = r#"
import os, socket, threading
port = int(os.environ["PORT_8080"])
chunk = memoryview(bytes(1 << 20))
def serve(conn):
    with conn:
        reader = conn.makefile("rb")
        left = int(reader.readline())
        while left > 0:
            n = min(left, len(chunk))
            conn.sendall(chunk[:n])
            left -= n
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(65536):
            pass
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(128)
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"#;

/// A child process that is killed when dropped.
pub struct ChildProcess {
    pub pid: u32,
    child: Child,
    pub log: PathBuf,
}

impl ChildProcess {
    /// Stops the process and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// Everything the benchmark runs against; stops when dropped.
pub struct Stack {
    pub direct: Target,
    pub limit: Target,
    pub relayed: Target,
    pub pod: PodRef,
    /// The bench pod's twin on the leaf registered through an HTTP CONNECT proxy (`proxied`).
    pub proxied_pod: PodRef,
    pub hold_pod: PodRef,
    pub relaylet: ChildProcess,
    pub reference: ChildProcess,
    _hold: Served,
    _proxy: crate::sandbox::leaf_proxy::TestProxy,
    _leaf: Cluster,
    _root: Cluster,
    _files: tempfile::TempDir,
}

impl Stack {
    /// Starts everything; the log container writes `log_bytes` bytes of log lines.
    pub async fn start(log_bytes: u64) -> anyhow::Result<Stack> {
        let files = tempfile::Builder::new()
            .prefix("relaylet-bench-")
            .tempdir()?;
        let dir = files.path();
        let root = Cluster::start(ClusterOptions::new("root"))
            .await
            .context("starting the root cluster")?;
        create_namespace(&root, NAMESPACE)?;
        let leaf = Cluster::start(ClusterOptions::new("leaf"))
            .await
            .context("starting the leaf cluster")?;
        leaf.add_node("leaf-node")
            .await
            .context("starting the leaf node")?;
        let pod = bench_pod(log_bytes);
        crate::sandbox::sync_pod(&root, "relaylet-leaf", &leaf, "leaf-node", &pod)
            .await
            .context("starting the bench pod")?;
        let hold_pod = SimPod {
            namespace: "default".into(),
            name: "hold".into(),
            containers: vec![SimContainer {
                name: "main".into(),
                command: vec!["sleep".into(), "infinity".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let hold_root = root.add_pod("relaylet-hold", &hold_pod).await?;
        // The same leaf again, as leaf `proxied` reached only through an HTTP CONNECT proxy,
        // with its own copy of the bench pod (a leaf pod stands for one root pod).
        let mut proxied_pod = bench_pod(log_bytes);
        proxied_pod.name = "bench-proxied".into();
        crate::sandbox::sync_pod(&root, "relaylet-proxied", &leaf, "leaf-node", &proxied_pod)
            .await
            .context("starting the proxied bench pod")?;

        let hold_id = leaf.ca.issue_server(&["127.0.0.1"])?;
        let hold = super::hold::start(&hold_id, &hold_root).await?;
        let leaf_kubeconfig = leaf.kubeconfig(RELAYLET_USER, &["system:masters"])?;
        let hold_url = format!("https://{}", hold.addr);
        anyhow::ensure!(
            leaf_kubeconfig.contains(&leaf.api.url()),
            "leaf kubeconfig does not name {}",
            leaf.api.url()
        );
        let hold_kubeconfig = leaf_kubeconfig.replace(&leaf.api.url(), &hold_url);
        let behind = crate::sandbox::leaf_proxy::behind_proxy(
            &crate::sandbox::leaf_proxy::LeafProxyKind::Http,
            "proxied",
            &leaf_kubeconfig,
            leaf.api.addr,
        )
        .await
        .context("starting the HTTP CONNECT proxy")?;
        let proxy = behind
            .proxy
            .context("the test kit's proxy for leaf proxied")?;
        for (name, kubeconfig) in [
            ("leaf", &leaf_kubeconfig),
            ("hold", &hold_kubeconfig),
            ("proxied", &behind.kubeconfig),
        ] {
            root.api
                .store()
                .create_typed(&crate::sandbox::leaf_secret(NAMESPACE, name, kubeconfig))
                .map_err(|e| anyhow::anyhow!("creating the Secret of leaf {name}: {e}"))?;
        }

        let relaylet = spawn_relaylet(&root, dir).await?;
        let reference = spawn_reference(&leaf, dir).await?;

        let client_id = leaf.ca.issue_client("bench-client", &["system:masters"])?;
        let kubelet_client = root
            .ca
            .issue_client("kube-apiserver-kubelet-client", &["system:masters"])?;
        let leaf_addr: SocketAddr = leaf
            .api
            .url()
            .trim_start_matches("https://")
            .parse()
            .context("leaf apiserver address")?;
        let stack = Stack {
            direct: Target {
                route: Route::Direct,
                addr: leaf_addr,
                tls: leaf.ca.client_config(Some(&client_id))?,
            },
            limit: Target {
                route: Route::Limit,
                addr: reference.1,
                tls: leaf.ca.client_config(None)?,
            },
            relayed: Target {
                route: Route::Relayed,
                addr: relaylet.1,
                tls: root.ca.client_config(Some(&kubelet_client))?,
            },
            pod: PodRef {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            },
            proxied_pod: PodRef {
                namespace: proxied_pod.namespace.clone(),
                name: proxied_pod.name.clone(),
            },
            hold_pod: PodRef {
                namespace: hold_pod.namespace.clone(),
                name: hold_pod.name.clone(),
            },
            _proxy: proxy,
            relaylet: relaylet.0,
            reference: reference.0,
            _hold: hold,
            _leaf: leaf,
            _root: root,
            _files: files,
        };
        stack.wait_ready(Duration::from_secs(60)).await?;
        Ok(stack)
    }

    /// The target of `route`.
    pub fn target(&self, route: Route) -> &Target {
        match route {
            Route::Direct => &self.direct,
            Route::Limit => &self.limit,
            Route::Relayed => &self.relayed,
        }
    }

    /// The process that relays `route`, if any.
    pub fn relay_pid(&self, route: Route) -> Option<u32> {
        match route {
            Route::Direct => None,
            Route::Limit => Some(self.reference.pid),
            Route::Relayed => Some(self.relaylet.pid),
        }
    }

    /// Waits until every route runs `true` and relaylet reaches the hold leaf.
    async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        for route in Route::ALL {
            loop {
                let attempt = async {
                    super::client::exec_true(self.target(route), &self.pod).await?;
                    if route == Route::Relayed {
                        super::client::open_idle(self.target(route), &self.hold_pod).await?;
                        super::client::exec_true(self.target(route), &self.proxied_pod).await?;
                    }
                    anyhow::Ok(())
                };
                match attempt.await {
                    Ok(()) => break,
                    Err(err) if tokio::time::Instant::now() > deadline => {
                        return Err(err.context(format!(
                            "{route:?} route not ready within {within:?} (relaylet log: {})",
                            self.relaylet.log.display()
                        )));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
        Ok(())
    }

    /// Stops both child processes (the clusters stop when dropped).
    pub async fn stop(self) {
        self.relaylet.stop().await;
        self.reference.stop().await;
    }
}

/// The bench pod: `main` serves bulk bytes for port-forward (and hosts the exec commands);
/// `logs` writes `log_bytes` of 100-byte lines and then idles.
fn bench_pod(log_bytes: u64) -> SimPod {
    let line = "x".repeat(99);
    SimPod {
        namespace: "default".into(),
        name: "bench".into(),
        containers: vec![
            SimContainer {
                name: "main".into(),
                command: vec!["python3".into(), "-u".into(), "-c".into(), SENDER.into()],
                ports: vec![SENDER_PORT],
                ..Default::default()
            },
            SimContainer {
                name: "logs".into(),
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    format!("yes {line} | head -c {log_bytes}; exec sleep infinity"),
                ],
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Creates namespace `name` in `cluster`.
pub(super) fn create_namespace(cluster: &Cluster, name: &str) -> anyhow::Result<()> {
    cluster
        .api
        .store()
        .create_typed(&Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        })
        .map_err(|e| anyhow::anyhow!("creating namespace {name}: {e}"))?;
    Ok(())
}

fn log_file(path: &Path) -> anyhow::Result<(Stdio, Stdio)> {
    let file = std::fs::File::create(path)?;
    Ok((Stdio::from(file.try_clone()?), Stdio::from(file)))
}

/// relaylet as in a real install (env vars, a root kubeconfig for `user`, serving cert files),
/// ready to start in a process of its own: this binary's hidden `serve`, the same library call
/// (`relaylet::serve`) as the product binary's; one replica, its log in `dir`. The caller adds
/// what its benchmark needs. With its node server's port and the log's path.
pub(super) fn relaylet_command(
    root: &Cluster,
    dir: &Path,
    user: &str,
) -> anyhow::Result<(Command, u16, PathBuf)> {
    let kubeconfig = dir.join("root.kubeconfig");
    write(&kubeconfig, &root.kubeconfig(user, &["system:masters"])?)?;
    let serving = root.ca.issue_server(&["127.0.0.1"])?;
    let (cert, key) = (dir.join("relaylet.crt"), dir.join("relaylet.key"));
    write(&cert, &serving.cert_pem)?;
    write(&key, &serving.key_pem)?;
    // A child process told its port by number: see relaylet_sim::ports.
    let port = relaylet_sim::ports::free_loopback_port()?.port();
    let log = dir.join("relaylet.log");
    let (out, err) = log_file(&log)?;
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", &kubeconfig)
        .env("LEAF_NODE_IP", "127.0.0.1")
        .env("NODE_SERVER_PORT", port.to_string())
        .env("AUTH_MODE", "webhook")
        .env("APISERVER_CERT_LOCATION", &cert)
        .env("APISERVER_KEY_LOCATION", &key)
        .env("POD_NAME", "relaylet-0")
        .env("POD_NAMESPACE", NAMESPACE)
        .env("LEADER_ELECT", "false")
        .env(
            "RUST_LOG",
            std::env::var("RELAYLET_BENCH_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true);
    Ok((command, port, log))
}

/// relaylet for the data-path figures: it makes no leaf pods (the benchmark does, as another
/// syncer would), caps above what the figures open.
async fn spawn_relaylet(root: &Cluster, dir: &Path) -> anyhow::Result<(ChildProcess, SocketAddr)> {
    let (mut command, port, log) = relaylet_command(root, dir, RELAYLET_USER)?;
    let child = command
        .env("LEAF_POD_SYNC", "false")
        // Its own operations port, and caps above the 10,000 sessions the memory figure opens
        // from one client address as one user, in one namespace.
        .env("METRICS_ADDR", "127.0.0.1:0")
        .env("MAX_CONNECTIONS", "40000")
        .env("MAX_CONNECTIONS_PER_CLIENT", "40000")
        .env("MAX_SESSIONS", "40000")
        .env("MAX_SESSIONS_PER_USER", "40000")
        .env("MAX_SESSIONS_PER_NAMESPACE", "40000")
        .spawn()
        .context("starting relaylet serve")?;
    let pid = child.id().context("relaylet exited at once")?;
    Ok((
        ChildProcess { pid, child, log },
        SocketAddr::from(([127, 0, 0, 1], port)),
    ))
}

/// `relaylet-dev bench-relay` fixed on the leaf apiserver, with a leaf admin client certificate.
async fn spawn_reference(leaf: &Cluster, dir: &Path) -> anyhow::Result<(ChildProcess, SocketAddr)> {
    let serving = leaf.ca.issue_server(&["127.0.0.1"])?;
    let client = leaf.ca.issue_client("bench-relay", &["system:masters"])?;
    let args = RelayArgs {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        cert: dir.join("relay.crt"),
        key: dir.join("relay.key"),
        target: leaf
            .api
            .url()
            .trim_start_matches("https://")
            .parse()
            .context("leaf apiserver address")?,
        ca: dir.join("leaf-ca.crt"),
        client_cert: dir.join("relay-client.crt"),
        client_key: dir.join("relay-client.key"),
    };
    write(&args.cert, &serving.cert_pem)?;
    write(&args.key, &serving.key_pem)?;
    write(&args.ca, &leaf.ca.cert_pem())?;
    write(&args.client_cert, &client.cert_pem)?;
    write(&args.client_key, &client.key_pem)?;
    let log = dir.join("bench-relay.log");
    let err = std::fs::File::create(&log)?;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("bench-relay")
        .args(args.to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err))
        .kill_on_drop(true)
        .spawn()
        .context("starting bench-relay")?;
    let pid = child.id().context("bench-relay exited at once")?;
    let stdout = child.stdout.take().context("bench-relay stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("bench-relay did not start in time")??
        .context("bench-relay exited before listening")?;
    let addr: SocketAddr = line
        .strip_prefix(READY_PREFIX)
        .with_context(|| format!("unexpected bench-relay output {line:?}"))?
        .parse()
        .context("bench-relay address")?;
    Ok((ChildProcess { pid, child, log }, addr))
}

//! The local sandbox: simulated root and leaf clusters with the real relaylet between them,
//! wired exactly as in a real install, ready for the user's own `kubectl`.
//!
//! - a root cluster whose apiserver prefers `InternalDNS` node addresses (the Kosmos setting)
//!   and presents a kubelet client certificate, like kube-apiserver's `--kubelet-client-*`;
//! - leaf clusters `leaf-1`, `leaf-2`, each with one node whose kubelet stand-in runs real
//!   local processes;
//! - relaylet configured by the same env vars as in a cluster (`AUTH_MODE=webhook`, a serving
//!   certificate from files, the client CA read from the root), given the leaves as labelled
//!   kubeconfig Secrets, with its own least-privilege identity in each cluster;
//! - demo pods `demo-1` (leaf-1) and `demo-2` (leaf-2), container `main` logging a line a second
//!   and serving HTTP on container port 8080, created in the root on the virtual nodes and run
//!   in the leaves by relaylet, as a user's pods are;
//! - a metrics-server stand-in in every cluster, so `kubectl top` shows the processes' real CPU
//!   and memory through the production path: leaf kubelets' `/metrics/resource` → the leaf's
//!   `metrics.k8s.io` → relaylet's `/metrics/resource` per virtual node → the root's
//!   `metrics.k8s.io`.
//!
//! Tests start the same thing through [`Sandbox::start`]. Inside: `leaf_proxy` (the proxies of
//! leaves reached only through one) and `replica_pod` (the Running Pod each replica's leader
//! election asks for).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use relaylet_sim::apiserver::{Policy, Rule, UserInfo};
use relaylet_sim::cluster::{Cluster, ClusterOptions, METRICS_SERVER_USER, SimContainer, SimPod};
use relaylet_sim::metrics_server::MetricsServer;

pub mod leaf_proxy;
pub mod replica_pod;

use leaf_proxy::{LeafProxyKind, TestProxy};

use relaylet::Running;
use relaylet::config::Config;
use relaylet::ops::Shutdown;

/// The namespace relaylet runs in, in the root cluster: the one README's install and
/// `deploy/relaylet.yaml` use.
pub const RELAYLET_NAMESPACE: &str = "relaylet";
/// relaylet's identity in the root cluster: the chart's ServiceAccount.
pub const RELAYLET_ROOT_USER: &str = "system:serviceaccount:relaylet:relaylet";
/// The chart rendered with its default values (`deploy/render.sh`; tests/it/chart.rs keeps it equal
/// to the chart): the sandbox's root grants relaylet exactly the RBAC it holds.
pub const ROOT_MANIFEST: &str = include_str!("../../../deploy/relaylet.yaml");
/// relaylet's identity in each leaf cluster: the ServiceAccount `deploy/leaf-rbac.yaml` makes.
pub const RELAYLET_LEAF_USER: &str = "system:serviceaccount:relaylet:relaylet-leaf";

/// The leaf-side RBAC relaylet ships; the sandbox's leaves enforce exactly its rules.
pub const LEAF_RBAC_MANIFEST: &str = include_str!("../../../deploy/leaf-rbac.yaml");

/// The labelled Secret in `namespace` that registers leaf `name` (virtual node
/// `relaylet-<name>`) with `kubeconfig`: exactly how a user adds a leaf.
pub fn leaf_secret(namespace: &str, name: &str, kubeconfig: &str) -> Secret {
    leaf_secret_with(
        namespace,
        name,
        BTreeMap::from([(
            relaylet::leaf::KUBECONFIG_KEY.to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )]),
    )
}

/// [`leaf_secret`] with `data` as its keys (the kubeconfig and, say, a proxy's CA).
pub fn leaf_secret_with(namespace: &str, name: &str, data: BTreeMap<String, ByteString>) -> Secret {
    Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(format!("leaf-{name}")),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                relaylet::config::DEFAULT_LEAF_SECRET_LABEL.to_string(),
                name.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// What `relaylet-dev sandbox --help` prints.
pub const SANDBOX_USAGE: &str = "usage: relaylet-dev sandbox [--kubeconfig-out PATH]

Starts a simulated root cluster and two leaf clusters on loopback with the real relaylet
between them, and prints an `export KUBECONFIG=...` line for your kubectl. Ctrl-C stops it.

  --kubeconfig-out PATH  where to write the root cluster's admin kubeconfig
                         (default: target/sandbox/kubeconfig)
  -h, --help             this text";

/// Command-line options of `relaylet-dev sandbox`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Where to write the root cluster's kubeconfig.
    pub kubeconfig_out: Option<PathBuf>,
    /// Print the usage and stop.
    pub help: bool,
}

impl Options {
    pub fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--kubeconfig-out" => {
                    let path = args
                        .next()
                        .ok_or_else(|| anyhow::anyhow!("--kubeconfig-out needs a path"))?;
                    options.kubeconfig_out = Some(path.into());
                }
                "-h" | "--help" => options.help = true,
                other => {
                    anyhow::bail!("unknown sandbox option {other:?}\n\n{SANDBOX_USAGE}")
                }
            }
        }
        Ok(options)
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct Settings {
    pub leaves: Vec<String>,
    /// Extra env vars for relaylet (e.g. a short `STREAM_IDLE_TIMEOUT` in tests).
    pub env: BTreeMap<String, String>,
    /// Extra pods to create in each leaf (and mirror in the root), besides the demo pods.
    pub pods: Vec<(String, SimPod)>,
    /// Extra authorization rules for the root cluster (its RBAC).
    pub root_rules: Vec<Rule>,
    /// Bearer tokens the root cluster accepts (its token authenticator).
    pub root_tokens: Vec<(String, UserInfo)>,
    /// The leaf ClusterRole's rules; `None` uses `deploy/leaf-rbac.yaml` as shipped.
    pub leaf_rules: Option<Vec<PolicyRule>>,
    /// How often the metrics-server stand-ins scrape (`--metric-resolution`); `None` runs none
    /// (tests that write `metrics.k8s.io` objects themselves).
    pub metrics_resolution: Option<Duration>,
    /// Leaves reached only through a proxy (`sandbox::leaf_proxy`): their Secret's `server` is a
    /// name nothing but the proxy resolves.
    pub leaf_proxies: BTreeMap<String, LeafProxyKind>,
}

/// The sandbox's metrics-server resolution: the shortest metrics-server accepts, so `kubectl
/// top` has numbers about 30 s after start (two scrapes in the leaf, then two in the root).
pub const METRICS_RESOLUTION: Duration = Duration::from_secs(10);

impl Default for Settings {
    fn default() -> Self {
        Settings {
            leaves: vec!["leaf-1".to_string(), "leaf-2".to_string()],
            env: BTreeMap::new(),
            pods: Vec::new(),
            root_rules: Vec::new(),
            root_tokens: Vec::new(),
            leaf_rules: None,
            metrics_resolution: Some(METRICS_RESOLUTION),
            leaf_proxies: BTreeMap::new(),
        }
    }
}

/// A running sandbox; everything stops when it is dropped.
pub struct Sandbox {
    pub root: Cluster,
    pub leaves: HashMap<String, Cluster>,
    pub relaylet: Running,
    pub config: Config,
    pub shutdown: Shutdown,
    /// The proxies of the leaves in `Settings::leaf_proxies`, by leaf name.
    pub proxies: HashMap<String, TestProxy>,
    /// The clusters' metrics-server stand-ins (stopped when dropped).
    _metrics_servers: Vec<MetricsServer>,
    files: tempfile::TempDir,
}

impl Sandbox {
    /// Starts root, leaves, relaylet and the pods, and waits until every virtual node is Ready.
    pub async fn start(settings: Settings) -> anyhow::Result<Sandbox> {
        let files = tempfile::Builder::new()
            .prefix("relaylet-sandbox-")
            .tempdir()?;
        let mut root_options = ClusterOptions::new("root");
        // Kosmos installs put InternalDNS first: the first address of that type is relaylet's.
        root_options.preferred_address_types = [
            "InternalDNS",
            "InternalIP",
            "Hostname",
            "ExternalDNS",
            "ExternalIP",
        ]
        .map(String::from)
        .to_vec();
        let mut rules = root_rules()?;
        rules.extend(settings.root_rules.clone());
        root_options.policy = Policy::new(rules);
        root_options.tokens = settings.root_tokens.clone();
        let root = Cluster::start(root_options)
            .await
            .context("starting the root cluster")?;
        let store = root.api.store();
        store
            .create_typed(&namespace(RELAYLET_NAMESPACE))
            .map_err(|e| anyhow::anyhow!("creating namespace {RELAYLET_NAMESPACE}: {e}"))?;

        let mut leaves = HashMap::new();
        let mut proxies = HashMap::new();
        for name in &settings.leaves {
            let mut options = ClusterOptions::new(name);
            let leaf_rules = match &settings.leaf_rules {
                Some(rules) => rules.clone(),
                None => leaf_rbac_rules()?,
            };
            options.policy = leaf_policy(&leaf_rules);
            let leaf = Cluster::start(options)
                .await
                .with_context(|| format!("starting leaf {name}"))?;
            leaf.add_node(&format!("{name}-node"))
                .await
                .with_context(|| format!("starting the node of leaf {name}"))?;
            let secret = leaf_secret_with(
                RELAYLET_NAMESPACE,
                name,
                leaf_secret_data(&leaf, settings.leaf_proxies.get(name), &mut proxies, name)
                    .await?,
            );
            store
                .create_typed(&secret)
                .map_err(|e| anyhow::anyhow!("creating the Secret of leaf {name}: {e}"))?;
            leaves.insert(name.clone(), leaf);
        }

        // relaylet's serving certificate, as cert-manager or an operator would provide it.
        let serving = root.ca.issue_server(&["127.0.0.1", "localhost"])?;
        let cert_path = files.path().join("tls.crt");
        let key_path = files.path().join("tls.key");
        write_private(&cert_path, &serving.cert_pem)?;
        write_private(&key_path, &serving.key_pem)?;

        let mut env: BTreeMap<String, String> = BTreeMap::from([
            ("LEAF_NODE_IP".into(), "127.0.0.1".into()),
            // Any free port; the Nodes name the one bound.
            ("NODE_SERVER_PORT".into(), "0".into()),
            ("PREFERRED-ADDRESS-TYPE".into(), "InternalDNS".into()),
            ("AUTH_MODE".into(), "webhook".into()),
            (
                "APISERVER_CERT_LOCATION".into(),
                cert_path.display().to_string(),
            ),
            (
                "APISERVER_KEY_LOCATION".into(),
                key_path.display().to_string(),
            ),
            ("POD_NAME".into(), "relaylet-0".into()),
            ("POD_NAMESPACE".into(), RELAYLET_NAMESPACE.into()),
            // As the chart sets it: the Deployment's selector.
            (
                "REPLICA_SELECTOR".into(),
                crate::sandbox::replica_pod::selector(),
            ),
            // Port 0: several sandboxes (tests) may run at once; relaylet reports the bound
            // address (`Running::metrics_addr`).
            ("METRICS_ADDR".into(), "127.0.0.1:0".into()),
        ]);
        env.extend(settings.env.clone());
        if env
            .get("LEADER_ELECT")
            .is_some_and(|v| v == "false" || v == "0")
        {
            // A single replica has no peers to tell apart (relaylet refuses the selector).
            env.remove("REPLICA_SELECTOR");
        }
        let config = Config::from_lookup(|name| env.get(name).cloned())?;
        if config.leader_elect {
            // relaylet's own Pod, as its Deployment makes it: with leader election a replica
            // counts only as a Running pod its selector finds.
            let admin = kube_client(&root.admin_kubeconfig()?).await?;
            crate::sandbox::replica_pod::running(
                &admin,
                RELAYLET_NAMESPACE,
                &config.replica_name(),
                &config.leaf_node_ip.to_string(),
            )
            .await?;
        }
        let root_client = kube_client(&root.kubeconfig(RELAYLET_ROOT_USER, &[])?).await?;
        let shutdown = Shutdown::default();
        let relaylet = relaylet::start(config.clone(), root_client, shutdown.clone())
            .await
            .context("starting relaylet")?;

        // Each virtual node's own kubelet port is bound once relaylet takes its Node. Wait for
        // them before starting pods: the pods' ports are picked free-then-bound by the kubelet
        // stand-in, and must not race relaylet for the same number.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while relaylet.node_ports.all().len() < settings.leaves.len() {
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("relaylet did not open a kubelet port for every virtual node");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let mut metrics_servers = Vec::new();
        if let Some(resolution) = settings.metrics_resolution {
            for cluster in leaves.values().chain([&root]) {
                metrics_servers.push(cluster.start_metrics_server(resolution)?);
            }
        }
        let sandbox = Sandbox {
            root,
            leaves,
            relaylet,
            config,
            shutdown,
            proxies,
            _metrics_servers: metrics_servers,
            files,
        };
        for (index, name) in settings.leaves.iter().enumerate() {
            sandbox
                .add_pod(name, &demo_pod(&format!("demo-{}", index + 1)))
                .await?;
        }
        for (leaf, pod) in &settings.pods {
            sandbox.add_pod(leaf, pod).await?;
        }
        sandbox.wait_ready(Duration::from_secs(30)).await?;
        for (index, name) in settings.leaves.iter().enumerate() {
            sandbox
                .wait_serving(
                    name,
                    &format!("demo-{}", index + 1),
                    Duration::from_secs(30),
                )
                .await?;
        }
        Ok(sandbox)
    }

    /// Waits until demo pod `pod` in leaf `leaf` has logged its first line: it prints only
    /// after its HTTP socket is listening, so port-forward tests can use it at once.
    async fn wait_serving(&self, leaf: &str, pod: &str, within: Duration) -> anyhow::Result<()> {
        let cluster = self
            .leaves
            .get(leaf)
            .ok_or_else(|| anyhow::anyhow!("no leaf {leaf} in the sandbox"))?;
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(kube_client(&cluster.admin_kubeconfig()?).await?, "default");
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Ok(log) = pods.logs(pod, &Default::default()).await
                && !log.is_empty()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("demo pod {pod} in {leaf} did not start within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Creates `pod` in the root bound to leaf `leaf`'s virtual node, as a user (or a
    /// controller the root's scheduler placed) would: relaylet runs it in the leaf. With
    /// `LEAF_POD_SYNC=false` it plays the other syncer too: the root pod is shown and its copy
    /// made in the leaf, marked with the root pod's UID ([`sync_pod`]).
    pub async fn add_pod(&self, leaf: &str, pod: &SimPod) -> anyhow::Result<()> {
        let cluster = self
            .leaves
            .get(leaf)
            .ok_or_else(|| anyhow::anyhow!("no leaf {leaf} in the sandbox"))?;
        if self.config.leaf_pod_sync {
            let admin = kube_client(&self.root.admin_kubeconfig()?).await?;
            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::namespaced(admin, &pod.namespace);
            pods.create(
                &Default::default(),
                &root_pod(pod, &self.config.node_name(leaf))?,
            )
            .await
            .with_context(|| format!("creating pod {}/{} in the root", pod.namespace, pod.name))?;
            return Ok(());
        }
        sync_pod(
            &self.root,
            &self.config.node_name(leaf),
            cluster,
            &format!("{leaf}-node"),
            pod,
        )
        .await
    }

    /// Waits until every leaf's virtual node exists and is Ready.
    async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        for leaf in self.leaves.keys() {
            let name = self.config.node_name(leaf);
            loop {
                let ready = self
                    .root
                    .api
                    .store()
                    .get_typed::<Node>("", &name)
                    .ok()
                    .and_then(|n| n.status?.conditions)
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if ready {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    anyhow::bail!("virtual node {name} did not become Ready within {within:?}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Writes an admin kubeconfig for the root cluster to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        write_private(path, &self.root.admin_kubeconfig()?)
    }

    /// Where the sandbox keeps its files.
    pub fn files(&self) -> &Path {
        self.files.path()
    }
}

/// Runs the sandbox until Ctrl-C.
pub async fn run(options: Options) -> anyhow::Result<()> {
    let sandbox = Sandbox::start(Settings::default()).await?;
    let path = match options.kubeconfig_out {
        Some(path) => path,
        None => default_kubeconfig_path(),
    };
    sandbox.write_kubeconfig(&path)?;
    println!(
        "relaylet-dev sandbox ready: root apiserver {}, relaylet on {}, leaves {}",
        sandbox.root.api.url(),
        sandbox.relaylet.addr,
        {
            let mut names: Vec<_> = sandbox.leaves.keys().cloned().collect();
            names.sort();
            names.join(", ")
        }
    );
    println!(
        "  relaylet metrics: http://{}/metrics (health: /livez /readyz)",
        sandbox.relaylet.metrics_addr
    );
    for (node, addr) in sandbox.relaylet.node_ports.all() {
        println!(
            "  virtual node {node}: own kubelet port {addr} (/metrics/resource, /stats/summary, /pods)"
        );
    }
    println!("  export KUBECONFIG={}", path.display());
    println!(
        "  kubectl get nodes -o wide; kubectl exec -it demo-1 -- sh; kubectl logs -f demo-2; kubectl port-forward demo-1 8080:8080"
    );
    println!(
        "  kubectl top pod; kubectl top node  (metrics-server stand-ins scrape every {}s: numbers after about 30 s)",
        METRICS_RESOLUTION.as_secs()
    );
    println!("Ctrl-C stops everything.");
    tokio::signal::ctrl_c().await?;
    sandbox.shutdown.begin.cancel();
    sandbox.shutdown.sessions.cancel();
    Ok(())
}

fn default_kubeconfig_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"));
    target.join("sandbox").join("kubeconfig")
}

/// Does what a multi-cluster syncer does for `pod`: shows it in `root` on virtual node
/// `virtual_node`, then runs its copy on `leaf_node` of `leaf`, marked with the root pod's UID
/// (`counterpart::ROOT_UID_MARKER`) so relaylet can prove the copy is the root pod's.
pub async fn sync_pod(
    root: &Cluster,
    virtual_node: &str,
    leaf: &Cluster,
    leaf_node: &str,
    pod: &SimPod,
) -> anyhow::Result<()> {
    let root_pod = root.add_pod(virtual_node, pod).await?;
    let uid = root_pod
        .metadata
        .uid
        .ok_or_else(|| anyhow::anyhow!("root pod {} has no UID", pod.name))?;
    let mut copy = pod.clone();
    copy.annotations.insert(
        relaylet::model::counterpart::ROOT_UID_MARKER.to_string(),
        uid,
    );
    leaf.add_pod(leaf_node, &copy).await?;
    Ok(())
}

/// `pod` as a user writes it, bound to virtual node `node` (the sandbox's root has no
/// scheduler).
pub fn root_pod(pod: &SimPod, node: &str) -> anyhow::Result<k8s_openapi::api::core::v1::Pod> {
    let containers: Vec<serde_json::Value> = pod
        .containers
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name,
                "image": "busybox:1.36",
                "command": c.command,
                "env": c.env.iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect::<Vec<_>>(),
                "ports": c.ports.iter().map(|p| serde_json::json!({"containerPort": p})).collect::<Vec<_>>(),
                "resources": {"requests": c.requests},
                "stdin": c.stdin,
                "tty": c.tty,
            })
        })
        .collect();
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "labels": pod.labels,
            "annotations": pod.annotations,
        },
        "spec": {"nodeName": node, "containers": containers},
    }))?)
}

/// The demo pod: logs a line a second and serves HTTP on container port 8080.
pub fn demo_pod(name: &str) -> SimPod {
    const APP: &str = r#"
import datetime, http.server, os, sys, threading, time
name = os.environ.get("POD_NAME", "demo")
port = int(os.environ["PORT_8080"])
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from %s\n" % name).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Hello)
threading.Thread(target=server.serve_forever, daemon=True).start()
n = 0
while True:
    print("%s tick %d" % (name, n), flush=True)
    n += 1
    time.sleep(1)
"#;
    SimPod {
        namespace: "default".to_string(),
        name: name.to_string(),
        labels: BTreeMap::from([("app".to_string(), "demo".to_string())]),
        containers: vec![SimContainer {
            name: "main".to_string(),
            command: vec!["python3".into(), "-u".into(), "-c".into(), APP.into()],
            env: vec![("POD_NAME".to_string(), name.to_string())],
            ports: vec![8080],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// What relaylet may do in the root cluster: the rules of every ClusterRole and Role in
/// `deploy/relaylet.yaml` (all of them are bound to relaylet's ServiceAccount), each Role's
/// only in its namespace, plus `system:masters` for the admin. Discovery is every
/// authenticated user's, as upstream's bootstrap roles make it.
fn root_rules() -> anyhow::Result<Vec<Rule>> {
    let mut rules = vec![
        Rule::group("system:masters")
            .verbs(&["*"])
            .api_groups(&["*"])
            .resources(&["*"]),
        Rule::group("system:masters")
            .verbs(&["*"])
            .non_resource_urls(&["*"]),
    ];
    // metrics-server's own ClusterRole (`system:metrics-server` in its manifests): what relaylet's
    // authorization asks the root about when the stand-in scrapes a virtual node.
    rules.push(
        Rule::user(METRICS_SERVER_USER)
            .verbs(&["get"])
            .api_groups(&[""])
            .resources(&["nodes/metrics"]),
    );
    rules.push(
        Rule::user(METRICS_SERVER_USER)
            .verbs(&["get", "list", "watch"])
            .api_groups(&[""])
            .resources(&["pods", "nodes"]),
    );
    for document in ROOT_MANIFEST.split("\n---\n") {
        let value: serde_json::Value =
            serde_saphyr::from_str(document).context("parsing deploy/relaylet.yaml")?;
        let namespaces = match value["kind"].as_str() {
            Some("ClusterRole") => Vec::new(),
            Some("Role") => vec![
                value["metadata"]["namespace"]
                    .as_str()
                    .context("a Role in deploy/relaylet.yaml without a namespace")?
                    .to_string(),
            ],
            _ => continue,
        };
        // A Role and a ClusterRole hold rules the same way.
        let role_rules: Vec<PolicyRule> = serde_json::from_value(value["rules"].clone())
            .context("reading a role of deploy/relaylet.yaml")?;
        rules.extend(role_rules.iter().map(|rule| Rule {
            namespaces: namespaces.clone(),
            ..rule_for(RELAYLET_ROOT_USER, rule)
        }));
    }
    Ok(rules)
}

/// An RBAC PolicyRule as the stand-in's rule for `user`.
fn rule_for(user: &str, rule: &PolicyRule) -> Rule {
    let strs = |v: &Option<Vec<String>>| v.clone().unwrap_or_default();
    Rule {
        users: vec![user.to_string()],
        verbs: rule.verbs.clone(),
        api_groups: strs(&rule.api_groups),
        resources: strs(&rule.resources),
        names: strs(&rule.resource_names),
        non_resource_urls: strs(&rule.non_resource_urls),
        ..Rule::default()
    }
}

/// The rules of the ClusterRole in `deploy/leaf-rbac.yaml`.
pub fn leaf_rbac_rules() -> anyhow::Result<Vec<PolicyRule>> {
    for document in LEAF_RBAC_MANIFEST.split("\n---\n") {
        let value: serde_json::Value =
            serde_saphyr::from_str(document).context("parsing deploy/leaf-rbac.yaml")?;
        if value["kind"] == "ClusterRole" {
            let role: ClusterRole =
                serde_json::from_value(value).context("reading the leaf ClusterRole")?;
            return Ok(role.rules.unwrap_or_default());
        }
    }
    anyhow::bail!("deploy/leaf-rbac.yaml has no ClusterRole")
}

/// What relaylet may do in a leaf cluster: `rules` bound to its leaf ServiceAccount (plus the
/// bootstrap discovery rules every authenticated user has, which the stand-in applies itself).
fn leaf_policy(rules: &[PolicyRule]) -> Policy {
    let mut policy = vec![
        Rule::group("system:masters")
            .verbs(&["*"])
            .api_groups(&["*"])
            .resources(&["*"]),
        Rule::group("system:masters")
            .verbs(&["*"])
            .non_resource_urls(&["*"]),
    ];
    policy.extend(rules.iter().map(|rule| rule_for(RELAYLET_LEAF_USER, rule)));
    Policy::new(policy)
}

fn namespace(name: &str) -> Namespace {
    Namespace {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A kube client from kubeconfig text.
pub async fn kube_client(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

/// The data of leaf `name`'s Secret: its kubeconfig for relaylet's leaf user, rewritten to go
/// through a new proxy of `behind` (kept in `proxies`) if given, and that proxy's keys.
async fn leaf_secret_data(
    leaf: &Cluster,
    behind: Option<&LeafProxyKind>,
    proxies: &mut HashMap<String, TestProxy>,
    name: &str,
) -> anyhow::Result<BTreeMap<String, ByteString>> {
    let kubeconfig = leaf.kubeconfig(RELAYLET_LEAF_USER, &[])?;
    let Some(kind) = behind else {
        return Ok(BTreeMap::from([(
            relaylet::leaf::KUBECONFIG_KEY.to_string(),
            ByteString(kubeconfig.into_bytes()),
        )]));
    };
    let behind = crate::sandbox::leaf_proxy::behind_proxy(kind, name, &kubeconfig, leaf.api.addr)
        .await
        .with_context(|| format!("putting leaf {name} behind a proxy"))?;
    let mut data = BTreeMap::from([(
        relaylet::leaf::KUBECONFIG_KEY.to_string(),
        ByteString(behind.kubeconfig.into_bytes()),
    )]);
    for (key, value) in behind.secret_keys {
        data.insert(key, ByteString(value));
    }
    if let Some(proxy) = behind.proxy {
        proxies.insert(name.to_string(), proxy);
    }
    Ok(data)
}

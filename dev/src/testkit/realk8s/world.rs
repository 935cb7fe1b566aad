//! relaylet installed into real clusters as a user installs it: the chart's ServiceAccount and
//! RBAC applied to the real root apiserver (and relaylet's env taken from the rendered chart),
//! each leaf reached through `deploy/leaf-rbac.yaml` and a Secret made by
//! `deploy/make-leaf-secret.sh`. A [`Setup`] says how the root dials nodes, which address type
//! relaylet advertises, how many replicas run and which leaves exist.
//!
//! Each replica gets its own loopback IP (127.0.0.2, .3, ...) as a pod gets its own IP, while
//! the leaf kubelets listen on 127.0.0.1: a root apiserver that dialled a leaf address instead
//! of relaylet's would find nothing there, so every passing exec also proves the address choice.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use super::harness::{self, ControlPlane, K8s, Options};

pub const RELAYLET_NAMESPACE: &str = "relaylet";
/// The root's real node, where the chart's pods run (`Setup::helm_replicas`).
pub const ROOT_NODE: &str = "root-node";

/// The root node's pod range: a /24 of 100.64.0.0/10 (shared address space, RFC 6598, never a
/// host's here), picked from the pid so that concurrent test processes route apart.
fn root_pod_cidr() -> String {
    let pid = std::process::id();
    format!("100.{}.{}.0/24", 64 + ((pid >> 8) & 0x3f), pid & 0xff)
}

/// The real leaf node's pod range when its pods call the root apiserver
/// (`Setup::pod_root_apiserver`): routed from this machine so the answers find them.
fn leaf_pod_cidr() -> String {
    let pid = std::process::id();
    format!("10.{}.{}.0/24", 128 + ((pid >> 8) & 0x3f), pid & 0xff)
}

/// How the clusters and relaylet are set up.
pub struct Setup {
    /// The root apiserver's `--kubelet-preferred-address-types`.
    pub root_address_order: &'static str,
    /// relaylet's `PREFERRED-ADDRESS-TYPE` (the chart's default when `None`).
    pub preferred_address_type: Option<&'static str>,
    /// relaylet replicas (leader election decides which one writes the Nodes).
    pub replicas: usize,
    /// Leaf cluster names; leaf `x` has node `x-node` and virtual node `relaylet-x`.
    pub leaves: &'static [&'static str],
    /// Extra env for relaylet, over the chart's.
    pub env: &'static [(&'static str, &'static str)],
    /// Chart values (`helm template --set`) for the RBAC and env relaylet gets.
    pub chart_values: &'static [&'static str],
    /// relaylet runs the virtual nodes' pods in the leaves (`podSync.enabled`); off, the test
    /// plays the other syncer ([`World::sync_pod`]).
    pub pod_sync: bool,
    /// With `pod_sync` and a real leaf node: the chart's `podSync.rootApiserver` is the root
    /// apiserver on that node's host end, where its pods reach it (their tokens the root's).
    pub pod_root_apiserver: bool,
    /// The root apiserver verifies kubelet serving certificates against its CA.
    pub verify_kubelet_certificates: bool,
    /// Each replica is a Pod object in the root (status.podIP = its address) and authenticates
    /// with a token bound to it, as a real pod's projected token is.
    pub replica_pods: bool,
    /// Wait in [`World::start`] until every virtual node is Ready (a replica whose certificate
    /// waits for approval by hand never writes one).
    pub wait_for_nodes: bool,
    /// Give replicas routable addresses (on the loopback interface, added by the world, see
    /// [`super::addresses`]) instead of loopback ones: the root apiserver's node proxy refuses
    /// to dial loopback ("address not allowed"). Needs root.
    pub routable_replicas: bool,
    /// The root cluster's Kubernetes version.
    pub root_version: K8s,
    /// The leaf clusters' Kubernetes version (apiserver and leafkubelet).
    pub leaf_version: K8s,
    /// Another address the root apiserver serves on: the host's end of the network namespace
    /// a test runs relaylet in ([`super::netns`]).
    pub root_also_on: Option<IpAddr>,
    /// Leaves whose kubelet declares `ExtendWebSocketsToKubelet` and translates WebSocket calls
    /// itself, as a 1.36+ kubelet does (1.37 leaves only).
    pub declaring_leaves: &'static [&'static str],
    /// Leaves whose node is a real kubelet with containerd ([`super::real_node`]) instead of a
    /// leafkubelet (at most one).
    pub real_node_leaves: &'static [&'static str],
    /// relaylet as it ships, instead of replicas in this process (`replicas` must be 0): the
    /// image built from the Dockerfile, installed with `helm install` (this many replicas, and
    /// `chart_values`) onto a real root node ([`World::root_node`]) whose kube-scheduler places
    /// the pods; each leaf's Secret names its apiserver as the pods reach it.
    pub helm_replicas: usize,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            root_address_order: "InternalDNS,Hostname,InternalIP,ExternalDNS,ExternalIP",
            preferred_address_type: None,
            replicas: 1,
            leaves: &["leaf-1"],
            env: &[],
            chart_values: &[],
            pod_sync: false,
            pod_root_apiserver: false,
            verify_kubelet_certificates: false,
            replica_pods: false,
            wait_for_nodes: true,
            routable_replicas: false,
            root_version: K8s::V1_35,
            leaf_version: K8s::V1_35,
            root_also_on: None,
            declaring_leaves: &[],
            real_node_leaves: &[],
            helm_replicas: 0,
        }
    }
}

/// One relaylet replica, running in this process.
pub struct Replica {
    pub ip: IpAddr,
    pub running: relaylet::Running,
    pub shutdown: relaylet::ops::Shutdown,
}

/// The clusters and relaylet.
pub struct World {
    /// The real nodes of `Setup::real_node_leaves`, by leaf; dropped before their clusters.
    pub real_nodes: BTreeMap<String, super::real_node::RealNode>,
    /// The root's real node, where the chart's pods run (`Setup::helm_replicas`).
    pub root_node: Option<super::real_node::RealNode>,
    pub root: ControlPlane,
    pub leaves: BTreeMap<String, ControlPlane>,
    /// Replicas by index; a stopped one is `None`.
    pub replicas: Mutex<Vec<Option<Replica>>>,
    root_kubeconfig: String,
    /// Per replica, when replicas are pods: a kubeconfig with the token bound to its Pod.
    replica_kubeconfigs: Vec<String>,
    /// The replicas whose Pod exists (`replica_pod`).
    replica_pods: Mutex<std::collections::BTreeSet<usize>>,
    config_env: BTreeMap<String, String>,
    /// Where the replicas' addresses come from.
    addresses: super::addresses::ReplicaAddresses,
    pub runtime: tokio::runtime::Runtime,
    pub dir: tempfile::TempDir,
}

pub fn repo() -> PathBuf {
    crate::workspace_root()
}

pub fn virtual_node(leaf: &str) -> String {
    format!("relaylet-{leaf}")
}

pub fn leaf_node(leaf: &str) -> String {
    format!("{leaf}-node")
}

impl World {
    pub fn start(setup: Setup) -> World {
        harness::announce(setup.root_version, setup.leaf_version);
        let dir = tempfile::Builder::new()
            .prefix("relaylet-real-k8s-")
            .tempdir()
            .expect("temp dir");
        // A world kept in a static is never dropped (nor is its TempDir): each run left ~370 MB
        // of etcd data and logs behind.
        crate::testkit::remove_at_exit(dir.path().to_path_buf());
        let addresses = if setup.routable_replicas {
            super::addresses::ReplicaAddresses::routable(setup.replicas)
        } else {
            super::addresses::ReplicaAddresses::Loopback
        };
        let chart = setup.helm_replicas > 0;
        assert!(
            !chart || setup.replicas == 0,
            "relaylet runs either as the chart's pods or in this process"
        );
        // The root node's namespace: the root apiserver and the leaf apiservers serve on its
        // host end, where the chart's pods reach them.
        let root_netns = chart.then(super::netns::Netns::create);
        let pods_reach = root_netns.as_ref().map(|n| n.host_ip);
        // The real leaf nodes' namespaces, made first when their pods reach the root apiserver
        // on their host end (it serves there, its certificate naming the address).
        let mut leaf_netns: BTreeMap<&str, super::netns::Netns> = setup
            .real_node_leaves
            .iter()
            .map(|name| (*name, super::netns::Netns::create()))
            .collect();
        let leaf_pods_reach: Vec<IpAddr> = if setup.pod_root_apiserver {
            leaf_netns.values().map(|n| n.host_ip).collect()
        } else {
            Vec::new()
        };
        let mut root = ControlPlane::start(
            dir.path(),
            Options {
                name: "root".into(),
                preferred_address_types: setup.root_address_order.into(),
                controller_manager: true,
                verify_kubelet_certificates: setup.verify_kubelet_certificates,
                version: setup.root_version,
                also_serve_on: setup
                    .root_also_on
                    .into_iter()
                    .chain(pods_reach)
                    .chain(leaf_pods_reach.iter().copied())
                    .collect(),
            },
        );
        root.kubectl_ok(&["create", "namespace", RELAYLET_NAMESPACE]);
        let mut sets = chart_sets(setup.chart_values);
        sets.extend([
            "--set".to_string(),
            format!("podSync.enabled={}", setup.pod_sync),
        ]);
        if let Some(ip) = leaf_pods_reach.first() {
            let port = root
                .url
                .rsplit(':')
                .next()
                .expect("the root URL has a port");
            sets.extend([
                "--set".to_string(),
                format!("podSync.rootApiserver=https://{ip}:{port}"),
            ]);
        }
        if !chart {
            // relaylet's ServiceAccount, RBAC and CRD exactly as the chart renders them.
            let mut show = vec![
                "--show-only",
                "templates/serviceaccount.yaml",
                "--show-only",
                "templates/rbac.yaml",
                "--show-only",
                "templates/crd-leafclusters.yaml",
            ];
            show.extend(sets.iter().map(String::as_str));
            let rendered = helm_template(&show);
            root.kubectl_stdin_ok(&["apply", "-f", "-"], Some(&rendered));
        }

        let mut leaves = BTreeMap::new();
        let mut real_nodes = BTreeMap::new();
        assert!(
            setup.real_node_leaves.len() <= 1,
            "at most one real leaf node"
        );
        for name in setup.leaves {
            let netns = leaf_netns.remove(name);
            let mut leaf = ControlPlane::start(
                dir.path(),
                Options {
                    name: name.to_string(),
                    preferred_address_types: "InternalIP,Hostname".into(),
                    // Pods relaylet runs there need what every real cluster has: service
                    // accounts, their tokens and the root CA ConfigMap (the controller-manager),
                    // and a scheduler for the copies (below).
                    controller_manager: setup.pod_sync,
                    verify_kubelet_certificates: false,
                    version: setup.leaf_version,
                    // The real node's kubelet reaches its apiserver on the host's end, and so
                    // do the chart's pods on theirs.
                    also_serve_on: netns
                        .as_ref()
                        .map(|n| n.host_ip)
                        .into_iter()
                        .chain(pods_reach)
                        .collect(),
                },
            );
            match netns {
                Some(netns) => {
                    let pods = if setup.pod_root_apiserver {
                        super::real_node::Pods::Routed(leaf_pod_cidr())
                    } else {
                        super::real_node::Pods::Private
                    };
                    let node =
                        super::real_node::RealNode::start(&mut leaf, &leaf_node(name), netns, pods);
                    real_nodes.insert(name.to_string(), node);
                }
                None => leaf.add_kubelet(&leaf_node(name), setup.declaring_leaves.contains(name)),
            }
            if setup.pod_sync {
                leaf.start_scheduler(&super::real_node::built().1.join("kube-scheduler"));
            }
            let server: Vec<String> = match pods_reach {
                Some(ip) => vec![
                    "--leaf-server".into(),
                    leaf.url.replace("127.0.0.1", &ip.to_string()),
                ],
                None => Vec::new(),
            };
            connect_leaf(dir.path(), &root, &leaf, name, &server);
            leaves.insert(name.to_string(), leaf);
        }
        let root_node = root_netns.map(|netns| {
            let node = super::real_node::RealNode::start(
                &mut root,
                ROOT_NODE,
                netns,
                super::real_node::Pods::Routed(root_pod_cidr()),
            );
            root.start_scheduler(&super::real_node::built().1.join("kube-scheduler"));
            node.import_image(crate::testkit::image::built());
            node
        });

        // relaylet's env from the rendered chart; what the downward API gives a pod is given
        // per replica, and all replicas share the kubelet port as pods do.
        let mut config_env = chart_env(&sets);
        if let Some(t) = setup.preferred_address_type {
            config_env.insert("PREFERRED-ADDRESS-TYPE".into(), t.into());
        }
        config_env.insert("POD_NAMESPACE".into(), RELAYLET_NAMESPACE.into());
        config_env.insert("NODE_SERVER_PORT".into(), harness::free_port().to_string());
        for (k, v) in setup.env {
            config_env.insert(k.to_string(), v.to_string());
        }
        // relaylet's root identity: the chart's ServiceAccount (the chart's pods have their own
        // projected tokens).
        let root_kubeconfig = if chart {
            String::new()
        } else {
            token_kubeconfig(&root, relaylet_token(&root, &[]).trim())
        };
        // Every replica has its Pod, Running at its address: with leader election relaylet
        // counts a replica only as a live pod its selector (the chart's) finds.
        let pod_uids: Vec<String> = (0..setup.replicas)
            .map(|i| replica_pod(&root, i, addresses.ip(i)))
            .collect();
        let replica_kubeconfigs = if setup.replica_pods {
            pod_uids
                .iter()
                .enumerate()
                .map(|(i, uid)| token_kubeconfig(&root, &pod_bound_token(&root, i, uid)))
                .collect()
        } else {
            Vec::new()
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let world = World {
            real_nodes,
            root_node,
            root,
            leaves,
            replicas: Mutex::new(Vec::new()),
            root_kubeconfig,
            replica_kubeconfigs,
            replica_pods: Mutex::new((0..setup.replicas).collect()),
            config_env,
            addresses,
            runtime,
            dir,
        };
        for i in 0..setup.replicas {
            let replica = world.start_replica(i);
            world.replicas.lock().expect("replicas").push(Some(replica));
        }
        if chart {
            world.helm_install(setup.helm_replicas, &sets);
        }
        if setup.wait_for_nodes {
            world.wait_for_nodes(setup.leaves);
        }
        world
    }

    /// Waits until the virtual node of each of `leaves` is Ready.
    pub fn wait_for_nodes(&self, leaves: &[&str]) {
        for leaf in leaves {
            self.wait_for_node_ready(&virtual_node(leaf));
        }
    }

    /// `helm install` of the chart from the image imported into the root node, `replicas` pods
    /// and `sets` (`--set` pairs) over its defaults; waits until the Deployment has rolled out
    /// (its pods Running and Ready on the real kubelet).
    fn helm_install(&self, replicas: usize, sets: &[String]) {
        let mut args: Vec<String> = vec![
            "install".into(),
            "relaylet".into(),
            repo().join("charts/relaylet").display().to_string(),
            "--namespace".into(),
            RELAYLET_NAMESPACE.into(),
        ];
        let (repository, tag) = crate::testkit::image::IMAGE
            .rsplit_once(':')
            .expect("the image has a tag");
        for set in [
            format!("image.repository={repository}"),
            format!("image.tag={tag}"),
            "image.pullPolicy=Never".to_string(),
            format!("replicaCount={replicas}"),
        ] {
            args.extend(["--set".to_string(), set]);
        }
        args.extend(sets.iter().cloned());
        self.helm(&args);
        self.wait_for_rollout();
    }

    /// Runs helm with the root's admin kubeconfig; its stdout. Panics with its error.
    pub fn helm(&self, args: &[String]) -> String {
        let helm = relaylet_sim::tools::helm().expect("helm: run tests/tools/install.sh");
        let out = Command::new(helm)
            .args(args)
            .env("KUBECONFIG", &self.root.admin_kubeconfig)
            .output()
            .expect("helm runs");
        assert!(
            out.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the chart's Deployment has rolled out: every replica updated, Running and
    /// Ready. On a timeout, the pods and their events say why.
    pub fn wait_for_rollout(&self) {
        let out = Command::new(harness::kubectl_path())
            .args([
                "rollout",
                "status",
                "deployment/relaylet",
                "-n",
                RELAYLET_NAMESPACE,
                "--timeout=180s",
            ])
            .env("KUBECONFIG", &self.root.admin_kubeconfig)
            .output()
            .expect("kubectl rollout status");
        if !out.status.success() {
            let pods = self
                .root
                .kubectl_ok(&["describe", "pods", "-n", RELAYLET_NAMESPACE]);
            panic!(
                "the chart's Deployment did not roll out: {}\n{pods}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// The chart's pods: (name, pod IP) of each Running one not being deleted.
    pub fn chart_pods(&self) -> Vec<(String, String)> {
        let out = self.root.kubectl_ok(&[
            "get",
            "pods",
            "-n",
            RELAYLET_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=relaylet",
            "-o",
            "jsonpath={range .items[?(@.status.phase==\"Running\")]}{.metadata.name} {.status.podIP} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ]);
        out.lines()
            .filter_map(|l| {
                let mut parts = l.split_whitespace();
                let name = parts.next()?;
                let ip = parts.next()?;
                parts
                    .next()
                    .is_none()
                    .then(|| (name.to_string(), ip.to_string()))
            })
            .collect()
    }

    /// The address replica `i` listens on (its "pod IP").
    pub fn replica_ip(&self, i: usize) -> IpAddr {
        self.addresses.ip(i)
    }

    /// The kubeconfig replica `i` authenticates to the root with.
    pub fn replica_kubeconfig(&self, i: usize) -> &str {
        self.replica_kubeconfigs
            .get(i)
            .unwrap_or(&self.root_kubeconfig)
    }

    /// The env replica `i` runs with: the chart's, and what the downward API would give it.
    /// Its Pod is made first if it has none (every way of starting a replica asks for this).
    pub fn replica_env(&self, i: usize) -> BTreeMap<String, String> {
        let ip = self.replica_ip(i);
        if self.replica_pods.lock().expect("replica pods").insert(i) {
            replica_pod(&self.root, i, ip);
        }
        let mut env = self.config_env.clone();
        env.insert("LEAF_NODE_IP".into(), ip.to_string());
        env.insert("POD_NAME".into(), format!("relaylet-{i}"));
        env.insert(
            "METRICS_ADDR".into(),
            format!("{ip}:{}", harness::free_port()),
        );
        env
    }

    /// Starts replica `i` on its address.
    fn start_replica(&self, i: usize) -> Replica {
        let ip = self.replica_ip(i);
        let env = self.replica_env(i);
        let config = relaylet::config::Config::from_lookup(|name| env.get(name).cloned())
            .expect("the chart's env is a valid configuration");
        let shutdown = relaylet::ops::Shutdown::default();
        let running = self.runtime.block_on(async {
            // The root client `relaylet serve` builds (HTTP/2 to the real apiserver).
            let kubeconfig = kube::config::Kubeconfig::from_yaml(self.replica_kubeconfig(i))
                .expect("root kubeconfig");
            let root = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .expect("root config");
            let client = relaylet::kube_client::root_from(&root).expect("relaylet's root client");
            relaylet::start(config, client, shutdown.clone())
                .await
                .expect("relaylet starts")
        });
        Replica {
            ip,
            running,
            shutdown,
        }
    }

    /// Starts the shipped relaylet binary (`env!("CARGO_BIN_EXE_relaylet")`) as replica `i`,
    /// its own process on replica `i`'s address with the chart's env and `extra` over it, for
    /// tests that kill it. It joins the leader election; its log is `relaylet-<i>.log` in the
    /// world's directory.
    pub fn spawn_relaylet_process(
        &self,
        i: usize,
        binary: &Path,
        extra: &[(&str, &str)],
    ) -> harness::Process {
        self.spawn_relaylet_command(i, binary, &[], extra)
    }

    /// [`spawn_relaylet_process`](Self::spawn_relaylet_process) with `program args` as the
    /// command (`relaylet-dev serve` runs relaylet too).
    pub fn spawn_relaylet_command(
        &self,
        i: usize,
        program: &Path,
        args: &[String],
        extra: &[(&str, &str)],
    ) -> harness::Process {
        let kubeconfig = self.dir.path().join(format!("relaylet-{i}.kubeconfig"));
        std::fs::write(&kubeconfig, self.replica_kubeconfig(i)).expect("write kubeconfig");
        let mut env = self.replica_env(i);
        env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
        env.insert("RUST_LOG".into(), "info".into());
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        harness::Process::spawn_with_env(
            &format!("relaylet-{i}"),
            self.dir.path(),
            program,
            args,
            &env,
        )
    }

    /// Registers leaf cluster `leaf` (again) as leaf `name`, with `make-leaf-secret.sh`'s
    /// `extra` options (`--proxy-url ...`); the Secret is replaced if it exists.
    pub fn register_leaf(&self, leaf: &str, name: &str, extra: &[String]) {
        connect_leaf(self.dir.path(), &self.root, self.leaf(leaf), name, extra);
    }

    /// [`spawn_relaylet_process`](Self::spawn_relaylet_process) as replica 0 inside `netns`:
    /// its pod IP is the namespace's end of the pair, and it dials the root apiserver at the
    /// host's end (the world started with [`Setup::root_also_on`] that address).
    pub fn spawn_relaylet_in(
        &self,
        netns: &super::netns::Netns,
        binary: &Path,
    ) -> harness::Process {
        let mut env = self.replica_env(0);
        env.insert("LEAF_NODE_IP".into(), netns.ns_ip.to_string());
        env.insert(
            "METRICS_ADDR".into(),
            format!("{}:{}", netns.ns_ip, harness::free_port()),
        );
        let root_url = self
            .root
            .url
            .replace("127.0.0.1", &netns.host_ip.to_string());
        let kubeconfig = self.dir.path().join("relaylet-netns.kubeconfig");
        std::fs::write(
            &kubeconfig,
            self.replica_kubeconfig(0)
                .replace(&self.root.url, &root_url),
        )
        .expect("write kubeconfig");
        env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
        env.insert("RUST_LOG".into(), "info".into());
        let (program, args) = netns.wrap(binary, &[]);
        harness::Process::spawn_with_env("relaylet-0", self.dir.path(), &program, &args, &env)
    }

    /// Stops replica `i` as a rollout does (SIGTERM: stop accepting, give up leadership).
    pub fn stop_replica(&self, i: usize) {
        let replica = self.replicas.lock().expect("replicas")[i].take();
        if let Some(r) = replica {
            r.shutdown.begin.cancel();
            r.shutdown.sessions.cancel();
            let _ = self.runtime.block_on(r.running.server);
        }
    }

    /// Starts replica `i` again after [`stop_replica`].
    pub fn restart_replica(&self, i: usize) {
        let replica = self.start_replica(i);
        self.replicas.lock().expect("replicas")[i] = Some(replica);
    }

    /// The index of the replica that leads, waiting for one.
    pub fn leader(&self) -> usize {
        for _ in 0..300 {
            let replicas = self.replicas.lock().expect("replicas");
            if let Some(i) = replicas
                .iter()
                .position(|r| r.as_ref().is_some_and(|r| r.running.leadership.is_leader()))
            {
                return i;
            }
            drop(replicas);
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no relaylet replica became leader");
    }

    /// The index of the replica that writes `node` (its `relaylet.io/served-by`), waiting for
    /// one.
    pub fn writer_of(&self, node: &str) -> usize {
        for _ in 0..300 {
            let writer = self.root.kubectl_ok(&[
                "get",
                "node",
                node,
                "-o",
                "jsonpath={.metadata.annotations.relaylet\\.io/served-by}",
            ]);
            if let Some(i) = writer
                .trim()
                .strip_prefix("relaylet-")
                .and_then(|i| i.parse().ok())
            {
                return i;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no relaylet replica writes {node}");
    }

    /// The first address of `node` (the one relaylet makes the root dial).
    pub fn node_address(&self, node: &str) -> String {
        self.root
            .kubectl_ok(&[
                "get",
                "node",
                node,
                "-o",
                "jsonpath={.status.addresses[0].address}",
            ])
            .trim()
            .to_string()
    }

    /// The status of `node`'s Ready condition.
    pub fn node_ready(&self, node: &str) -> String {
        let out = Command::new(harness::kubectl_path())
            .args([
                "get",
                "node",
                node,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .env("KUBECONFIG", &self.root.admin_kubeconfig)
            .output()
            .expect("kubectl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn wait_for_node_ready(&self, node: &str) {
        for _ in 0..600 {
            if self.node_ready(node) == "True" {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("virtual node {node} never became Ready in the real root");
    }

    pub fn leaf(&self, name: &str) -> &ControlPlane {
        &self.leaves[name]
    }

    /// What a syncer does: the root pod on leaf `leaf`'s virtual node, then its leaf copy on
    /// the leaf node marked with the root pod's UID, then the leaf pod's status copied up. The
    /// container serves HTTP on port 8080 (its local port in PORT_8080), logs a line a second
    /// and answers each line on its stdin with `got <line>`.
    pub fn sync_pod(&self, leaf: &str, namespace: &str, name: &str) {
        self.sync_pod_from(leaf, namespace, name, super::pods::demo_pod);
    }

    /// [`sync_pod`](Self::sync_pod) with another manifest: `manifest(namespace, name, node,
    /// root_uid)`; its container must log a line with `tick` once it runs.
    pub fn sync_pod_from(
        &self,
        leaf: &str,
        namespace: &str,
        name: &str,
        manifest: fn(&str, &str, &str, Option<&str>) -> String,
    ) {
        self.root.kubectl_stdin_ok(
            &["create", "-f", "-"],
            Some(&manifest(namespace, name, &virtual_node(leaf), None)),
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
        self.leaf(leaf).kubectl_stdin_ok(
            &["create", "-f", "-"],
            Some(&manifest(
                namespace,
                name,
                &leaf_node(leaf),
                Some(uid.trim()),
            )),
        );
        // Running in the leaf once its first line is logged; kubectl port-forward wants the
        // root pod Running too.
        self.wait_for_log_lines(leaf, namespace, name, 1);
        let status = self.leaf(leaf).kubectl_ok(&[
            "get",
            "pod",
            name,
            "-n",
            namespace,
            "-o",
            "jsonpath={.status}",
        ]);
        self.root.kubectl_ok(&[
            "patch",
            "pod",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!("{{\"status\":{status}}}"),
        ]);
    }

    /// Waits until leaf pod `namespace/name` has logged at least `lines` lines.
    pub fn wait_for_log_lines(&self, leaf: &str, namespace: &str, name: &str, lines: usize) {
        for _ in 0..300 {
            let out = Command::new(harness::kubectl_path())
                .args(["logs", name, "-n", namespace])
                .env("KUBECONFIG", &self.leaf(leaf).admin_kubeconfig)
                .output()
                .expect("kubectl");
            if String::from_utf8_lossy(&out.stdout).matches("tick").count() >= lines {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("leaf pod {namespace}/{name} never logged {lines} lines");
    }

    pub fn root_kubeconfig(&self) -> &Path {
        &self.root.admin_kubeconfig
    }

    /// Where replica `i`'s kubelet API listens.
    pub fn kubelet_addr(&self, i: usize) -> std::net::SocketAddr {
        self.replicas.lock().expect("replicas")[i]
            .as_ref()
            .expect("replica running")
            .running
            .addr
    }
}

/// Gives relaylet access to `leaf` as the README says: deploy/leaf-rbac.yaml in the leaf, a
/// bounded token for its ServiceAccount, and the Secret deploy/make-leaf-secret.sh makes.
fn connect_leaf(
    dir: &Path,
    root: &ControlPlane,
    leaf: &ControlPlane,
    name: &str,
    extra: &[String],
) {
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
    let token_file = dir.join(format!("{}-token", leaf.name));
    std::fs::write(&token_file, token.trim()).expect("token file");
    let kubeconfigs = format!(
        "{}:{}",
        root.admin_kubeconfig.display(),
        leaf.admin_kubeconfig.display()
    );
    let out = Command::new("bash")
        .arg(repo().join("deploy/make-leaf-secret.sh"))
        .args(["--leaf-context", &leaf.name, "--name", name])
        .args(["--root-context", &root.name])
        .args(extra)
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
}

/// `helm template` of the chart with its default values, release relaylet in namespace relaylet.
pub fn helm_template(extra: &[&str]) -> String {
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

/// `--set` arguments for `values`.
fn chart_sets(values: &[&str]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| ["--set".to_string(), v.to_string()])
        .collect()
}

/// Makes Pod `relaylet-<i>` in relaylet's namespace with the chart's pod labels and replica
/// `i`'s address as its IP, Running, as the kubelet would report it (through the `status`
/// subresource; the Pod is bound to no node, so no kubelet or pod GC touches it); its UID.
pub fn replica_pod(root: &ControlPlane, i: usize, ip: IpAddr) -> String {
    let name = format!("relaylet-{i}");
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {RELAYLET_NAMESPACE}\n  labels:\n    app.kubernetes.io/name: relaylet\n    app.kubernetes.io/instance: relaylet\n    pod-template-hash: 5d8f7b9c4\nspec:\n  serviceAccountName: relaylet\n  containers:\n  - name: relaylet\n    image: relaylet:test\n"
    );
    root.kubectl_stdin_ok(&["create", "-f", "-"], Some(&pod));
    set_replica_phase(root, i, "Running", Some(ip));
    root.kubectl_ok(&[
        "get",
        "pod",
        &name,
        "-n",
        RELAYLET_NAMESPACE,
        "-o",
        "jsonpath={.metadata.uid}",
    ])
    .trim()
    .to_string()
}

/// Writes the phase (and IP) of replica `i`'s Pod, as its kubelet would.
pub fn set_replica_phase(root: &ControlPlane, i: usize, phase: &str, ip: Option<IpAddr>) {
    let ip = ip.map_or(String::new(), |ip| {
        format!(r#","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}]"#)
    });
    root.kubectl_ok(&[
        "patch",
        "pod",
        &format!("relaylet-{i}"),
        "-n",
        RELAYLET_NAMESPACE,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"phase":"{phase}"{ip}}}}}"#),
    ]);
}

/// A token of relaylet's ServiceAccount bound to replica `i`'s Pod (UID `uid`): what a pod's
/// projected token is (the apiserver adds the pod's name and UID to the user's extra).
fn pod_bound_token(root: &ControlPlane, i: usize, uid: &str) -> String {
    relaylet_token(
        root,
        &[
            "--bound-object-kind=Pod",
            &format!("--bound-object-name=relaylet-{i}"),
            &format!("--bound-object-uid={uid}"),
        ],
    )
}

/// A token of relaylet's ServiceAccount, with `kubectl create token` options `extra`.
fn relaylet_token(root: &ControlPlane, extra: &[&str]) -> String {
    let mut args = vec![
        "create",
        "token",
        "relaylet",
        "-n",
        RELAYLET_NAMESPACE,
        "--duration=24h",
    ];
    args.extend_from_slice(extra);
    root.kubectl_ok(&args).trim().to_string()
}

/// The literal env values of the rendered chart's relaylet container.
fn chart_env(sets: &[String]) -> BTreeMap<String, String> {
    let mut args = vec!["--show-only", "templates/deployment.yaml"];
    args.extend(sets.iter().map(String::as_str));
    let yaml = helm_template(&args);
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

/// A kube client of a relaylet kubelet port at `addr` with the credentials of `kubeconfig`
/// (whose server is `root_url`).
pub async fn kubelet_client(
    addr: std::net::SocketAddr,
    root_url: &str,
    kubeconfig: &Path,
) -> kube::Client {
    let yaml = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let yaml = yaml.replace(root_url, &format!("https://{addr}"));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    // relaylet's certificate is self-signed (servingCert.mode=generate).
    config.accept_invalid_certs = true;
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

/// Runs `kubectl port-forward pod/<pod> :8080` and makes `connections` HTTP requests
/// through it, one connection each; the answers (head and body) in order, empty for a
/// connection that never answered.
pub fn port_forward_answers(
    k: &relaylet_sim::tools::Kubectl,
    kubeconfig: &Path,
    pod: &str,
    connections: usize,
) -> Vec<String> {
    let forward = crate::testkit::port_forward::PortForward::start(crate::testkit::Run::new(
        k,
        kubeconfig,
        &["port-forward", &format!("pod/{pod}"), ":8080"],
    ));
    let mut answers = Vec::new();
    for _ in 0..connections {
        answers.push(forward.first_answer(200).unwrap_or_default());
    }
    answers
}

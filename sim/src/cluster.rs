//! One call to start a simulated cluster: an API server stand-in, kubelet stand-ins for its
//! nodes, and pods whose containers are real local processes.
//!
//! Tests and the sandbox build root and leaf clusters from this. Objects are written straight
//! into the API server's store (as the scheduler and kubelets would have left them), so a pod is
//! Running with a node, an IP and container statuses the moment `add_pod` returns.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

use crate::apiserver::{ApiError, ApiServer, ApiServerConfig, Policy, UserInfo};
use crate::kubelet::{ContainerRun, Kubelet, KubeletConfig, KubeletError, PodRun};
use crate::kubelet_proxy::KubeletClient;
use crate::tls::{Ca, TlsError};

/// The user kube-apiserver presents to kubelets (its `--kubelet-client-certificate`).
pub const APISERVER_KUBELET_CLIENT: &str = "kube-apiserver-kubelet-client";
/// The user metrics-server scrapes kubelets as (its ServiceAccount in the upstream manifests).
pub const METRICS_SERVER_USER: &str = "system:serviceaccount:kube-system:metrics-server";

/// Errors building a cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("API server: {0}")]
    Api(#[from] ApiError),
    #[error("kubelet: {0}")]
    Kubelet(#[from] KubeletError),
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("store: {0}")]
    Store(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no node {0} in this cluster")]
    NoNode(String),
}

/// How to start a cluster.
pub struct ClusterOptions {
    pub name: String,
    /// kube-apiserver's `--kubelet-preferred-address-types`.
    pub preferred_address_types: Vec<String>,
    pub policy: Policy,
    pub tokens: Vec<(String, UserInfo)>,
    /// Where the API server listens (port 0 picks one).
    pub listen: SocketAddr,
}

impl ClusterOptions {
    /// A cluster named `name` with upstream defaults: the default address preference order and
    /// only `system:masters` allowed everything.
    pub fn new(name: &str) -> ClusterOptions {
        ClusterOptions {
            name: name.to_string(),
            preferred_address_types: crate::kubelet_proxy::DEFAULT_PREFERRED_ADDRESS_TYPES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            policy: Policy::default(),
            tokens: Vec::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }
}

/// A container of a simulated pod.
#[derive(Debug, Clone, Default)]
pub struct SimContainer {
    pub name: String,
    /// The main process's argv (`attach` talks to it, `logs` shows its output).
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: bool,
    pub tty: bool,
    /// Container ports. Each is served by a real local port the cluster picks; the main process
    /// finds it in env var `PORT_<container port>`.
    pub ports: Vec<u16>,
    /// Resource requests (`cpu`, `memory`) as Kubernetes quantities.
    pub requests: BTreeMap<String, String>,
}

/// A simulated pod.
#[derive(Debug, Clone, Default)]
pub struct SimPod {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub containers: Vec<SimContainer>,
}

/// A running simulated cluster; everything stops when it is dropped.
pub struct Cluster {
    pub name: String,
    pub ca: Arc<Ca>,
    pub api: ApiServer,
    /// How the apiserver (and so metrics-server) picks a node's address.
    preferred_address_types: Vec<String>,
    kubelets: crate::pod_updates::Kubelets,
    data_dir: tempfile::TempDir,
    /// Stops the kubelets' watch of pod updates.
    _updates: tokio_util::sync::DropGuard,
}

impl Cluster {
    /// Starts the API server of a new cluster (no nodes yet).
    pub async fn start(options: ClusterOptions) -> Result<Cluster, ClusterError> {
        let ca = Arc::new(Ca::new(&format!("{}-ca", options.name))?);
        let kubelet_client = ca.issue_client(APISERVER_KUBELET_CLIENT, &["system:masters"])?;
        let mut config = ApiServerConfig::new(&options.name, ca.clone());
        config.listen = options.listen;
        config.policy = options.policy;
        config.tokens = options.tokens;
        // Like kube-apiserver without --kubelet-certificate-authority: it presents its client
        // certificate but does not verify kubelet serving certificates.
        let mut kubelet =
            KubeletClient::new(crate::tls::insecure_client_config(Some(&kubelet_client))?);
        kubelet.preferred_address_types = options.preferred_address_types.clone();
        config.kubelet = Some(kubelet);
        let api = ApiServer::start(config).await?;
        let data_dir = tempfile::Builder::new()
            .prefix(&format!("relaylet-sim-{}-", options.name))
            .tempdir()?;
        let kubelets = crate::pod_updates::Kubelets::default();
        let updates = tokio_util::sync::CancellationToken::new();
        crate::pod_updates::watch(api.store().clone(), kubelets.clone(), updates.clone());
        Ok(Cluster {
            name: options.name,
            ca,
            api,
            preferred_address_types: options.preferred_address_types,
            kubelets,
            data_dir,
            _updates: updates.drop_guard(),
        })
    }

    /// A kubeconfig (YAML) for `user` in `groups`, with a client certificate from this cluster.
    pub fn kubeconfig(&self, user: &str, groups: &[&str]) -> Result<String, ClusterError> {
        Ok(self.api.kubeconfig(user, groups)?)
    }

    /// A kubeconfig for a cluster admin.
    pub fn admin_kubeconfig(&self) -> Result<String, ClusterError> {
        self.kubeconfig("admin", &["system:masters"])
    }

    /// Starts a metrics-server stand-in for this cluster: it scrapes every Node's kubelet (at
    /// the address the apiserver would dial) as [`METRICS_SERVER_USER`] every `resolution`
    /// and fills `metrics.k8s.io`. Kubelets verify its client certificate, as they would
    /// metrics-server's; its serving certificates it does not (`--kubelet-insecure-tls`).
    pub fn start_metrics_server(
        &self,
        resolution: std::time::Duration,
    ) -> Result<crate::metrics_server::MetricsServer, ClusterError> {
        let identity = self.ca.issue_client(METRICS_SERVER_USER, &[])?;
        let mut kubelets = KubeletClient::new(crate::tls::insecure_client_config(Some(&identity))?);
        kubelets.preferred_address_types = self.preferred_address_types.clone();
        Ok(crate::metrics_server::MetricsServer::start(
            self.api.store().clone(),
            kubelets,
            resolution,
        ))
    }

    /// Where this cluster keeps its files (kubelet logs and container directories).
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.path().to_path_buf()
    }

    /// Adds a Ready node served by a new kubelet stand-in.
    pub async fn add_node(&self, name: &str) -> Result<Arc<Kubelet>, ClusterError> {
        let identity = self.ca.issue_server(&["127.0.0.1", "localhost"])?;
        let tls = self.ca.server_config_requiring_clients(&identity)?;
        let config = KubeletConfig::new(
            name,
            tls,
            SocketAddr::from(([127, 0, 0, 1], 0)),
            self.data_dir.path().join(name),
        );
        let kubelet = Arc::new(Kubelet::start(config).await?);
        self.create_node(name, Some(kubelet.addr.port()))?;
        self.lock_kubelets()
            .insert(name.to_string(), kubelet.clone());
        Ok(kubelet)
    }

    /// Adds a Ready node with no kubelet stand-in behind it: the object only, as cheap as a node
    /// can be (pods added to it are objects only too). For fleets of many leaves where only the
    /// API objects matter; nothing can exec into or read the logs of its pods.
    pub fn add_node_without_kubelet(&self, name: &str) -> Result<(), ClusterError> {
        self.create_node(name, None)
    }

    /// Writes node `name`'s object, Ready; with `kubelet_port`, the port its kubelet serves.
    fn create_node(&self, name: &str, kubelet_port: Option<u16>) -> Result<(), ClusterError> {
        let mut node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
                }
            },
            "spec": {},
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": "localhost"}
                ],
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "100Gi"},
                "allocatable": {"cpu": "3800m", "memory": "7Gi", "pods": "110", "ephemeral-storage": "90Gi"},
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet stand-in is ready"},
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                    {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"},
                    {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID"}
                ],
                "nodeInfo": {
                    "machineID": "", "systemUUID": "", "bootID": "",
                    "kernelVersion": "sim", "osImage": "relaylet-sim",
                    "containerRuntimeVersion": "relaylet-sim://1",
                    "kubeletVersion": crate::apiserver::KUBERNETES_VERSION,
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
                }
            }
        }))
        .map_err(|e| ClusterError::Store(e.to_string()))?;
        if let (Some(port), Some(status)) = (kubelet_port, node.status.as_mut()) {
            status.daemon_endpoints = Some(k8s_openapi::api::core::v1::NodeDaemonEndpoints {
                kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint {
                    port: i32::from(port),
                }),
            });
        }
        self.api
            .store()
            .create_typed(&node)
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        Ok(())
    }

    /// The kubelet stand-in of node `name`.
    pub fn kubelet(&self, name: &str) -> Option<Arc<Kubelet>> {
        self.lock_kubelets().get(name).cloned()
    }

    fn lock_kubelets(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Kubelet>>> {
        self.kubelets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates a Running pod on `node` and, when the node has a kubelet stand-in, starts its
    /// containers. On a node without one (a root cluster's virtual node) only the object is
    /// written.
    pub async fn add_pod(&self, node: &str, pod: &SimPod) -> Result<Pod, ClusterError> {
        let uid = crate::apiserver::store::new_uid();
        let kubelet = self.kubelet(node);
        let mut runs = Vec::new();
        let mut container_specs = Vec::new();
        let mut statuses = Vec::new();
        let started = k8s_openapi::jiff::Timestamp::now().to_string();
        for c in &pod.containers {
            let mut env = c.env.clone();
            let mut ports = Vec::new();
            for port in &c.ports {
                // The pod's process is told its port by number.
                let addr = crate::ports::free_loopback_port()?;
                env.push((format!("PORT_{port}"), addr.port().to_string()));
                ports.push((*port, addr));
            }
            runs.push(ContainerRun {
                name: c.name.clone(),
                command: c.command.clone(),
                env: env.clone(),
                stdin: c.stdin,
                tty: c.tty,
                ports,
            });
            container_specs.push(json!({
                "name": c.name,
                "image": "relaylet-sim/local:latest",
                "command": c.command,
                "env": env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
                "ports": c.ports.iter().map(|p| json!({"containerPort": p, "protocol": "TCP"})).collect::<Vec<_>>(),
                "resources": {"requests": c.requests},
                "stdin": c.stdin,
                "tty": c.tty,
                "imagePullPolicy": "IfNotPresent",
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
            }));
            statuses.push(json!({
                "name": c.name,
                "ready": true,
                "started": true,
                "restartCount": 0,
                "image": "relaylet-sim/local:latest",
                "imageID": "relaylet-sim/local@sha256:0",
                "containerID": format!("sim://{uid}-{}", c.name),
                "state": {"running": {"startedAt": started}},
            }));
        }
        let conditions: Vec<serde_json::Value> =
            ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
                .iter()
                .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": started}))
                .collect();
        let object: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": uid,
                "labels": pod.labels,
                "annotations": pod.annotations,
            },
            "spec": {
                "nodeName": node,
                "containers": container_specs,
                "restartPolicy": "Always",
                "dnsPolicy": "ClusterFirst",
                "schedulerName": "default-scheduler",
                "terminationGracePeriodSeconds": 30,
            },
            "status": {
                "phase": "Running",
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "podIPs": [{"ip": "127.0.0.1"}],
                "startTime": started,
                "qosClass": "BestEffort",
                "conditions": conditions,
                "containerStatuses": statuses,
            }
        }))
        .map_err(|e| ClusterError::Store(e.to_string()))?;
        let created = self
            .api
            .store()
            .create_typed(&object)
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        if let Some(kubelet) = kubelet {
            kubelet
                .run_pod(PodRun {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: created.metadata.uid.clone().unwrap_or(uid),
                    containers: runs,
                })
                .await?;
        }
        Ok(created)
    }
}

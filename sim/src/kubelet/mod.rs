//! The kubelet stand-in: the kubelet streaming API backed by real local processes.
//!
//! It serves the kubelet's own routes (upstream `pkg/kubelet/server/server.go`): `exec`,
//! `attach` and `portForward` over SPDY/3.1 or the `channel.k8s.io` WebSocket family (and,
//! like a kubelet with `ExtendWebSocketsToKubelet`, v5 WebSocket and SPDY-over-WebSocket
//! port-forward tunnels), and
//! `containerLogs` from CRI-format log files. Pods are started with [`Kubelet::run_pod`]; each
//! container's main process is a real local process, exec runs real processes (with a PTY for
//! `tty`), and port-forward connects to real local addresses. Errors, status bytes and edge
//! cases follow the upstream kubelet, because relaylet must pass them through unchanged.

mod attach;
mod container;
mod cri_log;
mod error;
mod exec;
mod idle;
mod log_options;
mod logs;
mod pods;
mod portforward;
mod process;
mod query;
mod routes;
mod shared;
mod spdy_transport;
mod status;
mod streams;
mod text;
mod usage;
mod websocket;
mod ws_tunnel;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::serve::{Served, serve_tls};
use shared::Shared;

pub use container::ContainerRun;
pub use error::KubeletError;
pub use pods::PodRun;
pub use status::{Outcome, StatusFormat};
pub use streams::TermSize;
pub use ws_tunnel::{TUNNEL_PREFIX, WsByteStream};

/// How to run a kubelet stand-in.
#[derive(Clone)]
pub struct KubeletConfig {
    pub node_name: String,
    pub tls: Arc<rustls::ServerConfig>,
    pub listen: SocketAddr,
    /// Logs and container working directories go under here.
    pub data_dir: PathBuf,
    /// How long a SPDY client may take to open its streams (kubelet default 30 s).
    pub stream_creation_timeout: Duration,
    /// How long a streaming connection may stay idle (kubelet default 4 h).
    pub stream_idle_timeout: Duration,
}

impl KubeletConfig {
    /// A config with the kubelet's default timeouts.
    pub fn new(
        node_name: impl Into<String>,
        tls: Arc<rustls::ServerConfig>,
        listen: SocketAddr,
        data_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            node_name: node_name.into(),
            tls,
            listen,
            data_dir: data_dir.into(),
            stream_creation_timeout: Duration::from_secs(30),
            stream_idle_timeout: Duration::from_secs(4 * 60 * 60),
        }
    }
}

/// The state of a container's current instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerStatus {
    pub restart_count: u32,
    pub running: bool,
    /// Set once the main process exited (128 + signal if it was killed).
    pub exit_code: Option<i32>,
}

/// A running kubelet stand-in; stops (and kills all its processes) when dropped.
pub struct Kubelet {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    served: Served,
}

impl Kubelet {
    /// Binds `cfg.listen` and serves the kubelet API over HTTPS.
    pub async fn start(cfg: KubeletConfig) -> Result<Kubelet, KubeletError> {
        // Its processes must not outlive the process that runs it, dropped or not.
        process::kill_every_group_at_exit();
        tokio::fs::create_dir_all(&cfg.data_dir)
            .await
            .map_err(|e| KubeletError::Io(format!("creating {}: {e}", cfg.data_dir.display())))?;
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| KubeletError::Bind {
                addr: cfg.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| KubeletError::Bind {
            addr: cfg.listen,
            source,
        })?;
        let shared = Arc::new(Shared {
            node_name: cfg.node_name,
            data_dir: cfg.data_dir,
            stream_creation_timeout: cfg.stream_creation_timeout,
            stream_idle_timeout: cfg.stream_idle_timeout,
            pods: pods::Pods::default(),
            stop: CancellationToken::new(),
            open_log_streams: Arc::default(),
        });
        let served = serve_tls(listener, cfg.tls, routes::router(shared.clone()));
        tracing::info!(node = %shared.node_name, %addr, "kubelet stand-in listening");
        Ok(Kubelet {
            addr,
            shared,
            served,
        })
    }

    /// Starts each container's main process and makes the pod reachable.
    pub async fn run_pod(&self, pod: PodRun) -> Result<(), KubeletError> {
        self.shared.pods.run(&self.shared.data_dir, pod).await
    }

    /// Starts an ephemeral container in a running pod (what the kubelet does after `kubectl
    /// debug`); nothing happens if the pod already has a container of that name.
    pub async fn add_container(
        &self,
        namespace: &str,
        pod: &str,
        container: ContainerRun,
    ) -> Result<(), KubeletError> {
        self.shared
            .pods
            .add_container(&self.shared.data_dir, namespace, pod, container)
            .await
    }

    /// Kills the pod's processes and forgets it.
    pub async fn remove_pod(&self, namespace: &str, name: &str) {
        self.shared.pods.remove(namespace, name);
    }

    /// Stops the pod as the kubelet does when it is deleted: SIGTERM to every container, up to
    /// `grace` for them to exit, SIGKILL to what is left; then forgets it.
    pub async fn stop_pod(&self, namespace: &str, name: &str, grace: Duration) {
        let Some(pod) = self.shared.pods.get(namespace, name) else {
            return;
        };
        let running: Vec<_> = pod.containers.iter().filter_map(|c| c.current()).collect();
        for instance in &running {
            instance.terminate();
        }
        let all_exited = async {
            for instance in &running {
                let mut alive = instance.running();
                let _ = alive.wait_for(|r| !*r).await;
            }
        };
        let _ = tokio::time::timeout(grace, all_exited).await;
        self.shared.pods.remove(namespace, name);
    }

    /// Whether this kubelet runs pod `uid` as `namespace/name`.
    pub fn runs(&self, namespace: &str, name: &str, uid: &str) -> bool {
        self.shared
            .pods
            .get(namespace, name)
            .is_some_and(|p| p.uid == uid)
    }

    /// Kills a container's main process and starts a new instance; the old log becomes the
    /// `previous` one.
    pub async fn restart_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<(), KubeletError> {
        self.shared.pods.restart(namespace, pod, container).await
    }

    /// What the runtime knows of a container: restarts, whether it runs, its last exit code.
    pub fn container_status(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Option<ContainerStatus> {
        let c = self
            .shared
            .pods
            .get(namespace, pod)?
            .container(container)?
            .clone();
        let current = c.current()?;
        Some(ContainerStatus {
            restart_count: current.restart,
            running: current.is_running(),
            exit_code: current.exit_code(),
        })
    }

    /// Waits until a container's current process has exited and returns its exit code; `None`
    /// if there is no such container.
    pub async fn container_exit(&self, namespace: &str, pod: &str, container: &str) -> Option<i32> {
        let instance = self
            .shared
            .pods
            .get(namespace, pod)?
            .container(container)?
            .current()?;
        let mut running = instance.running();
        // The exit code is set before `running` turns false.
        let _ = running.wait_for(|r| !*r).await;
        instance.exit_code()
    }

    /// How many containerLogs responses are still being written.
    pub fn open_log_streams(&self) -> usize {
        self.shared
            .open_log_streams
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops serving, ends every streaming session and kills every process.
    pub fn stop(&self) {
        self.shared.stop.cancel();
        self.served.stop();
        self.shared.pods.kill_all();
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

//! relaylet: the kubelet of virtual nodes whose pods run in leaf clusters.
//!
//! The root kube-apiserver sends `exec`, `attach`, `portForward` and `containerLogs` calls for a
//! virtual node to relaylet's node server; relaylet finds the pod's leaf cluster and relays the
//! call to that cluster's apiserver, splicing the streams. The parts are mapped in
//! docs/development.md, "The parts": the folders below, from the bottom up, are `model`,
//! `config`, `caps`, `ops`, `kube_client`, `certs`, `leaf`, `relay` and `routing`,
//! `node_server`, `replicas`, `virtual_node` and `cli`; each folder uses only those below it. This
//! file only wires them together.

pub mod caps;
pub mod certs;
pub mod cli;
pub mod config;
pub mod kube_client;
pub mod leaf;
pub mod model;
pub mod node_server;
pub mod ops;
pub mod pod_sync;
pub mod relay;
pub mod replicas;
pub mod routing;
pub mod virtual_node;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use kube::Client;

use crate::config::Config;
use crate::leaf::{Registry, SecretSource};
use crate::node_server::NodePorts;
use crate::ops::{Health, Metrics, Shutdown};
use crate::replicas::Leadership;
use crate::routing::PodIndex;

/// A started relaylet.
pub struct Running {
    /// Where the node server listens.
    pub addr: SocketAddr,
    pub registry: Registry,
    pub leadership: Leadership,
    /// Ends when the node server has stopped accepting and its sessions have ended (or were
    /// cut when the shutdown grace period ran out).
    pub server: tokio::task::JoinHandle<()>,
    /// Where the plain-HTTP metrics and health server listens (`METRICS_ADDR`).
    pub metrics_addr: SocketAddr,
    pub metrics: Metrics,
    /// Each virtual node's own kubelet listener.
    pub node_ports: NodePorts,
}

/// `relaylet serve`: relaylet configured by its env vars against the root cluster of
/// `KUBECONFIG` (or the in-cluster one), until SIGTERM or SIGINT and the grace period after.
pub async fn serve() -> anyhow::Result<()> {
    let config = Config::from_env()?;
    ops::telemetry::init(config.log_format);
    let root = kube_client::root().await?;
    let shutdown = Shutdown::default();
    shutdown.on_signals(config.shutdown_grace_period);
    let running = start(config, root, shutdown).await?;
    running.server.await?;
    Ok(())
}

/// Starts every part of relaylet against the root cluster `root`; runs until `shutdown` fires.
pub async fn start(config: Config, root: Client, shutdown: Shutdown) -> anyhow::Result<Running> {
    let config = Arc::new(config);
    // This install's namespace: where its Secrets, Leases and pods are, and its mark on Nodes.
    let namespace = config
        .pod_namespace
        .clone()
        .unwrap_or_else(|| root.default_namespace().to_string());
    let metrics = Metrics::new();
    let (health, metrics_addr) = serve_health(&config, &metrics, &shutdown).await?;
    let registry = watch_leaves(&config, &root, &namespace, &metrics, &shutdown).await?;
    let pods = PodIndex::new(root.clone(), registry.clone());
    let names = {
        let registry = registry.clone();
        move || registry.node_names()
    };
    let csr = certs::start_csr_mode(&config, &root, &namespace, names, &metrics, &shutdown);
    let joined = replicas::start(&config, &root, &namespace, &metrics, &shutdown, csr.clone());
    spawn_until(&shutdown, health.clone().probe(root.clone()));
    // Bound before the node listeners, which take the free ports above it (NODE_SERVER_PORT=0
    // takes any free one).
    let addr = SocketAddr::new(config.leaf_node_ip, config.node_server_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr} (LEAF_NODE_IP:NODE_SERVER_PORT)"))?;
    let node_ports = NodePorts::default();
    virtual_node::start(
        virtual_node::Parts {
            config: config.clone(),
            root: root.clone(),
            registry: registry.clone(),
            pods: pods.clone(),
            leadership: joined.leadership.clone(),
            replicas: joined.replicas,
            publication: joined.publication,
            node_ports: node_ports.clone(),
            metrics: metrics.clone(),
            health: health.clone(),
            owner: namespace,
        },
        &shutdown,
    );
    let parts = node_server::Parts {
        config,
        root,
        registry: registry.clone(),
        pods,
        metrics: metrics.clone(),
        node_ports: node_ports.clone(),
        csr,
    };
    let (addr, server) = parts.serve(listener, &health, &shutdown).await?;
    Ok(Running {
        addr,
        registry,
        leadership: joined.leadership,
        server,
        metrics_addr,
        metrics,
        node_ports,
    })
}

/// Serves metrics and health on `METRICS_ADDR`.
async fn serve_health(
    config: &Config,
    metrics: &Metrics,
    shutdown: &Shutdown,
) -> anyhow::Result<(Arc<Health>, SocketAddr)> {
    let health = Health::new(metrics.clone(), shutdown.begin.clone());
    let listener = ops::bind_health(config.metrics_addr)
        .await
        .with_context(|| format!("listening on {} (METRICS_ADDR)", config.metrics_addr))?;
    let addr = listener.local_addr()?;
    tokio::spawn(ops::serve_health(
        listener,
        health.clone(),
        shutdown.sessions.clone(),
    ));
    tracing::info!(url = %format!("http://{addr}/metrics"), "metrics server listening");
    Ok((health, addr))
}

/// The leaf registry, filled from `LEAF_KUBECONFIG` and kept in step with the leaf Secrets.
async fn watch_leaves(
    config: &Arc<Config>,
    root: &Client,
    namespace: &str,
    metrics: &Metrics,
    shutdown: &Shutdown,
) -> anyhow::Result<Registry> {
    let registry = Registry::default();
    leaf::load_static_leaf(config, &registry, metrics).await?;
    let source = SecretSource {
        root: root.clone(),
        namespace: config
            .leaf_secret_namespace
            .clone()
            .unwrap_or_else(|| namespace.to_string()),
        label: config.leaf_secret_label.clone(),
        owner: namespace.to_string(),
    };
    spawn_until(
        shutdown,
        leaf::watch_secrets(source, config.clone(), registry.clone(), metrics.clone()),
    );
    Ok(registry)
}

/// Runs `task` until shutdown begins.
fn spawn_until(shutdown: &Shutdown, task: impl std::future::Future<Output = ()> + Send + 'static) {
    let stop = shutdown.begin.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = task => {}
            _ = stop.cancelled() => {}
        }
    });
}

//! relaylet: the kubelet of virtual nodes whose pods run in leaf clusters.
//!
//! The root kube-apiserver sends `exec`, `attach`, `portForward` and `containerLogs` calls for a
//! virtual node to relaylet's node server; relaylet finds the pod's leaf cluster and relays the
//! call to that cluster's apiserver, splicing the streams. See DESIGN in the repository README.

pub mod auth;
#[cfg(feature = "sim")]
pub mod bench;
pub mod config;
pub mod kubelet_request;
pub mod leader;
pub mod leaf;
pub mod memory;
pub mod node_server;
pub mod pod_index;
pub mod relay;
#[cfg(feature = "sim")]
pub mod sandbox;
pub mod shutdown;
pub mod splice;
pub mod status;
pub mod telemetry;
pub mod tls;
pub mod virtual_node;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

use crate::config::{AuthMode, Config};
use crate::leaf::Registry;
use crate::shutdown::Shutdown;

/// The Lease replicas elect their leader on, in relaylet's own namespace.
pub const LEADER_LEASE: &str = "relaylet-leader";

/// A started relaylet.
pub struct Running {
    /// Where the node server listens.
    pub addr: SocketAddr,
    pub registry: Registry,
    pub leadership: leader::Leadership,
    /// Ends when the node server has stopped accepting.
    pub server: tokio::task::JoinHandle<()>,
}

/// Starts every part of relaylet against the root cluster `root`; runs until `shutdown` fires.
pub async fn start(config: Config, root: Client, shutdown: Shutdown) -> anyhow::Result<Running> {
    let config = Arc::new(config);
    let registry = Registry::default();
    leaf::load_static_leaf(&config, &registry).await?;
    let secret_namespace = config
        .leaf_secret_namespace
        .clone()
        .or_else(|| config.pod_namespace.clone())
        .unwrap_or_else(|| root.default_namespace().to_string());
    spawn_until(
        &shutdown,
        leaf::watch_secrets(
            root.clone(),
            secret_namespace,
            config.leaf_secret_label.clone(),
            config.clone(),
            registry.clone(),
        ),
    );
    let pods = pod_index::PodIndex::new(root.clone(), registry.clone());
    spawn_until(&shutdown, pods.clone().run());

    let leadership = if config.leader_elect {
        let namespace = config
            .pod_namespace
            .clone()
            .unwrap_or_else(|| root.default_namespace().to_string());
        let identity = config
            .pod_name
            .clone()
            .unwrap_or_else(|| format!("relaylet-{}", config.leaf_node_ip));
        leader::elect(
            root.clone(),
            &namespace,
            LEADER_LEASE,
            identity,
            shutdown.begin.clone(),
        )
    } else {
        leader::Leadership::always()
    };
    let controller = Arc::new(virtual_node::Controller {
        config: config.clone(),
        root: root.clone(),
        registry: registry.clone(),
        pods: pods.clone(),
        leadership: leadership.clone(),
    });
    spawn_until(&shutdown, controller.run());

    let client_roots = match config.auth_mode {
        AuthMode::None => None,
        _ => Some(client_ca(&config, &root).await?),
    };
    let tls = tls::server_config(&config, client_roots)?;
    let addr = SocketAddr::new(config.leaf_node_ip, config.node_server_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr} (LEAF_NODE_IP:NODE_SERVER_PORT)"))?;
    let addr = listener.local_addr()?;
    if config.auth_mode == AuthMode::None {
        tracing::warn!(
            "AUTH_MODE=none: anyone who reaches {addr} can exec into every leaf pod; use only in a sandbox"
        );
    }
    let server = Arc::new(node_server::NodeServer {
        auth: auth::Authenticator::new(config.auth_mode, Some(root.clone())),
        registry: registry.clone(),
        pods,
        relay: relay::Relay {
            creation_timeout: config.stream_creation_timeout,
            idle_timeout: config.stream_idle_timeout,
            stop: shutdown.sessions.clone(),
        },
    });
    tracing::info!(%addr, auth = ?config.auth_mode, "node server listening");
    let server = tokio::spawn(node_server::serve(
        listener,
        tls,
        server,
        shutdown.begin.clone(),
    ));
    Ok(Running {
        addr,
        registry,
        leadership,
        server,
    })
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

/// The CA bundle that verifies callers' client certificates: `APISERVER_CA_CERT_LOCATION`, or
/// the root cluster's own client CA as kube-apiserver publishes it.
async fn client_ca(config: &Config, root: &Client) -> anyhow::Result<rustls::RootCertStore> {
    if let Some(path) = &config.client_ca {
        return tls::read_roots(path).context("APISERVER_CA_CERT_LOCATION");
    }
    let api: Api<ConfigMap> = Api::namespaced(root.clone(), "kube-system");
    let cm = api
        .get("extension-apiserver-authentication")
        .await
        .context("reading the root client CA from kube-system/extension-apiserver-authentication (set APISERVER_CA_CERT_LOCATION to give it directly)")?;
    let pem = cm
        .data
        .as_ref()
        .and_then(|d| d.get("client-ca-file"))
        .context("kube-system/extension-apiserver-authentication has no client-ca-file")?;
    tls::roots_from_pem(pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("root client CA (client-ca-file): {e}"))
}

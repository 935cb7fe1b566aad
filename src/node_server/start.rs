//! Starting the kubelet API: the certificates, one [`NodeServer`] behind every port (one set
//! of caps, one relay, one set of caches), the shared port and each virtual node's own.

use std::net::SocketAddr;
use std::sync::Arc;

use kube::Client;
use rustls::server::ResolvesServerCert;

use super::auth::Authenticator;
use super::connection::{Listeners, serve};
use super::node_ports::NodePorts;
use super::resource_metrics::NodeStats;
use super::server::NodeServer;
use crate::caps::Gate;
use crate::certs::{CsrCert, server_config, serving_certificate, start_client_ca};
use crate::config::{AuthMode, Config};
use crate::leaf::Registry;
use crate::ops::{CertificateCheck, Health, Metrics, Shutdown};
use crate::relay::Relay;
use crate::routing::PodIndex;

/// What the node servers are built from.
pub struct Parts {
    pub config: Arc<Config>,
    pub root: Client,
    pub registry: Registry,
    pub pods: PodIndex,
    pub metrics: Metrics,
    pub node_ports: NodePorts,
    /// The CSR-issued serving certificate (`SERVING_CERT_MODE=csr`).
    pub csr: Option<Arc<CsrCert>>,
}

impl Parts {
    /// Loads the certificates and serves the kubelet API on `listener` (bound to
    /// `LEAF_NODE_IP:NODE_SERVER_PORT`) and on each virtual node's port. The handle ends when
    /// the server has stopped and its sessions have ended or were cut after the grace period.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        health: &Health,
        shutdown: &Shutdown,
    ) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let config = self.config.clone();
        let client_ca = match config.auth_mode {
            AuthMode::None => None,
            _ => Some(start_client_ca(&config, &self.root, shutdown.begin.clone()).await?),
        };
        let (certificate, check): (Arc<dyn ResolvesServerCert>, CertificateCheck) = match &self.csr
        {
            Some(csr) => {
                let csr = csr.clone();
                (
                    csr.clone(),
                    Arc::new(move || csr.problem(std::time::SystemTime::now())),
                )
            }
            None => (serving_certificate(&config)?, Arc::new(|| None)),
        };
        let tls = server_config(certificate, client_ca)?;
        health.certificates_loaded(check);
        let addr = listener.local_addr()?;
        if config.auth_mode == AuthMode::None {
            tracing::warn!(
                "AUTH_MODE=none: anyone who reaches {addr} can exec into every leaf pod; use only in a sandbox"
            );
        }
        tracing::info!(%addr, auth = ?config.auth_mode, "node server listening");
        let node_ports = self.node_ports.clone();
        let listeners = Listeners::new(self.node_server(shutdown));
        node_ports.serve(
            addr,
            config.node_ports,
            tls.clone(),
            listeners.clone(),
            shutdown.begin.clone(),
        );
        // Armed here, not only by the signal handler, so any way of beginning shutdown (a
        // signal, an embedding test) gets the configured grace period.
        let grace = config.shutdown_grace_period;
        let server = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                serve(listener, tls, listeners, None, shutdown.begin.clone()).await;
                shutdown.drain(grace).await;
                tracing::info!("node server stopped; every session has ended");
            }
        });
        Ok((addr, server))
    }

    /// The node server behind every port: one set of caps, one relay and one set of caches.
    fn node_server(self, shutdown: &Shutdown) -> Arc<NodeServer> {
        let gate = Gate::new(self.config.limits);
        let relay = Relay {
            creation_timeout: self.config.stream_creation_timeout,
            idle_timeout: self.config.stream_idle_timeout,
            stop: shutdown.sessions.clone(),
            open: shutdown.open.clone(),
            metrics: self.metrics.clone(),
        };
        let stats = Arc::new(NodeStats::new(
            self.root.clone(),
            self.registry.clone(),
            self.config.leaf_pod_match.clone(),
            self.config.node_stats_cache_ttl,
        ));
        // One authenticator for every port: one cache, and one budget of token reviews.
        let auth = Arc::new(Authenticator::new(
            self.config.auth_mode,
            Some(self.root.clone()),
            self.config.x509_allowed_users.clone(),
        ));
        Arc::new(NodeServer {
            gate,
            auth,
            registry: self.registry,
            pods: self.pods,
            relay,
            metrics: self.metrics,
            stats,
            node_name_prefix: self.config.node_name_prefix.clone(),
            leaf_pod_match: self.config.leaf_pod_match.clone(),
        })
    }
}

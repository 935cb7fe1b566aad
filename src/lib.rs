//! relaylet: the kubelet of virtual nodes whose pods run in leaf clusters.
//!
//! The root kube-apiserver sends `exec`, `attach`, `portForward` and `containerLogs` calls for a
//! virtual node to relaylet's node server; relaylet finds the pod's leaf cluster and relays the
//! call to that cluster's apiserver, splicing the streams. The parts are mapped in
//! docs/development.md, "The parts": the folders below, from the bottom up,
//! are `model`, `config`, `ops`, `certs`, `leaf`, `relay` and `routing`, `node_server`,
//! `replicas` and `virtual_node`; each folder uses only those below it.

pub mod certs;
pub mod config;
pub mod leaf;
pub mod model;
pub mod node_server;
pub mod ops;
pub mod relay;
pub mod replicas;
pub mod routing;
pub mod virtual_node;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use kube::Client;

use rustls::server::ResolvesServerCert;

use crate::certs::{client_ca, csr_approver, serving_csr, tls};
use crate::config::{AuthMode, Config, ServingCert};
use crate::leaf::Registry;
use crate::node_server::{auth, node_ports, resource_metrics};
use crate::ops::shutdown::{self, Shutdown};
use crate::ops::{api_client, health, limits, metrics, telemetry};
use crate::replicas::leader;
use crate::routing::pod_index;

/// The Lease replicas elect their leader on, in relaylet's own namespace.
pub const LEADER_LEASE: &str = "relaylet-leader";

/// A started relaylet.
pub struct Running {
    /// Where the node server listens.
    pub addr: SocketAddr,
    pub registry: Registry,
    pub leadership: leader::Leadership,
    /// Ends when the node server has stopped accepting and its sessions have ended (or were
    /// cut when the shutdown grace period ran out).
    pub server: tokio::task::JoinHandle<()>,
    /// Where the plain-HTTP metrics and health server listens (`METRICS_ADDR`).
    pub metrics_addr: SocketAddr,
    pub metrics: metrics::Metrics,
    /// Each virtual node's own kubelet listener.
    pub node_ports: node_ports::NodePorts,
}

/// `relaylet serve`: relaylet configured by its env vars against the root cluster of
/// `KUBECONFIG` (or the in-cluster one), until SIGTERM or SIGINT and the grace period after.
pub async fn serve() -> anyhow::Result<()> {
    let config = Config::from_env()?;
    telemetry::init(config.log_format);
    let root = api_client::root().await?;
    let shutdown = Shutdown::default();
    shutdown.on_signals(config.shutdown_grace_period);
    let running = start(config, root, shutdown).await?;
    running.server.await?;
    Ok(())
}

/// Starts every part of relaylet against the root cluster `root`; runs until `shutdown` fires.
pub async fn start(config: Config, root: Client, shutdown: Shutdown) -> anyhow::Result<Running> {
    let config = Arc::new(config);
    let metrics = metrics::Metrics::new();
    let (health, metrics_addr) = serve_health(&config, &metrics, &shutdown).await?;
    let registry = watch_leaves(&config, &root, &metrics, &shutdown).await?;
    let pods = pod_index::PodIndex::new(root.clone(), registry.clone());
    let csr = request_serving_certificate(&config, &root, &registry, &metrics, &shutdown);
    let judges = replica_judges(&config, &root, &metrics, &shutdown);
    let leadership = elect_leader(&config, &root, &metrics, &shutdown, csr.clone(), &judges);
    let replicas = join_replicas(
        &config,
        &root,
        &shutdown,
        csr.clone(),
        leadership.clone(),
        judges,
    );
    spawn_until(&shutdown, health.clone().probe(root.clone()));
    // Bound before the node listeners, which take the free ports above it (NODE_SERVER_PORT=0
    // takes any free one).
    let addr = SocketAddr::new(config.leaf_node_ip, config.node_server_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr} (LEAF_NODE_IP:NODE_SERVER_PORT)"))?;
    let node_ports = node_ports::NodePorts::default();
    let controller = Arc::new(virtual_node::Controller {
        config: config.clone(),
        root: root.clone(),
        registry: registry.clone(),
        pods: pods.clone(),
        leadership: leadership.clone(),
        replicas,
        assignment: tokio::sync::watch::Sender::new(Default::default()),
        served: tokio::sync::watch::Sender::new(Default::default()),
        node_ports: node_ports.clone(),
        metrics: metrics.clone(),
        health: health.clone(),
        owner: owner(&config, &root),
        nodes: virtual_node::node_watch::NodeWatch::default(),
        grid: virtual_node::rounds::Grid::starting_now(),
    });
    spawn_until(&shutdown, controller.nodes.clone().run(root.clone()));
    spawn_until(&shutdown, controller.clone().run());
    tokio::spawn(hand_over(controller, shutdown.clone()));
    let parts = NodeServers {
        csr,
        config,
        root,
        registry: registry.clone(),
        pods,
        metrics: metrics.clone(),
        node_ports: node_ports.clone(),
    };
    let (addr, server) = parts.serve(listener, &health, &shutdown).await?;
    Ok(Running {
        addr,
        registry,
        leadership,
        server,
        metrics_addr,
        metrics,
        node_ports,
    })
}

/// Serves metrics and health on `METRICS_ADDR`.
async fn serve_health(
    config: &Config,
    metrics: &metrics::Metrics,
    shutdown: &Shutdown,
) -> anyhow::Result<(Arc<health::Health>, SocketAddr)> {
    let health = health::Health::new(metrics.clone(), shutdown.begin.clone());
    let listener = health::bind(config.metrics_addr)
        .await
        .with_context(|| format!("listening on {} (METRICS_ADDR)", config.metrics_addr))?;
    let addr = listener.local_addr()?;
    tokio::spawn(health::serve(
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
    metrics: &metrics::Metrics,
    shutdown: &Shutdown,
) -> anyhow::Result<Registry> {
    let registry = Registry::default();
    leaf::load_static_leaf(config, &registry, metrics).await?;
    let secret_namespace = config
        .leaf_secret_namespace
        .clone()
        .or_else(|| config.pod_namespace.clone())
        .unwrap_or_else(|| root.default_namespace().to_string());
    let source = leaf::SecretSource {
        root: root.clone(),
        namespace: secret_namespace,
        label: config.leaf_secret_label.clone(),
        owner: owner(config, root),
    };
    spawn_until(
        shutdown,
        leaf::watch_secrets(source, config.clone(), registry.clone(), metrics.clone()),
    );
    Ok(registry)
}

/// This install's identity on its Nodes (`node_ownership::OWNER_LABEL`): its namespace.
fn owner(config: &Config, root: &Client) -> String {
    config
        .pod_namespace
        .clone()
        .unwrap_or_else(|| root.default_namespace().to_string())
}

/// `SERVING_CERT_MODE=csr`: starts requesting (and renewing) the serving certificate from the
/// root cluster's kubelet-serving signer, and the approver when enabled.
fn request_serving_certificate(
    config: &Config,
    root: &Client,
    registry: &Registry,
    metrics: &metrics::Metrics,
    shutdown: &Shutdown,
) -> Option<Arc<serving_csr::CsrCert>> {
    let ServingCert::Csr(settings) = config.serving_cert else {
        return None;
    };
    let cert = serving_csr::CsrCert::new(settings.approver);
    let names = {
        let registry = registry.clone();
        move || registry.node_names()
    };
    if settings.approver {
        let namespace = config
            .pod_namespace
            .clone()
            .unwrap_or_else(|| root.default_namespace().to_string());
        spawn_until(
            shutdown,
            csr_approver::run(root.clone(), namespace, names.clone(), metrics.clone()),
        );
    }
    let subject = serving_csr::Subject {
        name: config.replica_name(),
        ip: config.leaf_node_ip,
    };
    tokio::spawn(cert.clone().run(
        root.clone(),
        subject,
        settings,
        names,
        metrics.clone(),
        shutdown.begin.clone(),
    ));
    Some(cert)
}

/// Shutting down: once `hand_over` fires, waits until the other replicas write this one's
/// virtual nodes (at most `HANDOVER_LIMIT`), then fires `begin` (stop accepting). `begin` fired
/// by anyone else hands over too.
async fn hand_over(controller: Arc<virtual_node::Controller>, shutdown: Shutdown) {
    tokio::select! {
        _ = shutdown.hand_over.cancelled() => {
            let handed = tokio::time::timeout(shutdown::HANDOVER_LIMIT, controller.handed_over()).await;
            match handed {
                // A request the root apiserver routed by the old address just before the new
                // writer's update is still on its way here: a moment to arrive.
                Ok(()) => tokio::time::sleep(shutdown::HANDOVER_SETTLE).await,
                Err(_) => tracing::warn!(
                    nodes = controller.served.borrow().len(),
                    "no other replica took this one's virtual nodes in time: stopping anyway"
                ),
            }
        }
        _ = shutdown.begin.cancelled() => {}
    }
    shutdown.hand_over.cancel();
    shutdown.begin.cancel();
}

/// The future a replica waits for before it takes part in elections: with a CSR-issued
/// serving certificate, its issue (no replica advertises an address it cannot serve TLS on).
async fn eligible(csr: Option<Arc<serving_csr::CsrCert>>) {
    if let Some(cert) = csr {
        cert.ready().await;
    }
}

/// With leader election: who counts as a replica (this install's live pods, watched) and
/// where Leases that break the rules are reported. `None` with `LEADER_ELECT=false`.
fn replica_judges(
    config: &Config,
    root: &Client,
    metrics: &metrics::Metrics,
    shutdown: &Shutdown,
) -> Option<replicas::Judges> {
    if !config.leader_elect {
        return None;
    }
    let namespace = owner(config, root);
    Some(replicas::Judges {
        live: replicas::live_pods::LivePods::watch(
            root.clone(),
            &namespace,
            config.replica_selector.clone(),
            config.replica_name(),
            shutdown.begin.clone(),
        ),
        ignored: replicas::ignored::IgnoredLeases::new(
            root.clone(),
            &namespace,
            metrics.clone(),
            &config.replica_name(),
        ),
    })
}

/// What a replica waits for before it stands in an election: [`eligible`], and with leader
/// election its own pod seen among the live relaylet pods (its peers would ignore it before).
async fn eligible_replica(
    csr: Option<Arc<serving_csr::CsrCert>>,
    judges: Option<replicas::Judges>,
    me: String,
) {
    eligible(csr).await;
    if let Some(judges) = judges {
        judges.live.includes(&me).await;
    }
}

/// Joins the replicas that share the virtual nodes (alone with `LEADER_ELECT=false`).
fn join_replicas(
    config: &Config,
    root: &Client,
    shutdown: &Shutdown,
    csr: Option<Arc<serving_csr::CsrCert>>,
    leadership: leader::Leadership,
    judges: Option<replicas::Judges>,
) -> replicas::Replicas {
    let Some(judges) = judges else {
        return replicas::Replicas::alone(config.replica_name(), eligible(csr));
    };
    replicas::Replicas::join(
        root.clone(),
        &owner(config, root),
        config.replica_name(),
        eligible_replica(csr, Some(judges.clone()), config.replica_name()),
        leadership,
        judges,
        shutdown.hand_over.clone(),
    )
}

/// Takes part in leader election (or leads alone with `LEADER_ELECT=false`), and keeps the
/// leader gauge up to date. With a CSR-issued certificate, only once it is issued.
fn elect_leader(
    config: &Config,
    root: &Client,
    metrics: &metrics::Metrics,
    shutdown: &Shutdown,
    csr: Option<Arc<serving_csr::CsrCert>>,
    judges: &Option<replicas::Judges>,
) -> leader::Leadership {
    let leadership = if let Some(judges) = judges {
        let namespace = config
            .pod_namespace
            .clone()
            .unwrap_or_else(|| root.default_namespace().to_string());
        leader::elect(
            root.clone(),
            &namespace,
            LEADER_LEASE,
            config.replica_name(),
            leader::Holders::LivePods(judges.live.clone()),
            judges.ignored.clone(),
            eligible_replica(csr, Some(judges.clone()), config.replica_name()),
            shutdown.hand_over.clone(),
        )
    } else if matches!(config.serving_cert, ServingCert::Csr(_)) {
        leader::Leadership::once(eligible(csr))
    } else {
        leader::Leadership::always()
    };
    tokio::spawn({
        let mut leadership = leadership.clone();
        let gauge = metrics.leader.clone();
        let begin = shutdown.begin.clone();
        async move {
            loop {
                gauge.set(i64::from(leadership.is_leader()));
                tokio::select! {
                    _ = leadership.changed() => {}
                    // Shutting down releases leadership at once (see `leader::elect`).
                    _ = begin.cancelled() => break,
                }
            }
            gauge.set(0);
        }
    });
    leadership
}

/// What the node servers (the kubelet API on the shared port and on each virtual node's own)
/// are built from.
struct NodeServers {
    /// The CSR-issued serving certificate (`SERVING_CERT_MODE=csr`).
    csr: Option<Arc<serving_csr::CsrCert>>,
    config: Arc<Config>,
    root: Client,
    registry: Registry,
    pods: pod_index::PodIndex,
    metrics: metrics::Metrics,
    node_ports: node_ports::NodePorts,
}

impl NodeServers {
    /// Loads the certificates, binds `LEAF_NODE_IP:NODE_SERVER_PORT` and serves the kubelet
    /// API there and on each virtual node's port. The handle ends when the server has stopped
    /// and its sessions have ended or were cut after the grace period.
    async fn serve(
        self,
        listener: tokio::net::TcpListener,
        health: &health::Health,
        shutdown: &Shutdown,
    ) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let config = self.config.clone();
        let client_ca = match config.auth_mode {
            AuthMode::None => None,
            _ => Some(client_ca::start(&config, &self.root, shutdown.begin.clone()).await?),
        };
        let (certificate, check): (Arc<dyn ResolvesServerCert>, health::CertificateCheck) =
            match &self.csr {
                Some(csr) => {
                    let csr = csr.clone();
                    (
                        csr.clone(),
                        Arc::new(move || csr.problem(std::time::SystemTime::now())),
                    )
                }
                None => (tls::certificate(&config)?, Arc::new(|| None)),
            };
        let tls = tls::server_config(certificate, client_ca)?;
        health.certificates_loaded(check);
        let addr = listener.local_addr()?;
        if config.auth_mode == AuthMode::None {
            tracing::warn!(
                "AUTH_MODE=none: anyone who reaches {addr} can exec into every leaf pod; use only in a sandbox"
            );
        }
        tracing::info!(%addr, auth = ?config.auth_mode, "node server listening");
        let node_ports = self.node_ports.clone();
        let listeners = node_server::Listeners::new(self.node_server(shutdown));
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
                node_server::serve(listener, tls, listeners, None, shutdown.begin.clone()).await;
                shutdown.drain(grace).await;
                tracing::info!("node server stopped; every session has ended");
            }
        });
        Ok((addr, server))
    }

    /// Makes the node server behind every port, the shared one and each virtual node's: one set
    /// of caps, one relay and one set of caches.
    fn node_server(self, shutdown: &Shutdown) -> Arc<node_server::NodeServer> {
        let gate = limits::Gate::new(self.config.limits);
        let relay = relay::Relay {
            creation_timeout: self.config.stream_creation_timeout,
            idle_timeout: self.config.stream_idle_timeout,
            stop: shutdown.sessions.clone(),
            open: shutdown.open.clone(),
            metrics: self.metrics.clone(),
        };
        let stats = Arc::new(resource_metrics::NodeStats::new(
            self.root.clone(),
            self.registry.clone(),
            self.config.leaf_pod_match.clone(),
            self.config.node_stats_cache_ttl,
        ));
        // One authenticator for every port: one cache, and one budget of token reviews.
        let auth = Arc::new(auth::Authenticator::new(
            self.config.auth_mode,
            Some(self.root.clone()),
            self.config.x509_allowed_users.clone(),
        ));
        Arc::new(node_server::NodeServer {
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

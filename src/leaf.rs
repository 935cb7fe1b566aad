//! The leaf clusters relaylet knows, each with the clients that reach its apiserver.
//!
//! A leaf is a kubeconfig: from a Secret labelled `relaylet.io/leaf-cluster: <name>` (watched,
//! so adding, changing or deleting one takes effect without a restart) or from the
//! `LEAF_KUBECONFIG` file. Each leaf gets two kube clients built from the same kubeconfig, so
//! both carry its TLS settings and credentials (client certificates, bearer tokens, exec
//! plugins): one for ordinary API calls, and one for relayed streams, which has no read or write
//! timeout (an interactive shell may be quiet for hours; relaylet enforces its own idle timeout)
//! and no retries (a retried exec would run a command twice).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Taint};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::config::Config;
use crate::counterpart::{NAMESPACE_MAP_ANNOTATION, NamespaceMap};
use crate::dns::check_dns_label;
use crate::metrics::Metrics;
use crate::read_ahead::ReadAheadConnector;
use crate::warm_connector::{Sources, WarmConnector};

/// The client for relayed streams: the same TLS settings, credentials and headers as
/// `Client::try_from(config)`, but its TCP connections set `TCP_NODELAY`. kube's own connector
/// leaves Nagle's algorithm on, which holds back an interactive session's small TLS records
/// until the previous one is acknowledged (measured by `relaylet-dev bench`: p99 keystroke round
/// trips of ~1.7 ms instead of ~0.15 ms). Its connector keeps a spare connection dialed for the
/// next session (see [`WarmConnector`]).
fn stream_client(
    config: &kube::Config,
    sources: Sources,
    spare: bool,
) -> Result<Client, kube::Error> {
    use kube::client::ConfigExt;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = WarmConnector::new(
        config.rustls_https_connector_with_connector(ReadAheadConnector(http))?,
        sources,
        spare,
    );
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, kube::client::Body>(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// Annotation on a leaf Secret that overrides its virtual node's name.
pub const NODE_NAME_ANNOTATION: &str = "relaylet.io/node-name";
/// The Secret key holding the kubeconfig.
pub const KUBECONFIG_KEY: &str = "kubeconfig";

/// One leaf cluster.
pub struct Leaf {
    /// The leaf's name (the Secret label's value).
    pub name: String,
    /// The virtual node that stands for this leaf in the root cluster.
    pub node_name: String,
    /// For ordinary API calls (reads, watches).
    pub client: Client,
    /// For relayed exec/attach/port-forward/logs: no timeouts, no retries.
    pub stream_client: Client,
    /// Extra labels for the virtual Node (Secret annotation `relaylet.io/node-labels`).
    pub node_labels: BTreeMap<String, String>,
    /// Taints replacing the default one (Secret annotation `relaylet.io/node-taints`).
    pub node_taints: Option<Vec<Taint>>,
    /// Root namespace → leaf namespace (Secret annotation `relaylet.io/namespace-map`, or
    /// `LEAF_NAMESPACE_MAP`); the administrator's, never a pod author's.
    pub namespaces: NamespaceMap,
}

impl std::fmt::Debug for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaf")
            .field("name", &self.name)
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

/// Why a leaf could not be set up. Never carries kubeconfig contents (they hold secrets).
#[derive(Debug, thiserror::Error)]
pub enum LeafError {
    #[error("leaf Secret {secret}: {message}")]
    BadSecret { secret: String, message: String },
    #[error("leaf {leaf}: kubeconfig: {source}")]
    Kubeconfig {
        leaf: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("leaf {leaf}: building client: {source}")]
    Client {
        leaf: String,
        #[source]
        source: kube::Error,
    },
}

impl Leaf {
    /// Builds a leaf's clients from kubeconfig text; its stream connections are counted in
    /// `metrics`, and with `spare` one is kept dialed ahead of the next session.
    pub async fn from_kubeconfig(
        name: &str,
        node_name: &str,
        kubeconfig_yaml: &str,
        metrics: &Metrics,
        spare: bool,
    ) -> Result<Leaf, LeafError> {
        let kubeconfig_err = |source| LeafError::Kubeconfig {
            leaf: name.to_string(),
            source,
        };
        let kubeconfig = Kubeconfig::from_yaml(kubeconfig_yaml).map_err(kubeconfig_err)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_err)?;
        let client_err = |source| LeafError::Client {
            leaf: name.to_string(),
            source,
        };
        let mut stream_config = config.clone();
        stream_config.read_timeout = None;
        stream_config.write_timeout = None;
        stream_config.default_retry = false;
        Ok(Leaf {
            name: name.to_string(),
            node_name: node_name.to_string(),
            client: Client::try_from(config).map_err(client_err)?,
            stream_client: stream_client(
                &stream_config,
                metrics.leaf_connection_sources(name),
                spare,
            )
            .map_err(client_err)?,
            node_labels: BTreeMap::new(),
            node_taints: None,
            namespaces: NamespaceMap::default(),
        })
    }
}

/// The leaves by virtual node name. Cheap to clone; readers see a consistent snapshot.
#[derive(Clone)]
pub struct Registry {
    leaves: watch::Sender<BTreeMap<String, Arc<Leaf>>>,
    /// Set once the leaf Secrets have been listed: only then is a missing leaf really gone.
    synced: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            leaves: watch::Sender::new(BTreeMap::new()),
            synced: Arc::default(),
        }
    }
}

impl Registry {
    /// Whether the leaf Secrets have been listed at least once.
    pub fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The leaf behind virtual node `node_name`.
    pub fn by_node(&self, node_name: &str) -> Option<Arc<Leaf>> {
        self.leaves.borrow().get(node_name).cloned()
    }

    /// All leaves now.
    pub fn snapshot(&self) -> BTreeMap<String, Arc<Leaf>> {
        self.leaves.borrow().clone()
    }

    /// Wakes whenever the set of leaves changes.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, Arc<Leaf>>> {
        self.leaves.subscribe()
    }

    /// Adds or replaces a leaf (keyed by its virtual node name).
    pub fn insert(&self, leaf: Leaf) {
        tracing::info!(leaf = %leaf.name, node = %leaf.node_name, "leaf cluster registered");
        let leaf = Arc::new(leaf);
        self.leaves.send_modify(|map| {
            // A leaf renamed its node: drop the old entry so one leaf never has two nodes.
            map.retain(|_, l| l.name != leaf.name);
            map.insert(leaf.node_name.clone(), leaf);
        });
    }

    /// Removes leaf `name`.
    pub fn remove(&self, name: &str) {
        self.leaves.send_if_modified(|map| {
            let before = map.len();
            map.retain(|_, l| l.name != name);
            let changed = map.len() != before;
            if changed {
                tracing::info!(leaf = %name, "leaf cluster removed");
            }
            changed
        });
    }

    /// Keeps only leaves whose names are in `names`.
    fn retain_names(&self, names: &[String]) {
        self.leaves.send_if_modified(|map| {
            let before = map.len();
            map.retain(|_, l| names.contains(&l.name));
            map.len() != before
        });
    }
}

/// Adds the `LEAF_KUBECONFIG` leaf, if configured.
pub async fn load_static_leaf(
    config: &Config,
    registry: &Registry,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    if let Some(leaf) = &config.static_leaf {
        let yaml = tokio::fs::read_to_string(&leaf.kubeconfig)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "LEAF_KUBECONFIG: reading {}: {e}",
                    leaf.kubeconfig.display()
                )
            })?;
        let mut built = Leaf::from_kubeconfig(
            &leaf.name,
            &config.node_name(&leaf.name),
            &yaml,
            metrics,
            config.leaf_spare_connection,
        )
        .await?;
        built.namespaces = leaf.namespaces.clone();
        registry.insert(built);
    }
    Ok(())
}

/// Watches labelled leaf Secrets in `namespace` and keeps `registry` in step until the stream
/// ends (it only ends when the task is dropped; watch errors are retried with backoff).
pub async fn watch_secrets(
    root: Client,
    namespace: String,
    label: String,
    config: Arc<Config>,
    registry: Registry,
    metrics: Metrics,
) {
    let api: Api<Secret> = Api::namespaced(root, &namespace);
    let watch_config = watcher::Config::default().labels(&label);
    let mut events = watcher(api, watch_config).default_backoff().boxed();
    // Names seen during a (re)list; leaves not seen are gone.
    let mut relisted: Vec<String> = Vec::new();
    let static_name = config.static_leaf.as_ref().map(|l| l.name.clone());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => relisted.clear(),
            Ok(watcher::Event::InitApply(secret)) => {
                if let Some(name) =
                    apply_secret(&secret, &label, &config, &registry, &metrics).await
                {
                    relisted.push(name);
                }
            }
            Ok(watcher::Event::InitDone) => {
                relisted.extend(static_name.clone());
                registry.retain_names(&relisted);
                registry
                    .synced
                    .store(true, std::sync::atomic::Ordering::Release);
                // Wake subscribers even when nothing changed: a synced registry is news (the
                // virtual node controller may now look for orphans).
                registry.leaves.send_modify(|_| {});
            }
            Ok(watcher::Event::Apply(secret)) => {
                apply_secret(&secret, &label, &config, &registry, &metrics).await;
            }
            Ok(watcher::Event::Delete(secret)) => {
                if let Some(name) = leaf_name(&secret, &label)
                    && Some(&name) != static_name.as_ref()
                {
                    registry.remove(&name);
                }
            }
            Err(err) => tracing::warn!(%err, namespace = %namespace, "watching leaf Secrets"),
        }
    }
}

fn leaf_name(secret: &Secret, label: &str) -> Option<String> {
    secret.metadata.labels.as_ref()?.get(label).cloned()
}

/// Registers the leaf a Secret describes; returns its name when it is valid.
async fn apply_secret(
    secret: &Secret,
    label: &str,
    config: &Config,
    registry: &Registry,
    metrics: &Metrics,
) -> Option<String> {
    let secret_name = secret.metadata.name.clone().unwrap_or_default();
    match leaf_from_secret(secret, label, config, metrics).await {
        Ok(leaf) => {
            let name = leaf.name.clone();
            registry.insert(leaf);
            Some(name)
        }
        Err(err) => {
            // A broken Secret must not take a working leaf down with it: keep the old one.
            tracing::error!(secret = %secret_name, %err, "ignoring leaf Secret");
            leaf_name(secret, label).filter(|n| registry.snapshot().values().any(|l| &l.name == n))
        }
    }
}

async fn leaf_from_secret(
    secret: &Secret,
    label: &str,
    config: &Config,
    metrics: &Metrics,
) -> Result<Leaf, LeafError> {
    let secret_name = secret.metadata.name.clone().unwrap_or_default();
    let bad = |message: String| LeafError::BadSecret {
        secret: secret_name.clone(),
        message,
    };
    let name = leaf_name(secret, label).ok_or_else(|| bad(format!("no {label} label")))?;
    check_dns_label(&name).map_err(|m| bad(format!("label {label}: {m}")))?;
    let node_name = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_NAME_ANNOTATION))
        .cloned()
        .unwrap_or_else(|| config.node_name(&name));
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .ok_or_else(|| bad(format!("no {KUBECONFIG_KEY:?} key")))?;
    let yaml = std::str::from_utf8(&data.0)
        .map_err(|_| bad(format!("{KUBECONFIG_KEY:?} is not UTF-8")))?;
    let annotations = secret.metadata.annotations.clone().unwrap_or_default();
    let overrides = crate::node_overrides::overrides(&annotations).map_err(bad)?;
    let namespaces = match annotations.get(NAMESPACE_MAP_ANNOTATION) {
        None => NamespaceMap::default(),
        Some(text) => NamespaceMap::parse(text)
            .map_err(|m| bad(format!("annotation {NAMESPACE_MAP_ANNOTATION}: {m}")))?,
    };
    let mut leaf = Leaf::from_kubeconfig(
        &name,
        &node_name,
        yaml,
        metrics,
        config.leaf_spare_connection,
    )
    .await?;
    leaf.node_labels = overrides.labels;
    leaf.node_taints = overrides.taints;
    leaf.namespaces = namespaces;
    Ok(leaf)
}

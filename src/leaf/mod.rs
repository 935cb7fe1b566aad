//! The leaf clusters relaylet knows, each with the clients that reach its apiserver. This
//! subsystem offers the [`Registry`] of [`Leaf`]s (filled by [`watch_secrets`] and
//! [`load_static_leaf`]) to everything that reaches a leaf. Inside: this file (the registry and
//! its Secret watch), `clients` (a leaf's two API clients, built on first use), `kubeconfig`,
//! `names`, `refusal`, `dialer` (the one way to open a TCP connection to a leaf), `proxy` (a
//! leaf behind a proxy) and `warm_connector` (a spare connection dialled ahead).
//!
//! A leaf is a kubeconfig: from a Secret labelled `relaylet.io/leaf-cluster: <name>` (watched,
//! so adding, changing or deleting one takes effect without a restart) or from the
//! `LEAF_KUBECONFIG` file. A Secret is data, not code: its kubeconfig may carry inline
//! credentials only (`kubeconfig`), its names may not take over another leaf's or a Node
//! this install does not own (`names`), and a refused Secret registers nothing and says
//! why (`refusal`). Each leaf gets two kube clients built from the same kubeconfig
//! (`clients`).

mod clients;
pub mod dialer;
pub mod kubeconfig;
pub mod names;
pub mod proxy;
pub mod refusal;
pub mod warm_connector;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Secret, Taint};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::config::Config;
use crate::leaf::clients::LeafClients;
use crate::leaf::dialer::LeafDialer;
use crate::leaf::names::{Claim, Reserved};
use crate::leaf::proxy::{LeafProxy, ProxySetupError, ProxyTls};
use crate::leaf::refusal::{Refusal, Reporter};
use crate::model::counterpart::{NAMESPACE_MAP_ANNOTATION, NamespaceMap};
use crate::model::dns::{check_dns_label, check_node_name};
use crate::ops::calls::Calls;
use crate::ops::metrics::Metrics;

/// The `proxy-url` of the cluster the kubeconfig's current context uses (the entry kube builds
/// the client from), if any.
pub fn proxy_url(kubeconfig: &Kubeconfig) -> Option<&str> {
    let context = kubeconfig.current_context.as_deref()?;
    let cluster = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .cluster
        .as_str();
    kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == cluster)?
        .cluster
        .as_ref()?
        .proxy_url
        .as_deref()
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
    /// Its two API clients, built on first use: see [`Leaf::client`].
    clients: LeafClients,
    /// The proxy every connection to this leaf goes through (`host:port`), if any.
    pub proxy: Option<String>,
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
    #[error("leaf {leaf}: kubeconfig: {source}")]
    Kubeconfig {
        leaf: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("leaf {leaf}: {source}")]
    Proxy {
        leaf: String,
        #[source]
        source: ProxySetupError,
    },
    #[error("leaf {leaf}: building client: {source}")]
    Client {
        leaf: String,
        #[source]
        source: kube::Error,
    },
}

impl LeafError {
    /// The error of leaf `leaf`'s unusable kubeconfig.
    fn kubeconfig(leaf: &str) -> impl FnOnce(kube::config::KubeconfigError) -> LeafError + '_ {
        move |source| LeafError::Kubeconfig {
            leaf: leaf.to_string(),
            source,
        }
    }
}

impl Leaf {
    /// The client for ordinary API calls (reads, watches), built on first use.
    pub fn client(&self) -> Calls {
        self.clients.api()
    }

    /// The client for relayed exec/attach/port-forward/logs (no timeouts, no retries), built on
    /// first use.
    pub fn stream_client(&self) -> Calls {
        self.clients.stream()
    }

    /// Drops the leaf's clients (a replica that no longer serves its Node): their connections,
    /// TLS state and buffers are freed once calls in flight end, and the next use builds them
    /// again.
    pub fn release_clients(&self) {
        self.clients.release();
    }

    /// Builds a leaf's clients from kubeconfig text; its stream connections are counted in
    /// `metrics`, and with `spare` one is kept dialed ahead of the next session.
    pub async fn from_kubeconfig(
        name: &str,
        node_name: &str,
        kubeconfig_yaml: &str,
        metrics: &Metrics,
        spare: bool,
    ) -> Result<Leaf, LeafError> {
        let kubeconfig =
            Kubeconfig::from_yaml(kubeconfig_yaml).map_err(LeafError::kubeconfig(name))?;
        Leaf::from_parsed(
            name,
            node_name,
            kubeconfig,
            &ProxyTls::default(),
            metrics,
            spare,
        )
        .await
    }

    /// Builds a leaf's clients from a parsed kubeconfig, used as it is: a leaf Secret's must
    /// have passed `kubeconfig::check` first (this reads the files it names). A
    /// `proxy-url` is used with `proxy_tls` (the leaf Secret's keys for an `https://` proxy).
    pub async fn from_parsed(
        name: &str,
        node_name: &str,
        kubeconfig: Kubeconfig,
        proxy_tls: &ProxyTls,
        metrics: &Metrics,
        spare: bool,
    ) -> Result<Leaf, LeafError> {
        let proxy = proxy_url(&kubeconfig)
            .map(|url| LeafProxy::new(url, proxy_tls))
            .transpose()
            .map_err(|source| LeafError::Proxy {
                leaf: name.to_string(),
                source,
            })?;
        let dialer = LeafDialer::new(name, proxy);
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(LeafError::kubeconfig(name))?;
        let client_err = |source| LeafError::Client {
            leaf: name.to_string(),
            source,
        };
        let proxy = dialer.proxy().map(|p| p.url.to_string());
        let clients = LeafClients::new(name, config, dialer, metrics, spare);
        // Refused now, with the leaf's Secret, not at first use: whatever makes a client fail
        // to build (its TLS settings, credentials, headers) is in the kubeconfig, and the
        // stream client is built from the same. Built and dropped: a replica that does not
        // serve the leaf keeps no client.
        clients.build_api().map_err(client_err)?;
        Ok(Leaf {
            name: name.to_string(),
            node_name: node_name.to_string(),
            proxy,
            clients,
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

    /// The virtual node names of the leaves registered now.
    pub fn node_names(&self) -> std::collections::BTreeSet<String> {
        self.leaves
            .borrow()
            .values()
            .map(|leaf| leaf.node_name.clone())
            .collect()
    }

    /// Wakes whenever the set of leaves changes.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, Arc<Leaf>>> {
        self.leaves.subscribe()
    }

    /// Adds or replaces a leaf (keyed by its virtual node name).
    pub fn insert(&self, leaf: Leaf) {
        self.replace(None, leaf);
    }

    /// Adds `leaf` in place of `old` (the same Secret's previous leaf, which may have had
    /// another name), in one step so watchers never see the leaf missing.
    fn replace(&self, old: Option<&Arc<Leaf>>, leaf: Leaf) -> Arc<Leaf> {
        tracing::info!(
            leaf = %leaf.name,
            node = %leaf.node_name,
            proxy = leaf.proxy.as_deref().unwrap_or("none"),
            "leaf cluster registered"
        );
        let leaf = Arc::new(leaf);
        self.leaves.send_modify(|map| {
            // A leaf renamed its node: drop the old entry so one leaf never has two nodes.
            map.retain(|_, l| l.name != leaf.name && !old.is_some_and(|o| Arc::ptr_eq(o, l)));
            map.insert(leaf.node_name.clone(), leaf.clone());
        });
        leaf
    }

    /// Removes exactly `leaf` (not another leaf of the same name).
    fn remove_exact(&self, leaf: &Arc<Leaf>) {
        self.leaves.send_if_modified(|map| {
            let before = map.len();
            map.retain(|_, l| !Arc::ptr_eq(l, leaf));
            let changed = map.len() != before;
            if changed {
                tracing::info!(leaf = %leaf.name, node = %leaf.node_name, "leaf cluster removed");
            }
            changed
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
}

/// Adds the `LEAF_KUBECONFIG` leaf, if configured. Its kubeconfig is used as it is (exec
/// plugins, file paths and all), unlike a leaf Secret's: the file is the administrator's, who
/// controls relaylet's pod anyway. Only credentials over plain HTTP refuse it, as they refuse
/// a Secret (relaylet then does not start, saying why).
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
        let kubeconfig = Kubeconfig::from_yaml(&yaml).map_err(LeafError::kubeconfig(&leaf.name))?;
        // The one rule the administrator's file is held to: no credentials over plain HTTP.
        if let Err(refused) = crate::leaf::kubeconfig::check_plaintext(&kubeconfig) {
            anyhow::bail!(
                "LEAF_KUBECONFIG {} refused: {refused}",
                leaf.kubeconfig.display()
            );
        }
        let mut built = Leaf::from_parsed(
            &leaf.name,
            &config.node_name(&leaf.name),
            kubeconfig,
            &ProxyTls::default(),
            metrics,
            config.leaf_spare_connection,
        )
        .await?;
        built.namespaces = leaf.namespaces.clone();
        registry.insert(built);
    }
    Ok(())
}

/// Where and how leaf Secrets are watched, and whose Nodes they may name.
pub struct SecretSource {
    pub root: Client,
    pub namespace: String,
    /// The label that marks leaf Secrets; its value is the leaf name.
    pub label: String,
    /// This install's owner label value on its Nodes (see `node_ownership`).
    pub owner: String,
}

/// Leaf Secret events decided on together at most: a writer who never pauses still gets
/// decisions.
const MAX_BATCH: usize = 1024;

/// Watches labelled leaf Secrets and keeps `registry` in step until the stream ends (it only
/// ends when the task is dropped; watch errors are retried with backoff).
pub async fn watch_secrets(
    source: SecretSource,
    config: Arc<Config>,
    registry: Registry,
    metrics: Metrics,
) {
    let api: Api<Secret> = Api::namespaced(source.root.clone(), &source.namespace);
    let watch_config = watcher::Config::default().labels(&source.label);
    let mut events = watcher(api.clone(), watch_config).default_backoff().boxed();
    let namespace = source.namespace.clone();
    let mut secrets = LeafSecrets {
        reporter: Reporter {
            root: source.root.clone(),
            metrics: metrics.clone(),
            instance: config.replica_name(),
        },
        nodes: Api::all(source.root),
        owner: source.owner,
        label: source.label,
        config,
        registry,
        metrics,
        secrets: BTreeMap::new(),
        seen: BTreeMap::new(),
        api,
        stripped: HashSet::new(),
    };
    // The Secrets of a (re)list, decided on together once it is complete.
    let mut relisted: BTreeMap<String, Secret> = BTreeMap::new();
    while let Some(first) = events.next().await {
        // Every event already waiting is taken before deciding: each decision is a pass over
        // all Secrets, and a fleet registering 1,000 leaves in a burst would otherwise make
        // 1,000 passes over up to 1,000 Secrets (`relaylet-dev bench --only fleet`).
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH
            && let Some(Some(event)) = events.next().now_or_never()
        {
            batch.push(event);
        }
        let (mut changed, mut synced) = (false, false);
        for event in batch {
            match event {
                Ok(watcher::Event::Init) => relisted.clear(),
                Ok(watcher::Event::InitApply(secret)) => {
                    relisted.insert(
                        secret.metadata.name.clone().unwrap_or_default(),
                        lean(secret),
                    );
                }
                Ok(watcher::Event::InitDone) => {
                    secrets.secrets = std::mem::take(&mut relisted);
                    secrets.stripped.clear();
                    (changed, synced) = (true, true);
                }
                Ok(watcher::Event::Apply(secret)) => {
                    let name = secret.metadata.name.clone().unwrap_or_default();
                    secrets.stripped.remove(&name);
                    secrets.secrets.insert(name, lean(secret));
                    changed = true;
                }
                Ok(watcher::Event::Delete(secret)) => {
                    let name = secret.metadata.name.clone().unwrap_or_default();
                    secrets.stripped.remove(&name);
                    secrets.secrets.remove(&name);
                    changed = true;
                }
                Err(err) => tracing::warn!(%err, namespace = %namespace, "watching leaf Secrets"),
            }
        }
        if changed {
            secrets.reconcile().await;
        }
        if synced {
            secrets
                .registry
                .synced
                .store(true, std::sync::atomic::Ordering::Release);
            // Wake subscribers even when nothing changed: a synced registry is news (the
            // virtual node controller may now look for orphans).
            secrets.registry.leaves.send_modify(|_| {});
        }
    }
}

/// The leaf Secrets and what was decided for each.
struct LeafSecrets {
    label: String,
    config: Arc<Config>,
    registry: Registry,
    metrics: Metrics,
    reporter: Reporter,
    nodes: Api<Node>,
    owner: String,
    /// Every labelled Secret now, by name; without its data once its leaf is registered (see
    /// `stripped`).
    secrets: BTreeMap<String, Secret>,
    /// What was decided for each Secret, by name.
    seen: BTreeMap<String, Seen>,
    /// The leaf Secrets, to read one again whose data was dropped.
    api: Api<Secret>,
    /// The Secrets kept without their data: their leaf is registered, and the data (the
    /// kubeconfig, 2 KiB or more) was needed only to build it. Every replica keeps every leaf
    /// Secret of the fleet (at 1,000 leaves and three replicas a Secret's data cost 8 KiB per
    /// leaf served). Deciding on one of them again (its names lost and won back) reads it
    /// again first.
    stripped: HashSet<String>,
}

/// What was decided for one Secret.
struct Seen {
    /// The Secret's resourceVersion then (`None`: decide again at the next chance).
    resource_version: Option<String>,
    /// The names verdict then.
    names: Result<(String, String), Refusal>,
    /// The leaf registered from this Secret: kept while a later version is refused for its
    /// own content, dropped when its names go to another Secret or it is deleted.
    leaf: Option<Arc<Leaf>>,
}

impl Seen {
    /// Whether this decision still stands for `secret` with these `names`: the same version
    /// of it, decided for good, with the same verdict on its names.
    fn decided(&self, secret: &Secret, names: &Result<(String, String), Refusal>) -> bool {
        self.resource_version.is_some()
            && self.resource_version == secret.metadata.resource_version
            && self.names == *names
    }
}

impl LeafSecrets {
    /// Decides again for every Secret whose content or names verdict changed: registers,
    /// replaces, removes, or refuses (once per change, so relists and other Secrets' events
    /// do not repeat a refusal).
    async fn reconcile(&mut self) {
        for (name, seen) in std::mem::take(&mut self.seen) {
            if self.secrets.contains_key(&name) {
                self.seen.insert(name, seen);
            } else if let Some(leaf) = seen.leaf {
                self.registry.remove_exact(&leaf);
            }
        }
        let names: BTreeMap<String, Result<(String, String), Refusal>> = self
            .secrets
            .iter()
            .map(|(name, secret)| (name.clone(), self.names(secret)))
            .collect();
        let reserved = self.config.static_leaf.as_ref().map(|l| Reserved {
            leaf: l.name.clone(),
            node: self.config.node_name(&l.name),
        });
        let claims = names
            .iter()
            .filter_map(|(secret, names)| {
                let (leaf, node) = names.as_ref().ok()?;
                Some(Claim {
                    secret: secret.clone(),
                    created: self
                        .secrets
                        .get(secret)?
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0),
                    leaf: leaf.clone(),
                    node: node.clone(),
                })
            })
            .collect();
        let mut verdicts = crate::leaf::names::resolve(reserved.as_ref(), claims);
        let (winners, losers): (Vec<_>, Vec<_>) = names
            .into_iter()
            .map(|(name, names)| {
                let names = names.and_then(|pair| match verdicts.remove(&name) {
                    Some(Err(refusal)) => Err(refusal),
                    _ => Ok(pair),
                });
                (name, names)
            })
            .partition(|(_, names)| names.is_ok());
        // Winners first: a node taken over from a younger Secret gets its new leaf before the
        // old one goes, so the node is never without a leaf (the controller would delete it).
        for (name, names) in winners.into_iter().chain(losers) {
            let Some(secret) = self.secrets.get(&name) else {
                continue;
            };
            if self
                .seen
                .get(&name)
                .is_some_and(|seen| seen.decided(secret, &names))
            {
                continue;
            }
            let secret = if self.stripped.contains(&name) {
                match self.read_again(&name).await {
                    Some(secret) => secret,
                    // Said in the log; the next event of any leaf Secret tries again.
                    None => continue,
                }
            } else {
                secret.clone()
            };
            self.decide(&name, &secret, names).await;
        }
        self.strip_registered();
    }

    /// Drops the data of every Secret whose leaf is registered from this very version.
    fn strip_registered(&mut self) {
        for (name, secret) in &mut self.secrets {
            let registered = self.seen.get(name).is_some_and(|seen| {
                seen.leaf.is_some() && seen.resource_version == secret.metadata.resource_version
            });
            if registered && secret.data.is_some() {
                secret.data = None;
                secret.string_data = None;
                self.stripped.insert(name.clone());
            }
        }
    }

    /// Secret `name` read again whole (its data was dropped), and kept so until decided.
    async fn read_again(&mut self, name: &str) -> Option<Secret> {
        // A list of the one Secret: relaylet's Role lets it list and watch Secrets, not get them.
        let params = ListParams::default()
            .labels(&self.label)
            .fields(&format!("metadata.name={name}"));
        match self
            .api
            .list(&params)
            .await
            .map(|l| l.items.into_iter().next())
        {
            Ok(Some(secret)) => {
                let secret = lean(secret);
                self.stripped.remove(name);
                self.secrets.insert(name.to_string(), secret.clone());
                Some(secret)
            }
            // Deleted meanwhile: its Delete event comes next.
            Ok(None) => None,
            Err(err) => {
                tracing::warn!(secret = name, %err, "reading a leaf Secret again to decide on it");
                None
            }
        }
    }

    /// The leaf and node names a Secret asks for, if they are well formed.
    fn names(&self, secret: &Secret) -> Result<(String, String), Refusal> {
        let label = &self.label;
        let leaf = leaf_name(secret, label)
            .ok_or_else(|| Refusal::Invalid(format!("no {label} label")))?;
        check_dns_label(&leaf).map_err(|m| Refusal::Invalid(format!("label {label}: {m}")))?;
        let node = match annotation(secret, NODE_NAME_ANNOTATION) {
            Some(node) => {
                check_node_name(node, &self.config.node_name_prefix)
                    .map_err(Refusal::NodeNameInvalid)?;
                node.to_string()
            }
            None => self.config.node_name(&leaf),
        };
        Ok((leaf, node))
    }

    async fn decide(
        &mut self,
        name: &str,
        secret: &Secret,
        names: Result<(String, String), Refusal>,
    ) {
        let resource_version = secret.metadata.resource_version.clone();
        let mut leaf = self.seen.remove(name).and_then(|seen| seen.leaf);
        let outcome = match &names {
            Err(refusal) => Err(refusal.clone()),
            Ok((leaf_name, node_name)) => self.leaf_from_secret(secret, leaf_name, node_name).await,
        };
        let mut resource_version = resource_version;
        match outcome {
            Ok(built) => leaf = Some(self.registry.replace(leaf.as_ref(), built)),
            Err(refusal) => {
                if refusal.lost_names()
                    && let Some(old) = leaf.take()
                {
                    // Its names belong to an older Secret now: that one's leaf takes over.
                    self.registry.remove_exact(&old);
                }
                if matches!(refusal, Refusal::NodeCheckFailed { .. }) {
                    // Not the Secret's fault: try again at the next event.
                    resource_version = None;
                }
                let leaf_name = names.as_ref().ok().map(|(l, _)| l.as_str());
                self.reporter.refused(secret, leaf_name, &refusal).await;
            }
        }
        self.seen.insert(
            name.to_string(),
            Seen {
                resource_version,
                names,
                leaf,
            },
        );
    }

    /// Builds the leaf a Secret describes, after checking that its kubeconfig is data only and
    /// that its node is not someone else's.
    async fn leaf_from_secret(
        &self,
        secret: &Secret,
        name: &str,
        node_name: &str,
    ) -> Result<Leaf, Refusal> {
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(KUBECONFIG_KEY))
            .ok_or_else(|| Refusal::Invalid(format!("no {KUBECONFIG_KEY:?} key")))?;
        let yaml = std::str::from_utf8(&data.0)
            .map_err(|_| Refusal::Invalid(format!("{KUBECONFIG_KEY:?} is not UTF-8")))?;
        let annotations = secret.metadata.annotations.clone().unwrap_or_default();
        let overrides =
            crate::model::node_overrides::overrides(&annotations).map_err(Refusal::Invalid)?;
        let namespaces = match annotations.get(NAMESPACE_MAP_ANNOTATION) {
            None => NamespaceMap::default(),
            Some(text) => NamespaceMap::parse(text).map_err(|m| {
                Refusal::Invalid(format!("annotation {NAMESPACE_MAP_ANNOTATION}: {m}"))
            })?,
        };
        // The parser's own message is withheld: it may quote the Secret's contents.
        let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|_| {
            Refusal::Unusable(format!(
                "the {KUBECONFIG_KEY:?} key does not parse as a kubeconfig"
            ))
        })?;
        let warnings = crate::leaf::kubeconfig::check(&kubeconfig)?;
        crate::leaf::kubeconfig::check_plaintext(&kubeconfig)?;
        for cluster in warnings.insecure_clusters {
            tracing::warn!(
                secret = %secret.metadata.name.as_deref().unwrap_or_default(),
                leaf = name,
                cluster = %cluster,
                "leaf kubeconfig sets insecure-skip-tls-verify: the leaf apiserver's identity is not verified"
            );
        }
        self.check_node(node_name).await?;
        let proxy_tls = proxy_tls(secret);
        let mut leaf = Leaf::from_parsed(
            name,
            node_name,
            kubeconfig,
            &proxy_tls,
            &self.metrics,
            self.config.leaf_spare_connection,
        )
        .await
        .map_err(|err| match err {
            LeafError::Kubeconfig { source, .. } => Refusal::Unusable(source.to_string()),
            LeafError::Proxy { source, .. } => Refusal::Proxy(source),
            LeafError::Client { source, .. } => {
                Refusal::Unusable(format!("building a client: {source}"))
            }
        })?;
        leaf.node_labels = overrides.labels;
        leaf.node_taints = overrides.taints;
        leaf.namespaces = namespaces;
        Ok(leaf)
    }

    /// Refuses a node name that is an existing Node this install may not write (a real node,
    /// another tool's or another install's).
    async fn check_node(&self, node: &str) -> Result<(), Refusal> {
        match self.nodes.get_opt(node).await {
            Ok(Some(found)) => {
                let ownership = crate::model::node_ownership::ownership(&found, &self.owner);
                if ownership.writable() {
                    Ok(())
                } else {
                    Err(Refusal::NodeNotOurs {
                        node: node.to_string(),
                        owner: ownership.to_string(),
                    })
                }
            }
            Ok(None) => Ok(()),
            Err(err) => Err(Refusal::NodeCheckFailed {
                node: node.to_string(),
                message: err.to_string(),
            }),
        }
    }
}

/// `secret` without what relaylet never reads of it: its managed fields, and the copy of
/// itself (data included) that `kubectl apply` leaves in an annotation.
fn lean(mut secret: Secret) -> Secret {
    secret.metadata.managed_fields = None;
    if let Some(annotations) = secret.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    secret
}

/// The leaf Secret's TLS material for an `https://` proxy (keys in `proxy`).
fn proxy_tls(secret: &Secret) -> ProxyTls {
    let key = |name: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(name))
            .map(|v| v.0.clone())
    };
    ProxyTls {
        ca: key(crate::leaf::proxy::PROXY_CA_KEY),
        client_cert: key(crate::leaf::proxy::PROXY_CLIENT_CERT_KEY),
        client_key: key(crate::leaf::proxy::PROXY_CLIENT_KEY_KEY),
    }
}

fn leaf_name(secret: &Secret, label: &str) -> Option<String> {
    secret.metadata.labels.as_ref()?.get(label).cloned()
}

fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config whose `LEAF_KUBECONFIG` is a file holding `kubeconfig`; the file's path.
    fn static_config(name: &str, kubeconfig: &str) -> (Config, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "relaylet-static-{}-{name}.kubeconfig",
            std::process::id()
        ));
        std::fs::write(&path, kubeconfig).unwrap();
        let vars = [
            ("LEAF_NODE_IP", "10.0.0.1".to_string()),
            ("LEAF_KUBECONFIG", path.display().to_string()),
            ("LEAF_CLUSTER_NAME", name.to_string()),
        ];
        let config = Config::from_lookup(|var| {
            vars.iter()
                .find(|(v, _)| *v == var)
                .map(|(_, value)| value.clone())
        })
        .unwrap();
        (config, path)
    }

    fn kubeconfig(server: &str, user: &str) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: '{server}'}}
users:
- name: u
  user: {user}
contexts:
- name: ctx
  context: {{cluster: c, user: u}}
current-context: ctx
"
        )
    }

    #[tokio::test]
    async fn the_static_leaf_sends_no_credentials_over_plain_http() {
        let metrics = Metrics::new();
        let (config, path) = static_config(
            "plain",
            &kubeconfig("http://127.0.0.1:1", "{token: canary}"),
        );
        let registry = Registry::default();
        let err = load_static_leaf(&config, &registry, &metrics)
            .await
            .unwrap_err()
            .to_string();
        std::fs::remove_file(path).unwrap();
        assert!(
            err.contains("refused: kubeconfig cluster \"c\": its server is not https://"),
            "{err}"
        );
        assert!(!err.contains("canary"), "{err}");
        assert!(registry.snapshot().is_empty());

        // Without credentials, or over https://, the file's leaf registers.
        for (name, server, user) in [
            ("anonymous", "http://127.0.0.1:1", "{}"),
            ("tls", "https://127.0.0.1:1", "{token: canary}"),
        ] {
            let (config, path) = static_config(name, &kubeconfig(server, user));
            let loaded = load_static_leaf(&config, &registry, &metrics).await;
            std::fs::remove_file(path).unwrap();
            loaded.unwrap();
            assert!(
                registry.by_node(&format!("relaylet-{name}")).is_some(),
                "{name}"
            );
        }
    }

    /// The clients are built on first use, but a kubeconfig that cannot make one is still
    /// refused when the leaf is registered, naming the leaf and not its credentials.
    #[tokio::test]
    async fn a_kubeconfig_that_cannot_make_a_client_is_refused_at_once() {
        let metrics = Metrics::new();
        // Valid base64, not a certificate or key.
        let not_pem = "bm90IGEgY2VydGlmaWNhdGU=";
        let yaml = kubeconfig(
            "https://127.0.0.1:1",
            &format!("{{client-certificate-data: {not_pem}, client-key-data: {not_pem}}}"),
        );
        let err = Leaf::from_kubeconfig("leaf-x", "relaylet-leaf-x", &yaml, &metrics, true)
            .await
            .expect_err("refused");
        assert!(matches!(err, LeafError::Client { .. }), "{err:?}");
        let err = err.to_string();
        assert!(err.starts_with("leaf leaf-x"), "{err}");
        assert!(!err.contains(not_pem), "{err}");
    }
}

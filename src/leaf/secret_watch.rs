//! The leaf Secrets, watched: each labelled Secret registers a leaf (or is refused, saying why),
//! and a change or deletion takes effect without a restart. A Secret is data, not code: its
//! kubeconfig may carry inline credentials only (`kubeconfig`), its names may not take over
//! another leaf's or a Node this install does not own (`names`), and a refused Secret
//! registers nothing (`refusal`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::ListParams;
use kube::config::Kubeconfig;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::cluster::{Leaf, LeafError};
use super::registry::{Refused, Registry};
use crate::config::Config;
use crate::leaf::names::{Claim, Reserved};
use crate::leaf::proxy::ProxyTls;
use crate::leaf::refusal::{Reporter, SecretRefusal};
use crate::model::counterpart::{NAMESPACE_MAP_ANNOTATION, NamespaceMap};
use crate::model::leaf_row::SecretRef;
use crate::model::names::{check_dns_label, check_node_name};
use crate::ops::Metrics;

/// Annotation on a leaf Secret that overrides its virtual node's name.
pub const NODE_NAME_ANNOTATION: &str = "relaylet.io/node-name";
/// Annotation on a leaf Secret that lets its pod copies have host access (`"true"`): host
/// namespaces, privileged containers, hostPath volumes.
pub const HOST_ACCESS_ANNOTATION: &str = "relaylet.io/allow-host-access";
/// The Secret key holding the kubeconfig.
pub const KUBECONFIG_KEY: &str = "kubeconfig";

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
        // 1,000 passes over up to 1,000 Secrets.
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
            secrets.registry.mark_synced();
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
    /// kubeconfig, 2 KiB or more) was needed only to build it, and every replica keeps every
    /// leaf Secret of the fleet. Deciding on one of them again (its names lost and won back)
    /// reads it again first.
    stripped: HashSet<String>,
}

/// What was decided for one Secret.
struct Seen {
    /// The Secret's resourceVersion then (`None`: decide again at the next chance).
    resource_version: Option<String>,
    /// The names verdict then.
    names: Result<(String, String), SecretRefusal>,
    /// The leaf registered from this Secret: kept while a later version is refused for its
    /// own content, dropped when its names go to another Secret or it is deleted.
    leaf: Option<Arc<Leaf>>,
}

impl Seen {
    /// Whether this decision still stands for `secret` with these `names`: the same version
    /// of it, decided for good, with the same verdict on its names.
    fn decided(&self, secret: &Secret, names: &Result<(String, String), SecretRefusal>) -> bool {
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
            } else {
                self.registry.forget_refusal(&name);
                if let Some(leaf) = seen.leaf {
                    self.registry.remove_exact(&leaf);
                }
            }
        }
        let names: BTreeMap<String, Result<(String, String), SecretRefusal>> = self
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
    fn names(&self, secret: &Secret) -> Result<(String, String), SecretRefusal> {
        let label = &self.label;
        let leaf = leaf_name(secret, label)
            .ok_or_else(|| SecretRefusal::Invalid(format!("no {label} label")))?;
        check_dns_label(&leaf)
            .map_err(|m| SecretRefusal::Invalid(format!("label {label}: {m}")))?;
        let node = match annotation(secret, NODE_NAME_ANNOTATION) {
            Some(node) => {
                check_node_name(node, &self.config.node_name_prefix)
                    .map_err(SecretRefusal::NodeNameInvalid)?;
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
        names: Result<(String, String), SecretRefusal>,
    ) {
        let resource_version = secret.metadata.resource_version.clone();
        let mut leaf = self.seen.remove(name).and_then(|seen| seen.leaf);
        let outcome = match &names {
            Err(refusal) => Err(refusal.clone()),
            Ok((leaf_name, node_name)) => self.leaf_from_secret(secret, leaf_name, node_name).await,
        };
        let mut resource_version = resource_version;
        match outcome {
            Ok(built) => {
                self.registry.forget_refusal(name);
                leaf = Some(self.registry.replace(leaf.as_ref(), built));
            }
            Err(refusal) => {
                self.registry.refuse(Refused {
                    secret: secret_ref(secret),
                    leaf: names.as_ref().ok().map(|(l, _)| l.clone()),
                    node: names.as_ref().ok().map(|(_, n)| n.clone()),
                    refusal: refusal.clone(),
                    kept: leaf.is_some() && !refusal.lost_names(),
                });
                if refusal.lost_names()
                    && let Some(old) = leaf.take()
                {
                    // Its names belong to an older Secret now: that one's leaf takes over.
                    self.registry.remove_exact(&old);
                }
                if matches!(refusal, SecretRefusal::NodeCheckFailed { .. }) {
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
    ) -> Result<Leaf, SecretRefusal> {
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(KUBECONFIG_KEY))
            .ok_or_else(|| SecretRefusal::Invalid(format!("no {KUBECONFIG_KEY:?} key")))?;
        let yaml = std::str::from_utf8(&data.0)
            .map_err(|_| SecretRefusal::Invalid(format!("{KUBECONFIG_KEY:?} is not UTF-8")))?;
        let annotations = secret.metadata.annotations.clone().unwrap_or_default();
        let overrides = crate::model::node_overrides::overrides(&annotations)
            .map_err(SecretRefusal::Invalid)?;
        let host_access = match annotations.get(HOST_ACCESS_ANNOTATION).map(String::as_str) {
            None | Some("false") => false,
            Some("true") => true,
            Some(_) => {
                return Err(SecretRefusal::Invalid(format!(
                    "annotation {HOST_ACCESS_ANNOTATION}: must be \"true\" or \"false\""
                )));
            }
        };
        let namespaces = match annotations.get(NAMESPACE_MAP_ANNOTATION) {
            None => NamespaceMap::default(),
            Some(text) => NamespaceMap::parse(text).map_err(|m| {
                SecretRefusal::Invalid(format!("annotation {NAMESPACE_MAP_ANNOTATION}: {m}"))
            })?,
        };
        // The parser's own message is withheld: it may quote the Secret's contents.
        let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|_| {
            SecretRefusal::Unusable(format!(
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
            LeafError::Kubeconfig { source, .. } => SecretRefusal::Unusable(source.to_string()),
            LeafError::Proxy { source, .. } => SecretRefusal::Proxy(source),
            LeafError::Client { source, .. } => {
                SecretRefusal::Unusable(format!("building a client: {source}"))
            }
        })?;
        leaf.node_labels = overrides.labels;
        leaf.node_taints = overrides.taints;
        leaf.namespaces = namespaces;
        leaf.host_access = host_access;
        leaf.secret = Some(secret_ref(secret));
        Ok(leaf)
    }

    /// Refuses a node name that is an existing Node this install may not write (a real node,
    /// another tool's or another install's).
    async fn check_node(&self, node: &str) -> Result<(), SecretRefusal> {
        match self.nodes.get_opt(node).await {
            Ok(Some(found)) => {
                let ownership = crate::model::node_ownership::ownership(&found, &self.owner);
                if ownership.writable() {
                    Ok(())
                } else {
                    Err(SecretRefusal::NodeNotOurs {
                        node: node.to_string(),
                        owner: ownership.to_string(),
                    })
                }
            }
            Ok(None) => Ok(()),
            Err(err) => Err(SecretRefusal::NodeCheckFailed {
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

/// Which version of which Secret: what a row speaks of.
fn secret_ref(secret: &Secret) -> SecretRef {
    SecretRef {
        name: secret.metadata.name.clone().unwrap_or_default(),
        namespace: secret.metadata.namespace.clone().unwrap_or_default(),
        uid: secret.metadata.uid.clone().unwrap_or_default(),
        resource_version: secret.metadata.resource_version.clone().unwrap_or_default(),
    }
}

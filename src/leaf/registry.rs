//! The [`Registry`]: the leaves relaylet knows, by virtual node name, that everything reaching
//! a leaf looks up; and the `LEAF_KUBECONFIG` leaf, added at start.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::config::Kubeconfig;
use tokio::sync::watch;

use super::cluster::{Leaf, LeafError};
use super::refusal::SecretRefusal;
use crate::config::Config;
use crate::leaf::proxy::ProxyTls;
use crate::model::leaf_row::SecretRef;
use crate::ops::Metrics;

/// The leaves by virtual node name. Cheap to clone; readers see a consistent snapshot.
#[derive(Clone)]
pub struct Registry {
    leaves: watch::Sender<BTreeMap<String, Arc<Leaf>>>,
    /// Set once the leaf Secrets have been listed: only then is a missing leaf really gone.
    synced: Arc<std::sync::atomic::AtomicBool>,
    /// The leaf Secrets refused now, by Secret name: their rows say why.
    refused: watch::Sender<BTreeMap<String, Refused>>,
}

/// A leaf Secret refused, as its row tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub secret: SecretRef,
    /// The leaf and node names it asks for, when well formed.
    pub leaf: Option<String>,
    pub node: Option<String>,
    pub refusal: SecretRefusal,
    /// Whether the leaf of an earlier version of the Secret is still registered (the new
    /// version was refused for its own content): its Node stays served.
    pub kept: bool,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            leaves: watch::Sender::new(BTreeMap::new()),
            synced: Arc::default(),
            refused: watch::Sender::new(BTreeMap::new()),
        }
    }
}

impl Registry {
    /// Whether the leaf Secrets have been listed at least once.
    pub fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records that the leaf Secrets have been listed, and wakes subscribers even when nothing
    /// changed: a synced registry is news (the virtual node controller may now look for
    /// orphans).
    pub(super) fn mark_synced(&self) {
        self.synced
            .store(true, std::sync::atomic::Ordering::Release);
        self.leaves.send_modify(|_| {});
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
    pub(super) fn replace(&self, old: Option<&Arc<Leaf>>, leaf: Leaf) -> Arc<Leaf> {
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
    pub(super) fn remove_exact(&self, leaf: &Arc<Leaf>) {
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

    /// Records that Secret `refused.secret` is refused.
    pub(super) fn refuse(&self, refused: Refused) {
        self.refused.send_if_modified(|map| {
            let name = refused.secret.name.clone();
            let changed = map.get(&name) != Some(&refused);
            map.insert(name, refused);
            changed
        });
    }

    /// Forgets a refusal of Secret `secret` (accepted or deleted since).
    pub(super) fn forget_refusal(&self, secret: &str) {
        self.refused
            .send_if_modified(|map| map.remove(secret).is_some());
    }

    /// The leaf Secrets refused now.
    pub fn refusals(&self) -> BTreeMap<String, Refused> {
        self.refused.borrow().clone()
    }

    /// The refusal of Secret `secret`, if it is refused now.
    pub fn refusal(&self, secret: &str) -> Option<Refused> {
        self.refused.borrow().get(secret).cloned()
    }

    /// Wakes whenever the refused Secrets change.
    pub fn subscribe_refusals(&self) -> watch::Receiver<BTreeMap<String, Refused>> {
        self.refused.subscribe()
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

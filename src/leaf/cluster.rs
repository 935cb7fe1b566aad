//! One leaf cluster: its names, what its Secret says about its virtual Node, and its two
//! clients (built on first use, see `clients`), made from a kubeconfig.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::jiff::Timestamp;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::kube_client::Calls;
use crate::leaf::clients::LeafClients;
use crate::leaf::dialer::LeafDialer;
use crate::leaf::proxy::{LeafProxy, ProxySetupError, ProxyTls};
use crate::model::counterpart::NamespaceMap;
use crate::model::leaf_row::SecretRef;
use crate::ops::Metrics;

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
    /// Whether this leaf's pod copies may have host access (Secret annotation
    /// `relaylet.io/allow-host-access: "true"`); the administrator's, never a pod author's.
    pub host_access: bool,
    /// The leaf Secret it was registered from (none for the `LEAF_KUBECONFIG` leaf): its row.
    pub secret: Option<SecretRef>,
    /// When its credential expires, if the credential says.
    pub credential_expires: Option<Timestamp>,
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
    pub(super) fn kubeconfig(
        leaf: &str,
    ) -> impl FnOnce(kube::config::KubeconfigError) -> LeafError + '_ {
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
        let credential_expires = crate::leaf::credential::expires(&kubeconfig);
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
            host_access: false,
            secret: None,
            credential_expires,
        })
    }
}

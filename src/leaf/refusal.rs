//! Why a leaf Secret was refused, and how a refusal is made known: one error-level log line, a
//! Warning Event on the Secret (reason `LeafSecretRefused`, so `kubectl describe secret` shows
//! it to whoever wrote it) and the `relaylet_leaf_secret_refusals_total{reason}` counter.
//! Nothing here ever carries kubeconfig contents.

use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::leaf::kubeconfig;
use crate::model::event::{Said, event};
use crate::ops::Metrics;

/// The Event reason of every refusal.
pub const EVENT_REASON: &str = "LeafSecretRefused";

/// Why a leaf Secret does not register a leaf.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretRefusal {
    /// A malformed label, annotation or `kubeconfig` key.
    #[error("{0}")]
    Invalid(String),
    /// The kubeconfig names something that is code or a file, not data.
    #[error(transparent)]
    Kubeconfig(#[from] kubeconfig::Refused),
    /// The kubeconfig would send its credentials to a server that is not `https://`.
    #[error(transparent)]
    Plaintext(#[from] kubeconfig::Plaintext),
    /// The kubeconfig does not parse, or kube cannot build a client from it.
    #[error("kubeconfig: {0}")]
    Unusable(String),
    /// The kubeconfig's proxy, or the Secret's proxy TLS keys, cannot be used.
    #[error(transparent)]
    Proxy(#[from] crate::leaf::proxy::ProxySetupError),
    #[error("annotation relaylet.io/node-name: {0}")]
    NodeNameInvalid(String),
    /// An older leaf Secret (or the `LEAF_KUBECONFIG` leaf) has the node name.
    #[error(
        "node name {node:?} is already used by {holder}; the older Secret keeps it (give this leaf another relaylet.io/node-name)"
    )]
    NodeNameTaken { node: String, holder: String },
    /// An older leaf Secret (or the `LEAF_KUBECONFIG` leaf) has the leaf name.
    #[error("leaf name {leaf:?} is already used by {holder}; the older Secret keeps it")]
    LeafNameTaken { leaf: String, holder: String },
    /// A Node of that name exists and is not this install's to write.
    #[error(
        "node name {node:?} is an existing Node that belongs to {owner}; relaylet does not take it over"
    )]
    NodeNotOurs { node: String, owner: String },
    /// The root apiserver did not say whether the Node exists.
    #[error("checking whether Node {node:?} exists: {message}")]
    NodeCheckFailed { node: String, message: String },
}

impl SecretRefusal {
    /// The metric label: a short fixed word per kind of refusal.
    pub fn reason(&self) -> &'static str {
        match self {
            SecretRefusal::Invalid(_) => "invalid_secret",
            SecretRefusal::Kubeconfig(refused) => refused.field.reason(),
            SecretRefusal::Plaintext(_) => "plaintext_credentials",
            SecretRefusal::Unusable(_) => "kubeconfig_unusable",
            SecretRefusal::Proxy(_) => "proxy",
            SecretRefusal::NodeNameInvalid(_) => "node_name_invalid",
            SecretRefusal::NodeNameTaken { .. } => "node_name_taken",
            SecretRefusal::LeafNameTaken { .. } => "leaf_name_taken",
            SecretRefusal::NodeNotOurs { .. } => "node_not_owned",
            SecretRefusal::NodeCheckFailed { .. } => "node_check_failed",
        }
    }

    /// Whether the Secret lost its names to another one (rather than being wrong itself).
    pub fn lost_names(&self) -> bool {
        matches!(
            self,
            SecretRefusal::NodeNameTaken { .. } | SecretRefusal::LeafNameTaken { .. }
        )
    }
}

/// Makes refusals known.
#[derive(Clone)]
pub struct Reporter {
    pub root: Client,
    pub metrics: Metrics,
    /// The Events' `reportingInstance`: this replica.
    pub instance: String,
}

impl Reporter {
    /// Logs, counts and records on the Secret that `secret` (leaf `leaf`, when it names one)
    /// was refused. The Event is best effort: a failure to write it is logged, never retried.
    pub async fn refused(&self, secret: &Secret, leaf: Option<&str>, refusal: &SecretRefusal) {
        let name = secret.metadata.name.as_deref().unwrap_or_default();
        let namespace = secret.metadata.namespace.as_deref().unwrap_or_default();
        self.metrics.leaf_secret_refusal(refusal.reason());
        tracing::error!(
            secret = %format!("{namespace}/{name}"),
            leaf = leaf.unwrap_or("-"),
            reason = refusal.reason(),
            "leaf Secret refused: {refusal}"
        );
        let events: Api<Event> = Api::namespaced(self.root.clone(), namespace);
        let event = self.event(secret, &refusal.to_string());
        if let Err(err) = events.create(&PostParams::default(), &event).await {
            tracing::warn!(%err, secret = %format!("{namespace}/{name}"), "recording the refusal as an Event");
        }
    }

    /// A Warning Event about `secret`.
    fn event(&self, secret: &Secret, message: &str) -> Event {
        let regarding = ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Secret".to_string()),
            name: secret.metadata.name.clone(),
            namespace: secret.metadata.namespace.clone(),
            uid: secret.metadata.uid.clone(),
            resource_version: secret.metadata.resource_version.clone(),
            ..ObjectReference::default()
        };
        let said = Said {
            type_: "Warning",
            reason: EVENT_REASON,
            action: "Register",
            note: message,
        };
        event(regarding, &said, &self.instance, Timestamp::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_fixed_words() {
        let taken = SecretRefusal::NodeNameTaken {
            node: "n".into(),
            holder: "leaf Secret a".into(),
        };
        assert_eq!(taken.reason(), "node_name_taken");
        assert!(taken.lost_names());
        let foreign = SecretRefusal::NodeNotOurs {
            node: "n".into(),
            owner: "something other than relaylet".into(),
        };
        assert_eq!(foreign.reason(), "node_not_owned");
        assert!(!foreign.lost_names());
    }
}

//! The row per leaf: a `LeafCluster` object (group `relaylet.io`) beside each leaf Secret, named
//! as the Secret and owned by it, whose status says how that leaf is doing, so that
//! `kubectl get leafclusters` lists every registered leaf, refused ones included, and the rows
//! outlive relaylet's restarts. The CRD and its printer columns are in the chart
//! (`templates/crd-leafclusters.yaml`); this file is the one place the status's shape is
//! written down in Rust.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub const GROUP: &str = "relaylet.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "LeafCluster";
pub const PLURAL: &str = "leafclusters";
/// The label on every row: which install wrote it (the install's namespace), as on its Nodes.
pub use crate::model::node_ownership::OWNER_LABEL;
/// The start of every refusal's reason (`SecretRefusedExecPlugin`).
pub const REFUSED_REASON_PREFIX: &str = "SecretRefused";

/// The rows' API resource, for kube's dynamic API.
pub fn api_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: GROUP.to_string(),
        version: VERSION.to_string(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.to_string(),
        plural: PLURAL.to_string(),
    }
}

/// A row's `status`. Every field is relaylet's; a reader needs no other object to judge a leaf.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeafStatus {
    /// `True` (its Node is Ready), `False` (refused, or the Node is not Ready) or `Unknown`
    /// (registered, no replica serves it yet).
    pub ready: String,
    /// One CamelCase word: the Node's Ready reason (`LeafReady`, `LeafUnreachable`, ...),
    /// `Registered`, or the refusal's (`SecretRefused...`).
    pub reason: String,
    /// The same in a sentence.
    pub message: String,
    /// The leaf name (the Secret's label value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaf: Option<String>,
    /// The leaf apiserver's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The virtual Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The replica (pod name) that serves the Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<String>,
    /// Root pods bound to the Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<u64>,
    /// When the leaf credential in the Secret expires (RFC 3339), if it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_expires: Option<String>,
    /// The Secret's resourceVersion this row speaks of: a reader that wrote the Secret knows
    /// the row is about its version, not an earlier one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_resource_version: Option<String>,
}

impl LeafStatus {
    /// Whether relaylet refused the Secret version this row speaks of
    /// (`secret_resource_version`).
    pub fn refused(&self) -> bool {
        self.reason.starts_with(REFUSED_REASON_PREFIX)
    }
}

/// The Secret a row belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub resource_version: String,
}

/// The whole row, as relaylet applies it (server-side apply, its own field manager): the
/// owner reference makes the root's garbage collector delete it with its Secret.
pub fn row(secret: &SecretRef, owner: &str, status: &LeafStatus) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": secret.name,
            "namespace": secret.namespace,
            "labels": { OWNER_LABEL: owner },
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Secret",
                "name": secret.name,
                "uid": secret.uid,
            }],
        },
        "status": status,
    })
}

/// A refusal's fixed word (`node_name_taken`) as a reason (`NodeNameTaken`).
pub fn camel_case(word: &str) -> String {
    word.split('_')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_words_become_reasons() {
        for (word, reason) in [
            ("node_name_taken", "NodeNameTaken"),
            ("plaintext_credentials", "PlaintextCredentials"),
            ("proxy", "Proxy"),
            ("", ""),
        ] {
            assert_eq!(camel_case(word), reason);
        }
    }

    #[test]
    fn a_row_names_its_secret_as_owner_and_leaves_out_what_is_unknown() {
        let secret = SecretRef {
            name: "leaf-a".into(),
            namespace: "relaylet".into(),
            uid: "u-1".into(),
            resource_version: "7".into(),
        };
        let status = LeafStatus {
            ready: "Unknown".into(),
            reason: "Registered".into(),
            message: "waiting for a replica to serve its Node".into(),
            node: Some("relaylet-a".into()),
            ..LeafStatus::default()
        };
        let row = row(&secret, "relaylet", &status);
        assert_eq!(row["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(row["metadata"]["labels"][OWNER_LABEL], "relaylet");
        assert_eq!(row["status"]["node"], "relaylet-a");
        assert!(row["status"].get("version").is_none());
        let back: LeafStatus = serde_json::from_value(row["status"].clone()).unwrap();
        assert_eq!(back, status);
    }
}

//! The proof, read in the leaf before any byte is relayed, that a leaf pod is the counterpart of
//! the root pod a call names (the rules themselves are in `counterpart`).

use http::StatusCode;
use k8s_openapi::api::core::v1::Pod;

use crate::leaf::Leaf;
use crate::model::counterpart::{LeafPodMatch, NAMESPACE_MAP_ANNOTATION};

/// The root pod a call names, as the root cluster knows it.
#[derive(Debug, Clone, Copy)]
pub struct RootPod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: Option<&'a str>,
}

/// The leaf pod a call reaches, once proven.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafPod {
    pub namespace: String,
    pub name: String,
}

/// Why a call has no leaf pod to reach.
#[derive(Debug, thiserror::Error)]
pub enum CounterpartError {
    #[error(
        "pod {namespace}/{pod}: namespace {namespace} is not mapped to leaf cluster {leaf} (its Secret's {NAMESPACE_MAP_ANNOTATION})"
    )]
    NotMapped {
        namespace: String,
        pod: String,
        leaf: String,
    },
    #[error(
        "pod {namespace}/{pod} has no counterpart in leaf cluster {leaf}: no pod {leaf_namespace}/{pod} there"
    )]
    Missing {
        namespace: String,
        pod: String,
        leaf: String,
        leaf_namespace: String,
    },
    #[error(
        "pod {leaf_namespace}/{pod} in leaf cluster {leaf} is not the counterpart of root pod {namespace}/{pod}: {why}"
    )]
    NotCounterpart {
        namespace: String,
        pod: String,
        leaf: String,
        leaf_namespace: String,
        why: String,
    },
    /// The leaf apiserver did not answer (502). The cause is rendered whole: hyper's own
    /// message leaves it out, and a dial error names the leaf's proxy.
    #[error(
        "leaf cluster {leaf} is unreachable: checking pod {leaf_namespace}/{pod} there: {cause}",
        cause = crate::leaf::error_chain(&**source)
    )]
    Unreachable {
        pod: String,
        leaf: String,
        leaf_namespace: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The leaf apiserver refused or failed the read (its own status, e.g. 403 for a leaf
    /// ServiceAccount without `get pods`).
    #[error("leaf cluster {leaf} refused to show pod {leaf_namespace}/{pod}: {message}")]
    LeafRefused {
        pod: String,
        leaf: String,
        leaf_namespace: String,
        code: u16,
        message: String,
    },
}

impl CounterpartError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            CounterpartError::NotMapped { .. } | CounterpartError::Missing { .. } => {
                StatusCode::NOT_FOUND
            }
            CounterpartError::NotCounterpart { .. } => StatusCode::FORBIDDEN,
            CounterpartError::Unreachable { .. } => StatusCode::BAD_GATEWAY,
            CounterpartError::LeafRefused { code, .. } => {
                StatusCode::from_u16(*code).unwrap_or(StatusCode::BAD_GATEWAY)
            }
        }
    }

    /// A short word for the refusal metric.
    pub fn reason(&self) -> &'static str {
        match self {
            CounterpartError::NotMapped { .. } => "namespace_not_mapped",
            CounterpartError::Missing { .. } => "missing",
            CounterpartError::NotCounterpart { .. } => "not_counterpart",
            CounterpartError::Unreachable { .. } => "leaf_unreachable",
            CounterpartError::LeafRefused { .. } => "leaf_refused",
        }
    }
}

/// The leaf namespace and name of `root` in `leaf`, before any proof.
pub fn counterpart_target(leaf: &Leaf, root: RootPod<'_>) -> Result<LeafPod, CounterpartError> {
    let namespace = leaf
        .namespaces
        .leaf_namespace(root.namespace)
        .ok_or_else(|| CounterpartError::NotMapped {
            namespace: root.namespace.to_string(),
            pod: root.name.to_string(),
            leaf: leaf.name.clone(),
        })?;
    Ok(LeafPod {
        namespace: namespace.to_string(),
        name: root.name.to_string(),
    })
}

/// Finds `root`'s leaf pod and checks, with a fresh read from the leaf apiserver, that it
/// proves to be the counterpart under `rule`.
pub async fn verify_counterpart(
    leaf: &Leaf,
    rule: &LeafPodMatch,
    root: RootPod<'_>,
) -> Result<LeafPod, CounterpartError> {
    let target = counterpart_target(leaf, root)?;
    let found = leaf
        .client()
        .get_metadata_opt::<Pod>(&target.namespace, &target.name)
        .await
        .map_err(|source| match source {
            kube::Error::Api(status) => CounterpartError::LeafRefused {
                pod: target.name.clone(),
                leaf: leaf.name.clone(),
                leaf_namespace: target.namespace.clone(),
                code: status.code,
                // The leaf's own text: quoted short before it reaches the caller and the log.
                message: crate::model::quote::quote(&status.message),
            },
            source => CounterpartError::Unreachable {
                pod: target.name.clone(),
                leaf: leaf.name.clone(),
                leaf_namespace: target.namespace.clone(),
                source: Box::new(source),
            },
        })?;
    let Some(found) = found else {
        return Err(CounterpartError::Missing {
            namespace: root.namespace.to_string(),
            pod: root.name.to_string(),
            leaf: leaf.name.clone(),
            leaf_namespace: target.namespace,
        });
    };
    match rule.refusal(root.uid, &found.metadata) {
        None => Ok(target),
        Some(why) => Err(CounterpartError::NotCounterpart {
            namespace: root.namespace.to_string(),
            pod: root.name.to_string(),
            leaf: leaf.name.clone(),
            leaf_namespace: target.namespace,
            why,
        }),
    }
}

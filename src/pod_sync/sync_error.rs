//! Why a reconcile failed, by the apiserver that failed it: the pod is tried again later, and
//! the failure is counted by side (`relaylet_pod_sync_errors_total{side}`).

/// A failed call to the root's or the leaf's apiserver.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("root: {0}")]
    Root(kube::Error),
    #[error("leaf: {0}")]
    Leaf(kube::Error),
}

impl SyncError {
    /// The metric label.
    pub fn side(&self) -> &'static str {
        match self {
            SyncError::Root(_) => "root",
            SyncError::Leaf(_) => "leaf",
        }
    }
}

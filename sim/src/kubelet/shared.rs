//! What the kubelet stand-in's routes share.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::pods;

/// State shared by the routes.
pub(super) struct Shared {
    pub(super) node_name: String,
    pub(super) data_dir: PathBuf,
    pub(super) stream_creation_timeout: Duration,
    pub(super) stream_idle_timeout: Duration,
    pub(super) pods: pods::Pods,
    /// Fires when the kubelet stops: every streaming session ends with it.
    pub(super) stop: CancellationToken,
    /// containerLogs responses still being written (tests check follows end with their client).
    pub(super) open_log_streams: Arc<std::sync::atomic::AtomicUsize>,
}

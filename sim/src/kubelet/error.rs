//! The kubelet stand-in's errors.

use std::net::SocketAddr;

/// Errors from running the kubelet stand-in.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(String),
    #[error("starting container {0}: {1}")]
    Start(String, String),
    #[error("invalid pod: {0}")]
    InvalidPod(String),
    #[error("{0} not found")]
    NotFound(String),
}

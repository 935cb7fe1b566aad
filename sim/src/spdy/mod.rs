//! SPDY/3.1 as Kubernetes uses it: frames, compressed header blocks, and connections with streams.
//!
//! kubectl (before 1.30, and as fallback after), client-go's executors and the kube-apiserver all
//! talk to kubelets over SPDY/3.1 as implemented by Go's `moby/spdystream`. This module is a
//! peer for them: [`frame`] and [`headers`] are the pure wire format, [`Connection`] runs one
//! upgraded connection with its streams, and [`upgrade`] does the HTTP/1.1 upgrade and the
//! `X-Stream-Protocol-Version` negotiation on both sides.
//!
//! Like spdystream there is no send-window enforcement (spdystream never sends WINDOW_UPDATE);
//! flow control is backpressure through bounded per-stream buffers.

mod conn;
mod error;
pub mod frame;
pub mod headers;
mod shared;
mod stream;
pub mod upgrade;

pub use conn::{Connection, GOAWAY_GRACE, Incoming};
pub use shared::Role;
pub use stream::{Stream, StreamReader, StreamWriter};
pub use upgrade::{
    Accepting, NegotiationError, UpgradeError, accept, missing_protocol_response, negotiate,
    upgrade_client, upgrade_response,
};

use std::time::Duration;

/// Errors of a SPDY connection or stream operation.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("malformed SPDY input: {0}")]
    Frame(#[from] frame::FrameError),
    #[error("SPDY connection I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("SPDY connection is closed")]
    ConnectionClosed,
    #[error("SPDY connection is going away; no new streams")]
    GoneAway,
    #[error("stream {id} was reset by the peer (status {status})")]
    StreamReset { id: u32, status: u32 },
    #[error("no SYN_REPLY for stream {id} within {timeout:?}")]
    ReplyTimeout { id: u32, timeout: Duration },
    #[error("SPDY stream ids are exhausted on this connection")]
    StreamIdsExhausted,
}

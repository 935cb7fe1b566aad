//! What makes a SPDY frame or header block unusable.

/// Malformed or oversized input, or a zlib failure. Always fatal for the connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("control frame with SPDY version {0}, only 3 is supported")]
    UnsupportedVersion(u16),
    #[error("{kind} frame of {len} bytes exceeds the {cap}-byte cap")]
    TooLarge {
        kind: &'static str,
        len: usize,
        cap: usize,
    },
    #[error("{kind} frame body of {len} bytes is too short (needs {need})")]
    Truncated {
        kind: &'static str,
        len: usize,
        need: usize,
    },
    #[error("{kind} frame on stream 0")]
    ZeroStreamId { kind: &'static str },
    #[error("SETTINGS frame declares {declared} entries but carries {len} bytes")]
    BadSettings { declared: u32, len: usize },
    #[error("malformed header block: {0}")]
    BadHeaderBlock(&'static str),
    #[error("decompressed header block exceeds {0} bytes")]
    HeaderBlockTooLarge(usize),
    #[error("header block has more than {0} headers")]
    TooManyHeaders(usize),
    #[error("header block decompression failed: {0}")]
    Decompress(String),
    #[error("header block compression failed: {0}")]
    Compress(String),
    #[error("data frame of {0} bytes is larger than the 24-bit length field")]
    DataTooLarge(usize),
}

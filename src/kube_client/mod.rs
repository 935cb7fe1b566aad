//! The Kubernetes client stack: how relaylet calls the root apiserver and each leaf's.
//!
//! - `stack`: kube's layers (base URI, retries, auth, headers) on a connector of relaylet's
//!   choosing; the root's `kube::Client` and each leaf's [`Calls`].
//! - `calls`: [`Calls`], API calls on that stack without a `kube::Client` around it, with
//!   kube's errors.
//! - `conn_pool`: the few HTTP/2 connections the calls and watches of one apiserver share.
//! - `read_limits`: how much of one answer from a leaf is read.
//! - `lean_watch`: [`LeanWatch`], a list-then-watch that holds only what is in flight.
//! - `paged`: a LIST read a page at a time.
//!
//! It uses `ops` (its backoff) and nothing above it.

mod calls;
mod conn_pool;
mod lean_watch;
mod paged;
mod read_limits;
mod stack;

pub use calls::{Body, Calls, body_error};
pub use conn_pool::{Budget, ConnPool};
pub use lean_watch::LeanWatch;
pub use paged::{Page, continued, page_of, paged};
pub use read_limits::{Limit, MAX_BODY, MAX_ERROR_BODY, MAX_WATCH_LINE, OverLimit, ReadLimits};
pub use stack::{
    Alpn, LEAF_CONNECTIONS, ROOT_CONNECTIONS, STREAMS_PER_CONNECTION, api_calls, budget,
    calls_over, https_connector, root, root_from,
};

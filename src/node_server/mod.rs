//! The kubelet API: the kubelet-compatible HTTPS server that the root apiserver calls for every
//! virtual node. It offers [`NodeServer`] (what every handler needs, built in `lib.rs`),
//! [`serve`] (one listener) and `node_ports` (each virtual node's own port, opened by the virtual
//! node controller).
//!
//! One listener serves all virtual nodes (they share relaylet's address): a request names a pod,
//! the pod index says which virtual node it is on, and the registry says which leaf that is.
//! Like the kubelet's server, a request passes through layers in this order:
//! - `connection`: TLS, the connection caps (proving a certificate caller), the limits on the
//!   request head;
//! - `filters`: authentication (`auth`), once for every route, in front of the routing;
//! - `routes`: the pod calls (`calls`: parse, authorize, find the leaf pod, relay) and the
//!   node-level paths (`node_paths`, with `resource_metrics`), each authorizing what it serves.
//!
//! Every refusal is a `Refusal` that renders itself as a `metav1.Status`.

pub mod auth;
mod calls;
mod connection;
mod filters;
mod node_paths;
pub mod node_ports;
pub mod resource_metrics;
mod routes;
mod server;

pub use connection::{Listeners, SMALL_HEAD_BYTES, serve};
pub use server::NodeServer;

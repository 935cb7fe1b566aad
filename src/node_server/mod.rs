//! The kubelet API: the kubelet-compatible HTTPS server that the root apiserver calls for every
//! virtual node. It offers [`Parts`] (what the server is started from: `start`), and
//! [`NodePorts`] (each virtual node's own port, opened by the virtual node controller).
//!
//! One listener serves all virtual nodes (they share relaylet's address): a request names a pod,
//! the pod index says which virtual node it is on, and the registry says which leaf that is.
//! Like the kubelet's server, a request passes through layers in this order:
//! - `connection`: TLS, the connection caps (proving a certificate caller), the limits on the
//!   request head;
//! - `filters`: authentication (`auth`), once for every route, in front of the routing;
//! - `routes`: the pod calls (`pod_calls`: parse, authorize, find the leaf pod, relay) and the
//!   node-level paths (`node_paths`, with `resource_metrics`), each authorizing what it serves.
//!
//! What every handler needs (the caps, the authenticator, the registry, the pod index, the
//! relay) is one `server`, shared by every listener: the shared port and each virtual node's
//! own (`node_ports`). Every refusal is a `Refusal` that renders itself as a `metav1.Status`.

mod auth;
mod connection;
mod filters;
mod node_paths;
mod node_ports;
mod pod_calls;
mod resource_metrics;
mod routes;
mod server;
mod start;

pub use node_ports::NodePorts;
pub use start::Parts;

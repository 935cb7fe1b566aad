//! relaylet-sim: in-process stand-ins for kube-apiserver and the kubelet.
//!
//! relaylet's tests and its local sandbox run against these instead of a real cluster. They
//! behave like the real components in everything relaylet and kubectl touch: the kubelet's
//! streaming API (SPDY/3.1 and the `channel.k8s.io` WebSocket family) backed by real local
//! processes, and an API server with list/watch, patching, authentication and the kubelet proxy.

pub mod apiserver;
pub mod channel;
pub mod cluster;
pub mod connections;
pub mod kubelet;
pub mod kubelet_proxy;
pub mod metrics_server;
pub mod pod_lifecycle;
pub mod pod_updates;
pub mod ports;
pub mod serve;
pub mod spdy;
pub mod status;
pub mod tls;
pub mod tools;

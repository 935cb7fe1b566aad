//! Real Kubernetes under the tests: `harness` builds and starts the pinned components,
//! `world` installs relaylet into them as a user would, `metrics_server` adds a real
//! metrics-server to a cluster.

pub mod harness;
pub mod metrics_server;
pub mod world;

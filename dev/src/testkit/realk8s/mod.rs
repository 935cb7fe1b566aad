//! Real Kubernetes under the tests: `harness` builds and starts the pinned components,
//! `world` installs relaylet into them as a user would, `metrics_server` adds a real
//! metrics-server to a cluster, `addresses` gives relaylet replicas their pod IPs.

pub mod addresses;
pub mod harness;
pub mod konnectivity;
pub mod metrics_server;
pub mod world;

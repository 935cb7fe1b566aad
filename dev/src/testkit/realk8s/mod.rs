//! Real Kubernetes under the tests: `harness` builds and starts the pinned components,
//! `world` installs relaylet into them as a user would, `metrics_server` adds a real
//! metrics-server to a cluster, `addresses` gives relaylet replicas their pod IPs, `netns` a
//! network namespace that cannot dial the leaves, `real_node` a real kubelet and containerd,
//! `pods` the pods the suites run, `replica_process` runs a replica as its own process (to SIGKILL or SIGTERM it),
//! `websocket_calls` runs kubectl's WebSocket calls and reads how the root handled them.

pub mod addresses;
pub mod harness;
pub mod konnectivity;
pub mod metrics_server;
pub mod netns;
pub mod pods;
pub mod real_node;
pub mod replica_process;
pub mod websocket_calls;
pub mod world;

//! relaylet against real Kubernetes components (kube-apiserver, etcd, kube-controller-manager,
//! the kubelet with containerd, konnectivity, the image built from the Dockerfile), built at
//! pinned versions by `tests/tools/build-k8s.sh` and `build-node.sh`. One module per suite;
//! `.ci/run` runs each module in a process of its own (`cargo test --test real -- k8s::`), as
//! each world it starts lives until its process exits.

mod image;
mod join;
mod k8s;
mod k8s_csr;
mod k8s_leaf_policy;
mod k8s_nat;
mod k8s_replicas;
mod k8s_topology;
mod k8s_websockets;
mod leaf_konnectivity;
mod node;
mod node_chart;
mod pod_sync;
mod replica_chaos;

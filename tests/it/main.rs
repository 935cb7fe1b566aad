//! relaylet's tests that need no real Kubernetes component, as one test binary: end to end
//! through the sandbox (the sim's root and leaf control planes with the real relaylet between
//! them, one sandbox per module, on a runtime of its own), relaylet processes measured from
//! outside, the chart, the shipped manifests and the static checks of the source tree and the
//! docs. One binary links the whole graph once instead of once per file.

mod allocations;
mod auth_x509;
mod chart;
mod chart_lint;
mod connection_budgets;
mod counterpart;
mod docs_links;
mod e2e_clients;
mod e2e_failures;
mod e2e_kubectl;
mod honest_endings;
mod honest_shutdown;
mod honest_sigkill;
mod hostile_leaf;
mod layers;
mod leaf_memory;
mod leaf_proxy;
mod leaf_rbac;
mod leaf_rows;
mod leaf_secrets;
mod limits;
mod memory_caps;
mod metrics;
mod monitoring;
mod namespace_caps;
mod node_reads;
mod pod_sync;
mod pod_tokens;
mod root_connections;
mod security;
mod shutdown;
mod slim_decode;
mod token_reviews;
mod top;
mod top_live;
mod virtual_node;

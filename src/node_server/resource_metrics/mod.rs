//! `/metrics/resource`, `/stats/summary` and `/pods` of one virtual node, so metrics-server (and
//! with it `kubectl top`) sees the pods of a virtual node like any kubelet's.
//!
//! The numbers come from the leaf cluster's `metrics.k8s.io` PodMetrics, for exactly the pods
//! bound to the virtual node in the root cluster whose leaf counterparts prove to be theirs
//! (`counterpart`: the administrator's namespace map and the syncer's marker, as for exec); node
//! totals are the sum of those pods, never of the whole leaf. Pods are labelled with their
//! *root* namespace and name, which is what metrics-server matches against. `node_stats`
//! gathers the numbers (one read shared by concurrent callers: `reuse`); `encode` writes them
//! in the kubelet's formats.
//!
//! metrics.k8s.io gives a CPU *rate* (cores averaged over a window), while the kubelet exports
//! *cumulative* CPU seconds that metrics-server turns back into a rate. So relaylet integrates:
//! each container's counter starts at `rate × window` and grows by `rate × Δt` whenever the leaf
//! reports a newer sample; the node's counter grows by the sum of its containers' increments,
//! so it never goes backwards when a pod leaves. A rate computed by metrics-server between two
//! scrapes is then exactly the leaf's rate. A counter is never below `LEAST_CPU_SECONDS`:
//! metrics-server drops a container whose cumulative CPU is 0 (and with it the whole pod; a
//! node likewise), which a kubelet's never is, so an idle leaf pod would vanish from the root's
//! `kubectl top`.

pub mod encode;
mod node_stats;
mod reuse;

pub use node_stats::NodeStats;

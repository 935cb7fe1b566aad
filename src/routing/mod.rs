//! From a kubelet path to a leaf pod: which virtual node a root pod is on (`pod_index`:
//! [`PodIndex`], kept by watches so routing costs no API call) and the proof, read in the leaf
//! before any byte is relayed, that a leaf pod is that root pod's counterpart (`proof`:
//! [`verify_counterpart`]; the rules are in `model::counterpart`). The node server uses both;
//! the virtual node controller tells the index which nodes to watch.

mod pod_index;
mod proof;

pub use pod_index::{NodeListing, NodePodChanges, NodePods, PodIndex, PodRoute, RouteError};
pub use proof::{CounterpartError, LeafPod, RootPod, counterpart_target, verify_counterpart};

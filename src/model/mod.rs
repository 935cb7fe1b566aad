//! The shapes and rules every part of relaylet shares, as plain types and functions: no I/O, no
//! configuration, nothing from another folder (so every other folder may use them).
//!
//! - `kubelet_request`: what the root apiserver asks of a kubelet, and the same call as the leaf
//!   apiserver's pod subresource.
//! - `status`: the `metav1.Status` answers, and `Refusal`, the error every handler stops at.
//! - `counterpart`: which leaf pod stands for a root pod (the namespace map, the markers).
//! - `slim_pod`: a pod as relaylet's watches decode it, only the fields relaylet uses.
//! - `node_ownership`, `node_overrides`: whose a Node is; what a leaf Secret may add to it.
//! - `names`, `quantity`: Kubernetes' name and label rules; exact resource-quantity arithmetic.
//! - `quote`: text from a leaf made short and single-line before relaylet writes it anywhere.
//! - `event`: an Event as relaylet writes one, within upstream's limits.
//! - `micro_time`: Lease times cut to the microsecond, as the apiserver keeps them.
//! - `leaf_row`: the `LeafCluster` row beside each leaf Secret: how that leaf is doing.
//! - `uid`: an object UID kept in 16 bytes, not a String, in per-pod records.

pub mod counterpart;
pub mod event;
pub mod kubelet_request;
pub mod leaf_row;
pub mod micro_time;
pub mod names;
pub mod node_overrides;
pub mod node_ownership;
pub mod quantity;
pub mod quote;
pub mod slim_pod;
pub mod status;
pub mod uid;

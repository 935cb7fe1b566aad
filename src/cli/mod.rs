//! The operator's commands around relaylet, one file each; `main.rs` picks one from the first
//! argument. They run outside the cluster (or as `kubectl relaylet ...`, a kubectl plugin:
//! kubectl runs `kubectl-relaylet` from the PATH with the remaining arguments), so they say what
//! they did and exit non-zero with the reason when it did not work.
//!
//! Inside: `join` (a leaf registered, and how it went), `unjoin` (the way back), `status` (a
//! line per leaf); what they share: `leaf_access` (what join makes in a leaf: the embedded
//! leaf RBAC, a bounded token, the kubeconfig), `rows` (the leaves' `LeafCluster` rows, read
//! and shown), `contexts` (the clusters, from kubeconfig contexts), `args` (flags), `output`
//! (progress on a terminal, plain lines otherwise). `check` (whether an install works: its
//! pods Ready, every leaf Secret's Node Ready; the `helm test` hook).

mod args;
mod check;
mod contexts;
pub mod join;
mod leaf_access;
mod output;
mod rows;
pub mod status;
pub mod unjoin;

pub use check::{Args as CheckArgs, check};

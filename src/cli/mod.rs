//! The operator's commands around relaylet, one file each; `main.rs` picks one from the first
//! argument. They run outside the cluster (or as `kubectl relaylet ...`, a kubectl plugin:
//! kubectl runs `kubectl-relaylet` from the PATH with the remaining arguments), so they say what
//! they did and exit non-zero with the reason when it did not work.
//!
//! Inside: `output` (progress on a terminal, plain lines otherwise), `check` (whether an
//! install works: its pods Ready, every leaf Secret's Node Ready; the `helm test` hook).

mod check;
mod output;

pub use check::{Args as CheckArgs, check};
pub use output::Output;

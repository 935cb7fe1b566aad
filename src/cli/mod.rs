//! The operator's commands around relaylet, one file each; `main.rs` picks one from the first
//! argument. They run outside the cluster (or as `kubectl relaylet ...`, a kubectl plugin:
//! kubectl runs `kubectl-relaylet` from the PATH with the remaining arguments), so they say what
//! they did and exit non-zero with the reason when it did not work.
//!
//! Inside: `output` (progress on a terminal, plain lines otherwise).

mod output;

pub use output::Output;

//! relaylet's sandbox and benchmark, kept out of the product crate: both embed the simulated
//! control planes (`relaylet-sim`), which the shipped binary must not link.
//!
//! - [`sandbox`]: simulated root and leaf clusters with the real relaylet between them, for a
//!   user's own `kubectl` and for the end-to-end tests;
//! - [`bench`]: relaylet measured against the direct path, a bare reference relay and the
//!   physical floor, in one run;
//! - [`testkit`]: what the end-to-end tests share (the sandbox per test binary, kubectl runs,
//!   real Kubernetes).

pub mod bench;
pub mod sandbox;
pub mod testkit;

use std::path::{Path, PathBuf};

/// The workspace's root directory (this crate sits one level below it): where the chart,
/// `deploy/` and the test tools are, and where `target/` is unless `CARGO_TARGET_DIR` moves it.
pub fn workspace_root() -> PathBuf {
    let dev = Path::new(env!("CARGO_MANIFEST_DIR"));
    dev.parent().unwrap_or(dev).to_path_buf()
}

//! relaylet's sandbox and benchmark, kept out of the product crate: both embed the simulated
//! control planes (`relaylet-sim`), which the shipped binary must not link.
//!
//! - [`sandbox`]: simulated root and leaf clusters with the real relaylet between them, for a
//!   user's own `kubectl` and for the end-to-end tests;
//! - [`bench`]: relaylet measured against the direct path, a bare reference relay and the
//!   physical floor, in one run.

pub mod bench;
pub mod sandbox;

//! Real Kubernetes under the tests: `harness` builds and starts the pinned components,
//! `world` installs relaylet into them as a user would.

pub mod harness;
pub mod world;

//! The API server stand-in: an in-memory kube-apiserver.

pub mod clock;
pub mod failure;
pub mod fieldset;
pub mod kinds;
pub mod managed;
pub mod schema;
pub mod selector;
pub mod smp;
pub mod store;

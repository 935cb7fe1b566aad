//! What every subsystem runs on, and what operators see of it.
//!
//! - Connections: `listener` (accepting until shutdown), `read_ahead` ([`ReadAhead`], large
//!   reads under TLS).
//! - Lifecycle: `shutdown` ([`Shutdown`]: hand-over, drain, grace period), `memory` (freed
//!   memory given back), `backoff` ([`Backoff`], the growing wait after an error).
//! - Seen by operators: `metrics` ([`Metrics`], Prometheus), `health` ([`Health`], the
//!   operations port: `/metrics`, `/livez`, `/readyz`), `telemetry` (log output).
//!
//! It uses `config`, `model` and `caps`.

mod backoff;
mod health;
pub mod listener;
pub mod memory;
mod metrics;
mod read_ahead;
mod shutdown;
pub mod telemetry;

pub use backoff::Backoff;
pub use health::{CertificateCheck, Health, bind_health, serve_health};
pub use metrics::{
    CONTENT_TYPE, LeafConnectionLabels, Metrics, OneLabel, ResultLabels, SessionLabels,
};
pub use read_ahead::ReadAhead;
pub use shutdown::{HANDOVER_LIMIT, HANDOVER_SETTLE, OpenSessions, SessionGuard, Shutdown};

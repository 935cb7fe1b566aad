//! What every subsystem runs on, and what operators see of it.
//!
//! - Connections: `listener` (accepting until shutdown), `read_ahead` (large reads under TLS),
//!   `api_client` (the kube client of ordinary calls to the root and to each leaf),
//!   `conn_pool` (the few HTTP/2 connections those calls and watches share),
//!   `read_limits` (how much of one leaf answer is read), `paged` (a LIST read a page at a
//!   time).
//! - Caps: `limits` (connections, sessions and log streams against the configured caps),
//!   `proven` (the certificate callers authorized lately, who skip the small budget),
//!   `token_bucket` (the budget of work strangers can cause).
//! - Lifecycle: `shutdown` (hand-over, drain, grace period), `memory` (freed memory given back).
//! - Seen by operators: `metrics` (Prometheus), `health` (the operations port: `/metrics`,
//!   `/livez`, `/readyz`), `telemetry` (log output).
//!
//! It uses only `config` and `model`.

pub mod api_client;
pub mod calls;
pub mod conn_pool;
pub mod health;
pub mod lean_watch;
pub mod limits;
pub mod listener;
pub mod memory;
pub mod metrics;
pub mod paged;
pub mod proven;
pub mod read_ahead;
pub mod read_limits;
pub mod shutdown;
pub mod telemetry;
pub mod token_bucket;

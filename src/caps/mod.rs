//! What callers may hold at once, and what strangers may make relaylet do.
//!
//! - `gate`: [`Gate`], connections, not-yet-authorized connections, large heads, sessions and
//!   log streams counted against the configured caps, per client, per user and per namespace.
//! - `proven`: the certificate callers authorized lately, who skip the small budget.
//! - `token_bucket`: [`TokenBucket`], the budget of reviews and lookups strangers can cause.
//!
//! It uses `config` and `model` only.

mod gate;
mod proven;
mod token_bucket;

pub use gate::{CertCaller, Gate, Standing, StreamPermit};
pub use token_bucket::TokenBucket;

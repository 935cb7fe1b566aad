//! relaylet's settings, read from environment variables and checked once at start.
//!
//! Names follow Kosmos where Kosmos has one (`LEAF_NODE_IP`, `PREFERRED-ADDRESS-TYPE`,
//! `APISERVER_CERT_LOCATION`, ...), so an existing clustertree install can switch without
//! renaming. Every bad value is reported on one line naming the variable, and all of them are
//! reported at once so a user fixes a manifest in one go.
//!
//! [`Config`] (`settings`) is read with `vars` (the reader, and durations); each concern reads
//! its own variables: `node` (addresses and ports), `auth`, `serving_cert`, `leaves`, `limits`,
//! `replicas`, `observability`; `tests` checks them variable by variable.
//!
//! It uses `model` only.

mod auth;
mod leaves;
mod limits;
mod node;
mod observability;
mod replicas;
mod serving_cert;
mod settings;
#[cfg(test)]
mod tests;
mod vars;

pub use auth::{AuthMode, INSECURE_NONE_SWITCH};
pub use leaves::{DEFAULT_LEAF_SECRET_LABEL, LeafBounds, PodApiserver, StaticLeaf};
pub use limits::{Limits, namespace_share};
pub use node::{ADDRESS_TYPES, DEFAULT_NODE_PORTS};
pub use observability::LogFormat;
pub use replicas::ReplicaSelector;
pub use serving_cert::{CsrSettings, MIN_CSR_EXPIRATION, ServingCert};
pub use settings::Config;
pub use vars::{ConfigError, VarError, format_duration, parse_duration};

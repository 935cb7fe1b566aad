//! Certificates: the node server's serving certificate and the client CA it trusts.
//!
//! - `tls`: the node server's rustls configuration ([`server_config`]), its certificate from
//!   files, hot-reloaded, or `self_signed` ([`serving_certificate`]);
//! - `serving_csr`: [`CsrCert`], a certificate from the root cluster's kubelet-serving signer,
//!   renewed in time; `csr_approver`, the opt-in approver of relaylet's own CSRs; `csr_mode`,
//!   both started together ([`start_csr_mode`]);
//! - `client_ca`: the hot-reloaded CA that verifies callers ([`start_client_ca`]);
//! - `crypto`: the provider every TLS part shares, the leaf clients' included.
//!
//! It uses `config`, `model` and `ops`.

mod client_ca;
mod crypto;
mod csr_approver;
mod csr_mode;
mod self_signed;
mod serving_csr;
mod tls;

pub use client_ca::start_client_ca;
pub use crypto::{TlsError, crypto_provider};
pub use csr_mode::start_csr_mode;
pub use serving_csr::{CertState, CsrCert};
pub use tls::{ClientCa, read_roots, roots_from_pem, server_config, serving_certificate};

//! Certificates: the node server's serving certificate and the client CA it trusts.
//!
//! It offers `tls` (the node server's rustls configuration, from files or `self_signed`),
//! `serving_csr` (a certificate from the root cluster's kubelet-serving signer, renewed in
//! time), `csr_approver` (the opt-in approver of relaylet's own CSRs), `client_ca` (the
//! hot-reloaded CA that verifies callers) and `crypto` (the provider every TLS part shares,
//! including the leaf clients).
//!
//! It uses only `config`, `model` and `ops`.

pub mod client_ca;
pub mod crypto;
pub mod csr_approver;
pub mod self_signed;
pub mod serving_csr;
pub mod tls;

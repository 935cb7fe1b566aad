//! What every TLS part of relaylet shares: the crypto provider and the error type, apart from
//! the serving-certificate sources (`tls`, `self_signed`) so neither needs the other for them.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// Errors setting up TLS. Paths are named; key material never is.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    #[error("generating a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("client CA: {0}")]
    ClientCa(String),
    #[error("SERVING_CERT_MODE=csr: the certificate is requested by serving_csr, not loaded")]
    CsrNotStarted,
}

/// The crypto provider used everywhere (ring: no C toolchain beyond cc, no OpenSSL).
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

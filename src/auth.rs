//! Who is calling the kubelet API, and may they?
//!
//! The kubelet port of a virtual node opens exec into every pod of a leaf cluster with
//! relaylet's leaf credentials, so it is at least as closed as a real kubelet's. With
//! `AUTH_MODE=x509` a caller must present a client certificate that chains to the root
//! cluster's client CA (checked during the TLS handshake); the certificate's CN is the user and
//! its O values the groups, as in kube-apiserver. `AUTH_MODE=none` lets anyone in and says so
//! loudly on every request.

use rustls::pki_types::CertificateDer;

use crate::config::AuthMode;

/// A caller the node server has identified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub groups: Vec<String>,
}

/// Why a caller was turned away (401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error(
        "no client certificate: the kubelet API of a relaylet virtual node needs a client certificate signed by the root cluster's client CA"
    )]
    NoCredentials,
    #[error("client certificate has no usable subject: {0}")]
    BadCertificate(String),
    #[error("AUTH_MODE={0} is not available in this build")]
    Unsupported(&'static str),
}

/// Identifies callers according to the configured mode.
#[derive(Debug, Clone)]
pub struct Authenticator {
    mode: AuthMode,
}

impl Authenticator {
    pub fn new(mode: AuthMode) -> Authenticator {
        Authenticator { mode }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Identifies a caller from the client certificate it presented (already verified against
    /// the client CA by the TLS layer).
    pub fn authenticate(&self, cert: Option<&CertificateDer<'_>>) -> Result<Caller, AuthError> {
        match self.mode {
            AuthMode::None => Ok(match cert {
                Some(cert) => caller_from_cert(cert)?,
                None => Caller {
                    user: "system:anonymous".to_string(),
                    groups: vec!["system:unauthenticated".to_string()],
                },
            }),
            AuthMode::X509 => cert
                .map(caller_from_cert)
                .unwrap_or(Err(AuthError::NoCredentials)),
            AuthMode::Webhook => Err(AuthError::Unsupported("webhook")),
        }
    }
}

/// Reads user (CN) and groups (O) from a client certificate.
pub fn caller_from_cert(der: &CertificateDer<'_>) -> Result<Caller, AuthError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| AuthError::BadCertificate(e.to_string()))?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or_else(|| AuthError::BadCertificate("no common name".to_string()))?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Ok(Caller { user, groups })
}

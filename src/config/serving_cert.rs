//! Where the serving certificate comes from: `SERVING_CERT_MODE` and its variables.

use std::path::PathBuf;
use std::time::Duration;

use super::vars::{Vars, parse_duration};

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServingCert {
    /// PEM files, re-read when they change.
    Files { cert: PathBuf, key: PathBuf },
    /// A self-signed certificate made at start for `LEAF_NODE_IP`.
    SelfSigned,
    /// A certificate from the root cluster's `kubernetes.io/kubelet-serving` signer, requested
    /// with a CertificateSigningRequest (`SERVING_CERT_MODE=csr`; see `serving_csr`).
    Csr(CsrSettings),
}

/// How the CSR-issued serving certificate is requested and renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsrSettings {
    /// The CSR's `expirationSeconds` (`SERVING_CERT_CSR_EXPIRATION`); the signer's own
    /// duration when unset. The CSR API's minimum is 10 minutes.
    pub expiration: Option<Duration>,
    /// Renew once less than this is left (`SERVING_CERT_RENEW_BEFORE`); by default once 80%
    /// of the certificate's validity has passed, as a kubelet does (70-90%).
    pub renew_before: Option<Duration>,
    /// Approve relaylet's own CSRs after checking them (`SERVING_CERT_CSR_APPROVER`).
    pub approver: bool,
}

/// The CSR API refuses a shorter `expirationSeconds`.
pub const MIN_CSR_EXPIRATION: Duration = Duration::from_secs(600);

/// `SERVING_CERT_MODE` (`generate`, `files`, `csr`) and the variables of the chosen mode. Without
/// a mode, files when `APISERVER_CERT_LOCATION`/`APISERVER_KEY_LOCATION` are set, else generate.
pub(super) fn serving_cert(vars: &mut Vars<'_>) -> ServingCert {
    let cert = vars.get("APISERVER_CERT_LOCATION");
    let key = vars.get("APISERVER_KEY_LOCATION");
    let mode = vars.get("SERVING_CERT_MODE");
    let files = |vars: &mut Vars<'_>| match (cert.clone(), key.clone()) {
        (Some(cert), Some(key)) => ServingCert::Files {
            cert: cert.into(),
            key: key.into(),
        },
        (Some(_), None) => {
            vars.error(
                "APISERVER_KEY_LOCATION",
                "required when APISERVER_CERT_LOCATION is set",
            );
            ServingCert::SelfSigned
        }
        (None, Some(_)) => {
            vars.error(
                "APISERVER_CERT_LOCATION",
                "required when APISERVER_KEY_LOCATION is set",
            );
            ServingCert::SelfSigned
        }
        (None, None) => {
            vars.error(
                "APISERVER_CERT_LOCATION",
                "required (with APISERVER_KEY_LOCATION) when SERVING_CERT_MODE=files",
            );
            ServingCert::SelfSigned
        }
    };
    match mode.as_deref().map(str::trim) {
        None if cert.is_none() && key.is_none() => ServingCert::SelfSigned,
        None | Some("files") => files(vars),
        Some("generate") | Some("csr") if cert.is_some() || key.is_some() => {
            vars.error(
                "SERVING_CERT_MODE",
                "APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION are set: use SERVING_CERT_MODE=files or unset them",
            );
            ServingCert::SelfSigned
        }
        Some("generate") => ServingCert::SelfSigned,
        Some("csr") => {
            let expiration = vars.get("SERVING_CERT_CSR_EXPIRATION").map(|raw| {
                vars.parse(
                    "SERVING_CERT_CSR_EXPIRATION",
                    &raw,
                    MIN_CSR_EXPIRATION,
                    |v| {
                        let d = parse_duration(v)?;
                        if d < MIN_CSR_EXPIRATION {
                            Err("must be at least 10m (the CSR API's minimum)".to_string())
                        } else {
                            Ok(d)
                        }
                    },
                )
            });
            let renew_before = vars.get("SERVING_CERT_RENEW_BEFORE").map(|raw| {
                vars.parse(
                    "SERVING_CERT_RENEW_BEFORE",
                    &raw,
                    Duration::ZERO,
                    parse_duration,
                )
            });
            let approver = vars.flag("SERVING_CERT_CSR_APPROVER", false);
            ServingCert::Csr(CsrSettings {
                expiration,
                renew_before,
                approver,
            })
        }
        Some(other) => {
            vars.error(
                "SERVING_CERT_MODE",
                &format!("{other:?} is not one of generate, files, csr"),
            );
            ServingCert::SelfSigned
        }
    }
}

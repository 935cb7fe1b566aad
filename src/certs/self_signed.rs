//! The self-signed serving certificate used when no certificate files are configured: made for
//! `LEAF_NODE_IP` and the pod's DNS names, valid for a bounded time, and made anew before it
//! expires, on the handshake that finds it old, so a long-running replica never serves an
//! expired certificate and never needs a restart for it.
//!
//! One year, like the kubelet's own self-signed serving certificate; renewed once two thirds of
//! it have passed. Open connections keep the certificate they were set up with.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::pki_types::PrivateKeyDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::certs::crypto::{TlsError, crypto_provider as provider};

/// How long a self-signed certificate is valid.
pub const LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// Accepted clock skew: certificates are valid from this long before they are made.
const BACKDATE: Duration = Duration::from_secs(3600);

/// A self-signed certificate for `names`, renewed in time.
#[derive(Debug)]
pub struct SelfSigned {
    names: Vec<String>,
    common_name: String,
    lifetime: Duration,
    /// The certificate and when it should be replaced.
    current: Mutex<(SystemTime, Arc<CertifiedKey>)>,
}

impl SelfSigned {
    /// A certificate for `ip` (and the pod DNS names in `namespace`), valid for `lifetime` from
    /// `now`.
    pub fn new(
        ip: IpAddr,
        namespace: Option<&str>,
        lifetime: Duration,
        now: SystemTime,
    ) -> Result<SelfSigned, TlsError> {
        let ip = ip.to_string();
        let mut names = vec![ip.clone()];
        if let Some(ns) = namespace {
            // Pod DNS names (`a-b-c-d.<namespace>.pod[.cluster.local]`).
            let dashed = ip.replace(['.', ':'], "-");
            names.push(format!("{dashed}.{ns}.pod"));
            names.push(format!("{dashed}.{ns}.pod.cluster.local"));
        }
        let common_name = format!("relaylet@{ip}");
        let key = generate(&names, &common_name, now, lifetime)?;
        Ok(SelfSigned {
            names,
            common_name,
            lifetime,
            current: Mutex::new((renew_at(now, lifetime), Arc::new(key))),
        })
    }

    /// The certificate to serve at `now`: the current one, or a fresh one once the current one
    /// is due for renewal. A failed renewal keeps the current one (and says so).
    pub fn at(&self, now: SystemTime) -> Arc<CertifiedKey> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if now >= current.0 {
            match generate(&self.names, &self.common_name, now, self.lifetime) {
                Ok(key) => {
                    tracing::info!(names = ?self.names, "self-signed serving certificate renewed");
                    *current = (renew_at(now, self.lifetime), Arc::new(key));
                }
                Err(err) => {
                    tracing::warn!(%err, "renewing the self-signed serving certificate failed; keeping the old one")
                }
            }
        }
        current.1.clone()
    }
}

impl ResolvesServerCert for SelfSigned {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.at(SystemTime::now()))
    }
}

fn renew_at(now: SystemTime, lifetime: Duration) -> SystemTime {
    now + lifetime * 2 / 3
}

fn generate(
    names: &[String],
    common_name: &str,
    now: SystemTime,
    lifetime: Duration,
) -> Result<CertifiedKey, TlsError> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + lifetime).into();
    let cert = params.self_signed(&key)?;
    let key_der = PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| TlsError::Read {
        path: PathBuf::from("<generated key>"),
        message: e.to_string(),
    })?;
    Ok(CertifiedKey::from_der(
        vec![cert.der().clone()],
        key_der,
        &provider(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validity(key: &CertifiedKey) -> (i64, i64) {
        let (_, cert) = x509_parser::parse_x509_certificate(&key.cert[0]).unwrap();
        (
            cert.validity().not_before.timestamp(),
            cert.validity().not_after.timestamp(),
        )
    }

    fn unix(t: SystemTime) -> i64 {
        t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64
    }

    #[test]
    fn valid_for_a_year_and_renewed_after_two_thirds_of_it() {
        let day = Duration::from_secs(24 * 3600);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let cert =
            SelfSigned::new("10.0.0.7".parse().unwrap(), Some("relaylet"), LIFETIME, t0).unwrap();
        let first = cert.at(t0);
        assert_eq!(
            validity(&first),
            (unix(t0) - 3600, unix(t0 + LIFETIME)),
            "bounded: one year from now, backdated an hour"
        );
        assert!(Arc::ptr_eq(&first, &cert.at(t0 + 200 * day)), "not yet due");
        let later = t0 + 250 * day;
        let renewed = cert.at(later);
        assert!(!Arc::ptr_eq(&first, &renewed), "renewed once due");
        assert_eq!(validity(&renewed).1, unix(later + LIFETIME));
        assert!(Arc::ptr_eq(&renewed, &cert.at(later + day)));
    }

    #[test]
    fn names_the_ip_and_pod_dns_names() {
        let cert = SelfSigned::new(
            "10.0.0.7".parse().unwrap(),
            Some("relaylet"),
            LIFETIME,
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(
            cert.names,
            [
                "10.0.0.7",
                "10-0-0-7.relaylet.pod",
                "10-0-0-7.relaylet.pod.cluster.local"
            ]
        );
    }
}

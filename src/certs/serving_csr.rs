//! The serving certificate in `SERVING_CERT_MODE=csr`: requested from the root cluster's
//! `kubernetes.io/kubelet-serving` signer with a CertificateSigningRequest, as a kubelet with
//! `serverTLSBootstrap` does, so that a root apiserver started with
//! `--kubelet-certificate-authority` accepts it for the pod IP it dials.
//!
//! The key is made here and never leaves memory. The CSR names this replica
//! (`CN=system:node:<pod name>`, `O=system:nodes`, as the signer requires), its pod IP and the
//! virtual nodes it serves; it waits for approval (an administrator's `kubectl certificate
//! approve`, or relaylet's own approver, `csr_approver`) and the controller manager's signature.
//! Renewal starts once 80% of the validity has passed (or `SERVING_CERT_RENEW_BEFORE` is left)
//! and swaps the certificate for new handshakes only: open connections keep theirs.
//!
//! Until the first certificate arrives the replica is not ready (the reason names the CSR),
//! does not stand for leader and does not join the replicas that write Nodes, so no Node ever
//! points at an address without a valid certificate.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::certs::crypto::crypto_provider as provider;
use crate::config::CsrSettings;
use crate::ops::{Backoff, Metrics};

/// The signer whose certificates kube-apiserver's `--kubelet-certificate-authority` trusts.
pub const SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The subject organization and common-name prefix that signer requires.
pub const ORGANIZATION: &str = "system:nodes";
pub const COMMON_NAME_PREFIX: &str = "system:node:";
/// The usages the signer accepts for a non-RSA key (ours is ECDSA P-256).
pub const USAGES: [&str; 2] = ["digital signature", "server auth"];
/// Label on relaylet's CSRs, so an administrator can list them.
pub const CSR_LABEL: &str = "app.kubernetes.io/managed-by";
pub const CSR_LABEL_VALUE: &str = "relaylet";

/// Retry after a failed, denied or deleted request, doubling up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(5);
const MAX_RETRY: Duration = Duration::from_secs(300);
/// A CSR not decided within this is given up for a new one (as a kubelet does): the names it
/// asked for may have changed meanwhile.
const DECISION_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Never renew sooner than this after a certificate arrived, whatever `renew_before` says.
const MIN_RENEW_WAIT: Duration = Duration::from_secs(1);

/// Where the certificate stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertState {
    /// No CSR created yet (or creating one failed: `error`).
    Requesting { error: Option<String> },
    /// CSR `csr` waits for approval and signing.
    Pending { csr: String },
    /// CSR `csr` was denied, failed or deleted: `why`.
    Refused { csr: String, why: String },
    /// A certificate valid until `not_after` is served.
    Ready { not_after: SystemTime },
}

/// What this replica asks to be certified for.
#[derive(Debug, Clone)]
pub struct Subject {
    /// The replica's name (`POD_NAME`): the certificate's `CN=system:node:<name>`.
    pub name: String,
    /// The address the root apiserver dials (`LEAF_NODE_IP`).
    pub ip: IpAddr,
}

/// The CSR-issued certificate; a rustls resolver and the task that keeps it current.
pub struct CsrCert {
    current: RwLock<Option<(SystemTime, Arc<CertifiedKey>)>>,
    state: watch::Sender<CertState>,
    approver: bool,
}

impl std::fmt::Debug for CsrCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsrCert")
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl CsrCert {
    pub fn new(approver: bool) -> Arc<CsrCert> {
        Arc::new(CsrCert {
            current: RwLock::new(None),
            state: watch::Sender::new(CertState::Requesting { error: None }),
            approver,
        })
    }

    pub fn state(&self) -> CertState {
        self.state.borrow().clone()
    }

    /// Why the replica cannot serve a valid certificate now, or `None` when it can.
    pub fn problem(&self, now: SystemTime) -> Option<String> {
        let valid = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|(not_after, _)| now < *not_after);
        if valid {
            return None;
        }
        Some(match self.state() {
            CertState::Requesting { error: None } => "serving certificate: requesting".to_string(),
            CertState::Requesting { error: Some(e) } => {
                format!("serving certificate: cannot create a CSR: {e}")
            }
            CertState::Pending { csr } => self.pending_message(&csr),
            CertState::Refused { csr, why } => format!("serving certificate: CSR {csr} {why}"),
            CertState::Ready { .. } => "serving certificate expired".to_string(),
        })
    }

    fn pending_message(&self, csr: &str) -> String {
        if self.approver {
            format!("serving certificate: CSR {csr} awaits approval and signing")
        } else {
            format!(
                "serving certificate: CSR {csr} awaits approval (kubectl certificate approve {csr})"
            )
        }
    }

    /// Resolves once a certificate is served (at once if one is).
    pub async fn ready(self: Arc<Self>) {
        let mut state = self.state.subscribe();
        let _ = state
            .wait_for(|s| matches!(s, CertState::Ready { .. }))
            .await;
    }

    /// Requests a certificate, serves it, renews it in time; until `stop` fires. `names` gives
    /// the virtual nodes served at the time of each request.
    pub async fn run(
        self: Arc<Self>,
        root: Client,
        subject: Subject,
        settings: CsrSettings,
        names: impl Fn() -> BTreeSet<String> + Send + 'static,
        metrics: Metrics,
        stop: CancellationToken,
    ) {
        let api: Api<CertificateSigningRequest> = Api::all(root);
        let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
        loop {
            let names = names();
            let outcome = tokio::select! {
                outcome = self.obtain(&api, &subject, &settings, &names, &metrics) => outcome,
                _ = stop.cancelled() => return,
            };
            metrics.serving_cert_pending.set(0);
            let wait = match outcome {
                Ok(issued) => {
                    backoff.reset();
                    let wait = renew_at(issued.not_before, issued.not_after, settings.renew_before)
                        .duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .max(MIN_RENEW_WAIT);
                    tracing::info!(
                        csr = %issued.csr,
                        not_after = %humantime(issued.not_after),
                        renew_in = ?wait,
                        "serving certificate issued by {SIGNER}; serving it to new connections"
                    );
                    *self.current.write().unwrap_or_else(|e| e.into_inner()) =
                        Some((issued.not_after, issued.key));
                    self.state.send_replace(CertState::Ready {
                        not_after: issued.not_after,
                    });
                    metrics.serving_cert_issued.inc();
                    metrics
                        .serving_cert_expiry
                        .set(unix_seconds(issued.not_after));
                    wait
                }
                Err(state) => {
                    let still_valid = self.problem(SystemTime::now()).is_none();
                    tracing::error!(
                        state = ?state,
                        still_serving_the_old_certificate = still_valid,
                        retry_in = ?backoff.peek(),
                        "no serving certificate from {SIGNER}"
                    );
                    self.state.send_replace(state);
                    backoff.next_wait()
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Makes a key, requests a certificate for it and waits for it; a failure is returned as
    /// the state it leaves.
    async fn obtain(
        &self,
        api: &Api<CertificateSigningRequest>,
        subject: &Subject,
        settings: &CsrSettings,
        names: &BTreeSet<String>,
        metrics: &Metrics,
    ) -> Result<Issued, CertState> {
        let requesting = |e: String| CertState::Requesting { error: Some(e) };
        let key = rcgen::KeyPair::generate().map_err(|e| requesting(e.to_string()))?;
        let request = request_pem(subject, names, &key).map_err(requesting)?;
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", subject.name)),
                labels: Some(
                    [(CSR_LABEL.to_string(), CSR_LABEL_VALUE.to_string())]
                        .into_iter()
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.into_bytes()),
                signer_name: SIGNER.to_string(),
                usages: Some(USAGES.iter().map(|u| u.to_string()).collect()),
                expiration_seconds: settings
                    .expiration
                    .map(|d| i32::try_from(d.as_secs()).unwrap_or(i32::MAX)),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        };
        let created = api
            .create(&PostParams::default(), &csr)
            .await
            .map_err(|e| requesting(format!("creating the CertificateSigningRequest: {e}")))?;
        let name = created.metadata.name.unwrap_or_default();
        self.state
            .send_replace(CertState::Pending { csr: name.clone() });
        metrics.serving_cert_pending.set(1);
        if self.approver {
            tracing::info!(csr = %name, ip = %subject.ip, "serving certificate requested; relaylet's approver will check and approve it");
        } else {
            tracing::warn!(
                csr = %name,
                ip = %subject.ip,
                "serving certificate requested; this replica is not ready until an administrator approves it: kubectl certificate approve {name}"
            );
        }
        let refused = |why: String| CertState::Refused {
            csr: name.clone(),
            why,
        };
        let csr = tokio::time::timeout(DECISION_TIMEOUT, self.wait_for_decision(api, &name))
            .await
            .map_err(|_| {
                refused(format!(
                    "was not signed within {DECISION_TIMEOUT:?}; requesting anew"
                ))
            })?
            .ok_or_else(|| refused("was deleted before it was signed".into()))?;
        let conditions = csr
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        for c in &conditions {
            if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
                let verb = if c.type_ == "Denied" {
                    "was denied"
                } else {
                    "failed"
                };
                return Err(refused(format!(
                    "{verb}: {}: {}",
                    c.reason.as_deref().unwrap_or("no reason"),
                    c.message.as_deref().unwrap_or("no message")
                )));
            }
        }
        let pem = csr
            .status
            .and_then(|s| s.certificate)
            .map(|b| b.0)
            .unwrap_or_default();
        let issued = certified_key(&pem, &key, subject.ip).map_err(refused)?;
        Ok(Issued {
            csr: name,
            not_before: issued.0,
            not_after: issued.1,
            key: issued.2,
        })
    }

    /// Waits until CSR `name` is signed, denied or failed (`Some`) or deleted (`None`). A
    /// broken watch is resumed: the CSR is still there, asking again would only pile them up.
    async fn wait_for_decision(
        &self,
        api: &Api<CertificateSigningRequest>,
        name: &str,
    ) -> Option<CertificateSigningRequest> {
        loop {
            match kube::runtime::wait::await_condition(api.clone(), name, decided).await {
                Ok(csr) => return csr,
                Err(err) => {
                    tracing::warn!(csr = %name, %err, "watching the CSR failed; watching again");
                    tokio::time::sleep(FIRST_RETRY).await;
                }
            }
        }
    }
}

/// A certificate the signer issued, with its key.
struct Issued {
    csr: String,
    not_before: SystemTime,
    not_after: SystemTime,
    key: Arc<CertifiedKey>,
}

/// A CSR is decided once it carries a certificate or a Denied/Failed condition, or is gone.
fn decided(csr: Option<&CertificateSigningRequest>) -> bool {
    let Some(csr) = csr else { return true };
    let Some(status) = &csr.status else {
        return false;
    };
    status.certificate.as_ref().is_some_and(|c| !c.0.is_empty())
        || status
            .conditions
            .iter()
            .flatten()
            .any(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
}

/// The PEM CSR for `subject` and the virtual nodes `names`, signed with `key`.
pub fn request_pem(
    subject: &Subject,
    names: &BTreeSet<String>,
    key: &rcgen::KeyPair,
) -> Result<String, String> {
    let mut params = rcgen::CertificateParams::new(names.iter().cloned().collect::<Vec<_>>())
        .map_err(|e| format!("a virtual node name is not a DNS name: {e}"))?;
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress(subject.ip));
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, ORGANIZATION);
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("{COMMON_NAME_PREFIX}{}", subject.name),
    );
    params
        .serialize_request(key)
        .and_then(|csr| csr.pem())
        .map_err(|e| format!("making the CSR: {e}"))
}

/// The issued PEM chain with `key`, checked to match the key and to cover `ip`; with its
/// validity.
fn certified_key(
    pem: &[u8],
    key: &rcgen::KeyPair,
    ip: IpAddr,
) -> Result<(SystemTime, SystemTime, Arc<CertifiedKey>), String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("was signed, but the certificate is not PEM: {e}"))?;
    let leaf = chain
        .first()
        .ok_or_else(|| "was signed, but carries no certificate".to_string())?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("was signed, but the certificate does not parse: {e}"))?;
    let covers_ip = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .is_some_and(|san| {
            san.value.general_names.iter().any(|n| match n {
                x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                    ip_from_bytes(bytes) == Some(ip)
                }
                _ => false,
            })
        });
    if !covers_ip {
        return Err(format!(
            "was signed, but the certificate does not name {ip} (the address the root apiserver dials)"
        ));
    }
    let validity = cert.validity();
    let not_before = to_system_time(validity.not_before.timestamp());
    let not_after = to_system_time(validity.not_after.timestamp());
    let key_der = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| format!("serializing our own key: {e}"))?;
    // from_der also checks that the certificate is for this key.
    let certified = CertifiedKey::from_der(chain.clone(), key_der, &provider())
        .map_err(|e| format!("was signed, but the certificate does not match our key: {e}"))?;
    Ok((not_before, not_after, Arc::new(certified)))
}

pub fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

fn to_system_time(unix: i64) -> SystemTime {
    match u64::try_from(unix) {
        Ok(secs) => SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}

/// When to renew a certificate valid from `not_before` to `not_after`.
pub fn renew_at(
    not_before: SystemTime,
    not_after: SystemTime,
    renew_before: Option<Duration>,
) -> SystemTime {
    match renew_before {
        Some(before) => not_after
            .checked_sub(before)
            .map_or(not_before, |t| t.max(not_before)),
        None => {
            let validity = not_after.duration_since(not_before).unwrap_or_default();
            not_before + validity.mul_f64(0.8)
        }
    }
}

fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn humantime(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{t:?}"))
}

impl ResolvesServerCert for CsrCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, key)| key.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> SystemTime = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);

    #[test]
    fn renewal_comes_at_four_fifths_of_the_validity_or_renew_before_the_end() {
        assert_eq!(renew_at(S(1000), S(2000), None), S(1800));
        assert_eq!(
            renew_at(S(1000), S(2000), Some(Duration::from_secs(300))),
            S(1700)
        );
        // More than the whole validity: at once (the caller waits at least MIN_RENEW_WAIT).
        assert_eq!(
            renew_at(S(1000), S(2000), Some(Duration::from_secs(5000))),
            S(1000)
        );
    }

    #[test]
    fn the_request_carries_the_subject_the_kubelet_serving_signer_requires() {
        let key = rcgen::KeyPair::generate().unwrap();
        let subject = Subject {
            name: "relaylet-0".into(),
            ip: "10.1.2.3".parse().unwrap(),
        };
        let names: BTreeSet<String> = ["relaylet-leaf-1".to_string()].into();
        let pem = request_pem(&subject, &names, &key).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        assert_eq!(pem.label, "CERTIFICATE REQUEST");
        use x509_parser::prelude::FromDer;
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
                .unwrap();
        let subject = csr.certification_request_info.subject.to_string();
        assert_eq!(subject, "O=system:nodes, CN=system:node:relaylet-0");
        // The signer refuses RSA-less requests whose key is RSA: ours is ECDSA P-256.
        assert_eq!(
            csr.certification_request_info
                .subject_pki
                .algorithm
                .algorithm
                .to_id_string(),
            "1.2.840.10045.2.1"
        );
    }

    #[test]
    fn a_pending_csr_is_the_readiness_reason_with_the_approve_command() {
        let manual = CsrCert::new(false);
        assert_eq!(
            manual.problem(SystemTime::now()).as_deref(),
            Some("serving certificate: requesting")
        );
        manual.state.send_replace(CertState::Pending {
            csr: "relaylet-0-x7k2p".into(),
        });
        assert_eq!(
            manual.problem(SystemTime::now()).as_deref(),
            Some(
                "serving certificate: CSR relaylet-0-x7k2p awaits approval (kubectl certificate approve relaylet-0-x7k2p)"
            )
        );
        manual.state.send_replace(CertState::Refused {
            csr: "relaylet-0-x7k2p".into(),
            why: "was denied: Nope: not yours".into(),
        });
        assert_eq!(
            manual.problem(SystemTime::now()).as_deref(),
            Some("serving certificate: CSR relaylet-0-x7k2p was denied: Nope: not yours")
        );
    }
}

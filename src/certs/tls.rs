//! The node server's TLS: its serving certificate and which client certificates it accepts.
//!
//! The serving certificate comes from `APISERVER_CERT_LOCATION`/`APISERVER_KEY_LOCATION` and is
//! re-read when the files change (cert-manager rotates them in place), checked on each
//! handshake so a new certificate is served on the very next connection. Without files, a
//! self-signed certificate (`self_signed`) is made for `LEAF_NODE_IP` and the pod's DNS names; the
//! root apiserver only verifies kubelet certificates when `--kubelet-certificate-authority` is
//! set, so this works out of the box, but a warning says so. With `SERVING_CERT_MODE=csr` the
//! root cluster's kubelet-serving signer issues it (`serving_csr`), for apiservers that verify.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use crate::certs::crypto::TlsError;
use crate::certs::crypto::crypto_provider as provider;
use crate::config::{Config, ServingCert};

/// The serving certificate of `SERVING_CERT_MODE` files or generate. (`csr` certificates come
/// from `serving_csr::CsrCert`, which needs the root cluster.)
pub fn serving_certificate(config: &Config) -> Result<Arc<dyn ResolvesServerCert>, TlsError> {
    Ok(match &config.serving_cert {
        ServingCert::Files { cert, key } => Arc::new(FileCert::load(cert.clone(), key.clone())?),
        ServingCert::SelfSigned => {
            tracing::warn!(
                ip = %config.leaf_node_ip,
                "no APISERVER_CERT_LOCATION/APISERVER_KEY_LOCATION: serving a self-signed certificate; \
                 root apiservers that verify kubelet certificates (--kubelet-certificate-authority) will refuse it \
                 (SERVING_CERT_MODE=csr gets one they accept)"
            );
            Arc::new(crate::certs::self_signed::SelfSigned::new(
                config.leaf_node_ip,
                config.pod_namespace.as_deref(),
                crate::certs::self_signed::LIFETIME,
                SystemTime::now(),
            )?)
        }
        ServingCert::Csr(_) => return Err(TlsError::CsrNotStarted),
    })
}

/// Builds the node server's TLS settings around `certificate`. With `client_ca`, client
/// certificates are verified against it when offered (callers without one may still use a
/// bearer token).
pub fn server_config(
    certificate: Arc<dyn ResolvesServerCert>,
    client_ca: Option<Arc<ClientCa>>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(ca),
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder.with_cert_resolver(certificate);
    // Every kubelet streaming protocol is an HTTP/1.1 upgrade.
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

/// Reads a PEM CA bundle into a root store.
pub fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let pem = std::fs::read(path).map_err(|e| TlsError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    roots_from_pem(&pem).map_err(|message| TlsError::Read {
        path: path.to_path_buf(),
        message,
    })
}

/// Parses a PEM CA bundle.
pub fn roots_from_pem(pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("bad PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("bad CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("no CA certificate in the bundle".to_string());
    }
    Ok(roots)
}

/// A certificate read from files and re-read when they change.
#[derive(Debug)]
struct FileCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

/// What tells us a file changed: modification time and length of both files.
type Stamp = Option<(SystemTime, u64, SystemTime, u64)>;

impl FileCert {
    fn load(cert_path: PathBuf, key_path: PathBuf) -> Result<FileCert, TlsError> {
        let stamp = stamp(&cert_path, &key_path);
        let key = read_certified_key(&cert_path, &key_path)?;
        Ok(FileCert {
            cert_path,
            key_path,
            current: Mutex::new((stamp, Arc::new(key))),
        })
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let c = std::fs::metadata(cert).ok()?;
    let k = std::fs::metadata(key).ok()?;
    Some((c.modified().ok()?, c.len(), k.modified().ok()?, k.len()))
}

fn read_certified_key(cert_path: &Path, key_path: &Path) -> Result<CertifiedKey, TlsError> {
    let read_err = |path: &Path, message: String| TlsError::Read {
        path: path.to_path_buf(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| read_err(cert_path, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_err(cert_path, e.to_string()))?;
    if certs.is_empty() {
        return Err(read_err(cert_path, "no certificate in the file".into()));
    }
    let key =
        PrivateKeyDer::from_pem_file(key_path).map_err(|e| read_err(key_path, e.to_string()))?;
    Ok(CertifiedKey::from_der(certs, key, &provider())?)
}

impl ResolvesServerCert for FileCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let now = stamp(&self.cert_path, &self.key_path);
        if now.is_some() && now != current.0 {
            match read_certified_key(&self.cert_path, &self.key_path) {
                Ok(key) => {
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                    *current = (now, Arc::new(key));
                }
                // Mid-rotation the two files may not match yet: keep serving the old pair.
                Err(err) => {
                    tracing::warn!(%err, "serving certificate changed but cannot be loaded; keeping the old one")
                }
            }
        }
        Some(current.1.clone())
    }
}

/// The client CA, swappable while running: the root cluster's CA bundle can change (rotation,
/// an added CA) and relaylet must follow without a restart.
#[derive(Debug)]
pub struct ClientCa {
    current: std::sync::RwLock<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
}

impl ClientCa {
    pub fn new(roots: RootCertStore) -> Result<Arc<ClientCa>, TlsError> {
        Ok(Arc::new(ClientCa {
            current: std::sync::RwLock::new(verifier(roots)?),
        }))
    }

    /// Verifies against `roots` from the next handshake on.
    pub fn replace(&self, roots: RootCertStore) -> Result<(), TlsError> {
        let new = verifier(roots)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = new;
        Ok(())
    }

    fn get(&self) -> Arc<dyn rustls::server::danger::ClientCertVerifier> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn verifier(
    roots: RootCertStore,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::ClientCa(e.to_string()))
}

impl rustls::server::danger::ClientCertVerifier for ClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        // Callers with a bearer token instead of a certificate must get through the handshake;
        // the HTTP layer turns away anyone without credentials (401).
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        // No hints: a Go client sends its certificate whatever CA the server names, but only
        // when the hint list is empty or matches; empty is always safe.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        self.get()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.get().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.get().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.get().supported_verify_schemes()
    }
}

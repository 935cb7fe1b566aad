//! The sim's certificate authority and TLS settings.
//!
//! Every stand-in (apiserver, kubelet) serves HTTPS and most callers present client
//! certificates, as in a real cluster. One [`Ca`] per simulated cluster mints server
//! certificates for loopback addresses and client certificates whose subject carries the
//! Kubernetes user (CN) and groups (O), exactly as kube-apiserver reads them.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;

/// Errors from minting certificates or building TLS settings.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("building TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("building client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("parsing certificate: {0}")]
    Parse(String),
}

/// The ring provider, named once so every config uses the same one without relying on a
/// process-wide default.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate authority for one simulated cluster.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    /// A fresh CA named `name` (its CN).
    pub fn new(name: &str) -> Result<Self, TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        Ok(Self { issuer })
    }

    /// The CA certificate in PEM, as it goes into kubeconfigs and CA bundles.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA's private key in PEM (for a real control plane's signer in the real-Kubernetes
    /// tests; the sim itself never writes it out).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// The CA certificate in DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A root store holding only this CA.
    pub fn root_store(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        // Our own freshly minted CA always parses.
        let _ = roots.add(self.cert_der());
        roots
    }

    /// A server certificate valid for `names` (DNS names or IP addresses).
    pub fn issue_server(&self, names: &[&str]) -> Result<Identity, TlsError> {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        let cn = names.first().copied().unwrap_or("server");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate for Kubernetes user `user` in `groups` (CN and O, as
    /// kube-apiserver's x509 authenticator reads them).
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<Identity, TlsError> {
        self.issue_client_with_names(&[user], groups)
    }

    /// A client certificate whose subject carries every one of `common_names` as a CN (at most
    /// two): what a hostile CSR may ask for. Go's x509 reads the last CN as the user.
    pub fn issue_client_with_names(
        &self,
        common_names: &[&str],
        groups: &[&str],
    ) -> Result<Identity, TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        // As for groups below: a second CN goes in under its OID (2.5.4.3) as a custom type.
        let name_types = [DnType::CommonName, DnType::CustomDnType(vec![2, 5, 4, 3])];
        if common_names.is_empty() || common_names.len() > name_types.len() {
            return Err(TlsError::Parse(format!(
                "1 to {} common names per client certificate, got {}",
                name_types.len(),
                common_names.len()
            )));
        }
        for (ty, name) in name_types.into_iter().zip(common_names) {
            params.distinguished_name.push(ty, *name);
        }
        // rcgen keeps one value per attribute type, so a second group goes in under the same
        // OID (2.5.4.10) spelled as a custom type: the certificate then carries two O values.
        let group_types = [
            DnType::OrganizationName,
            DnType::CustomDnType(vec![2, 5, 4, 10]),
        ];
        if groups.len() > group_types.len() {
            return Err(TlsError::Parse(format!(
                "at most {} groups per client certificate, got {}",
                group_types.len(),
                groups.len()
            )));
        }
        for (ty, group) in group_types.into_iter().zip(groups) {
            params.distinguished_name.push(ty, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Result<Identity, TlsError> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Identity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        })
    }

    /// Server TLS settings with `identity`, requiring client certificates from this CA.
    pub fn server_config_requiring_clients(
        &self,
        identity: &Identity,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(self.root_store()), provider())
                .build()?;
        identity.server_config_with_verifier(verifier)
    }

    /// Server TLS settings with `identity` that verify a client certificate from this CA when
    /// one is offered but also admit clients without one (bearer tokens, anonymous), as
    /// kube-apiserver does.
    pub fn server_config_optional_clients(
        &self,
        identity: &Identity,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(self.root_store()), provider())
                .allow_unauthenticated()
                .build()?;
        identity.server_config_with_verifier(verifier)
    }

    /// Client TLS settings trusting this CA, presenting `identity` when given.
    pub fn client_config(
        &self,
        identity: Option<&Identity>,
    ) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        client_config(self.root_store(), identity)
    }
}

/// Client TLS settings trusting `roots`, presenting `identity` when given.
pub fn client_config(
    roots: RootCertStore,
    identity: Option<&Identity>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => builder.with_client_auth_cert(vec![id.cert_der.clone()], id.private_key())?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A certificate and its private key.
#[derive(Clone)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl Identity {
    /// The private key in the form rustls takes.
    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// Server TLS settings with this identity and no client certificates.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth();
        self.finish_server(builder)
    }

    fn server_config_with_verifier(
        &self,
        verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier);
        self.finish_server(builder)
    }

    fn finish_server(
        &self,
        builder: rustls::ConfigBuilder<rustls::ServerConfig, rustls::server::WantsServerCert>,
    ) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut config =
            builder.with_single_cert(vec![self.cert_der.clone()], self.private_key())?;
        // HTTP/1.1 only: every streaming protocol Kubernetes uses is an HTTP/1.1 upgrade.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The Kubernetes user a client certificate names: CN is the user, each O a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertUser {
    pub name: String,
    pub groups: Vec<String>,
}

/// Reads user and groups from a DER client certificate.
pub fn cert_user(der: &[u8]) -> Result<CertUser, TlsError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| TlsError::Parse(e.to_string()))?;
    let subject = cert.subject();
    // Go's pkix.Name keeps the last CN of the subject, and kube-apiserver's x509 authenticator
    // reads that one.
    let name = subject
        .iter_common_name()
        .last()
        .and_then(|cn| cn.as_str().ok())
        .ok_or_else(|| TlsError::Parse("client certificate has no common name".into()))?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Ok(CertUser { name, groups })
}

/// True when `host` is an IP address literal (for SAN and SNI decisions).
pub fn is_ip(host: &str) -> bool {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_cert_carries_user_and_groups() {
        let ca = Ca::new("test-ca").unwrap();
        let id = ca
            .issue_client("system:kube-apiserver", &["system:masters", "ops"])
            .unwrap();
        let user = cert_user(&id.cert_der).unwrap();
        assert_eq!(user.name, "system:kube-apiserver");
        assert_eq!(user.groups, vec!["system:masters", "ops"]);
    }

    #[tokio::test]
    async fn server_and_client_configs_handshake() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ca = Ca::new("test-ca").unwrap();
        let server_id = ca.issue_server(&["127.0.0.1", "localhost"]).unwrap();
        let client_id = ca.issue_client("alice", &[]).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(
            ca.server_config_requiring_clients(&server_id).unwrap(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let peer = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
            tls.write_all(b"ok").await.unwrap();
            tls.shutdown().await.unwrap();
            cert_user(&peer).unwrap().name
        });
        let connector =
            tokio_rustls::TlsConnector::from(ca.client_config(Some(&client_id)).unwrap());
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        let mut buf = Vec::new();
        tls.read_to_end(&mut buf).await.unwrap();
        assert_eq!(buf, b"ok");
        assert_eq!(server.await.unwrap(), "alice");
    }
}

/// Client TLS settings that present `identity` but accept any server certificate: what
/// kube-apiserver does towards kubelets when `--kubelet-certificate-authority` is not set.
/// Handshake signatures are still checked, so the peer must hold the key it presents.
pub fn insecure_client_config(
    identity: Option<&Identity>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServerCert(provider())));
    let mut config = match identity {
        Some(id) => builder.with_client_auth_cert(vec![id.cert_der.clone()], id.private_key())?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts every server certificate (see [`insecure_client_config`]).
#[derive(Debug)]
struct AnyServerCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

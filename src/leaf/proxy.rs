//! A leaf reached through a proxy: what a kubeconfig's `proxy-url` may be, and how a tunnel to
//! the leaf apiserver is opened through it.
//!
//! Leaves behind NAT or in another network cannot be dialled, but an existing reverse tunnel can
//! reach them: most often the Kubernetes network proxy (konnectivity), whose agent in the leaf
//! dials out to a proxy server beside relaylet, and which clients use with HTTP CONNECT. A leaf
//! kubeconfig names it as client-go does, with the cluster's `proxy-url`: `http://`, `https://`
//! (TLS to the proxy, verified with the CA in the leaf Secret's `proxy-ca.crt` and optionally
//! authenticated with `proxy-client.crt`/`proxy-client.key`, see [`ProxyTls`]) or `socks5://`.
//! Credentials in the URL's userinfo go to the proxy (`Proxy-Authorization: Basic` or SOCKS5
//! user/password); they never appear in a log line or an error: everything here names a proxy
//! by `host:port` only.
//!
//! The tunnel carries the leaf's own TLS end to end: the proxy sees a TCP stream of TLS records,
//! never the requests, tokens or streams inside. `dialer` opens every connection relaylet
//! makes to a leaf (API client, stream client, the spare) through here, so no path goes around
//! the proxy; and only the kubeconfig decides: `HTTPS_PROXY` and friends in relaylet's
//! environment never apply to leaves.
//!
//! HTTP CONNECT is written here (a request line and a status line); SOCKS5 is hyper-util's
//! (`client-proxy` feature: the same code kube's own `socks5` feature uses), which asks the
//! proxy to resolve the leaf's host name, as a NATed leaf's name may only resolve beyond it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http::Uri;
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::kube_client::OverLimit;
use crate::model::quote::quote;

/// Leaf Secret key: the PEM CA bundle that verifies an `https://` proxy's certificate.
pub const PROXY_CA_KEY: &str = "proxy-ca.crt";
/// Leaf Secret key: a PEM client certificate presented to an `https://` proxy.
pub const PROXY_CLIENT_CERT_KEY: &str = "proxy-client.crt";
/// Leaf Secret key: the PEM private key of [`PROXY_CLIENT_CERT_KEY`].
pub const PROXY_CLIENT_KEY_KEY: &str = "proxy-client.key";

/// The longest CONNECT answer head read; a proxy's is a few dozen bytes.
const MAX_ANSWER_HEAD: usize = 8 * 1024;
/// How much of a refusal's body is quoted in the error.
const MAX_REFUSAL_BODY: usize = 256;
/// How long a refusal's body is waited for (konnectivity closes right after it; another proxy
/// may keep the connection open without a length).
const REFUSAL_BODY_WAIT: Duration = Duration::from_secs(2);

/// The proxy kinds a leaf kubeconfig may name (those client-go honours).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
    Socks5,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
            Scheme::Socks5 => 1080,
        }
    }
}

/// Why a `proxy-url` was refused. Fixed words: the URL itself may carry a password, so it is
/// never quoted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error("only http://, https:// and socks5:// proxies are supported")]
    Scheme,
    #[error("the proxy URL has no host")]
    NoHost,
    #[error("the proxy URL's port is not a number from 1 to 65535")]
    Port,
    #[error("the proxy URL may have no path, query or fragment")]
    Path,
    #[error("the proxy URL is malformed")]
    Malformed,
}

/// A parsed `proxy-url`. Displays as `host:port`, without credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    pub scheme: Scheme,
    /// Host name or IP address (an IPv6 address without brackets).
    pub host: String,
    pub port: u16,
    /// Percent-decoded user and password from the userinfo.
    credentials: Option<(String, String)>,
}

impl fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyUrl")
            .field("scheme", &self.scheme)
            .field("address", &self.to_string())
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl ProxyUrl {
    /// Parses a kubeconfig `proxy-url` by relaylet's rules (see [`UrlProblem`]).
    pub fn parse(url: &str) -> Result<ProxyUrl, UrlProblem> {
        let (scheme, rest) = url.split_once("://").ok_or(UrlProblem::Scheme)?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            "socks5" => Scheme::Socks5,
            _ => return Err(UrlProblem::Scheme),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err(UrlProblem::Path);
        }
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport)?;
        if host.is_empty() {
            return Err(UrlProblem::NoHost);
        }
        if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(UrlProblem::Malformed);
        }
        let port = match port {
            None => scheme.default_port(),
            Some(port) => match port.parse::<u16>() {
                Ok(port) if port != 0 => port,
                _ => return Err(UrlProblem::Port),
            },
        };
        let credentials = userinfo.map(|userinfo| {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            (decode(user), decode(password))
        });
        Ok(ProxyUrl {
            scheme,
            host: host.to_string(),
            port,
            credentials,
        })
    }

    /// The URI of the proxy itself, to dial it (no credentials).
    fn dial_uri(&self) -> Result<Uri, UrlProblem> {
        format!("http://{self}")
            .parse()
            .map_err(|_| UrlProblem::Malformed)
    }
}

/// `host[:port]`, with `[v6]` brackets removed from the host.
fn split_host_port(hostport: &str) -> Result<(&str, Option<&str>), UrlProblem> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or(UrlProblem::Malformed)?;
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(UrlProblem::Malformed),
            },
        };
    }
    match hostport.rsplit_once(':') {
        Some((host, _)) if host.contains(':') => Err(UrlProblem::Malformed),
        Some((host, port)) => Ok((host, Some(port))),
        None => Ok((hostport, None)),
    }
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// TLS material for an `https://` proxy, from the leaf Secret's keys (PEM), inline like every
/// other leaf credential. The CA is required for an `https://` proxy: relaylet trusts no
/// system roots for leaf traffic.
#[derive(Clone, Default)]
pub struct ProxyTls {
    pub ca: Option<Vec<u8>>,
    pub client_cert: Option<Vec<u8>>,
    pub client_key: Option<Vec<u8>>,
}

impl ProxyTls {
    /// Whether any key is set.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client_cert.is_none() && self.client_key.is_none()
    }
}

/// Why a proxy could not be set up from a kubeconfig and Secret. Never quotes a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxySetupError {
    #[error("proxy-url: {0}")]
    Url(#[from] UrlProblem),
    #[error(
        "an https:// proxy needs the CA that verifies it in the leaf Secret's {PROXY_CA_KEY:?} key"
    )]
    NoCa,
    #[error(
        "{PROXY_CLIENT_CERT_KEY:?} and {PROXY_CLIENT_KEY_KEY:?} go together: give both or neither"
    )]
    HalfClientCert,
    #[error("{key:?}: {message}")]
    Pem { key: &'static str, message: String },
    #[error("proxy TLS keys are set but proxy-url is not https://; they would not be used")]
    TlsUnused,
}

/// A leaf's proxy, ready to open tunnels.
#[derive(Clone)]
pub struct LeafProxy {
    pub url: ProxyUrl,
    /// TLS to an `https://` proxy.
    tls: Option<tokio_rustls::TlsConnector>,
    dial_uri: Uri,
}

impl fmt::Debug for LeafProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeafProxy").field("url", &self.url).finish()
    }
}

impl LeafProxy {
    /// Sets up a proxy from a kubeconfig's `proxy-url` and the leaf Secret's proxy TLS keys.
    pub fn new(url: &str, tls: &ProxyTls) -> Result<LeafProxy, ProxySetupError> {
        let url = ProxyUrl::parse(url)?;
        let dial_uri = url.dial_uri()?;
        let tls = match url.scheme {
            Scheme::Https => Some(tls_connector(tls)?),
            Scheme::Http | Scheme::Socks5 if !tls.is_empty() => {
                return Err(ProxySetupError::TlsUnused);
            }
            Scheme::Http | Scheme::Socks5 => None,
        };
        Ok(LeafProxy { url, tls, dial_uri })
    }
}

fn tls_connector(tls: &ProxyTls) -> Result<tokio_rustls::TlsConnector, ProxySetupError> {
    let ca = tls.ca.as_deref().ok_or(ProxySetupError::NoCa)?;
    let roots: RootCertStore =
        crate::certs::roots_from_pem(ca).map_err(|message| ProxySetupError::Pem {
            key: PROXY_CA_KEY,
            message,
        })?;
    let builder = rustls::ClientConfig::builder_with_provider(crate::certs::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ProxySetupError::Pem {
            key: PROXY_CA_KEY,
            message: e.to_string(),
        })?
        .with_root_certificates(roots);
    let config = match (&tls.client_cert, &tls.client_key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pem_error(PROXY_CLIENT_CERT_KEY, e))?;
            if chain.is_empty() {
                return Err(ProxySetupError::Pem {
                    key: PROXY_CLIENT_CERT_KEY,
                    message: "no certificate in it".into(),
                });
            }
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| pem_error(PROXY_CLIENT_KEY_KEY, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| ProxySetupError::Pem {
                    key: PROXY_CLIENT_KEY_KEY,
                    message: e.to_string(),
                })?
        }
        _ => return Err(ProxySetupError::HalfClientCert),
    };
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

fn pem_error(key: &'static str, err: rustls_pki_types::pem::Error) -> ProxySetupError {
    ProxySetupError::Pem {
        key,
        message: format!("bad PEM: {err}"),
    }
}

/// Why a connection to a leaf apiserver could not be opened. Names the leaf and, through a
/// proxy, the proxy by `host:port`; never credentials.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("cannot connect to leaf {leaf}'s apiserver at {target}: {message}")]
    Direct {
        leaf: String,
        target: String,
        message: String,
    },
    #[error("cannot connect to proxy {proxy} for leaf {leaf}: {message}")]
    ProxyUnreachable {
        proxy: String,
        leaf: String,
        message: String,
    },
    #[error("TLS to proxy {proxy} for leaf {leaf} failed: {message}")]
    ProxyTls {
        proxy: String,
        leaf: String,
        message: String,
    },
    #[error("proxy {proxy} refused CONNECT to {leaf}'s apiserver: {answer}")]
    Refused {
        proxy: String,
        leaf: String,
        answer: String,
    },
    #[error("proxy {proxy} failed CONNECT to {leaf}'s apiserver: {message}")]
    Broken {
        proxy: String,
        leaf: String,
        message: String,
    },
    #[error("SOCKS5 proxy {proxy} did not connect to {leaf}'s apiserver: {message}")]
    Socks {
        proxy: String,
        leaf: String,
        message: String,
    },
    #[error("leaf {leaf}: the apiserver URL {target:?} has no host")]
    NoHost { leaf: String, target: String },
}

impl DialError {
    /// The first `DialError` in an error's chain (hyper and kube wrap it).
    pub fn find<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a DialError> {
        let mut next = Some(err);
        while let Some(err) = next {
            if let Some(found) = err.downcast_ref::<DialError>() {
                return Some(found);
            }
            next = err.source();
        }
        None
    }
}

/// The message of an error and its sources, for errors (hyper's) whose own message leaves the
/// cause out, fit to quote: what the leaf said appears once and short (`model::quote`). A
/// leaf's error answer is its code, reason and message (kube's own rendering of it repeats the
/// message, escaped the second time); an answer past relaylet's read limit says which limit.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    if let Some(dial) = DialError::find(err) {
        return quote(&dial.to_string());
    }
    if let Some(over) = OverLimit::find(err) {
        return over.to_string();
    }
    if let Some(status) = api_status(err) {
        // kube names a body that is not a Status "Failed to parse error data": not the leaf's.
        let reason = match status.reason.as_str() {
            "" | "Failed to parse error data" => String::new(),
            reason => format!(" {}", quote(reason)),
        };
        return format!(
            "the leaf answered {}{reason}: {}",
            status.code,
            quote(&status.message)
        );
    }
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(err) = next {
        let part = err.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = err.source();
    }
    quote(&text)
}

/// The leaf's error answer somewhere in `err`'s chain.
fn api_status<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a kube::core::Status> {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(kube::Error::Api(status)) = err.downcast_ref::<kube::Error>() {
            return Some(status);
        }
        if let Some(status) = err.downcast_ref::<kube::core::Status>() {
            return Some(status);
        }
        next = err.source();
    }
    None
}

/// `host:port` of the leaf apiserver as a CONNECT target (brackets kept for IPv6).
pub fn target_of(uri: &Uri) -> Option<String> {
    let host = uri.host()?;
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    Some(format!("{host}:{port}"))
}

/// What a tunnel through a proxy starts from: a plain TCP connection, or TLS over it for an
/// `https://` proxy.
pub enum ProxyStream {
    Tcp(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

impl LeafProxy {
    /// The URI to dial the proxy itself.
    pub fn dial_uri(&self) -> &Uri {
        &self.dial_uri
    }

    /// Credentials for SOCKS5 user/password authentication.
    pub fn socks_credentials(&self) -> Option<(String, String)> {
        self.url.credentials.clone()
    }

    /// Opens TLS to an `https://` proxy over `tcp`; a plain stream for `http://`.
    pub async fn secure(
        &self,
        tcp: tokio::net::TcpStream,
        leaf: &str,
    ) -> Result<ProxyStream, DialError> {
        let Some(tls) = &self.tls else {
            return Ok(ProxyStream::Tcp(tcp));
        };
        let name =
            ServerName::try_from(self.url.host.clone()).map_err(|e| DialError::ProxyTls {
                proxy: self.url.to_string(),
                leaf: leaf.to_string(),
                message: e.to_string(),
            })?;
        let stream = tls
            .connect(name, tcp)
            .await
            .map_err(|e| DialError::ProxyTls {
                proxy: self.url.to_string(),
                leaf: leaf.to_string(),
                message: e.to_string(),
            })?;
        Ok(ProxyStream::Tls(Box::new(stream)))
    }

    /// Asks an HTTP proxy to CONNECT to `target` (the leaf apiserver's `host:port`) and reads
    /// its answer up to the end of its head, not a byte further: what follows is the leaf's TLS.
    pub async fn connect<S>(&self, io: &mut S, target: &str, leaf: &str) -> Result<(), DialError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let broken = |message: String| DialError::Broken {
            proxy: self.url.to_string(),
            leaf: leaf.to_string(),
            message,
        };
        let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some((user, password)) = &self.url.credentials {
            let basic =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            request.push_str(&format!("Proxy-Authorization: Basic {basic}\r\n"));
        }
        request.push_str("\r\n");
        io.write_all(request.as_bytes())
            .await
            .map_err(|e| broken(format!("sending CONNECT: {e}")))?;
        io.flush()
            .await
            .map_err(|e| broken(format!("sending CONNECT: {e}")))?;
        let head = read_head(io).await.map_err(broken)?;
        let status_line = head.lines().next().unwrap_or_default();
        let status = parse_status(status_line)
            .ok_or_else(|| broken(format!("not an HTTP answer: {}", printable(status_line))))?;
        if (200..300).contains(&status) {
            return Ok(());
        }
        let body = read_refusal_body(io).await;
        let mut answer = printable(status_line.trim_start_matches(|c| c != ' ').trim());
        if !body.is_empty() {
            answer.push_str(": ");
            answer.push_str(&body);
        }
        Err(DialError::Refused {
            proxy: self.url.to_string(),
            leaf: leaf.to_string(),
            answer,
        })
    }
}

/// Reads an HTTP answer's head one byte at a time, so that nothing after it is consumed (a
/// few dozen reads, once per connection).
async fn read_head<S: AsyncRead + Unpin>(io: &mut S) -> Result<String, String> {
    let mut head = Vec::with_capacity(64);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_ANSWER_HEAD {
            return Err(format!("its answer's head is over {MAX_ANSWER_HEAD} bytes"));
        }
        match io.read(&mut byte).await {
            Ok(0) => {
                return Err(if head.is_empty() {
                    "it closed the connection without answering".to_string()
                } else {
                    "it closed the connection in the middle of its answer".to_string()
                });
            }
            Ok(_) => head.push(byte[0]),
            Err(e) => return Err(format!("reading its answer: {e}")),
        }
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// The status code of `HTTP/1.x NNN reason`.
fn parse_status(line: &str) -> Option<u16> {
    let mut parts = line.split(' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 {
        return None;
    }
    code.parse().ok()
}

/// The start of a refusal's body, for the error message; whatever arrives within a short wait.
async fn read_refusal_body<S: AsyncRead + Unpin>(io: &mut S) -> String {
    let mut body = Vec::with_capacity(MAX_REFUSAL_BODY);
    let reading = async {
        let mut chunk = [0u8; MAX_REFUSAL_BODY];
        while body.len() < MAX_REFUSAL_BODY {
            match io.read(&mut chunk[..MAX_REFUSAL_BODY - body.len()]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_BODY_WAIT, reading).await;
    printable(String::from_utf8_lossy(&body).trim())
}

/// Text from a proxy, made safe for one log line: control characters become spaces.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_error_is_quoted_once_and_short() {
        let page = format!("readyz check failed\n{}", "[-]etcd failed\n".repeat(4000));
        let status =
            kube::core::Status::failure(&page, "Failed to parse error data").with_code(500);
        let err = kube::Error::Api(Box::new(status));
        // kube's own message carries the page twice.
        assert!(err.to_string().len() > 2 * page.len());
        let text = error_chain(&err);
        assert!(
            text.starts_with("the leaf answered 500: readyz check failed [-]etcd failed"),
            "{text}"
        );
        assert_eq!(text.matches("readyz check failed").count(), 1, "{text}");
        assert!(text.len() < 400, "{text}");
        assert!(!text.contains('\n'), "{text}");

        let status = kube::core::Status::failure("pods is forbidden", "Forbidden").with_code(403);
        assert_eq!(
            error_chain(&kube::Error::Api(Box::new(status))),
            "the leaf answered 403 Forbidden: pods is forbidden"
        );
        let over = crate::kube_client::OverLimit {
            limit: crate::kube_client::Limit::ErrorBody,
        };
        assert_eq!(
            error_chain(&kube::Error::Service(Box::new(over))),
            "the leaf sent an error answer longer than 64 KiB, relaylet's limit; it was not read further"
        );
    }

    #[test]
    fn the_three_schemes_parse_with_their_default_ports() {
        let http = ProxyUrl::parse("http://konnectivity.relaylet.svc:8090").unwrap();
        assert_eq!(
            (http.scheme, http.host.as_str(), http.port),
            (Scheme::Http, "konnectivity.relaylet.svc", 8090)
        );
        assert_eq!(ProxyUrl::parse("HTTPS://p").unwrap().port, 443);
        assert_eq!(ProxyUrl::parse("socks5://p/").unwrap().port, 1080);
        assert_eq!(ProxyUrl::parse("http://p").unwrap().port, 80);
        let v6 = ProxyUrl::parse("http://[fd00::1]:3128").unwrap();
        assert_eq!(v6.host, "fd00::1");
        assert_eq!(v6.to_string(), "[fd00::1]:3128");
    }

    #[test]
    fn other_schemes_and_malformed_urls_are_refused() {
        for (url, problem) in [
            ("socks4://p:1080", UrlProblem::Scheme),
            ("ftp://p", UrlProblem::Scheme),
            ("p:3128", UrlProblem::Scheme),
            ("", UrlProblem::Scheme),
            ("http://", UrlProblem::NoHost),
            ("http://:3128", UrlProblem::NoHost),
            ("http://p:0", UrlProblem::Port),
            ("http://p:99999", UrlProblem::Port),
            ("http://p:x", UrlProblem::Port),
            ("http://p/path", UrlProblem::Path),
            ("http://p?q=1", UrlProblem::Path),
            ("http://fd00::1:80", UrlProblem::Malformed),
            ("http://[fd00::1", UrlProblem::Malformed),
            ("http://p q:80", UrlProblem::Malformed),
        ] {
            assert_eq!(ProxyUrl::parse(url), Err(problem), "{url}");
        }
    }

    #[test]
    fn credentials_are_decoded_and_never_shown() {
        let url = ProxyUrl::parse("http://us%40er:pa%3Ass@p:3128").unwrap();
        assert_eq!(
            url.credentials,
            Some(("us@er".to_string(), "pa:ss".to_string()))
        );
        assert_eq!(url.to_string(), "p:3128");
        assert!(!format!("{url:?}").contains("pa:ss"));
        let proxy = LeafProxy::new("http://u:hunter2@p:3128", &ProxyTls::default()).unwrap();
        assert!(!format!("{proxy:?}").contains("hunter2"));
    }

    #[test]
    fn an_https_proxy_needs_its_ca_and_whole_client_certificates() {
        assert_eq!(
            LeafProxy::new("https://p:8090", &ProxyTls::default()).unwrap_err(),
            ProxySetupError::NoCa
        );
        let ca = rcgen::generate_simple_self_signed(vec!["p".to_string()]).unwrap();
        let half = ProxyTls {
            ca: Some(ca.cert.pem().into_bytes()),
            client_cert: Some(ca.cert.pem().into_bytes()),
            client_key: None,
        };
        assert_eq!(
            LeafProxy::new("https://p:8090", &half).unwrap_err(),
            ProxySetupError::HalfClientCert
        );
        let whole = ProxyTls {
            client_key: Some(ca.signing_key.serialize_pem().into_bytes()),
            ..half.clone()
        };
        assert!(LeafProxy::new("https://p:8090", &whole).is_ok());
        assert_eq!(
            LeafProxy::new("http://p:8090", &whole).unwrap_err(),
            ProxySetupError::TlsUnused
        );
        let bad = ProxyTls {
            ca: Some(b"not pem".to_vec()),
            ..ProxyTls::default()
        };
        assert!(matches!(
            LeafProxy::new("https://p", &bad).unwrap_err(),
            ProxySetupError::Pem {
                key: PROXY_CA_KEY,
                ..
            }
        ));
    }

    #[test]
    fn status_lines() {
        assert_eq!(
            parse_status("HTTP/1.1 200 Connection Established"),
            Some(200)
        );
        assert_eq!(parse_status("HTTP/1.0 503 Service Unavailable"), Some(503));
        assert_eq!(parse_status("SSH-2.0-OpenSSH"), None);
        assert_eq!(parse_status("HTTP/1.1 20 x"), None);
    }

    /// A proxy answer after which the leaf's bytes follow at once: only the head is consumed.
    #[tokio::test]
    async fn connect_consumes_exactly_the_answer_head() {
        let (mut ours, mut theirs) = tokio::io::duplex(4096);
        let proxy = LeafProxy::new("http://u:p%21@p:3128", &ProxyTls::default()).unwrap();
        let server = tokio::spawn(async move {
            let mut request = vec![0u8; 512];
            let n = theirs.read(&mut request).await.unwrap();
            theirs
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\nLEAF")
                .await
                .unwrap();
            String::from_utf8(request[..n].to_vec()).unwrap()
        });
        proxy
            .connect(&mut ours, "leaf:6443", "leaf-3")
            .await
            .unwrap();
        let request = server.await.unwrap();
        assert!(request.starts_with("CONNECT leaf:6443 HTTP/1.1\r\nHost: leaf:6443\r\n"));
        let basic = base64::engine::general_purpose::STANDARD.encode("u:p!");
        assert!(request.contains(&format!("Proxy-Authorization: Basic {basic}\r\n")));
        let mut rest = [0u8; 4];
        ours.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"LEAF");
    }

    #[tokio::test]
    async fn a_refusal_names_the_proxy_the_leaf_and_the_answer() {
        let (mut ours, mut theirs) = tokio::io::duplex(4096);
        let proxy = LeafProxy::new(
            "http://u:secret@konnectivity.relaylet.svc:8090",
            &ProxyTls::default(),
        )
        .unwrap();
        tokio::spawn(async move {
            let mut request = vec![0u8; 512];
            let _ = theirs.read(&mut request).await.unwrap();
            theirs
                .write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available\r\n")
                .await
                .unwrap();
        });
        let err = proxy
            .connect(&mut ours, "leaf:6443", "leaf-3")
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "proxy konnectivity.relaylet.svc:8090 refused CONNECT to leaf-3's apiserver: 503 Service Unavailable: currently no tunnels available"
        );
    }

    #[tokio::test]
    async fn a_proxy_that_closes_or_babbles_is_a_clear_error() {
        let proxy = LeafProxy::new("http://p:1", &ProxyTls::default()).unwrap();
        let (mut ours, theirs) = tokio::io::duplex(64);
        drop(theirs);
        let err = proxy.connect(&mut ours, "l:1", "leaf-3").await.unwrap_err();
        assert!(
            err.to_string()
                .contains("proxy p:1 failed CONNECT to leaf-3's apiserver"),
            "{err}"
        );
        let (mut ours, mut theirs) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let mut request = vec![0u8; 512];
            let _ = theirs.read(&mut request).await;
            let _ = theirs.write_all(&[b'x'; 9000]).await;
        });
        let err = proxy.connect(&mut ours, "l:1", "leaf-3").await.unwrap_err();
        assert!(err.to_string().contains("over 8192 bytes"), "{err}");
    }
}

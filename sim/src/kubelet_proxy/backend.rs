//! One HTTPS connection from the "apiserver" to a kubelet, and the request we forward on it.
//!
//! kube-apiserver dials the node endpoint with its kubelet client certificate and verifies the
//! kubelet's serving certificate (when it has a CA for it) against the address it dialled, so
//! the TLS server name here is exactly the host picked from the Node's addresses.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, header};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::error::ProxyError;

/// How long dialing and the TLS handshake may take (the apiserver's kubelet dial timeout).
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers that describe one hop only and are never forwarded on a plain request.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// A kubelet endpoint to dial.
#[derive(Clone)]
pub(crate) struct Backend {
    pub host: String,
    pub port: u16,
    pub tls: Arc<rustls::ClientConfig>,
}

impl Backend {
    /// `host:port`, with IPv6 literals bracketed.
    pub(crate) fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    pub(crate) fn url(&self, path_and_query: &str) -> String {
        format!("https://{}{}", self.authority(), path_and_query)
    }

    /// Dials TLS and starts an HTTP/1.1 client connection that allows upgrades.
    pub(crate) async fn connect(&self) -> Result<SendRequest<Body>, ProxyError> {
        let dial = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|e| ProxyError::Dial(format!("dial tcp {}: {e}", self.authority())))?;
            let _ = tcp.set_nodelay(true);
            let name = ServerName::try_from(self.host.clone()).map_err(|e| {
                ProxyError::Dial(format!("invalid kubelet host {:?}: {e}", self.host))
            })?;
            tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| ProxyError::Dial(format!("tls: {e}")))
        };
        let tls = tokio::time::timeout(DIAL_TIMEOUT, dial)
            .await
            .map_err(|_| {
                ProxyError::Dial(format!("dial tcp {}: i/o timeout", self.authority()))
            })??;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| ProxyError::Dial(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(err) = conn.with_upgrades().await {
                tracing::debug!(%err, "kubelet connection ended with an error");
            }
        });
        Ok(sender)
    }
}

/// Builds the request we send to the kubelet: the client's method and headers (hop-by-hop ones
/// only when `keep_upgrade_headers` is false), the kubelet path, and our own `Host`. The
/// client's `Authorization` never travels on: the apiserver consumed it.
pub(crate) fn forward_request(
    method: Method,
    client_headers: &HeaderMap,
    backend: &Backend,
    path_and_query: &str,
    keep_upgrade_headers: bool,
    body: Body,
) -> Result<Request<Body>, ProxyError> {
    let mut request = Request::builder()
        .method(method)
        .uri(path_and_query)
        .body(body)
        .map_err(|e| ProxyError::BadRequest(format!("cannot build kubelet request: {e}")))?;
    let headers = request.headers_mut();
    for (name, value) in client_headers {
        if name == header::HOST || name == header::AUTHORIZATION {
            continue;
        }
        if !keep_upgrade_headers && is_hop_by_hop(name) {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    let host = HeaderValue::from_str(&backend.authority())
        .map_err(|_| ProxyError::BadRequest("kubelet address is not a valid Host".into()))?;
    headers.insert(header::HOST, host);
    Ok(request)
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// Response headers to relay: everything but hop-by-hop ones.
pub(crate) fn relay_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !is_hop_by_hop(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

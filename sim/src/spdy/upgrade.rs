//! The HTTP/1.1 upgrade to SPDY/3.1 and `X-Stream-Protocol-Version` negotiation, both sides.
//!
//! Client side ([`upgrade_client`]) sends what client-go's SPDY round tripper sends: a POST with
//! `Connection: Upgrade`, `Upgrade: SPDY/3.1` and one `X-Stream-Protocol-Version` header per
//! offered protocol in preference order. Server side ([`negotiate`], [`accept`],
//! [`upgrade_response`]) answers like the kubelet: `httpstream.Handshake` picks the first client
//! protocol the server knows, then `ResponseUpgrader` checks the upgrade headers and answers 101.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::{Connection, Incoming, Role};

/// `X-Stream-Protocol-Version`: offered (request, repeated) and chosen (response) protocols.
pub const PROTOCOL_VERSION_HEADER: &str = "X-Stream-Protocol-Version";
/// `X-Accepted-Stream-Protocol-Versions`: what the server would have accepted (on 403).
pub const ACCEPTED_VERSIONS_HEADER: &str = "X-Accepted-Stream-Protocol-Versions";
/// The `Upgrade` token.
pub const SPDY_31: &str = "SPDY/3.1";

/// Largest error body we keep from a refused upgrade.
const MAX_ERROR_BODY: usize = 1024 * 1024;
/// How long dialing, TLS and the upgrade exchange may take together.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The client offered protocols but the server knows none of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unable to upgrade: unable to negotiate protocol: client supports [{}], server accepts [{}]",
    client.join(" "),
    server.join(" ")
)]
pub struct NegotiationError {
    pub client: Vec<String>,
    pub server: Vec<String>,
}

impl NegotiationError {
    /// What `httpstream.Handshake` answers: 403, one `X-Accepted-Stream-Protocol-Versions`
    /// header per server protocol, and the message as a `text/plain` body (Go's `http.Error`).
    pub fn into_response(self) -> Response<Body> {
        let mut response = plain_error(StatusCode::FORBIDDEN, &self.to_string());
        for protocol in &self.server {
            if let Ok(value) = HeaderValue::from_str(protocol) {
                response
                    .headers_mut()
                    .append(ACCEPTED_VERSIONS_HEADER, value);
            }
        }
        response
    }
}

/// Why a client-side upgrade failed.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("bad upgrade URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS handshake with {addr} failed: {source}")]
    Tls {
        addr: String,
        source: std::io::Error,
    },
    #[error("HTTP exchange failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("request could not be built: {0}")]
    Request(#[from] http::Error),
    /// The server did not switch protocols; its status, headers and (capped) body.
    #[error("upgrade refused with {status}: {}", String::from_utf8_lossy(body))]
    Status {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    #[error("unable to upgrade: missing upgrade headers in response")]
    MissingUpgradeHeaders,
    #[error("upgrade handshake took longer than {0:?}")]
    Timeout(Duration),
}

/// `httpstream.Handshake`'s choice: the offered protocols are every `X-Stream-Protocol-Version`
/// value (repeated headers and comma-joined lists, trimmed, empties dropped), and the first one in
/// the *client's* order that the server supports wins.
///
/// `Ok(None)` means the client offered nothing. Old kubelets took that as the legacy unnamed
/// protocol; current ones answer `400 unable to upgrade: X-Stream-Protocol-Version is required`
/// (see [`missing_protocol_response`]). The caller chooses which it imitates.
pub fn negotiate(
    request_headers: &HeaderMap,
    server_protocols: &[&str],
) -> Result<Option<String>, NegotiationError> {
    let client: Vec<String> = request_headers
        .get_all(PROTOCOL_VERSION_HEADER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|p| p.trim_matches(' ').to_string())
        .filter(|p| !p.is_empty())
        .collect();
    if client.is_empty() {
        return Ok(None);
    }
    match client
        .iter()
        .find(|c| server_protocols.contains(&c.as_str()))
    {
        Some(chosen) => Ok(Some(chosen.clone())),
        None => Err(NegotiationError {
            client,
            server: server_protocols.iter().map(|s| s.to_string()).collect(),
        }),
    }
}

/// The 400 current kubelets send when a client offers no `X-Stream-Protocol-Version`.
pub fn missing_protocol_response() -> Response<Body> {
    plain_error(
        StatusCode::BAD_REQUEST,
        "unable to upgrade: X-Stream-Protocol-Version is required",
    )
}

/// The 101 answer to a SPDY upgrade, with the negotiated protocol if there is one.
pub fn upgrade_response(protocol: Option<&str>) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(SPDY_31));
    if let Some(value) = protocol.and_then(|p| HeaderValue::from_str(p).ok()) {
        headers.insert(PROTOCOL_VERSION_HEADER, value);
    }
    response
}

/// A server-side upgrade in progress: resolves to the connection once the 101 has been sent.
#[derive(Debug)]
pub struct Accepting {
    on_upgrade: OnUpgrade,
}

impl Accepting {
    /// Waits for hyper to hand over the upgraded connection and starts SPDY on it as the server.
    pub async fn connection(self) -> Result<(Connection, Incoming), hyper::Error> {
        let upgraded = self.on_upgrade.await?;
        Ok(Connection::new(TokioIo::new(upgraded), Role::Server))
    }
}

/// Server side of the upgrade, like the kubelet's `ResponseUpgrader`: the request must carry
/// `Connection: ...upgrade...` and `Upgrade: ...spdy/3.1...` (case-insensitive), otherwise the
/// answer is 400 `unable to upgrade: missing upgrade headers in request: ...`. On success,
/// returns the 101 to send (with `protocol` from [`negotiate`]) and the pending connection.
#[allow(clippy::result_large_err)]
pub fn accept<B>(
    req: &mut Request<B>,
    protocol: Option<&str>,
) -> Result<(Response<Body>, Accepting), Response<Body>> {
    let first = |name: header::HeaderName| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    let connection = first(header::CONNECTION);
    let upgrade = first(header::UPGRADE);
    if !connection.contains("upgrade") || !upgrade.contains("spdy/3.1") {
        let message = format!(
            "unable to upgrade: missing upgrade headers in request: {:?}",
            req.headers()
        );
        return Err(plain_error(StatusCode::BAD_REQUEST, &message));
    }
    let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
        return Err(plain_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unable to upgrade: unable to hijack response",
        ));
    };
    Ok((upgrade_response(protocol), Accepting { on_upgrade }))
}

/// Go's `http.Error`: text body with a trailing newline, and `nosniff`.
fn plain_error(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(format!("{message}\n")));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// Client side: dials `url` (https) with `tls`, asks to upgrade to SPDY/3.1 offering `protocols`
/// in preference order, and on 101 starts SPDY as the client. Returns the protocol the server
/// chose (empty if it named none). `extra_headers` (e.g. `Authorization`) are sent as given.
pub async fn upgrade_client(
    url: &str,
    tls: Arc<rustls::ClientConfig>,
    protocols: &[&str],
    extra_headers: &[(String, String)],
) -> Result<(String, Connection, Incoming), UpgradeError> {
    tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        upgrade_client_inner(url, tls, protocols, extra_headers),
    )
    .await
    .map_err(|_| UpgradeError::Timeout(HANDSHAKE_TIMEOUT))?
}

async fn upgrade_client_inner(
    url: &str,
    tls: Arc<rustls::ClientConfig>,
    protocols: &[&str],
    extra_headers: &[(String, String)],
) -> Result<(String, Connection, Incoming), UpgradeError> {
    let bad = |reason: &str| UpgradeError::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let uri: http::Uri = url.parse().map_err(|_| bad("not a URI"))?;
    if uri.scheme_str() != Some("https") {
        return Err(bad("scheme must be https"));
    }
    let host = uri.host().ok_or_else(|| bad("no host"))?;
    let port = uri.port_u16().unwrap_or(443);
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let addr = format!("{host}:{port}");
    let tcp = TcpStream::connect((bare_host, port))
        .await
        .map_err(|source| UpgradeError::Connect {
            addr: addr.clone(),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from(bare_host.to_string())
        .map_err(|_| bad("host is not a valid TLS server name"))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .map_err(|source| UpgradeError::Tls {
            addr: addr.clone(),
            source,
        })?;

    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(err) = conn.with_upgrades().await {
            tracing::debug!(%err, "upgrade client connection ended");
        }
    });

    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(
            header::HOST,
            uri.authority().map(|a| a.as_str()).unwrap_or(host),
        )
        .header(header::CONTENT_LENGTH, "0")
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, SPDY_31);
    for protocol in protocols {
        builder = builder.header(PROTOCOL_VERSION_HEADER, *protocol);
    }
    for (name, value) in extra_headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let request = builder.body(Empty::<Bytes>::new())?;
    let mut response = sender.send_request(request).await?;

    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let headers = response.headers().clone();
        let body = match Limited::new(response.into_body(), MAX_ERROR_BODY)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(_) => Bytes::new(),
        };
        return Err(UpgradeError::Status {
            status,
            headers,
            body,
        });
    }
    let has = |name: header::HeaderName, token: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains(token))
    };
    if !has(header::CONNECTION, "upgrade") || !has(header::UPGRADE, "spdy/3.1") {
        return Err(UpgradeError::MissingUpgradeHeaders);
    }
    let protocol = response
        .headers()
        .get(PROTOCOL_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let upgraded = hyper::upgrade::on(&mut response).await?;
    let (connection, incoming) = Connection::new(TokioIo::new(upgraded), Role::Client);
    Ok((protocol, connection, incoming))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(
                PROTOCOL_VERSION_HEADER,
                HeaderValue::from_str(v).expect("value"),
            );
        }
        headers
    }

    #[test]
    fn negotiation_reads_repeated_and_comma_joined_values_in_client_order() {
        let server = ["v4.channel.k8s.io", "v5.channel.k8s.io"];
        let headers = offered(&[
            " v3.channel.k8s.io , v5.channel.k8s.io",
            "v4.channel.k8s.io",
        ]);
        assert_eq!(
            negotiate(&headers, &server).expect("match"),
            Some("v5.channel.k8s.io".to_string())
        );
        assert_eq!(negotiate(&offered(&[]), &server).expect("none"), None);
        assert_eq!(
            negotiate(&offered(&[" , "]), &server).expect("empties"),
            None
        );
    }

    #[test]
    fn refusal_lists_every_server_protocol_in_its_own_header() {
        let err = negotiate(
            &offered(&["v9.channel.k8s.io,v8.channel.k8s.io"]),
            &["a", "b"],
        )
        .expect_err("no match");
        assert_eq!(
            err.to_string(),
            "unable to upgrade: unable to negotiate protocol: client supports \
             [v9.channel.k8s.io v8.channel.k8s.io], server accepts [a b]"
        );
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let accepted: Vec<_> = response
            .headers()
            .get_all(ACCEPTED_VERSIONS_HEADER)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect();
        assert_eq!(accepted, [b"a".to_vec(), b"b".to_vec()]);
    }

    #[test]
    fn accept_checks_the_upgrade_headers_like_the_kubelet() {
        let mut plain = Request::new(());
        let refused = accept(&mut plain, None).expect_err("not an upgrade");
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        let mut websocket = Request::builder()
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .body(())
            .expect("request");
        assert!(accept(&mut websocket, None).is_err());
        let ok = upgrade_response(Some("v4.channel.k8s.io"));
        assert_eq!(ok.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(
            ok.headers()
                .get(PROTOCOL_VERSION_HEADER)
                .map(|v| v.as_bytes()),
            Some(&b"v4.channel.k8s.io"[..])
        );
        assert_eq!(
            ok.headers().get(header::UPGRADE).map(|v| v.as_bytes()),
            Some(&b"SPDY/3.1"[..])
        );
    }
}

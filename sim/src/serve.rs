//! Serving an axum router over HTTPS with HTTP/1.1 upgrades, the way every stand-in listens;
//! an apiserver also speaks HTTP/2 to a client that asks for it by ALPN, as kube-apiserver does.
//!
//! Each connection is counted by who made it and its protocol ([`Connections`]). Each accepted
//! connection gets the client certificate it presented (if any) as a
//! [`PeerCert`] request extension, its client's address as a [`PeerAddr`], and a [`Stop`] token that fires when the server is stopped,
//! so upgraded streams can end with their server (a stopped stand-in must look dead).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::connections::Connections;

/// The HTTP versions a server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Http {
    /// HTTP/1.1 only (the kubelet stand-in's streaming API; ALPN offers `http/1.1`).
    Http1,
    /// HTTP/2 when the client offers `h2` by ALPN, with at most `max_streams` concurrent
    /// streams per connection; HTTP/1.1 (and its upgrades) otherwise.
    H2OrHttp1 { max_streams: u32 },
}

/// The address a request's connection came from (a test tells clients on one machine apart
/// by it, as `ss` would).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The client certificate chain a caller presented during the TLS handshake (leaf first).
#[derive(Clone, Debug, Default)]
pub struct PeerCert(pub Option<Arc<Vec<CertificateDer<'static>>>>);

impl PeerCert {
    /// The caller's leaf certificate, if it presented one.
    pub fn leaf(&self) -> Option<&CertificateDer<'static>> {
        self.0.as_ref().and_then(|chain| chain.first())
    }
}

/// Fires when the server that accepted the request is stopped.
#[derive(Clone, Debug)]
pub struct Stop(pub CancellationToken);

/// A running HTTPS server; stopped when dropped.
pub struct Served {
    pub addr: SocketAddr,
    stop: CancellationToken,
    connections: Connections,
}

impl Served {
    /// Stops accepting and cuts every open connection, upgraded ones included.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// The connections this server accepted and has open.
    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    /// A token that fires when this server stops.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serves `app` over TLS on `listener`, HTTP/1.1 only, until the returned handle is stopped or
/// dropped.
pub fn serve_tls(listener: TcpListener, tls: Arc<rustls::ServerConfig>, app: Router) -> Served {
    serve_tls_with(listener, tls, app, Http::Http1)
}

/// Serves `app` over TLS on `listener` speaking `http` until the returned handle is stopped or
/// dropped. With [`Http::H2OrHttp1`] the server offers `h2` before `http/1.1` by ALPN.
pub fn serve_tls_with(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    http: Http,
) -> Served {
    let tls = match http {
        Http::Http1 => tls,
        Http::H2OrHttp1 { .. } => {
            let mut both = (*tls).clone();
            both.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Arc::new(both)
        }
    };
    let connections = Connections::default();
    let counted = connections.clone();
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let stop = CancellationToken::new();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let token = stop.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, from) = tokio::select! {
                _ = token.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(err) => {
                        tracing::warn!(%err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let app = app.clone();
            let token = token.clone();
            let counted = counted.clone();
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp));
                let tls = match handshake.await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(err)) => {
                        tracing::debug!(%err, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
                let peer =
                    PeerCert(tls.get_ref().1.peer_certificates().map(|chain| {
                        Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect())
                    }));
                let session = tls.get_ref().1;
                let user = session
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|der| crate::tls::cert_user(der).ok())
                    .map(|u| u.name)
                    .unwrap_or_default();
                let alpn = session
                    .alpn_protocol()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .unwrap_or_default();
                let _open = counted.accepted(&user, &alpn);
                let stop = Stop(token.clone());
                let service =
                    hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                        req.extensions_mut().insert(peer.clone());
                        req.extensions_mut().insert(PeerAddr(from));
                        req.extensions_mut().insert(stop.clone());
                        app.clone().oneshot(req)
                    });
                let io = TokioIo::new(tls);
                let served: std::pin::Pin<
                    Box<dyn Future<Output = Result<(), hyper::Error>> + Send>,
                > = match http {
                    Http::H2OrHttp1 { max_streams } if alpn == "h2" => Box::pin(
                        hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .max_concurrent_streams(max_streams)
                        .serve_connection(io, service),
                    ),
                    _ => Box::pin(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .with_upgrades(),
                    ),
                };
                tokio::select! {
                    _ = token.cancelled() => {}
                    result = served => {
                        if let Err(err) = result {
                            tracing::debug!(%err, "connection ended with error");
                        }
                    }
                }
            });
        }
    });
    Served {
        addr,
        stop,
        connections,
    }
}

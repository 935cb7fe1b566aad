//! Serving an axum router over HTTPS with HTTP/1.1 upgrades, the way every stand-in listens.
//!
//! Each accepted connection gets the client certificate it presented (if any) as a
//! [`PeerCert`] request extension, and a [`Stop`] token that fires when the server is stopped,
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
}

impl Served {
    /// Stops accepting and cuts every open connection, upgraded ones included.
    pub fn stop(&self) {
        self.stop.cancel();
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

/// Serves `app` over TLS on `listener` until the returned handle is stopped or dropped.
pub fn serve_tls(listener: TcpListener, tls: Arc<rustls::ServerConfig>, app: Router) -> Served {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let stop = CancellationToken::new();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let token = stop.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
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
                let stop = Stop(token.clone());
                let service =
                    hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                        req.extensions_mut().insert(peer.clone());
                        req.extensions_mut().insert(stop.clone());
                        app.clone().oneshot(req)
                    });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades();
                tokio::select! {
                    _ = token.cancelled() => {}
                    result = conn => {
                        if let Err(err) = result {
                            tracing::debug!(%err, "connection ended with error");
                        }
                    }
                }
            });
        }
    });
    Served { addr, stop }
}

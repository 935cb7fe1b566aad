//! The one way relaylet opens a TCP connection to a leaf apiserver: directly, or through the
//! proxy the leaf's kubeconfig names (`proxy`).
//!
//! Both of a leaf's clients (the API client for watches, pod reads and the counterpart proof,
//! and the stream client with its spare connection) put their TLS to the leaf on top of a
//! [`LeafDialer`], so no connection to a leaf can go around its proxy, and the leaf's TLS runs
//! end to end inside the tunnel. Connections set `TCP_NODELAY` (an interactive session's small
//! TLS records must not wait for the previous one's acknowledgement) and read ahead in large
//! chunks while data flows (`read_ahead`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::proxy::SocksV5;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tower::{Service, ServiceExt};

use crate::leaf::proxy::{DialError, LeafProxy, ProxyStream, Scheme, target_of};
use crate::ops::ReadAhead;

/// Dials one leaf's apiserver, through its proxy if it has one.
#[derive(Clone)]
pub struct LeafDialer {
    leaf: Arc<str>,
    proxy: Option<Arc<LeafProxy>>,
    tcp: HttpConnector,
}

impl LeafDialer {
    pub fn new(leaf: &str, proxy: Option<LeafProxy>) -> LeafDialer {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        LeafDialer {
            leaf: leaf.into(),
            proxy: proxy.map(Arc::new),
            tcp,
        }
    }

    /// The proxy this leaf is reached through, if any.
    pub fn proxy(&self) -> Option<&LeafProxy> {
        self.proxy.as_deref()
    }

    async fn dial(self, uri: Uri) -> Result<LeafTcp, DialError> {
        let leaf = self.leaf.to_string();
        let target = target_of(&uri).ok_or_else(|| DialError::NoHost {
            leaf: leaf.clone(),
            target: uri.to_string(),
        })?;
        let Some(proxy) = self.proxy else {
            let tcp = self.tcp.oneshot(uri).await.map_err(|e| DialError::Direct {
                leaf,
                target,
                message: crate::leaf::error_chain(&e),
            })?;
            return Ok(LeafTcp::new(Transport::Tcp(tcp.into_inner())));
        };
        if proxy.url.scheme == Scheme::Socks5 {
            let mut socks = SocksV5::new(proxy.dial_uri().clone(), self.tcp);
            if let Some((user, password)) = proxy.socks_credentials() {
                socks = socks.with_auth(user, password);
            }
            let tcp = socks.oneshot(uri).await.map_err(|e| DialError::Socks {
                proxy: proxy.url.to_string(),
                leaf: leaf.clone(),
                message: crate::leaf::error_chain(&e),
            })?;
            return Ok(LeafTcp::new(Transport::Tcp(tcp.into_inner())));
        }
        let tcp = self
            .tcp
            .oneshot(proxy.dial_uri().clone())
            .await
            .map_err(|e| DialError::ProxyUnreachable {
                proxy: proxy.url.to_string(),
                leaf: leaf.clone(),
                message: crate::leaf::error_chain(&e),
            })?
            .into_inner();
        let transport = match proxy.secure(tcp, &leaf).await? {
            ProxyStream::Tcp(mut tcp) => {
                proxy.connect(&mut tcp, &target, &leaf).await?;
                Transport::Tcp(tcp)
            }
            ProxyStream::Tls(mut tls) => {
                proxy.connect(&mut tls, &target, &leaf).await?;
                Transport::ProxyTls(tls)
            }
        };
        Ok(LeafTcp::new(transport))
    }
}

type Dialing = Pin<Box<dyn Future<Output = Result<LeafTcp, DialError>> + Send>>;

impl Service<Uri> for LeafDialer {
    type Response = LeafTcp;
    type Error = DialError;
    type Future = Dialing;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // HttpConnector is always ready; each call dials with a clone.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().dial(uri))
    }
}

/// The byte stream under the leaf's TLS: TCP to the leaf or to an HTTP/SOCKS5 proxy, or TLS to
/// an `https://` proxy.
pub enum Transport {
    Tcp(TcpStream),
    ProxyTls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Transport::ProxyTls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Tcp(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Transport::ProxyTls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Tcp(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Transport::ProxyTls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Tcp(tcp) => tcp.is_write_vectored(),
            Transport::ProxyTls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(tcp) => Pin::new(tcp).poll_flush(cx),
            Transport::ProxyTls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Tcp(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Transport::ProxyTls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A leaf connection as hyper's client needs it: [`ReadAhead`] over the dialed transport.
pub struct LeafTcp(TokioIo<ReadAhead<Transport>>);

impl LeafTcp {
    fn new(transport: Transport) -> LeafTcp {
        LeafTcp(TokioIo::new(ReadAhead::new(transport)))
    }
}

impl Connection for LeafTcp {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for LeafTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for LeafTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        hyper::rt::Write::is_write_vectored(&self.0)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

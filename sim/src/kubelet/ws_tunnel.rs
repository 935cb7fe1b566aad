//! A WebSocket as a byte stream, for SPDY tunnelled through WebSocket.
//!
//! Port-forward clients from Kubernetes 1.31 on ask for the WebSocket subprotocol
//! `SPDY/3.1+portforward.k8s.io` and then speak plain SPDY inside binary messages (upstream
//! `TunnelingConnection`: no channel byte, message boundaries mean nothing). Kubelets with
//! `ExtendWebSocketsToKubelet` accept that directly. This adapter turns either end of such a
//! WebSocket into `AsyncRead + AsyncWrite` so the SPDY connection code runs on it unchanged.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::{self, Message};

/// The WebSocket subprotocol prefix that marks a tunnelled SPDY protocol.
pub const TUNNEL_PREFIX: &str = "SPDY/3.1+";

/// Bytes over binary WebSocket messages.
pub struct WsByteStream<S> {
    ws: S,
    pending: Bytes,
    eof: bool,
}

impl<S> WsByteStream<S> {
    pub fn new(ws: S) -> Self {
        WsByteStream {
            ws,
            pending: Bytes::new(),
            eof: false,
        }
    }
}

fn to_io(err: tungstenite::Error) -> io::Error {
    match err {
        tungstenite::Error::Io(e) => e,
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
            io::Error::new(io::ErrorKind::BrokenPipe, "WebSocket closed")
        }
        other => io::Error::other(other),
    }
}

impl<S> AsyncRead for WsByteStream<S>
where
    S: Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                let chunk = self.pending.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            if self.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => self.pending = data,
                // Control frames are answered by tungstenite itself.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "invalid message type received",
                    )));
                }
                Some(Ok(Message::Close(_))) | None => self.eof = true,
                Some(Err(e)) => return Poll::Ready(Err(to_io(e))),
            }
        }
    }
}

impl<S> AsyncWrite for WsByteStream<S>
where
    S: Sink<Message, Error = tungstenite::Error> + Unpin,
{
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(to_io)?;
        Pin::new(&mut self.ws)
            .start_send(Message::binary(buf.to_vec()))
            .map_err(to_io)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(to_io)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_close(cx).map_err(to_io)
    }
}

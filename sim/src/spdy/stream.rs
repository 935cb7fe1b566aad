//! One SPDY stream as an async byte pipe: reads are the peer's DATA frames, writes become our DATA
//! frames, shutdown sends FIN.
//!
//! A stream is two independent half-duplex pipes, like a TCP connection: the peer's FIN ends our
//! reads (EOF) while we may keep writing, and our FIN ends our writes while we keep reading.
//! RST_STREAM ends both. Reads also end with EOF after a reset, and when the connection dies
//! under an open stream, because that is what spdystream does (`Serve` closes every stream's
//! remote channels when the connection ends, and `Stream.Read` then returns `io.EOF`) and what
//! client-go's executors see: the kubelet resets the error stream after writing the exit Status
//! to it, and a connection cut under a session reads exactly like a clean end. That last case is
//! why a cut with no Status on the error stream reads as exit code 0 to client-go; the
//! stand-ins must not be kinder than the real thing, or tests would miss it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

use super::SpdyError;
use super::frame::{FLAG_FIN, Frame, rst};
use super::headers::HeaderList;
use super::shared::{Lifeline, Shared, StreamState, WriteCmd};

/// Largest DATA frame we send; bigger writes are split (client-go writes 32 KiB at a time too).
pub(crate) const MAX_WRITE_CHUNK: usize = 32 * 1024;

/// A SPDY stream: the headers it was opened with, and an async byte pipe.
pub struct Stream {
    headers: Arc<HeaderList>,
    reader: StreamReader,
    writer: StreamWriter,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.id())
            .field("headers", &self.headers)
            .finish()
    }
}

impl Stream {
    pub(crate) fn new(
        state: Arc<StreamState>,
        headers: HeaderList,
        data: mpsc::Receiver<Bytes>,
        shared: Arc<Shared>,
        lifeline: Arc<Lifeline>,
    ) -> Stream {
        Stream {
            headers: Arc::new(headers),
            reader: StreamReader {
                state: state.clone(),
                data,
                pending: Bytes::new(),
                _lifeline: lifeline.clone(),
            },
            writer: StreamWriter {
                state,
                sender: PollSender::new(shared.writer.clone()),
                shared,
                _lifeline: lifeline,
            },
        }
    }

    /// The stream id (odd if the client opened it, even if the server did).
    pub fn id(&self) -> u32 {
        self.writer.state.id
    }

    /// The headers of the SYN_STREAM that opened the stream (lowercase names, wire order).
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The first value of header `name`, compared case-insensitively (Go peers write
    /// `streamType`, the wire carries `streamtype`).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Accepts a peer-opened stream with an empty SYN_REPLY, as the kubelet does.
    pub async fn reply(&self) -> Result<(), SpdyError> {
        self.writer
            .shared
            .send(WriteCmd::Frame(Frame::SynReply {
                stream_id: self.id(),
                flags: 0,
                headers: Vec::new(),
            }))
            .await
    }

    /// Ends both directions at once with RST_STREAM (CANCEL).
    pub async fn reset(&self) -> Result<(), SpdyError> {
        self.writer.reset().await
    }

    /// Splits into independently owned read and write halves.
    pub fn into_split(self) -> (StreamReader, StreamWriter) {
        (self.reader, self.writer)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.writer).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_shutdown(cx)
    }
}

/// The receiving half of a stream: the peer's DATA payloads, then EOF after its FIN or reset.
pub struct StreamReader {
    state: Arc<StreamState>,
    data: mpsc::Receiver<Bytes>,
    pending: Bytes,
    _lifeline: Arc<Lifeline>,
}

impl StreamReader {
    pub fn id(&self) -> u32 {
        self.state.id
    }
}

impl AsyncRead for StreamReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while self.pending.is_empty() {
            match ready!(self.data.poll_recv(cx)) {
                Some(chunk) => self.pending = chunk,
                // FIN, RST_STREAM or a lost connection: spdystream reads EOF in every case.
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = self.pending.len().min(buf.remaining());
        let chunk = self.pending.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

/// The sending half of a stream. Dropping it without shutting it down sends FIN, so the peer's
/// reads end the way an `io.Copy` + `Close` in Go would end them.
pub struct StreamWriter {
    state: Arc<StreamState>,
    sender: PollSender<WriteCmd>,
    shared: Arc<Shared>,
    // Declared last so the FIN queued by `Drop` goes out before a last-handle GOAWAY.
    _lifeline: Arc<Lifeline>,
}

impl StreamWriter {
    pub fn id(&self) -> u32 {
        self.state.id
    }

    /// Ends both directions at once with RST_STREAM (CANCEL).
    pub async fn reset(&self) -> Result<(), SpdyError> {
        if self.state.is_reset() {
            return Ok(());
        }
        self.state.close_local();
        self.shared.reset_locally(self.state.id);
        self.shared
            .send(WriteCmd::Frame(Frame::RstStream {
                stream_id: self.state.id,
                status: rst::CANCEL,
            }))
            .await
    }

    fn closed_error(&self) -> Option<io::Error> {
        if self.state.is_reset() {
            Some(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "SPDY stream was reset",
            ))
        } else if self.state.is_local_closed() {
            Some(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "SPDY stream is closed for writing",
            ))
        } else if self.shared.is_closed() {
            Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "SPDY connection is closed",
            ))
        } else {
            None
        }
    }
}

fn channel_gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "SPDY connection is closed",
    )
}

impl AsyncWrite for StreamWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(err) = self.closed_error() {
            return Poll::Ready(Err(err));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if ready!(self.sender.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(channel_gone()));
        }
        let n = buf.len().min(MAX_WRITE_CHUNK);
        let frame = Frame::Data {
            stream_id: self.state.id,
            flags: 0,
            data: Bytes::copy_from_slice(&buf[..n]),
        };
        match self.sender.send_item(WriteCmd::Frame(frame)) {
            Ok(()) => Poll::Ready(Ok(n)),
            Err(_) => Poll::Ready(Err(channel_gone())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Frames are handed to the writer task in order and it flushes whenever its queue runs
        // dry, so there is nothing to wait for here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.state.is_local_closed() {
            return Poll::Ready(Ok(()));
        }
        if self.shared.is_closed() {
            return Poll::Ready(Err(channel_gone()));
        }
        if ready!(self.sender.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(channel_gone()));
        }
        let fin = Frame::Data {
            stream_id: self.state.id,
            flags: FLAG_FIN,
            data: Bytes::new(),
        };
        if self.sender.send_item(WriteCmd::Frame(fin)).is_err() {
            return Poll::Ready(Err(channel_gone()));
        }
        self.state.close_local();
        self.shared.closed_locally(self.state.id);
        Poll::Ready(Ok(()))
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        if self.state.is_local_closed() || self.state.is_reset() || self.shared.is_closed() {
            return;
        }
        self.state.close_local();
        let fin = WriteCmd::Frame(Frame::Data {
            stream_id: self.state.id,
            flags: FLAG_FIN,
            data: Bytes::new(),
        });
        self.shared.send_from_drop(fin);
        self.shared.closed_locally(self.state.id);
    }
}

//! A TCP connection under TLS that reads ahead in large chunks while data flows.
//!
//! rustls reads its transport 4 KiB at a time (`read_tls`; up to 16 KiB more while part of a
//! record is buffered), so every 16 KiB TLS record a relay receives costs it up to five read
//! system calls, each with its fixed kernel cost. [`ReadAhead`] reads up to [`AHEAD`] bytes per
//! system call into a buffer of its own and hands rustls its pieces from memory: one more copy
//! in user space, about a fifth of the system calls. The buffer exists only while data is
//! flowing: reads go straight to the socket until one brings 4 KiB or more at once (more is
//! probably waiting), and the buffer is freed the first time the socket has nothing ready. So
//! keystrokes and idle connections never allocate it (an idle session's memory is budgeted, see
//! `splice`), a handshake only if a flight brings 4 KiB at once, and a 64 KiB allocation is made
//! once per burst of data, not once per read.
//!
//! Writes pass straight through (rustls already writes whole records, vectored).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes per read system call while data flows: four full TLS records and their headers.
pub const AHEAD: usize = 64 * 1024 + 4 * 64;

/// A direct read that brings this much (rustls' own read size), or fills a smaller buffer,
/// means data is flowing: more is probably waiting.
const FLOWING: usize = 4096;

/// A connection whose reads go through a read-ahead buffer (see the module comment).
pub struct ReadAhead<T> {
    io: T,
    /// Read but not yet handed on; `None` while reads go straight to the socket.
    ahead: Option<Ahead>,
    /// The last direct read brought [`FLOWING`] bytes or more (or filled a smaller buffer):
    /// the next one reads ahead.
    flowing: bool,
}

/// The last large read, handed on from `start`. Kept while data flows, so that its
/// allocation is reused.
struct Ahead {
    buf: Vec<u8>,
    start: usize,
}

impl Ahead {
    fn is_empty(&self) -> bool {
        self.start == self.buf.len()
    }
}

impl<T> ReadAhead<T> {
    pub fn new(io: T) -> Self {
        ReadAhead {
            io,
            ahead: None,
            flowing: false,
        }
    }

    /// The connection itself. Bytes read ahead and not yet handed on are dropped: callers take
    /// it only to reset it.
    pub fn into_inner(self) -> T {
        self.io
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.ahead.as_ref().is_none_or(Ahead::is_empty) {
            if !this.flowing || dst.remaining() >= AHEAD {
                // Straight to the socket. rustls offers 4 KiB, or more while part of a record
                // is buffered, a read it rarely fills: so it is the bytes that came that tell.
                let room = dst.remaining();
                let read = Pin::new(&mut this.io).poll_read(cx, dst);
                let came = room - dst.remaining();
                this.flowing =
                    matches!(read, Poll::Ready(Ok(()))) && room > 0 && came >= room.min(FLOWING);
                this.ahead = None;
                return read;
            }
            let ahead = this.ahead.get_or_insert_with(|| Ahead {
                buf: Vec::with_capacity(AHEAD),
                start: 0,
            });
            ahead.buf.clear();
            ahead.start = 0;
            let read = tokio_util::io::poll_read_buf(Pin::new(&mut this.io), cx, &mut ahead.buf);
            if !matches!(read, Poll::Ready(Ok(n)) if n > 0) {
                // Nothing ready, the end, or an error: the buffer goes until data flows again.
                this.ahead = None;
                this.flowing = false;
                return read.map_ok(|_| ());
            }
        }
        if let Some(ahead) = &mut this.ahead {
            let end = ahead.buf.len().min(ahead.start + dst.remaining());
            dst.put_slice(&ahead.buf[ahead.start..end]);
            ahead.start = end;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Counts the reads that reach the connection under the read-ahead.
    struct CountingReads<R> {
        inner: R,
        reads: usize,
    }

    impl<R: AsyncRead + Unpin> AsyncRead for CountingReads<R> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
            if polled.is_ready() {
                this.reads += 1;
            }
            polled
        }
    }

    #[tokio::test]
    async fn small_reads_are_served_from_one_large_read_and_every_byte_arrives_in_order() {
        let (mut writer, reader) = tokio::io::duplex(4 * AHEAD);
        let sent: Vec<u8> = (0..3 * AHEAD).map(|i| (i % 251) as u8).collect();
        writer.write_all(&sent).await.unwrap();
        drop(writer);
        let mut ahead = ReadAhead::new(CountingReads {
            inner: reader,
            reads: 0,
        });
        let mut got = Vec::new();
        let mut piece = [0u8; 4096];
        loop {
            let n = ahead.read(&mut piece).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&piece[..n]);
        }
        assert_eq!(got, sent);
        // 3 x AHEAD in 4 KiB pieces would be 49 reads straight through; with the read-ahead it
        // is one 4 KiB read that fills the piece, three large ones and the end of stream.
        assert_eq!(ahead.io.reads, 5);
    }

    #[tokio::test]
    async fn an_idle_connection_holds_no_buffer() {
        let (mut writer, reader) = tokio::io::duplex(1024);
        let mut ahead = ReadAhead::new(reader);
        writer.write_all(b"keystroke").await.unwrap();
        let mut piece = [0u8; 4096];
        let n = ahead.read(&mut piece).await.unwrap();
        assert_eq!(&piece[..n], b"keystroke");
        // A read of less than 4 KiB: no buffer taken.
        assert!(ahead.ahead.is_none() && !ahead.flowing);
        let waiting = futures::FutureExt::now_or_never(ahead.read(&mut piece));
        assert!(waiting.is_none());
        assert!(ahead.ahead.is_none());
    }

    #[tokio::test]
    async fn the_buffer_goes_when_a_burst_ends_and_comes_back_with_the_next() {
        let (mut writer, reader) = tokio::io::duplex(4 * AHEAD);
        let mut ahead = ReadAhead::new(reader);
        let mut piece = [0u8; 4096];
        writer.write_all(&[1u8; 3 * 4096]).await.unwrap();
        assert_eq!(ahead.read(&mut piece).await.unwrap(), 4096);
        assert!(
            ahead.flowing,
            "a read that fills the piece means data is flowing"
        );
        assert_eq!(ahead.read(&mut piece).await.unwrap(), 4096);
        assert!(ahead.ahead.is_some(), "the rest was read ahead");
        assert_eq!(ahead.read(&mut piece).await.unwrap(), 4096);
        // The burst is over: waiting lets the buffer go.
        assert!(futures::FutureExt::now_or_never(ahead.read(&mut piece)).is_none());
        assert!(ahead.ahead.is_none() && !ahead.flowing);
        writer.write_all(&[2u8; 2 * 4096]).await.unwrap();
        assert_eq!(ahead.read(&mut piece).await.unwrap(), 4096);
        assert!(ahead.ahead.is_none() && ahead.flowing);
        assert_eq!(ahead.read(&mut piece).await.unwrap(), 4096);
        assert_eq!(piece, [2u8; 4096]);
    }

    /// rustls asks for 4 KiB, or for more (up to the rest of a record and 4 KiB) while part of
    /// a record is buffered; such a read is rarely filled, yet 4 KiB arriving at once means
    /// data is flowing just the same.
    #[tokio::test]
    async fn four_kib_into_a_larger_buffer_means_data_is_flowing() {
        let (mut writer, reader) = tokio::io::duplex(4 * AHEAD);
        let mut ahead = ReadAhead::new(CountingReads {
            inner: reader,
            reads: 0,
        });
        let mut piece = vec![0u8; 16_406];
        writer.write_all(&[1u8; 10_000]).await.unwrap();
        assert_eq!(ahead.read(&mut piece).await.unwrap(), 10_000);
        assert!(ahead.flowing, "10,000 bytes at once: data is flowing");
        writer.write_all(&vec![2u8; 2 * AHEAD]).await.unwrap();
        let mut got = 0;
        while got < 2 * AHEAD {
            let n = ahead.read(&mut piece).await.unwrap();
            assert!(piece[..n].iter().all(|&b| b == 2));
            got += n;
        }
        assert_eq!(got, 2 * AHEAD);
        // The first read, then two large ones.
        assert_eq!(ahead.io.reads, 3);
    }

    #[tokio::test]
    async fn a_large_read_goes_straight_through() {
        let (mut writer, reader) = tokio::io::duplex(2 * AHEAD);
        writer.write_all(&vec![7u8; AHEAD]).await.unwrap();
        let mut ahead = ReadAhead::new(reader);
        let mut big = vec![0u8; AHEAD];
        let n = ahead.read(&mut big).await.unwrap();
        assert_eq!(n, AHEAD);
        assert!(ahead.ahead.is_none());
    }
}

//! Copies bytes both ways between the caller's upgraded connection and the leaf's, until either
//! side closes, the stream has been idle too long, or relaylet shuts down.
//!
//! relaylet never parses the streaming protocol (SPDY, WebSocket, port-forward): it splices.
//! Two rules matter for correctness:
//! - Closing either side ends the other at once, so no leaf session outlives its client.
//! - A cut relaylet makes itself (idle timeout, shutdown) resets the caller's TCP connection
//!   instead of closing it cleanly. With SPDY, a clean close of every stream without an exit
//!   Status makes client-go report success (exit code 0) for a command that was cut short; a
//!   reset is reported as an error.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Bytes per read while data is flowing. One TLS record carries at most 16 KiB of plaintext.
const BUF_SIZE: usize = 16 * 1024;
/// Bytes per read while a direction is idle: enough for keystrokes and small protocol frames
/// (SPDY pings, window updates), small enough that thousands of idle sessions cost little.
/// The flowing-data buffer is allocated only when a read fills this one, and released as soon
/// as the reader has nothing more ready.
const IDLE_BUF_SIZE: usize = 512;

/// The caller's side: the TLS connection the root apiserver opened, plus any bytes it sent
/// right after the upgrade request that the HTTP server had already read.
pub struct ClientSide {
    pub io: tokio_rustls::server::TlsStream<TcpStream>,
    pub read_ahead: Bytes,
}

impl ClientSide {
    /// Resets the TCP connection (RST, not FIN), so the peer sees an error, not an end.
    fn abort(self) {
        let (tcp, _) = self.io.into_inner();
        if let Err(err) = tcp.set_zero_linger() {
            tracing::debug!(%err, "setting SO_LINGER=0 before reset");
        }
        drop(tcp);
    }
}

/// How a splice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The caller closed (or its connection failed).
    ClientClosed,
    /// The leaf closed (or its connection failed): the session is over.
    LeafClosed,
    /// No byte moved either way for the idle timeout.
    IdleTimeout,
    /// relaylet is shutting down and the grace period is over.
    Shutdown,
}

/// What a splice moved and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub to_leaf: u64,
    pub to_client: u64,
    pub end: End,
}

/// relaylet-wide byte counters the splice adds to as bytes move (one relaxed atomic add per
/// chunk, next to the session's own count), so long sessions show up in the metrics while they
/// run, not only when they end.
#[derive(Clone, Debug, Default)]
pub struct Meter {
    pub to_leaf: Counter,
    pub to_client: Counter,
}

/// Where one direction's bytes are counted: the session's own total and relaylet's.
#[derive(Clone, Copy)]
struct Counted<'a> {
    session: &'a AtomicU64,
    total: &'a Counter,
}

/// Splices `client` and `leaf` until one side ends; see the module comment for the rules.
pub async fn splice<L>(
    client: ClientSide,
    leaf: L,
    idle: Duration,
    stop: CancellationToken,
    meter: &Meter,
) -> Outcome
where
    L: AsyncRead + AsyncWrite + Unpin,
{
    // Counted until this future ends or is dropped; see `memory` for why.
    let _session = crate::memory::Session::start();
    let start = Instant::now();
    let last_activity = Arc::new(AtomicU64::new(0));
    let to_leaf = AtomicU64::new(0);
    let to_client = AtomicU64::new(0);

    let ClientSide { io, read_ahead } = client;
    let mut client_io = io;
    let mut leaf = leaf;
    let end = {
        let (mut client_read, mut client_write) = tokio::io::split(&mut client_io);
        let (mut leaf_read, mut leaf_write) = tokio::io::split(&mut leaf);
        let upstream = async {
            if !read_ahead.is_empty() {
                leaf_write.write_all(&read_ahead).await?;
                leaf_write.flush().await?;
                to_leaf.fetch_add(read_ahead.len() as u64, Ordering::Relaxed);
                meter.to_leaf.inc_by(read_ahead.len() as u64);
            }
            // Even when empty it may share the HTTP server's read buffer: let it go now, not
            // when the session ends.
            drop(read_ahead);
            copy(
                &mut client_read,
                &mut leaf_write,
                Counted {
                    session: &to_leaf,
                    total: &meter.to_leaf,
                },
                &last_activity,
                start,
            )
            .await
        };
        let downstream = copy(
            &mut leaf_read,
            &mut client_write,
            Counted {
                session: &to_client,
                total: &meter.to_client,
            },
            &last_activity,
            start,
        );
        let idle_watch = idle_expired(&last_activity, start, idle);
        tokio::select! {
            result = upstream => {
                if let Err(err) = result {
                    tracing::debug!(%err, "client side ended with an error");
                }
                End::ClientClosed
            }
            result = downstream => {
                if let Err(err) = result {
                    tracing::debug!(%err, "leaf side ended with an error");
                }
                End::LeafClosed
            }
            _ = idle_watch => End::IdleTimeout,
            _ = stop.cancelled() => End::Shutdown,
        }
    };
    let outcome = Outcome {
        to_leaf: to_leaf.load(Ordering::Relaxed),
        to_client: to_client.load(Ordering::Relaxed),
        end,
    };
    match end {
        // The leaf finished: everything it sent has been written to the caller; end cleanly.
        End::LeafClosed => {
            let _ = client_io.shutdown().await;
        }
        // The caller is gone: close the leaf connection now so the leaf session ends too.
        End::ClientClosed => {
            let _ = leaf.shutdown().await;
        }
        End::IdleTimeout | End::Shutdown => {
            drop(leaf);
            ClientSide {
                io: client_io,
                read_ahead: Bytes::new(),
            }
            .abort();
        }
    }
    outcome
}

/// Copies until EOF; each chunk is flushed at once (interactive shells need every keystroke).
/// On EOF the writer is shut down so the other side sees the end.
///
/// Memory: an idle direction waits with a small inline buffer. A read that fills it means data
/// is flowing: a [`BUF_SIZE`] buffer is taken, topped up with whatever is already readable
/// (one write per TLS record, not per small read), and kept while reads keep completing without
/// waiting; the first time the reader has nothing ready it is freed. Reads into it go into
/// uninitialised capacity (`read_buf`), so taking it costs an allocation, not a memset.
async fn copy<R, W>(
    reader: &mut R,
    writer: &mut W,
    counter: Counted<'_>,
    last_activity: &AtomicU64,
    start: Instant,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut small = [0u8; IDLE_BUF_SIZE];
    loop {
        let n = reader.read(&mut small).await?;
        if n == 0 {
            writer.shutdown().await?;
            return Ok(());
        }
        if n < IDLE_BUF_SIZE {
            send(writer, &small[..n], counter, last_activity, start).await?;
            continue;
        }
        let mut buf = BytesMut::with_capacity(BUF_SIZE);
        buf.extend_from_slice(&small[..n]);
        loop {
            // Top up with what is already readable, without waiting.
            let mut eof = false;
            while buf.len() < BUF_SIZE {
                match reader.read_buf(&mut buf).now_or_never() {
                    Some(Ok(0)) => {
                        eof = true;
                        break;
                    }
                    Some(Ok(_)) => {}
                    Some(Err(err)) => return Err(err),
                    None => break,
                }
            }
            send(writer, &buf, counter, last_activity, start).await?;
            buf.clear();
            if eof {
                writer.shutdown().await?;
                return Ok(());
            }
            // Keep the buffer only while data keeps coming without a wait.
            match reader.read_buf(&mut buf).now_or_never() {
                Some(Ok(0)) => {
                    writer.shutdown().await?;
                    return Ok(());
                }
                Some(Ok(_)) => {}
                Some(Err(err)) => return Err(err),
                None => break,
            }
        }
    }
}

/// Writes and flushes one chunk and records the activity.
async fn send<W>(
    writer: &mut W,
    chunk: &[u8],
    counter: Counted<'_>,
    last_activity: &AtomicU64,
    start: Instant,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    writer.write_all(chunk).await?;
    writer.flush().await?;
    counter
        .session
        .fetch_add(chunk.len() as u64, Ordering::Relaxed);
    counter.total.inc_by(chunk.len() as u64);
    last_activity.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    Ok(())
}

/// Resolves once no byte has moved for `idle`.
async fn idle_expired(last_activity: &AtomicU64, start: Instant, idle: Duration) {
    loop {
        let last = Duration::from_millis(last_activity.load(Ordering::Relaxed));
        let deadline = start + last + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small writes, writes of exactly the idle buffer, and bulk data all arrive intact and in
    /// order, and EOF is passed on.
    #[tokio::test]
    async fn copy_moves_every_byte_through_both_buffers() {
        let (mut source, mut reader) = tokio::io::duplex(64 * 1024);
        let (mut writer, mut sink) = tokio::io::duplex(64 * 1024);
        let mut sent = Vec::new();
        let producer = async {
            for len in [1, IDLE_BUF_SIZE, IDLE_BUF_SIZE + 1, 3, 200_000, 7] {
                let chunk: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
                source.write_all(&chunk).await.unwrap();
                sent.extend_from_slice(&chunk);
                tokio::task::yield_now().await;
            }
            source.shutdown().await.unwrap();
        };
        let counter = AtomicU64::new(0);
        let total = Counter::default();
        let last = AtomicU64::new(0);
        let counted = Counted {
            session: &counter,
            total: &total,
        };
        let copier = copy(&mut reader, &mut writer, counted, &last, Instant::now());
        let mut received = Vec::new();
        let consumer = sink.read_to_end(&mut received);
        let ((), copied, read) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(producer, copier, consumer)
        })
        .await
        .unwrap();
        copied.unwrap();
        read.unwrap();
        assert_eq!(received, sent);
        assert_eq!(counter.load(Ordering::Relaxed), sent.len() as u64);
        assert_eq!(total.get(), sent.len() as u64);
    }
}

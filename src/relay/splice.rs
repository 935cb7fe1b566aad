//! Copies bytes both ways between the caller's upgraded connection and the leaf's, until either
//! side closes, the stream has been idle too long, or relaylet shuts down.
//!
//! The hot path is a byte splice: relaylet does not terminate the streaming protocol, and the
//! frame trackers of `frames` only look at the bytes as they pass (frame headers, in place).
//! The rules:
//! - Closing either side ends the other at once, so no leaf session outlives its client.
//! - A session the leaf ends is relayed exactly as the leaf ends it: its Status, its close.
//! - A session relaylet ends itself (idle timeout, shutdown grace over), or whose leaf
//!   connection ends before the leaf answered on the error stream, must not read as success.
//!   The caller is the root apiserver's proxy, which turns a reset into a clean close, and
//!   client-go reads every stream ending without a Status as exit code 0. So at a frame
//!   boundary relaylet writes a Failure Status saying why on the error stream (or channel 3)
//!   and then closes the caller's connection cleanly, so that the Status is read. At a cut
//!   made at shutdown the leaf first gets a moment to complete the frame it is sending; a frame
//!   the leaf will never complete is filled up with filler bytes. Sessions that cannot be ended
//!   this way (port-forward, unknown protocols, a cut inside a control frame or frame header)
//!   are reset.
//! - Closing the caller's connection cleanly means reading what it still sends until it closes
//!   too (bounded): a socket closed with unread bytes is reset, and the reset discards whatever
//!   the kernel had not yet delivered, the end of the output and the exit status with it.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ops::ReadAhead;
use crate::relay::frames::{Ending, Frames, Observe};

/// Bytes per write while data is flowing: four TLS records' plaintext (16 KiB each), which rustls
/// seals and hands the socket in one system call.
const BUF_SIZE: usize = 64 * 1024;
/// Bytes per read while a direction is idle: enough for keystrokes and small protocol frames
/// (SPDY pings, window updates), small enough that thousands of idle sessions cost little.
/// The flowing-data buffer is allocated only when a read fills this one, and released as soon
/// as the reader has nothing more ready.
const IDLE_BUF_SIZE: usize = 128;
/// At a cut made at shutdown, how long the leaf gets to complete the frame it is sending.
const FINISH_FRAME: Duration = Duration::from_millis(500);
/// How long writing relaylet's ending (the rest of a frame, the Status, the close) may take.
const WRITE_ENDING: Duration = Duration::from_secs(1);
/// After the leaf ended a session: how long relaylet may take to deliver the rest of what the
/// leaf sent and see the caller close its side (see [`close_cleanly`]).
const CLOSE_AFTER_LEAF: Duration = Duration::from_secs(10);
/// After a cut, how long a write to the caller that is under way may take to complete (the
/// copy stops only between writes); after that the caller's connection is reset.
const STOP_COPYING: Duration = Duration::from_secs(1);

/// The caller's side: the TLS connection the root apiserver opened, plus any bytes it sent
/// right after the upgrade request that the HTTP server had already read.
pub struct ClientSide {
    pub io: CallerStream,
    pub read_ahead: Bytes,
}

/// The caller's connection, as the node server accepts it.
pub type CallerStream = tokio_rustls::server::TlsStream<ReadAhead<TcpStream>>;

/// What the node server gives hyper for a caller's connection. hyper's upgrade hands back only
/// a type-erased connection, and the splice needs the TCP socket under it (to reset it), so the
/// relay takes it back as exactly this type: both sides name it here, never separately.
pub type ServedIo = hyper_util::rt::TokioIo<CallerStream>;

impl ClientSide {
    /// The caller's connection back from hyper's upgrade, with the bytes hyper had read past
    /// the request head; the upgrade itself if it is not a [`ServedIo`].
    pub fn from_upgraded(
        upgraded: hyper::upgrade::Upgraded,
    ) -> Result<ClientSide, hyper::upgrade::Upgraded> {
        upgraded.downcast::<ServedIo>().map(|parts| ClientSide {
            io: parts.io.into_inner(),
            read_ahead: parts.read_buf,
        })
    }

    /// Resets the TCP connection (RST, not FIN), so the peer sees an error, not an end.
    fn abort(self) {
        let tcp = self.io.into_inner().0.into_inner();
        if let Err(err) = tcp.set_zero_linger() {
            tracing::debug!(%err, "setting SO_LINGER=0 before reset");
        }
        drop(tcp);
    }
}

/// How a splice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The leaf ended the session: it answered on the error stream (its exit Status), or, for
    /// sessions without one (port-forward, untracked protocols), it closed first.
    Completed,
    /// The caller closed (or its connection failed) before the leaf answered.
    ClientClosed,
    /// The leaf connection ended (closed or failed) before the leaf answered.
    LeafLost,
    /// No byte moved either way for the idle timeout.
    IdleTimeout,
    /// relaylet is shutting down and the grace period is over.
    Shutdown,
}

/// How relaylet closed the caller's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// TLS close_notify and FIN, after what the leaf sent.
    Clean,
    /// relaylet's Failure Status on the error stream, then a clean close.
    WithStatus,
    /// A TCP reset.
    Reset,
}

/// What a splice moved and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub to_leaf: u64,
    pub to_client: u64,
    pub end: End,
    pub closing: Closing,
}

/// relaylet-wide byte counters the splice adds to as bytes move (one relaxed atomic add per
/// chunk, next to the session's own count), so long sessions show up in the metrics while they
/// run, not only when they end.
#[derive(Clone, Debug, Default)]
pub struct Meter {
    pub to_leaf: Counter,
    pub to_client: Counter,
}

/// What a splice needs besides the two connections.
pub struct Options<'a> {
    /// The idle timeout (`STREAM_IDLE_TIMEOUT`).
    pub idle: Duration,
    /// Fires when open sessions must end (shutdown grace over).
    pub stop: CancellationToken,
    pub meter: &'a Meter,
    /// The leaf's name, for the message when its connection is lost.
    pub leaf_name: &'a str,
}

/// Where one direction's bytes are counted: the session's own total and relaylet's.
#[derive(Clone, Copy)]
struct Counted<'a> {
    session: &'a AtomicU64,
    total: &'a Counter,
}

impl Counted<'_> {
    fn add(self, n: usize) {
        self.session.fetch_add(n as u64, Ordering::Relaxed);
        self.total.inc_by(n as u64);
    }
}

/// How one direction's copy stopped.
#[derive(Debug)]
enum Stopped {
    /// The reader ended (EOF, or an error).
    ReaderDone(Option<io::Error>),
    /// Writing failed.
    WriterFailed(io::Error),
    /// A cut, taken between writes: everything read so far has been written.
    Cut(End),
    /// A cut, but a write under way did not complete in time.
    Stuck(End),
}

/// Which side's copy stopped first.
enum First {
    /// Caller → leaf.
    Up(Stopped),
    /// Leaf → caller.
    Down(Stopped),
}

/// Splices `client` and `leaf` until one side ends; see the module comment for the rules.
///
/// Memory: this future is a session's largest allocation while it idles, so the connections
/// are used in place (never moved into a second slot of the future), and the rare work of
/// ending a session runs in a future of its own, boxed, allocated only then.
pub async fn splice<L>(
    mut client: ClientSide,
    mut leaf: L,
    options: Options<'_>,
    mut frames: Frames,
) -> Outcome
where
    L: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last_activity = AtomicU64::new(0);
    let to_leaf = AtomicU64::new(0);
    let to_client = AtomicU64::new(0);
    let up_count = Counted {
        session: &to_leaf,
        total: &options.meter.to_leaf,
    };
    let down_count = Counted {
        session: &to_client,
        total: &options.meter.to_client,
    };
    let activity = Activity {
        last: &last_activity,
        start,
    };

    let first = {
        let read_ahead = std::mem::take(&mut client.read_ahead);
        let (mut client_read, mut client_write) = tokio::io::split(&mut client.io);
        let (mut leaf_read, mut leaf_write) = tokio::io::split(&mut leaf);
        let (mut client_frames, mut leaf_frames) = frames.split();
        let upstream = async {
            if !read_ahead.is_empty() {
                client_frames.observe(&read_ahead);
                if let Err(err) = send(&mut leaf_write, &read_ahead, up_count, activity).await {
                    return Stopped::WriterFailed(err);
                }
            }
            // Even when empty it may share the HTTP server's read buffer: let it go now, not
            // when the session ends.
            drop(read_ahead);
            copy(
                &mut client_read,
                &mut leaf_write,
                up_count,
                activity,
                &mut client_frames,
                std::future::pending(),
                None,
            )
            .await
        };
        let downstream = copy(
            &mut leaf_read,
            &mut client_write,
            down_count,
            activity,
            &mut leaf_frames,
            cut(activity, options.idle, &options.stop),
            Some(&options.stop),
        );
        let mut upstream = pin!(upstream);
        let mut downstream = pin!(downstream);
        tokio::select! {
            stopped = &mut upstream => match stopped {
                // The leaf takes no more bytes: its connection is gone, and what its side of
                // the splice shows (its answer, or none) decides how the session ends.
                Stopped::WriterFailed(err) => {
                    tracing::debug!(%err, "writing to the leaf failed");
                    First::Down(downstream.await)
                }
                stopped => First::Up(stopped),
            },
            stopped = &mut downstream => First::Down(stopped),
        }
    };

    let teardown = Teardown {
        client,
        leaf,
        frames,
        stop: &options.stop,
        leaf_name: options.leaf_name,
        idle: options.idle,
        counted: down_count,
    };
    let (end, closing) = Box::pin(teardown.run(first)).await;
    Outcome {
        to_leaf: to_leaf.load(Ordering::Relaxed),
        to_client: to_client.load(Ordering::Relaxed),
        end,
        closing,
    }
}

/// What is left of a session once its copying stopped, to end it (see the module comment).
struct Teardown<'a, L> {
    client: ClientSide,
    leaf: L,
    frames: Frames,
    stop: &'a CancellationToken,
    leaf_name: &'a str,
    idle: Duration,
    counted: Counted<'a>,
}

impl<L> Teardown<'_, L>
where
    L: AsyncRead + AsyncWrite + Unpin,
{
    async fn run(mut self, first: First) -> (End, Closing) {
        match first {
            First::Up(stopped) | First::Down(stopped @ Stopped::WriterFailed(_)) => {
                if let Stopped::ReaderDone(Some(err)) | Stopped::WriterFailed(err) = &stopped {
                    tracing::debug!(%err, "the caller's side ended with an error");
                }
                // The caller is gone: close the leaf connection now so the leaf session ends
                // too.
                let _ = tokio::time::timeout(WRITE_ENDING, self.leaf.shutdown()).await;
                let end = if self.frames.leaf_finished() {
                    End::Completed
                } else {
                    End::ClientClosed
                };
                (end, Closing::Clean)
            }
            First::Down(Stopped::ReaderDone(err)) => {
                if let Some(err) = &err {
                    tracing::debug!(%err, "the leaf's side ended with an error");
                }
                if self.frames.client_closed() && !self.frames.leaf_finished() {
                    // The caller ended the session (a WebSocket close frame) and the leaf's
                    // side followed: nothing was lost, and the caller is not written to.
                    close_cleanly(&mut self.client.io, tokio::time::sleep(WRITE_ENDING)).await;
                    return (End::ClientClosed, Closing::Clean);
                }
                if !self.frames.tracked() || self.frames.leaf_finished() {
                    // The leaf finished: everything it sent has been written to the caller.
                    let until = async {
                        tokio::select! {
                            _ = tokio::time::sleep(CLOSE_AFTER_LEAF) => {}
                            _ = self.stop.cancelled() => {}
                        }
                    };
                    close_cleanly(&mut self.client.io, until).await;
                    (End::Completed, Closing::Clean)
                } else {
                    let message = format!(
                        "relaylet: connection to leaf cluster {} lost",
                        self.leaf_name
                    );
                    (End::LeafLost, self.with_status(&message).await)
                }
            }
            First::Down(Stopped::Cut(why)) => {
                if self.frames.leaf_finished() {
                    // The leaf's answer went through; only the teardown was left.
                    close_cleanly(&mut self.client.io, tokio::time::sleep(WRITE_ENDING)).await;
                    return (End::Completed, Closing::Clean);
                }
                if self.frames.client_closed() {
                    // The caller had already ended the session: it is owed nothing.
                    close_cleanly(&mut self.client.io, tokio::time::sleep(WRITE_ENDING)).await;
                    return (End::ClientClosed, Closing::Clean);
                }
                if !self.frames.tracked() {
                    tracing::debug!(
                        "session protocol not tracked: resetting the caller's connection"
                    );
                    self.client.abort();
                    return (why, Closing::Reset);
                }
                // At shutdown the leaf is still there: let it complete the frame it is sending.
                if why == End::Shutdown && !self.finish_frame().await {
                    self.client.abort();
                    return (why, Closing::Reset);
                }
                let message = match why {
                    End::IdleTimeout => format!(
                        "relaylet: idle timeout after {}",
                        crate::config::format_duration(self.idle)
                    ),
                    _ => "relaylet: shutting down".to_string(),
                };
                (why, self.with_status(&message).await)
            }
            First::Down(Stopped::Stuck(why)) => {
                tracing::debug!("a write to the caller did not complete after the cut: resetting");
                self.client.abort();
                let end = if self.frames.leaf_finished() {
                    End::Completed
                } else {
                    why
                };
                (end, Closing::Reset)
            }
        }
    }

    /// Writes relaylet's ending (see `frames`) and closes the caller's connection cleanly, or
    /// resets it when no ending can be written.
    async fn with_status(mut self, message: &str) -> Closing {
        drop(self.leaf);
        let ending = match self.frames.ending(message) {
            Ok(ending) => ending,
            Err(why) => {
                tracing::debug!(%why, message, "cannot end the session with a Status: resetting");
                self.client.abort();
                return Closing::Reset;
            }
        };
        let deadline = Instant::now() + WRITE_ENDING;
        let written = tokio::time::timeout_at(
            deadline,
            write_ending(&mut self.client.io, &ending, self.counted),
        )
        .await;
        if matches!(written, Ok(Ok(()))) {
            drain(&mut self.client.io, tokio::time::sleep_until(deadline)).await;
            tracing::debug!(
                message,
                filler = ending.pad,
                "ended the session with a Status"
            );
            Closing::WithStatus
        } else {
            tracing::debug!(message, "writing the ending failed: resetting");
            self.client.abort();
            Closing::Reset
        }
    }

    /// At a shutdown cut: relays the rest of the leaf's frame in progress (and nothing more),
    /// so relaylet's ending starts at a frame boundary. False if the caller could not be
    /// written to in time; a leaf that does not complete its frame in time is left to the
    /// ending's filler. All of it within [`FINISH_FRAME`]: with the ending's [`WRITE_ENDING`],
    /// a cut session ends well inside the time shutdown waits for cut sessions
    /// (`shutdown::CUT_SETTLE`).
    async fn finish_frame(&mut self) -> bool {
        if self.frames.at_boundary() {
            return true;
        }
        let deadline = Instant::now() + FINISH_FRAME;
        let mut buf = vec![0u8; BUF_SIZE];
        while !self.frames.at_boundary() {
            let n = match tokio::time::timeout_at(deadline, self.leaf.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => n,
                _ => return true,
            };
            let rest = self.frames.rest_of_frame(&buf[..n]);
            let chunk = &buf[..rest];
            let io = &mut self.client.io;
            let written = tokio::time::timeout_at(deadline, async {
                io.write_all(chunk).await?;
                io.flush().await
            })
            .await;
            if !matches!(written, Ok(Ok(()))) {
                return false;
            }
            self.frames.leaf().observe(chunk);
            self.counted.add(rest);
        }
        true
    }
}

async fn write_ending<W>(writer: &mut W, ending: &Ending, counted: Counted<'_>) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    if ending.pad > 0 {
        let filler = vec![ending.pad_byte; ending.pad.min(BUF_SIZE)];
        let mut left = ending.pad;
        while left > 0 {
            let n = left.min(filler.len());
            writer.write_all(&filler[..n]).await?;
            left -= n;
        }
    }
    writer.write_all(&ending.tail).await?;
    writer.flush().await?;
    counted.add(ending.pad + ending.tail.len());
    writer.shutdown().await
}

/// Ends the caller's connection after the last byte relaylet owes it: flushes, sends
/// close_notify and FIN, then [`drain`]s until the caller closes too, or `until` resolves.
async fn close_cleanly(io: &mut CallerStream, until: impl Future<Output = ()>) {
    let close = async {
        if io.shutdown().await.is_ok() {
            drain(io, std::future::pending()).await;
        }
    };
    tokio::select! {
        () = close => {}
        () = until => {}
    }
}

/// Reads and drops what the caller still sends (a SPDY client's window updates, a WebSocket
/// pong) until it closes its side, or `until` resolves. Closing a socket that holds unread
/// bytes resets the connection, and a reset throws away what the kernel had not yet delivered
/// to the caller: the end of the output and the exit status.
async fn drain(io: &mut CallerStream, until: impl Future<Output = ()>) {
    let reading = async {
        let mut buf = [0u8; IDLE_BUF_SIZE];
        while let Ok(n) = io.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::select! {
        () = reading => {}
        () = until => {}
    }
}

/// Resolves with the reason when the session must be cut: idle for `idle`, or shutdown.
async fn cut(activity: Activity<'_>, idle: Duration, stop: &CancellationToken) -> End {
    tokio::select! {
        _ = activity.idle_for(idle) => End::IdleTimeout,
        _ = stop.cancelled() => End::Shutdown,
    }
}

/// When a byte last moved, in milliseconds since the splice started.
#[derive(Clone, Copy)]
struct Activity<'a> {
    last: &'a AtomicU64,
    start: Instant,
}

impl Activity<'_> {
    fn touch(self) {
        self.last
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Resolves once no byte has moved for `idle`.
    async fn idle_for(self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = self.start + last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// Copies until the reader ends, a write fails, or `cut` fires; each chunk is shown to
/// `observer`, then written and flushed at once (interactive shells need every keystroke). The
/// cut is only taken between writes, so everything read has been written when it is: while
/// waiting for data (`cut`), or between full buffers of flowing data (`stop`; an idle timeout
/// cannot fire while data flows). The writer is not shut down: the splice decides how to end.
///
/// Memory: an idle direction waits with a small inline buffer. A read that fills it means data
/// is flowing: a [`BUF_SIZE`] buffer is taken, topped up with whatever is already readable
/// (one write per TLS record, not per small read), and kept while reads keep completing without
/// waiting; the first time the reader has nothing ready it is freed. Reads into it go into
/// uninitialised capacity (`read_buf`), so taking it costs an allocation, not a memset.
async fn copy<R, W, O, C>(
    reader: &mut R,
    writer: &mut W,
    counted: Counted<'_>,
    activity: Activity<'_>,
    observer: &mut O,
    cut: C,
    stop: Option<&CancellationToken>,
) -> Stopped
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    O: Observe,
    C: Future<Output = End>,
{
    let mut cut = pin!(cut);
    let mut small = [0u8; IDLE_BUF_SIZE];
    loop {
        let read = tokio::select! {
            biased;
            why = cut.as_mut() => return Stopped::Cut(why),
            read = reader.read(&mut small) => read,
        };
        let n = match read {
            Ok(0) => return Stopped::ReaderDone(None),
            Ok(n) => n,
            Err(err) => return Stopped::ReaderDone(Some(err)),
        };
        if n < IDLE_BUF_SIZE {
            observer.observe(&small[..n]);
            if let Err(stopped) =
                send_or_cut(writer, &small[..n], counted, activity, cut.as_mut()).await
            {
                return stopped;
            }
            continue;
        }
        let mut buf = BytesMut::with_capacity(BUF_SIZE);
        buf.extend_from_slice(&small[..n]);
        loop {
            // Top up with what is already readable, without waiting.
            let mut ended = None;
            while buf.len() < BUF_SIZE {
                match reader.read_buf(&mut buf).now_or_never() {
                    Some(Ok(0)) => {
                        ended = Some(None);
                        break;
                    }
                    Some(Ok(_)) => {}
                    Some(Err(err)) => {
                        ended = Some(Some(err));
                        break;
                    }
                    None => break,
                }
            }
            observer.observe(&buf);
            if let Err(stopped) = send_or_cut(writer, &buf, counted, activity, cut.as_mut()).await {
                return stopped;
            }
            buf.clear();
            if let Some(err) = ended {
                return Stopped::ReaderDone(err);
            }
            if stop.is_some_and(CancellationToken::is_cancelled) {
                return Stopped::Cut(End::Shutdown);
            }
            // Keep the buffer only while data keeps coming without a wait.
            match reader.read_buf(&mut buf).now_or_never() {
                Some(Ok(0)) => return Stopped::ReaderDone(None),
                Some(Ok(_)) => {}
                Some(Err(err)) => return Stopped::ReaderDone(Some(err)),
                None => break,
            }
        }
    }
}

/// [`send`], unless `cut` fires while the write is under way: then the write (whose bytes
/// the tracker has seen) gets [`STOP_COPYING`] to complete, and the copy stops.
async fn send_or_cut<W, C>(
    writer: &mut W,
    chunk: &[u8],
    counted: Counted<'_>,
    activity: Activity<'_>,
    cut: Pin<&mut C>,
) -> Result<(), Stopped>
where
    W: AsyncWrite + Unpin,
    C: Future<Output = End>,
{
    let mut sending = pin!(send(writer, chunk, counted, activity));
    tokio::select! {
        biased;
        sent = &mut sending => sent.map_err(Stopped::WriterFailed),
        // Boxed: a rare path, kept out of the copy future's idle footprint.
        why = cut => match Box::pin(tokio::time::timeout(STOP_COPYING, sending)).await {
            Ok(Ok(())) => Err(Stopped::Cut(why)),
            Ok(Err(err)) => Err(Stopped::WriterFailed(err)),
            Err(_) => Err(Stopped::Stuck(why)),
        },
    }
}

/// Writes and flushes one chunk and records the activity.
async fn send<W>(
    writer: &mut W,
    chunk: &[u8],
    counted: Counted<'_>,
    activity: Activity<'_>,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    writer.write_all(chunk).await?;
    writer.flush().await?;
    counted.add(chunk.len());
    activity.touch();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::frames::proptests::{error_syn_stream, leaf_spdy_session, reads};
    use crate::relay::frames::{Protocol, StatusFormat};
    use proptest::prelude::*;
    use std::task::{Context, Poll};

    struct Nothing;
    impl Observe for Nothing {
        fn observe(&mut self, _: &[u8]) {}
    }

    /// Small writes, writes of exactly the idle buffer, and bulk data all arrive intact and in
    /// order, and EOF is reported.
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
        let activity = Activity {
            last: &last,
            start: Instant::now(),
        };
        let copier = async {
            let stopped = copy(
                &mut reader,
                &mut writer,
                counted,
                activity,
                &mut Nothing,
                std::future::pending(),
                None,
            )
            .await;
            writer.shutdown().await.unwrap();
            stopped
        };
        let mut received = Vec::new();
        let consumer = sink.read_to_end(&mut received);
        let ((), stopped, read) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(producer, copier, consumer)
        })
        .await
        .unwrap();
        assert!(matches!(stopped, Stopped::ReaderDone(None)), "{stopped:?}");
        read.unwrap();
        assert_eq!(received, sent);
        assert_eq!(counter.load(Ordering::Relaxed), sent.len() as u64);
        assert_eq!(total.get(), sent.len() as u64);
    }

    /// Yields `data` in reads of the given sizes, and has nothing ready every other time it
    /// is asked, so both the waiting read and the top-up reads of `copy` are used.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        sizes: Vec<usize>,
        reads: usize,
        polls: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.polls += 1;
            if self.polls.is_multiple_of(2) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let size = self.sizes[self.reads % self.sizes.len()];
            self.reads += 1;
            let n = size.min(buf.remaining()).min(self.data.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    /// Shows each chunk to the tracker and keeps a copy of everything it was shown.
    struct Recording<O> {
        inner: O,
        seen: Vec<u8>,
    }

    impl<O: Observe> Observe for Recording<O> {
        fn observe(&mut self, chunk: &[u8]) {
            self.seen.extend_from_slice(chunk);
            self.inner.observe(chunk);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Through `copy`, whatever the reads: every byte of a leaf's SPDY session arrives
        /// unchanged and in order, and the tracker is shown each byte exactly once, so it ends
        /// in the state of a tracker shown the whole session at once.
        #[test]
        fn copy_relays_every_byte_unchanged_and_shows_each_to_the_tracker_once(
            (session, error) in leaf_spdy_session(),
            sizes in reads(),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let protocol = Some(Protocol::Spdy { status: StatusFormat::Json });
            let mut frames = Frames::new(protocol);
            let mut whole = Frames::new(protocol);
            for f in [&mut frames, &mut whole] {
                f.split().0.observe(&error_syn_stream(error));
            }
            whole.leaf().observe(&session);
            let mut out = Vec::new();
            let mut recording = Recording { inner: frames.leaf(), seen: Vec::new() };
            let mut reader = Trickle { data: session.clone(), at: 0, sizes, reads: 0, polls: 0 };
            let counter = AtomicU64::new(0);
            let total = Counter::default();
            let last = AtomicU64::new(0);
            let stopped = runtime.block_on(copy(
                &mut reader,
                &mut out,
                Counted { session: &counter, total: &total },
                Activity { last: &last, start: Instant::now() },
                &mut recording,
                std::future::pending(),
                None,
            ));
            prop_assert!(matches!(stopped, Stopped::ReaderDone(None)), "{:?}", stopped);
            prop_assert!(out == session, "relayed bytes differ");
            prop_assert!(recording.seen == session, "the tracker was not shown each byte once");
            drop(recording);
            prop_assert_eq!(frames.leaf_finished(), whole.leaf_finished());
            prop_assert!(frames.at_boundary());
            prop_assert_eq!(frames.ending("x"), whole.ending("x"));
        }
    }

    /// A leaf that ends its session while the caller still has bytes on their way to relaylet
    /// (a SPDY client's window updates, a WebSocket pong): every byte the leaf sent reaches the
    /// caller, then a clean close. Closing a socket with unread bytes resets it, and a reset
    /// throws away what the kernel had not yet delivered: the end of the output, the exit
    /// status. The caller's receive buffer is kept small and relaylet's send buffer large, so
    /// the leaf's bytes are still queued in relaylet's kernel when the session ends.
    #[tokio::test]
    async fn a_leaf_ending_delivers_every_byte_although_the_caller_still_sends() {
        const SENT: usize = 256 * 1024;
        let ca = relaylet_sim::tls::Ca::new("test").unwrap();
        let identity = ca.issue_server(&["127.0.0.1"]).unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(4 * 1024 * 1024).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = socket.local_addr().unwrap();
        let listener = socket.listen(8).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(identity.server_config().unwrap());
        let connector = tokio_rustls::TlsConnector::from(ca.client_config(None).unwrap());
        let client = tokio::spawn(async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_recv_buffer_size(16 * 1024).unwrap();
            let tcp = socket.connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            connector.connect(name, tcp).await.unwrap()
        });
        let (tcp, _) = listener.accept().await.unwrap();
        let io = acceptor.accept(ReadAhead::new(tcp)).await.unwrap();
        let mut caller = client.await.unwrap();
        // The leaf connection holds 8 KiB and its far end reads nothing: the caller's bytes
        // beyond that stay unread in relaylet's socket.
        let (leaf, mut far_end) = tokio::io::duplex(8 * 1024);
        caller.write_all(&vec![7u8; 64 * 1024]).await.unwrap();
        caller.flush().await.unwrap();

        let meter = Meter::default();
        let splice = splice(
            ClientSide {
                io,
                read_ahead: Bytes::new(),
            },
            leaf,
            Options {
                idle: Duration::from_secs(3600),
                stop: CancellationToken::new(),
                meter: &meter,
                leaf_name: "leaf",
            },
            Frames::new(None),
        );
        let output: Vec<u8> = (0..SENT).map(|i| (i * 7 + i / 4096) as u8).collect();
        let leaf_sends = async {
            far_end.write_all(&output).await.unwrap();
            far_end.shutdown().await.unwrap();
            // Keep the far end (and its unread bytes) until the session is over.
            far_end
        };
        let caller_reads = async {
            // Read only once relaylet has handed every byte to its socket.
            while meter.to_client.get() < SENT as u64 {
                tokio::task::yield_now().await;
            }
            let mut received = Vec::new();
            let read = caller.read_to_end(&mut received).await;
            drop(caller);
            (read, received)
        };
        let (outcome, _far_end, (read, received)) = tokio::join!(splice, leaf_sends, caller_reads);
        assert!(read.is_ok(), "the caller's connection failed: {read:?}");
        assert_eq!(received.len(), SENT);
        assert!(received == output, "the caller received other bytes");
        assert_eq!(
            (outcome.end, outcome.closing),
            (End::Completed, Closing::Clean)
        );
    }

    /// An idle session's largest allocation is its splice task (the benchmark's idle-session
    /// figure is about 20 KiB per session, TLS state and buffers included). Before the frame
    /// trackers it was 5,968 bytes; a careless change (a connection moved into a second slot,
    /// a rare-path future kept inline) adds kilobytes to every idle session.
    #[tokio::test]
    async fn the_splice_task_is_small() {
        let ca = relaylet_sim::tls::Ca::new("test").unwrap();
        let identity = ca.issue_server(&["127.0.0.1"]).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(identity.server_config().unwrap());
        let connector = tokio_rustls::TlsConnector::from(ca.client_config(None).unwrap());
        let client = tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            connector.connect(name, tcp).await.unwrap()
        });
        let (tcp, _) = listener.accept().await.unwrap();
        let io = acceptor.accept(ReadAhead::new(tcp)).await.unwrap();
        let _client = client.await.unwrap();
        let (leaf, _far_end) = tokio::io::duplex(64);
        let meter = Meter::default();
        let options = Options {
            idle: Duration::from_secs(1),
            stop: CancellationToken::new(),
            meter: &meter,
            leaf_name: "leaf",
        };
        let frames = Frames::new(Some(Protocol::Spdy {
            status: StatusFormat::Json,
        }));
        let task = splice(
            ClientSide {
                io,
                read_ahead: Bytes::new(),
            },
            leaf,
            options,
            frames,
        );
        let size = std::mem::size_of_val(&task);
        eprintln!(
            "splice future: {size} bytes; Frames {}, TlsStream {}, Sleep {}",
            std::mem::size_of::<Frames>(),
            std::mem::size_of::<CallerStream>(),
            std::mem::size_of::<tokio::time::Sleep>()
        );
        assert!(size <= 5376, "the splice future takes {size} bytes");
    }
}

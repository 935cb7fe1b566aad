//! One SPDY/3.1 connection: a reader task that decodes and dispatches the peer's frames, and a
//! writer task that encodes ours, both over the same upgraded byte stream.
//!
//! Frames are written by one task so that header blocks go through the connection's single zlib
//! compressor in wire order. Peer frames are dispatched by one task for the same reason on the
//! receiving side; a stream whose buffer is full makes that task wait, which is the backpressure
//! spdystream applies too (it has no per-stream window either).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::SpdyError;
use super::frame::{Frame, FrameDecoder, FrameEncoder, goaway, rst};
use super::headers::HeaderList;
use super::shared::{Lifeline, RemoteEnd, Role, Shared, StreamEntry, StreamState, WriteCmd, lock};
use super::stream::Stream;

/// How long `open_stream` waits for SYN_REPLY (client-go's createStreamResponseTimeout).
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Frames queued for the writer task; beyond this, writers wait.
const WRITE_QUEUE: usize = 64;
/// DATA payloads buffered per stream before the reader task waits for the stream's reader.
const STREAM_BUFFER: usize = 16;
/// Peer-opened streams waiting for `Incoming::next`.
const INCOMING_QUEUE: usize = 16;
/// How long `goaway` waits for queued frames and the GOAWAY to be written.
pub const GOAWAY_GRACE: Duration = Duration::from_secs(5);
/// Bytes the writer task batches into one socket write.
const WRITE_BATCH: usize = 64 * 1024;

/// A handle to one SPDY connection. Cheap to clone; every clone drives the same connection.
/// The connection closes (GOAWAY) when it, its `Incoming` and all its streams are dropped.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    lifeline: Arc<Lifeline>,
}

/// The streams the peer opens, in the order it opened them.
pub struct Incoming {
    streams: mpsc::Receiver<Stream>,
    _lifeline: Arc<Lifeline>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("role", &self.shared.role)
            .field("closed", &self.shared.is_closed())
            .finish()
    }
}

impl Incoming {
    /// The next peer-opened stream, or `None` once the connection is gone.
    pub async fn next(&mut self) -> Option<Stream> {
        self.streams.recv().await
    }
}

impl Connection {
    /// Runs SPDY over `io` (an upgraded HTTP connection) and returns the handle and the stream of
    /// peer-opened streams. Must be called inside a Tokio runtime: it spawns the reader and
    /// writer tasks, which end when the connection closes.
    pub fn new<IO>(io: IO, role: Role) -> (Connection, Incoming)
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (writer, write_rx) = mpsc::channel(WRITE_QUEUE);
        let (incoming_tx, incoming_rx) = mpsc::channel(INCOMING_QUEUE);
        let closed = CancellationToken::new();
        let lifeline = Arc::new(Lifeline {
            writer: writer.clone(),
            closed: closed.clone(),
        });
        let shared = Arc::new(Shared {
            role,
            writer,
            streams: Mutex::new(HashMap::new()),
            next_id: tokio::sync::Mutex::new(role.first_stream_id()),
            closed,
            going_away: AtomicBool::new(false),
            last_peer_stream: AtomicU32::new(0),
            pings: Mutex::new(HashMap::new()),
            next_ping_id: AtomicU32::new(role.first_stream_id()),
            lifeline: Arc::downgrade(&lifeline),
        });
        let (read_half, write_half) = tokio::io::split(io);
        tokio::spawn(write_loop(write_half, write_rx, shared.clone()));
        tokio::spawn(read_loop(read_half, incoming_tx, shared.clone()));
        (
            Connection {
                shared,
                lifeline: lifeline.clone(),
            },
            Incoming {
                streams: incoming_rx,
                _lifeline: lifeline,
            },
        )
    }

    /// Opens a stream with `headers` (names are sent lowercase) and waits for the peer's
    /// SYN_REPLY, as client-go's `CreateStream` does.
    pub async fn open_stream(&self, headers: Vec<(String, String)>) -> Result<Stream, SpdyError> {
        let shared = &self.shared;
        if shared.is_closed() {
            return Err(SpdyError::ConnectionClosed);
        }
        if shared.going_away.load(Ordering::Acquire) {
            return Err(SpdyError::GoneAway);
        }
        let headers: HeaderList = headers
            .into_iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v))
            .collect();
        let (reply_tx, reply_rx) = oneshot::channel();
        let (data_tx, data_rx) = mpsc::channel(STREAM_BUFFER);
        let state;
        {
            let mut next = shared.next_id.lock().await;
            let id = *next;
            if id > 0x7fff_ffff {
                return Err(SpdyError::StreamIdsExhausted);
            }
            *next += 2;
            state = Arc::new(StreamState::new(id));
            shared.streams().insert(
                id,
                StreamEntry {
                    state: state.clone(),
                    data: Some(data_tx),
                    reply: Some(reply_tx),
                },
            );
            let syn = Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                slot: 0,
                flags: 0,
                headers: headers.clone(),
            };
            if let Err(err) = shared.send(WriteCmd::Frame(syn)).await {
                shared.streams().remove(&id);
                return Err(err);
            }
        }
        let id = state.id;
        let stream = Stream::new(
            state,
            headers,
            data_rx,
            shared.clone(),
            self.lifeline.clone(),
        );
        match tokio::time::timeout(REPLY_TIMEOUT, reply_rx).await {
            Ok(Ok(Ok(_reply_headers))) => Ok(stream),
            Ok(Ok(Err(err))) => Err(err),
            Ok(Err(_)) => Err(SpdyError::ConnectionClosed),
            Err(_) => {
                let _ = stream.reset().await;
                Err(SpdyError::ReplyTimeout {
                    id,
                    timeout: REPLY_TIMEOUT,
                })
            }
        }
    }

    /// Sends GOAWAY, closes the connection and waits until it is gone.
    /// A peer that stops reading cannot hold this up for more than [`GOAWAY_GRACE`]; after that
    /// the connection is dropped without ceremony.
    pub async fn goaway(&self) {
        self.shared.going_away.store(true, Ordering::Release);
        let graceful = async {
            if self.shared.send(WriteCmd::GoAway).await.is_err() {
                self.shared.closed.cancel();
            }
            self.closed().await;
        };
        if tokio::time::timeout(GOAWAY_GRACE, graceful).await.is_err() {
            self.shared.closed.cancel();
        }
    }

    /// Drops the connection at once, without GOAWAY: open streams read an error.
    pub fn abort(&self) {
        self.shared.closed.cancel();
    }

    /// Resolves once the connection is gone (closed by either side or failed).
    pub async fn closed(&self) {
        self.shared.closed.cancelled().await;
    }

    /// Sends a PING and waits for the peer's echo; returns the round-trip time. client-go's
    /// SPDY round tripper pings every 5 s, which also keeps idle-timeout counters moving.
    pub async fn ping(&self) -> Result<Duration, SpdyError> {
        let shared = &self.shared;
        let id = shared.next_ping_id.fetch_add(2, Ordering::AcqRel);
        let (tx, rx) = oneshot::channel();
        lock(&shared.pings).insert(id, tx);
        let started = tokio::time::Instant::now();
        if let Err(err) = shared.send(WriteCmd::Frame(Frame::Ping { id })).await {
            lock(&shared.pings).remove(&id);
            return Err(err);
        }
        let answer = tokio::select! {
            answer = rx => answer.map_err(|_| SpdyError::ConnectionClosed),
            _ = shared.closed.cancelled() => Err(SpdyError::ConnectionClosed),
        };
        lock(&shared.pings).remove(&id);
        answer.map(|()| started.elapsed())
    }

    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Which end of the connection we are.
    pub fn role(&self) -> Role {
        self.shared.role
    }
}

async fn write_loop<W>(mut io: W, mut commands: mpsc::Receiver<WriteCmd>, shared: Arc<Shared>)
where
    W: AsyncWrite + Unpin,
{
    let mut encoder = FrameEncoder::new();
    let mut buf = BytesMut::with_capacity(WRITE_BATCH);
    loop {
        let cmd = tokio::select! {
            biased;
            _ = shared.closed.cancelled() => break,
            cmd = commands.recv() => cmd,
        };
        let Some(mut cmd) = cmd else { break };
        let mut going_away = false;
        // Batch whatever is already queued into one write.
        loop {
            match cmd {
                WriteCmd::Frame(frame) => {
                    if let Err(err) = encoder.encode(&frame, &mut buf) {
                        tracing::warn!(%err, "cannot encode SPDY frame; closing the connection");
                        shared.closed.cancel();
                        return;
                    }
                }
                WriteCmd::GoAway => {
                    let frame = Frame::GoAway {
                        last_good_stream_id: shared.last_peer_stream.load(Ordering::Acquire),
                        status: goaway::OK,
                    };
                    if encoder.encode(&frame, &mut buf).is_err() {
                        shared.closed.cancel();
                        return;
                    }
                    going_away = true;
                    break;
                }
            }
            if buf.len() >= WRITE_BATCH {
                break;
            }
            match commands.try_recv() {
                Ok(next) => cmd = next,
                Err(_) => break,
            }
        }
        let written = async {
            io.write_all(&buf).await?;
            io.flush().await
        };
        let result = tokio::select! {
            _ = shared.closed.cancelled() => break,
            result = written => result,
        };
        buf.clear();
        if let Err(err) = result {
            tracing::debug!(%err, "SPDY write failed; closing the connection");
            break;
        }
        if going_away {
            let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
            break;
        }
    }
    shared.closed.cancel();
}

async fn read_loop<R>(mut io: R, incoming: mpsc::Sender<Stream>, shared: Arc<Shared>)
where
    R: AsyncRead + Unpin,
{
    let mut decoder = FrameDecoder::new();
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut incoming = Some(incoming);
    'read: loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    let handled = tokio::select! {
                        _ = shared.closed.cancelled() => break 'read,
                        handled = dispatch(frame, &shared, &mut incoming) => handled,
                    };
                    if let Err(err) = handled {
                        tracing::debug!(%err, "SPDY connection failed");
                        break 'read;
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    tracing::debug!(%err, "malformed SPDY input; closing the connection");
                    break 'read;
                }
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        let read = tokio::select! {
            _ = shared.closed.cancelled() => break,
            read = io.read_buf(&mut buf) => read,
        };
        match read {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) => {
                tracing::debug!(%err, "SPDY read failed");
                break;
            }
        }
    }
    shared.closed.cancel();
    // Everything still open was cut: readers see EOF (as with spdystream), pending opens fail.
    let entries: Vec<StreamEntry> = shared.streams().drain().map(|(_, e)| e).collect();
    for mut entry in entries {
        entry.state.end_remote(RemoteEnd::ConnectionLost);
        if let Some(reply) = entry.reply.take() {
            let _ = reply.send(Err(SpdyError::ConnectionClosed));
        }
    }
}

/// Acts on one frame from the peer.
async fn dispatch(
    frame: Frame,
    shared: &Arc<Shared>,
    incoming: &mut Option<mpsc::Sender<Stream>>,
) -> Result<(), SpdyError> {
    match frame {
        Frame::SynStream {
            stream_id,
            flags,
            headers,
            ..
        } => {
            let fin = flags & super::frame::FLAG_FIN != 0;
            accept_stream(stream_id, fin, headers, shared, incoming).await
        }
        Frame::SynReply {
            stream_id,
            flags,
            headers,
        } => {
            let fin = flags & super::frame::FLAG_FIN != 0;
            let mut streams = shared.streams();
            if let Some(entry) = streams.get_mut(&stream_id)
                && let Some(reply) = entry.reply.take()
            {
                let _ = reply.send(Ok(headers));
            }
            drop(streams);
            if fin {
                end_remote(shared, stream_id, RemoteEnd::Fin);
            }
            Ok(())
        }
        Frame::Headers {
            stream_id, flags, ..
        } => {
            if flags & super::frame::FLAG_FIN != 0 {
                end_remote(shared, stream_id, RemoteEnd::Fin);
            }
            Ok(())
        }
        Frame::Data {
            stream_id,
            flags,
            data,
        } => {
            let sender = shared
                .streams()
                .get(&stream_id)
                .and_then(|entry| entry.data.clone());
            // Data for unknown or finished streams is dropped, as spdystream does.
            if let Some(sender) = sender
                && !data.is_empty()
            {
                // A dropped reader just means nobody wants the bytes.
                let _ = sender.send(data).await;
            }
            if flags & super::frame::FLAG_FIN != 0 {
                end_remote(shared, stream_id, RemoteEnd::Fin);
            }
            Ok(())
        }
        Frame::RstStream { stream_id, status } => {
            if let Some(mut entry) = shared.streams().remove(&stream_id) {
                entry.state.end_remote(RemoteEnd::Reset);
                if let Some(reply) = entry.reply.take() {
                    let _ = reply.send(Err(SpdyError::StreamReset {
                        id: stream_id,
                        status,
                    }));
                }
            }
            Ok(())
        }
        Frame::Ping { id } => {
            // Echo the peer's pings; a ping with our parity is the answer to one of ours.
            if shared.role.is_peers(id) {
                shared.send(WriteCmd::Frame(Frame::Ping { id })).await?;
            } else if let Some(waiter) = lock(&shared.pings).remove(&id) {
                let _ = waiter.send(());
            }
            Ok(())
        }
        Frame::GoAway { .. } => {
            // Existing streams carry on; we just may not open new ones.
            shared.going_away.store(true, Ordering::Release);
            Ok(())
        }
        Frame::Settings { .. } | Frame::WindowUpdate { .. } | Frame::Unknown { .. } => Ok(()),
    }
}

async fn accept_stream(
    stream_id: u32,
    fin: bool,
    headers: HeaderList,
    shared: &Arc<Shared>,
    incoming: &mut Option<mpsc::Sender<Stream>>,
) -> Result<(), SpdyError> {
    let last = shared.last_peer_stream.load(Ordering::Acquire);
    if !shared.role.is_peers(stream_id) || stream_id <= last {
        return shared
            .send(WriteCmd::Frame(Frame::RstStream {
                stream_id,
                status: rst::PROTOCOL_ERROR,
            }))
            .await;
    }
    shared.last_peer_stream.store(stream_id, Ordering::Release);
    let Some(sender) = incoming
        .as_ref()
        .filter(|_| !shared.going_away.load(Ordering::Acquire) || shared.role == Role::Client)
    else {
        return refuse(shared, stream_id).await;
    };
    // No user handle left means nobody could ever take the stream.
    let Some(lifeline) = shared.lifeline.upgrade() else {
        return refuse(shared, stream_id).await;
    };
    let state = Arc::new(StreamState::new(stream_id));
    let (data_tx, data_rx) = mpsc::channel(STREAM_BUFFER);
    if fin {
        state.end_remote(RemoteEnd::Fin);
    }
    shared.streams().insert(
        stream_id,
        StreamEntry {
            state: state.clone(),
            data: (!fin).then_some(data_tx),
            reply: None,
        },
    );
    let stream = Stream::new(state, headers, data_rx, shared.clone(), lifeline);
    if sender.send(stream).await.is_err() {
        // Nobody takes new streams any more.
        *incoming = None;
        shared.streams().remove(&stream_id);
        return refuse(shared, stream_id).await;
    }
    Ok(())
}

async fn refuse(shared: &Arc<Shared>, stream_id: u32) -> Result<(), SpdyError> {
    shared
        .send(WriteCmd::Frame(Frame::RstStream {
            stream_id,
            status: rst::REFUSED_STREAM,
        }))
        .await
}

/// The peer finished its side of `id`; forget the stream if ours is finished too.
fn end_remote(shared: &Shared, id: u32, why: RemoteEnd) {
    let mut streams = shared.streams();
    let Some(entry) = streams.get_mut(&id) else {
        return;
    };
    entry.state.end_remote(why);
    entry.data = None;
    if entry.state.is_local_closed() && entry.reply.is_none() {
        streams.remove(&id);
    }
}

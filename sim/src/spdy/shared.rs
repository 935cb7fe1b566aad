//! What a SPDY connection's parts share: the connection state its tasks, handles and streams
//! all hold (`Shared`), the writer task's commands, the handles' lifeline, and each stream's
//! state as the reader task and the stream's halves see it. `conn` and `stream` both build on
//! this file; neither needs the other for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::SpdyError;
use super::frame::Frame;
use super::headers::HeaderList;

/// Which end of the upgrade we are: clients open odd stream ids, servers even ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

impl Role {
    pub(super) fn first_stream_id(self) -> u32 {
        match self {
            Role::Client => 1,
            Role::Server => 2,
        }
    }

    /// Whether `id` (a stream or ping id) was chosen by our peer.
    pub(super) fn is_peers(self, id: u32) -> bool {
        match self {
            Role::Client => id.is_multiple_of(2),
            Role::Server => !id.is_multiple_of(2),
        }
    }
}

/// Things the writer task is asked to do.
pub(crate) enum WriteCmd {
    Frame(Frame),
    /// Send GOAWAY, flush, close our side and end the connection.
    GoAway,
}

/// A stream the reader task can deliver to.
pub(super) struct StreamEntry {
    pub(super) state: Arc<StreamState>,
    /// `None` once the peer's side ended.
    pub(super) data: Option<mpsc::Sender<Bytes>>,
    /// Set for streams we opened, until the SYN_REPLY (or a reset) arrives.
    pub(super) reply: Option<oneshot::Sender<Result<HeaderList, SpdyError>>>,
}

/// State shared by the connection handles, its streams and its two tasks.
pub(crate) struct Shared {
    pub(super) role: Role,
    pub(super) writer: mpsc::Sender<WriteCmd>,
    pub(super) streams: Mutex<HashMap<u32, StreamEntry>>,
    /// The next id we will open; held across sending SYN_STREAM so ids hit the wire in order.
    pub(super) next_id: tokio::sync::Mutex<u32>,
    pub(super) closed: CancellationToken,
    /// We or the peer sent GOAWAY: no new streams.
    pub(super) going_away: AtomicBool,
    pub(super) last_peer_stream: AtomicU32,
    /// Our unanswered PINGs by id.
    pub(super) pings: Mutex<HashMap<u32, oneshot::Sender<()>>>,
    pub(super) next_ping_id: AtomicU32,
    /// The user handles' lifeline; the reader task only holds it weakly.
    pub(super) lifeline: std::sync::Weak<Lifeline>,
}

/// Locks a mutex, recovering from poisoning (a panicking holder cannot leave these maps in a
/// state worse than a lost connection).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    pub(super) fn streams(&self) -> MutexGuard<'_, HashMap<u32, StreamEntry>> {
        // A panic while holding this lock cannot leave the map inconsistent in a way that matters
        // more than losing the connection, so recover the guard instead of propagating poison.
        self.streams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    pub(crate) async fn send(&self, cmd: WriteCmd) -> Result<(), SpdyError> {
        if self.is_closed() {
            return Err(SpdyError::ConnectionClosed);
        }
        self.writer
            .send(cmd)
            .await
            .map_err(|_| SpdyError::ConnectionClosed)
    }

    /// Queues a frame from a `Drop` impl, which cannot wait: if the queue is full, a task waits.
    pub(crate) fn send_from_drop(&self, cmd: WriteCmd) {
        match self.writer.try_send(cmd) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(cmd)) => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let writer = self.writer.clone();
                    runtime.spawn(async move {
                        let _ = writer.send(cmd).await;
                    });
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Our side of stream `id` sent FIN: forget it once the peer's side has ended too.
    pub(crate) fn closed_locally(&self, id: u32) {
        let mut streams = self.streams();
        if let Some(entry) = streams.get(&id)
            && entry.data.is_none()
            && entry.reply.is_none()
        {
            streams.remove(&id);
        }
    }

    /// We reset stream `id`: both sides are over.
    pub(crate) fn reset_locally(&self, id: u32) {
        if let Some(entry) = self.streams().remove(&id) {
            entry.state.end_remote(RemoteEnd::Reset);
        }
    }
}

/// Held by every user handle (connection clones, `Incoming`, stream halves). When the last one
/// goes, nobody can use the connection any more, so it is closed gracefully: whatever was
/// queued is written, then GOAWAY, then the socket is closed. Without this a forgotten
/// connection would keep its socket and tasks until the peer hung up.
pub(crate) struct Lifeline {
    pub(super) writer: mpsc::Sender<WriteCmd>,
    pub(super) closed: CancellationToken,
}

impl Drop for Lifeline {
    fn drop(&mut self) {
        if self.closed.is_cancelled() {
            return;
        }
        match self.writer.try_send(WriteCmd::GoAway) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(cmd)) => {
                let writer = self.writer.clone();
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => {
                        runtime.spawn(async move {
                            let _ = writer.send(cmd).await;
                        });
                    }
                    Err(_) => self.closed.cancel(),
                }
            }
        }
    }
}

/// Why the peer's side of a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RemoteEnd {
    Open = 0,
    Fin = 1,
    Reset = 2,
    ConnectionLost = 3,
}

/// State shared between a stream's halves and the connection's reader task.
#[derive(Debug)]
pub(crate) struct StreamState {
    pub(crate) id: u32,
    remote_end: AtomicU8,
    local_closed: AtomicBool,
    reset: AtomicBool,
}

impl StreamState {
    pub(crate) fn new(id: u32) -> Self {
        StreamState {
            id,
            remote_end: AtomicU8::new(RemoteEnd::Open as u8),
            local_closed: AtomicBool::new(false),
            reset: AtomicBool::new(false),
        }
    }

    /// Records how the remote side ended; the first reason wins.
    pub(crate) fn end_remote(&self, why: RemoteEnd) {
        let _ = self.remote_end.compare_exchange(
            RemoteEnd::Open as u8,
            why as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if why == RemoteEnd::Reset {
            self.reset.store(true, Ordering::Release);
        }
    }

    pub(crate) fn is_local_closed(&self) -> bool {
        self.local_closed.load(Ordering::Acquire)
    }

    /// Marks our side closed; true if it was open until now.
    pub(crate) fn close_local(&self) -> bool {
        !self.local_closed.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn is_reset(&self) -> bool {
        self.reset.load(Ordering::Acquire)
    }
}

//! Keeps one connection to a leaf apiserver dialed ahead of the next session.
//!
//! Every exec, attach and port-forward takes a connection to the leaf over for good (the
//! upgrade consumes it), so without a spare each session waits for a TCP and a TLS handshake to
//! the leaf before its request can be sent: two round trips to a cluster that may be far away,
//! in the path of every `kubectl exec`. [`WarmConnector`] wraps the stream client's connector:
//! after a connection is taken it dials the next one in the background and hands it to the
//! next session.
//!
//! A spare is handed out only while it is known to be open. A watcher task reads from it: rustls
//! consumes post-handshake messages (session tickets) without yielding bytes, so any byte, end
//! of stream or error means the server closed or broke it, and the spare is dropped. Spares are
//! replaced after [`MAX_AGE`], well before kube-apiserver's 32 s `ReadHeaderTimeout` closes a
//! connection that never sent a request, and only while the leaf is in use: a leaf without
//! sessions for [`KEEP_WARM_FOR`] gets no more spares until its next session.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use prometheus_client::metrics::counter::Counter;
use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use crate::ops::Metrics;

/// How long a spare is kept before it is replaced by a fresh one.
pub const MAX_AGE: Duration = Duration::from_secs(20);
/// How long after the last session a leaf's spare is still renewed.
pub const KEEP_WARM_FOR: Duration = Duration::from_secs(600);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connector that keeps one spare connection of its inner connector ready.
pub struct WarmConnector<C: Service<Uri>> {
    inner: C,
    shared: Arc<Shared<C::Response>>,
    sources: Sources,
    /// Off (`LEAF_SPARE_CONNECTION=false`), every call dials and no spare is kept.
    enabled: bool,
}

/// Counts the connections handed out, by where they came from.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// Served by the spare.
    pub spare: Counter,
    /// Dialed for the caller (no spare, or it was lost).
    pub dialed: Counter,
}

impl Sources {
    /// `leaf`'s counters in `relaylet_leaf_connections_total`.
    pub fn of_leaf(metrics: &Metrics, leaf: &str) -> Sources {
        Sources {
            spare: metrics.leaf_connections(leaf, "spare"),
            dialed: metrics.leaf_connections(leaf, "dialed"),
        }
    }
}

impl<C: Service<Uri> + Clone> Clone for WarmConnector<C> {
    fn clone(&self) -> Self {
        WarmConnector {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            sources: self.sources.clone(),
            enabled: self.enabled,
        }
    }
}

/// State shared by the clones of one connector (one leaf's stream client).
struct Shared<S> {
    slot: Mutex<Slot<S>>,
}

struct Slot<S> {
    /// The spare's watcher, asked for the connection through this channel.
    spare: Option<Spare<S>>,
    /// A background dial is under way.
    dialing: bool,
    /// When a connection was last asked for.
    last_used: Instant,
}

struct Spare<S> {
    uri: Uri,
    /// Sends the watcher a reply channel; the watcher answers with the connection.
    take: oneshot::Sender<oneshot::Sender<S>>,
}

impl<S> Shared<S> {
    fn lock(&self) -> MutexGuard<'_, Slot<S>> {
        // A panic while holding this lock leaves only plain data behind; go on with it.
        self.slot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<S> Slot<S> {
    /// Claims the right to dial a spare: none is held (alive) and none is being dialed.
    fn claim_dial(&mut self) -> bool {
        if self.spare.as_ref().is_some_and(|s| s.take.is_closed()) {
            self.spare = None;
        }
        if self.spare.is_some() || self.dialing {
            return false;
        }
        self.dialing = true;
        true
    }
}

impl<C: Service<Uri>> WarmConnector<C> {
    pub fn new(inner: C, sources: Sources, enabled: bool) -> WarmConnector<C> {
        WarmConnector {
            inner,
            sources,
            enabled,
            shared: Arc::new(Shared {
                slot: Mutex::new(Slot {
                    spare: None,
                    dialing: false,
                    last_used: Instant::now(),
                }),
            }),
        }
    }
}

impl<C, S> Service<Uri> for WarmConnector<C>
where
    C: Service<Uri, Response = S> + Clone + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
    S: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    type Response = S;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        // `call` must go to the connector that was readied; a clone takes its place.
        let fresh = self.inner.clone();
        let mut readied = std::mem::replace(&mut self.inner, fresh);
        let own_dial = readied.call(uri.clone());
        let dialer = self.inner.clone();
        let shared = self.shared.clone();
        let sources = self.sources.clone();
        if !self.enabled {
            return Box::pin(async move {
                sources.dialed.inc();
                own_dial.await.map_err(Into::into)
            });
        }
        Box::pin(async move {
            let spare = {
                let mut slot = shared.lock();
                slot.last_used = Instant::now();
                slot.spare.take()
            };
            let taken = match spare {
                Some(spare) if spare.uri == uri => hand_over(spare).await,
                _ => None,
            };
            if shared.lock().claim_dial() {
                tokio::spawn(keep_spare(Arc::downgrade(&shared), dialer, uri));
            }
            match taken {
                Some(stream) => {
                    sources.spare.inc();
                    Ok(stream)
                }
                None => {
                    sources.dialed.inc();
                    own_dial.await.map_err(Into::into)
                }
            }
        })
    }
}

/// Asks a spare's watcher for its connection; `None` if it was closed meanwhile.
async fn hand_over<S>(spare: Spare<S>) -> Option<S> {
    let (reply, answer) = oneshot::channel();
    spare.take.send(reply).ok()?;
    answer.await.ok()
}

/// Dials spares for `uri` and watches each until it is taken or lost; renews expired ones
/// while the leaf is in use. Ends with the connector (the leaf was removed or replaced).
async fn keep_spare<C, S>(shared: Weak<Shared<S>>, dialer: C, uri: Uri)
where
    C: Service<Uri, Response = S> + Clone + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
    S: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    loop {
        // The error is dropped here: the next session dials itself and reports it to its caller.
        let dialed = dialer.clone().oneshot(uri.clone()).await.ok();
        let Some(owner) = shared.upgrade() else {
            return;
        };
        let (take, asked) = oneshot::channel();
        {
            let mut slot = owner.lock();
            slot.dialing = false;
            if dialed.is_some() {
                slot.spare = Some(Spare {
                    uri: uri.clone(),
                    take,
                });
            }
        }
        drop(owner);
        let Some(stream) = dialed else {
            return;
        };
        if watch(TokioIo::new(stream), asked).await != Ended::Expired {
            return;
        }
        let Some(owner) = shared.upgrade() else {
            return;
        };
        let mut slot = owner.lock();
        if slot.last_used.elapsed() > KEEP_WARM_FOR || !slot.claim_dial() {
            return;
        }
    }
}

/// How a watcher ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// A session took the connection.
    Taken,
    /// The server closed or broke it, or nobody is left to ask for it.
    Lost,
    /// It reached [`MAX_AGE`] unused.
    Expired,
}

/// Holds a spare until it is asked for, the server closes it, or it grows too old.
async fn watch<S>(mut stream: TokioIo<S>, asked: oneshot::Receiver<oneshot::Sender<S>>) -> Ended
where
    S: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    let mut byte = [0u8; 1];
    let reply = tokio::select! {
        reply = asked => reply,
        // Nothing may arrive before a request: any outcome means the connection is unusable.
        _ = stream.read(&mut byte) => return Ended::Lost,
        _ = tokio::time::sleep(MAX_AGE) => return Ended::Expired,
    };
    match reply {
        Ok(reply) => {
            // If the session gave up meanwhile, the connection is dropped with the reply.
            let _ = reply.send(stream.into_inner());
            Ended::Taken
        }
        Err(_) => Ended::Lost,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncWriteExt, DuplexStream};

    use super::*;

    type Conn = TokioIo<DuplexStream>;

    /// A connector over in-memory pipes that keeps the server ends, numbered by dial.
    #[derive(Clone, Default)]
    struct Pipes {
        dials: Arc<AtomicUsize>,
        servers: Arc<Mutex<Vec<DuplexStream>>>,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Pipes {
        fn dials(&self) -> usize {
            self.dials.load(Ordering::SeqCst)
        }

        fn server(&self, dial: usize) -> DuplexStream {
            let mut servers = self.servers.lock().unwrap();
            std::mem::replace(&mut servers[dial], tokio::io::duplex(1).0)
        }
    }

    impl Service<Uri> for Pipes {
        type Response = Conn;
        type Error = std::io::Error;
        type Future = Pin<Box<dyn Future<Output = std::io::Result<Conn>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Uri) -> Self::Future {
            let this = self.clone();
            // Counted when awaited: an unused dial future costs nothing, like a real connector's.
            Box::pin(async move {
                this.dials.fetch_add(1, Ordering::SeqCst);
                if this.fail.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("refused"));
                }
                let (client, server) = tokio::io::duplex(1024);
                this.servers.lock().unwrap().push(server);
                Ok(TokioIo::new(client))
            })
        }
    }

    fn uri(authority: &str) -> Uri {
        format!("https://{authority}/").parse().unwrap()
    }

    /// Lets spawned dials and watchers run.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Writes `text` on a connection the connector handed out and reads it at dial `dial`'s
    /// server end: proves which dialed connection the caller got.
    async fn came_from(conn: Conn, pipes: &Pipes, dial: usize) {
        let mut conn = conn.into_inner();
        conn.write_all(b"x").await.unwrap();
        let mut server = pipes.server(dial);
        let mut byte = [0u8; 1];
        server.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"x");
    }

    /// A connector that has made one connection (dial 0, dropped) and has its spare (dial 1).
    async fn after_one_call() -> (Pipes, WarmConnector<Pipes>) {
        let pipes = Pipes::default();
        let mut connector = WarmConnector::new(pipes.clone(), Sources::default(), true);
        drop(connector.call(uri("leaf:6443")).await.unwrap());
        settle().await;
        (pipes, connector)
    }

    #[tokio::test]
    async fn the_next_call_gets_the_spare_dialed_after_the_previous_one() {
        let pipes = Pipes::default();
        let sources = Sources::default();
        let mut connector = WarmConnector::new(pipes.clone(), sources.clone(), true);
        let first = connector.call(uri("leaf:6443")).await.unwrap();
        settle().await;
        assert_eq!(pipes.dials(), 2, "the call's own dial and one spare");
        assert_eq!((sources.dialed.get(), sources.spare.get()), (1, 0));
        came_from(first, &pipes, 0).await;

        let second = connector.call(uri("leaf:6443")).await.unwrap();
        settle().await;
        assert_eq!(pipes.dials(), 3, "no own dial, one new spare");
        assert_eq!((sources.dialed.get(), sources.spare.get()), (1, 1));
        came_from(second, &pipes, 1).await;
    }

    #[tokio::test]
    async fn a_spare_the_server_closed_is_not_handed_out() {
        let (pipes, mut connector) = after_one_call().await;
        drop(pipes.server(1));
        settle().await;

        let conn = connector.call(uri("leaf:6443")).await.unwrap();
        came_from(conn, &pipes, 2).await;
    }

    #[tokio::test]
    async fn a_spare_the_server_wrote_to_is_not_handed_out() {
        let (pipes, mut connector) = after_one_call().await;
        let mut server = pipes.server(1);
        server
            .write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
            .await
            .unwrap();
        settle().await;

        let conn = connector.call(uri("leaf:6443")).await.unwrap();
        came_from(conn, &pipes, 2).await;
    }

    #[tokio::test]
    async fn a_spare_for_another_address_is_not_used() {
        let (pipes, mut connector) = after_one_call().await;

        let conn = connector.call(uri("other:6443")).await.unwrap();
        came_from(conn, &pipes, 2).await;
    }

    #[tokio::test]
    async fn a_failed_spare_dial_leaves_the_next_call_to_dial_and_report() {
        let pipes = Pipes::default();
        let mut connector = WarmConnector::new(pipes.clone(), Sources::default(), true);
        pipes.fail.store(true, Ordering::SeqCst);
        let err = connector.call(uri("leaf:6443")).await.err().unwrap();
        assert_eq!(err.to_string(), "refused");
        settle().await;
        assert_eq!(
            pipes.dials(),
            2,
            "the call's own dial and one spare attempt"
        );
        settle().await;
        assert_eq!(pipes.dials(), 2, "a failed spare is not retried on its own");

        pipes.fail.store(false, Ordering::SeqCst);
        let conn = connector.call(uri("leaf:6443")).await.unwrap();
        came_from(conn, &pipes, 0).await;
    }

    #[tokio::test(start_paused = true)]
    async fn spares_are_renewed_while_the_leaf_is_in_use_and_then_let_go() {
        let (pipes, mut connector) = after_one_call().await;
        assert_eq!(pipes.dials(), 2);

        tokio::time::sleep(MAX_AGE + Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(pipes.dials(), 3, "the old spare was replaced");
        let mut old = pipes.server(1);
        let mut byte = [0u8; 1];
        assert_eq!(old.read(&mut byte).await.unwrap(), 0, "and closed");

        tokio::time::sleep(KEEP_WARM_FOR).await;
        settle().await;
        let renewed = pipes.dials();
        tokio::time::sleep(MAX_AGE * 3).await;
        settle().await;
        assert_eq!(pipes.dials(), renewed, "an unused leaf gets no more spares");

        let conn = connector.call(uri("leaf:6443")).await.unwrap();
        came_from(conn, &pipes, renewed).await;
    }

    #[tokio::test]
    async fn switched_off_every_call_dials_and_nothing_is_kept() {
        let pipes = Pipes::default();
        let sources = Sources::default();
        let mut connector = WarmConnector::new(pipes.clone(), sources.clone(), false);
        for dial in 0..3 {
            let conn = connector.call(uri("leaf:6443")).await.unwrap();
            settle().await;
            came_from(conn, &pipes, dial).await;
        }
        assert_eq!(pipes.dials(), 3);
        assert_eq!((sources.dialed.get(), sources.spare.get()), (3, 0));
    }

    #[tokio::test]
    async fn dropping_the_connector_closes_its_spare() {
        let (pipes, connector) = after_one_call().await;
        drop(connector);
        settle().await;
        let mut spare = pipes.server(1);
        let mut byte = [0u8; 1];
        assert_eq!(spare.read(&mut byte).await.unwrap(), 0);
    }
}

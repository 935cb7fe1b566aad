//! The HTTP client under relaylet's API clients: a few connections to one apiserver that carry
//! every watch and call as HTTP/2 streams, spread over the connections by relaylet itself.
//!
//! Over HTTP/1.1 each watch holds a connection of its own, so the root connections grew with
//! the leaves (two long watches per virtual node). Over HTTP/2 one connection carries many
//! streams, up to the server's limit (`SETTINGS_MAX_CONCURRENT_STREAMS`: kube-apiserver's
//! `--http2-max-streams-per-connection`, 100 when unset). hyper's HTTP/2 client never opens a
//! second connection when that limit is reached: the next request waits for a stream to end,
//! and a watch ends only after minutes, so a full connection would stall every other call. So
//! this pool holds several hyper clients, each keeping a single HTTP/2 connection (hyper's pool
//! shares one per host), counts the streams open on each (a guard that lives as long as the
//! response body), sends each request on the one with the fewest, and adds a connection only
//! when every one carries its budget of streams, below the server's limit, up to a cap.
//!
//! A server that does not offer h2 by ALPN gets HTTP/1.1: then a single hyper client
//! (its own connection per request in flight, a few kept idle) serves every request.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::Connect;
use hyper_util::client::legacy::{Builder, Client};
use tower::Service;

/// How many streams each connection carries and how many connections there may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Streams a connection carries before the pool opens another; below the server's limit so
    /// that short calls still find a free stream on a connection full of watches.
    pub streams_per_connection: usize,
    /// The most connections the pool opens; past it, requests go to the least busy one.
    pub connections: usize,
}

/// The pool's hyper clients, each with its own HTTP/2 connection. Cheap to clone.
#[derive(Clone)]
pub struct ConnPool<C> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    builder: Builder,
    connector: C,
    budget: Budget,
    slots: Mutex<Vec<Slot<C>>>,
    /// Set once an answer came over HTTP/1.x: the server does not speak h2, so there is no
    /// point in more than one hyper client (each would keep idle connections of its own).
    http1: AtomicBool,
}

struct Slot<C> {
    client: Client<C, kube::client::Body>,
    open: Arc<AtomicUsize>,
}

impl<C> ConnPool<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// A pool of clients built by `builder` on `connector`, within `budget`. No connection is
    /// opened before the first request.
    pub fn new(builder: Builder, connector: C, budget: Budget) -> Self {
        let budget = Budget {
            streams_per_connection: budget.streams_per_connection.max(1),
            connections: budget.connections.max(1),
        };
        ConnPool {
            inner: Arc::new(Inner {
                builder,
                connector,
                budget,
                slots: Mutex::new(Vec::new()),
                http1: AtomicBool::new(false),
            }),
        }
    }

    /// Streams open on each connection of the pool (requests sent whose answer's body is not
    /// yet dropped), in the order the connections were added.
    pub fn open_streams(&self) -> Vec<usize> {
        self.inner
            .slots
            .lock()
            .map(|slots| {
                slots
                    .iter()
                    .map(|s| s.open.load(Ordering::Relaxed))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The client for the next request, and the guard that counts its stream.
    fn pick(&self) -> (Client<C, kube::client::Body>, StreamGuard) {
        let inner = &self.inner;
        // A poisoned lock only means another request panicked while choosing: the slots are
        // still consistent (each push is complete), so go on with them.
        let mut slots = inner.slots.lock().unwrap_or_else(|e| e.into_inner());
        let least = slots
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.open.load(Ordering::Relaxed))
            .map(|(i, s)| (i, s.open.load(Ordering::Relaxed)));
        let index = match least {
            Some((i, _)) if inner.http1.load(Ordering::Relaxed) => i,
            Some((i, open))
                if open < inner.budget.streams_per_connection
                    || slots.len() >= inner.budget.connections =>
            {
                i
            }
            _ => {
                slots.push(Slot {
                    client: inner.builder.build(inner.connector.clone()),
                    open: Arc::new(AtomicUsize::new(0)),
                });
                slots.len() - 1
            }
        };
        let slot = &slots[index];
        slot.open.fetch_add(1, Ordering::Relaxed);
        (slot.client.clone(), StreamGuard(slot.open.clone()))
    }
}

impl<C> Service<Request<kube::client::Body>> for ConnPool<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    type Response = Response<Counted<Incoming>>;
    type Error = hyper_util::client::legacy::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each hyper client is always ready; waiting for a stream happens inside `request`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let (client, guard) = self.pick();
        let inner = self.inner.clone();
        Box::pin(async move {
            let response = client.request(req).await?;
            if response.version() < http::Version::HTTP_2 {
                inner.http1.store(true, Ordering::Relaxed);
            }
            Ok(response.map(|body| Counted {
                body,
                _guard: guard,
            }))
        })
    }
}

/// Counts one open stream on a connection until dropped.
struct StreamGuard(Arc<AtomicUsize>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer's body that keeps its stream counted until it is dropped.
pub struct Counted<B> {
    body: B,
    _guard: StreamGuard,
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::client::legacy::connect::HttpConnector;

    fn pool(streams_per_connection: usize, connections: usize) -> ConnPool<HttpConnector> {
        let builder = Client::builder(hyper_util::rt::TokioExecutor::new());
        let budget = Budget {
            streams_per_connection,
            connections,
        };
        ConnPool::new(builder, HttpConnector::new(), budget)
    }

    #[test]
    fn a_connection_is_added_only_when_every_one_carries_its_budget_up_to_the_cap() {
        let pool = pool(2, 3);
        let mut guards: Vec<StreamGuard> = (0..2).map(|_| pool.pick().1).collect();
        assert_eq!(pool.open_streams(), vec![2]);
        guards.push(pool.pick().1);
        assert_eq!(pool.open_streams(), vec![2, 1]);
        guards.extend((0..3).map(|_| pool.pick().1));
        assert_eq!(pool.open_streams(), vec![2, 2, 2]);
        // At the cap: the least busy connection takes the next ones.
        guards.extend((0..2).map(|_| pool.pick().1));
        assert_eq!(pool.open_streams(), vec![3, 3, 2]);
        // Answers dropped free their streams, and the next request goes where fewest are open.
        guards.drain(0..2);
        assert_eq!(pool.open_streams(), vec![1, 3, 2]);
        guards.push(pool.pick().1);
        assert_eq!(pool.open_streams(), vec![2, 3, 2]);
    }

    #[test]
    fn over_http1_one_client_takes_every_request() {
        let pool = pool(1, 4);
        let first = pool.pick().1;
        pool.inner.http1.store(true, Ordering::Relaxed);
        let more: Vec<StreamGuard> = (0..5).map(|_| pool.pick().1).collect();
        assert_eq!(pool.open_streams(), vec![6]);
        drop((first, more));
        assert_eq!(pool.open_streams(), vec![0]);
    }
}

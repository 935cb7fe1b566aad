//! How much relaylet reads of one answer from a leaf apiserver: a tower layer on the leaf's API
//! client that fails a response body once it passes its limit.
//!
//! A leaf is not trusted (nor is whoever points a leaf Secret at a server of their own), and
//! kube's client reads without limits: a watch buffers its current line until a newline comes,
//! and every other call (and every error answer, watches' too) collects its whole body before
//! decoding it. A server that never sends a newline grew relaylet by 400 MB in 20 s. Here each
//! answer gets one limit, chosen from what Kubernetes can store:
//!
//! - a watch's event line ([`MAX_WATCH_LINE`]): one object in JSON. etcd stores at most 1.5 MiB
//!   per object and the apiserver takes request bodies of at most 3 MiB (both defaults); a pod
//!   or node whose JSON is larger than 4 MiB is more than 2.6 times its stored size.
//! - any other successful body ([`MAX_BODY`]): one object, or one page of a LIST. relaylet's
//!   leaf watches list in pages sized so that a page of ordinary pods or nodes is a small part
//!   of this (see `virtual_node::leaf_objects`).
//! - an error answer ([`MAX_ERROR_BODY`]): a `metav1.Status` is a few hundred bytes.
//!
//! Past a limit the body ends in an [`OverLimit`] error (so the call fails with kube's error
//! carrying it, and a watch is dropped), the connection is closed rather than drained, and the
//! [`ReadLimits`] hook hears of it (the leaf's metric and log line). The root cluster's client
//! and the leaf's stream client (exec, logs: streamed, never collected) pass bodies unchanged.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower::{BoxError, Layer, Service};

/// The longest watch event line read from a leaf.
pub const MAX_WATCH_LINE: usize = 4 * 1024 * 1024;
/// The largest successful body of any other call to a leaf (an object, a LIST page).
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// The largest error answer read from a leaf.
pub const MAX_ERROR_BODY: usize = 64 * 1024;

/// Which limit an answer went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    WatchLine,
    Body,
    ErrorBody,
}

impl Limit {
    /// The limit in bytes.
    pub fn bytes(self) -> usize {
        match self {
            Limit::WatchLine => MAX_WATCH_LINE,
            Limit::Body => MAX_BODY,
            Limit::ErrorBody => MAX_ERROR_BODY,
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Limit::WatchLine => "watch_line",
            Limit::Body => "body",
            Limit::ErrorBody => "error_body",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Limit::WatchLine => "a watch event line",
            Limit::Body => "an answer",
            Limit::ErrorBody => "an error answer",
        }
    }

    /// The limit for an answer with `status` to a request that is a watch or not.
    fn of(status: http::StatusCode, watch: bool) -> Limit {
        match (status.is_success(), watch) {
            (false, _) => Limit::ErrorBody,
            (true, true) => Limit::WatchLine,
            (true, false) => Limit::Body,
        }
    }
}

/// A leaf answer read past its limit: the error its body ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the leaf sent {what} longer than {size} KiB, relaylet's limit; it was not read further",
    what = limit.what(),
    size = limit.bytes() / 1024
)]
pub struct OverLimit {
    pub limit: Limit,
}

impl OverLimit {
    /// The `OverLimit` somewhere in `err`'s chain (kube and hyper wrap it, and an I/O error
    /// hides its inner error from `source`).
    pub fn find(err: &(dyn std::error::Error + 'static)) -> Option<OverLimit> {
        let mut next = Some(err);
        while let Some(err) = next {
            if let Some(found) = err.downcast_ref::<OverLimit>() {
                return Some(*found);
            }
            if let Some(inner) = err
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                && let Some(found) = OverLimit::find(inner)
            {
                return Some(found);
            }
            next = err.source();
        }
        None
    }
}

/// Limits on, and who hears of, answers read past them. Cheap to clone.
#[derive(Clone)]
pub struct ReadLimits {
    exceeded: Arc<dyn Fn(Limit) + Send + Sync>,
}

impl ReadLimits {
    /// The limits above; `exceeded` is called once per answer that goes over one.
    pub fn new(exceeded: impl Fn(Limit) + Send + Sync + 'static) -> ReadLimits {
        ReadLimits {
            exceeded: Arc::new(exceeded),
        }
    }
}

/// The layer: with `None`, bodies pass unchanged (the trusted root, streamed sessions).
#[derive(Clone)]
pub struct ReadLimitLayer(pub Option<ReadLimits>);

impl<S> Layer<S> for ReadLimitLayer {
    type Service = ReadLimited<S>;

    fn layer(&self, inner: S) -> ReadLimited<S> {
        ReadLimited {
            inner,
            limits: self.0.clone(),
        }
    }
}

/// A service whose response bodies are read within their limit.
#[derive(Clone)]
pub struct ReadLimited<S> {
    inner: S,
    limits: Option<ReadLimits>,
}

impl<S, Q, B> Service<Request<Q>> for ReadLimited<S>
where
    S: Service<Request<Q>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<LimitedBody<B>>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Q>) -> Self::Future {
        let watch = is_watch(req.uri());
        let limits = self.limits.clone();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let resp = answer.await?;
            let limit = Limit::of(resp.status(), watch);
            Ok(resp.map(|body| LimitedBody {
                inner: body,
                check: limits.map(|limits| Check {
                    limit,
                    run: 0,
                    limits,
                }),
                over: false,
            }))
        })
    }
}

/// Whether a request is a watch: `watch=true` or `watch=1` in its query, as kube asks. (A
/// deprecated `/watch/` path would be read as any other answer: bounded in all, not per line.)
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "watch" && (v == "true" || v == "1"))
    })
}

/// A response body that ends in [`OverLimit`] once it passes its limit.
pub struct LimitedBody<B> {
    inner: B,
    check: Option<Check>,
    /// Set once the limit was passed: nothing more is read.
    over: bool,
}

/// What a limited body has counted.
struct Check {
    limit: Limit,
    /// Bytes since the last newline (a watch), or in all (any other answer).
    run: usize,
    limits: ReadLimits,
}

impl Check {
    /// Counts `data`; whether the limit is passed.
    fn passed_with(&mut self, data: &[u8]) -> bool {
        match self.limit {
            Limit::WatchLine => match data.iter().rposition(|b| *b == b'\n') {
                Some(at) => self.run = data.len() - at - 1,
                None => self.run = self.run.saturating_add(data.len()),
            },
            Limit::Body | Limit::ErrorBody => self.run = self.run.saturating_add(data.len()),
        }
        self.run > self.limit.bytes()
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.over {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        let this = &mut *self;
        if let (Some(check), Some(data)) = (this.check.as_mut(), frame.data_ref())
            && check.passed_with(data)
        {
            this.over = true;
            (check.limits.exceeded)(check.limit);
            return Poll::Ready(Some(Err(Box::new(OverLimit { limit: check.limit }))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.over || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use std::sync::Mutex;

    type Chunks =
        StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, BoxError>>>>;

    fn chunks(parts: Vec<Vec<u8>>) -> Chunks {
        StreamBody::new(futures::stream::iter(
            parts
                .into_iter()
                .map(|p| Ok(Frame::data(Bytes::from(p))))
                .collect::<Vec<_>>(),
        ))
    }

    /// Reads `parts` as the body of an answer with `limit`; what was read before the end or the
    /// error, the error, and the limits the hook heard of.
    async fn read_body(
        limit: Limit,
        parts: Vec<Vec<u8>>,
    ) -> (usize, Option<OverLimit>, Vec<Limit>) {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let hook = heard.clone();
        let mut body = LimitedBody {
            inner: chunks(parts),
            check: Some(Check {
                limit,
                run: 0,
                limits: ReadLimits::new(move |l| hook.lock().unwrap().push(l)),
            }),
            over: false,
        };
        let mut read = 0;
        let mut error = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => read += frame.into_data().map(|d| d.len()).unwrap_or(0),
                Err(err) => {
                    error = OverLimit::find(&*err);
                    assert!(error.is_some(), "{err}");
                }
            }
        }
        let heard = heard.lock().unwrap().clone();
        (read, error, heard)
    }

    #[tokio::test]
    async fn a_watch_line_without_a_newline_is_cut_at_its_limit() {
        let chunk = vec![b'x'; 1024 * 1024];
        let (read, error, heard) = read_body(Limit::WatchLine, vec![chunk; 64]).await;
        assert_eq!(
            error,
            Some(OverLimit {
                limit: Limit::WatchLine
            })
        );
        assert_eq!(heard, vec![Limit::WatchLine]);
        assert!(read <= MAX_WATCH_LINE, "{read} bytes passed on");
    }

    #[tokio::test]
    async fn watch_lines_under_the_limit_pass_however_many() {
        let mut line = vec![b'x'; MAX_WATCH_LINE - 1];
        line.push(b'\n');
        // Twelve full-size lines, split across chunks at odd places.
        let all: Vec<u8> = line.repeat(12);
        let parts: Vec<Vec<u8>> = all
            .chunks(3 * 1024 * 1024 + 7)
            .map(<[u8]>::to_vec)
            .collect();
        let (read, error, heard) = read_body(Limit::WatchLine, parts).await;
        assert_eq!((error, heard), (None, vec![]));
        assert_eq!(read, all.len());
    }

    #[tokio::test]
    async fn bodies_are_cut_at_their_limit_whatever_their_newlines() {
        let lines = b"{}\n".repeat(1024 * 1024).to_vec();
        let (read, error, _) = read_body(Limit::ErrorBody, vec![lines.clone()]).await;
        assert_eq!(
            error,
            Some(OverLimit {
                limit: Limit::ErrorBody
            })
        );
        assert_eq!(read, 0);
        let (_, error, heard) = read_body(Limit::Body, vec![lines; 6]).await;
        assert_eq!(error, Some(OverLimit { limit: Limit::Body }));
        assert_eq!(heard, vec![Limit::Body]);
        let (read, error, _) = read_body(Limit::Body, vec![vec![b'x'; MAX_BODY]]).await;
        assert_eq!((read, error), (MAX_BODY, None));
    }

    #[test]
    fn watches_and_error_answers_are_told_apart() {
        let watch = |uri: &str| is_watch(&uri.parse().unwrap());
        assert!(watch("/api/v1/pods?watch=true&resourceVersion=5"));
        assert!(watch("/api/v1/nodes?allowWatchBookmarks=true&watch=1"));
        assert!(!watch("/api/v1/pods?limit=200&continue=abc"));
        assert!(!watch("/api/v1/pods?watch=false"));
        assert!(!watch("/readyz"));
        use http::StatusCode;
        assert_eq!(Limit::of(StatusCode::OK, true), Limit::WatchLine);
        assert_eq!(Limit::of(StatusCode::OK, false), Limit::Body);
        assert_eq!(Limit::of(StatusCode::GONE, true), Limit::ErrorBody);
        assert_eq!(
            Limit::of(StatusCode::INTERNAL_SERVER_ERROR, false),
            Limit::ErrorBody
        );
    }

    #[test]
    fn the_error_is_found_through_kube_and_io_wrappers() {
        let over = OverLimit {
            limit: Limit::WatchLine,
        };
        let kube = kube::Error::Service(Box::new(over));
        assert_eq!(OverLimit::find(&kube), Some(over));
        let io = std::io::Error::other(kube);
        let read = kube::Error::ReadEvents(io);
        assert_eq!(OverLimit::find(&read), Some(over));
        assert_eq!(
            over.to_string(),
            "the leaf sent a watch event line longer than 4096 KiB, relaylet's limit; it was not read further"
        );
    }
}

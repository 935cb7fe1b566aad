//! A list-then-watch of one kind of object that holds only what is in flight. It asks what
//! kube-runtime's `watcher` asks (a LIST in pages, then a WATCH from the list's
//! resourceVersion with bookmarks; a new WATCH from the last version seen when one ends; a new
//! LIST on 410 Gone; a growing, jittered wait after an error) and yields the same events, but
//! reads the stream itself: kube reads a watch through an 8 KiB line buffer that keeps
//! whatever it grew to, and boxes the stream and its backoff beside it, about 10 KiB a watch
//! when idle, and relaylet keeps three watches for each leaf it serves (the leaf's nodes and
//! pods, the root's pods on its Node). Here a watch holds no buffer between events and only the
//! part of a line not yet complete while one arrives.

use std::collections::VecDeque;
use std::time::Duration;

use http_body_util::BodyExt;
use kube::api::{ListParams, VersionMatch, WatchParams};
use kube::core::{ObjectList, Status, WatchEvent};
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::calls::{self, Calls};
use super::read_limits::MAX_WATCH_LINE;
use crate::ops::Backoff;

/// A WATCH the server has not ended after this long (its `timeoutSeconds`, 290, plus kube's
/// margin) is taken as a dead connection and started again.
const IDLE_TIMEOUT: Duration = Duration::from_secs(290 + 5);
/// The first wait after an error, doubled after each error up to [`MAX_RETRY`]; back to the
/// first after [`RESET_AFTER`] without one (kube-runtime's default backoff).
const FIRST_RETRY: Duration = Duration::from_millis(800);
const MAX_RETRY: Duration = Duration::from_secs(30);
const RESET_AFTER: Duration = Duration::from_secs(120);

/// Where a watch stands.
enum Phase<K> {
    /// To list from the start.
    Empty,
    /// Listing: the page's objects not yielded yet, the next page's token, the list's version.
    Paging {
        objects: VecDeque<K>,
        next_page: Option<String>,
        version: Option<String>,
    },
    /// To watch from `version`.
    Listed { version: String },
    /// Watching from `version`: the body, and what was read of it but not yielded.
    Watching {
        version: String,
        body: calls::Body,
        line: Lines,
    },
}

/// A watch of every `K` (or those `fields` and `labels` select), listed `page_size` at a time.
pub struct LeanWatch<K> {
    calls: Calls,
    /// Where every `K` is listed and watched (`/api/v1/pods`).
    url: String,
    fields: Option<String>,
    labels: Option<String>,
    page_size: u32,
    phase: Phase<K>,
    /// The wait before the next request, after an error.
    wait: Option<Duration>,
    /// The waits after errors.
    backoff: Backoff,
}

impl<K> LeanWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    /// A watch of every `K` on the cluster `calls` reach, matching `fields` if given; nothing
    /// is asked until [`LeanWatch::next`].
    pub fn new(calls: Calls, fields: Option<String>, page_size: u32) -> LeanWatch<K> {
        LeanWatch {
            calls,
            url: K::url_path(&(), None),
            fields,
            labels: None,
            page_size,
            phase: Phase::Empty,
            wait: None,
            backoff: Backoff::new(FIRST_RETRY, MAX_RETRY)
                .jittered()
                .reset_after(RESET_AFTER),
        }
    }

    /// Only the objects `selector` (a label selector) selects.
    pub fn labels(mut self, selector: String) -> LeanWatch<K> {
        self.labels = Some(selector);
        self
    }

    /// The next event, or the error of the last request (the watch carries on from where it
    /// stands on the next call, after a wait). `Init` starts a (re)list, `InitApply` is each
    /// object listed, `InitDone` ends the list; `Apply` and `Delete` follow as objects change.
    /// Dropped while it waits, the watch starts over with a new list at the next call.
    pub async fn next(&mut self) -> Result<Event<K>, kube::Error> {
        if let Some(wait) = self.wait.take() {
            tokio::time::sleep(wait).await;
        }
        loop {
            match self.step().await {
                Ok(Some(event)) => return Ok(event),
                Ok(None) => {}
                Err(err) => {
                    self.wait = Some(self.backoff.next_wait());
                    return Err(err);
                }
            }
        }
    }

    /// One step: an event, nothing yet (a page read, a watch opened or ended), or an error.
    async fn step(&mut self) -> Result<Option<Event<K>>, kube::Error> {
        match std::mem::replace(&mut self.phase, Phase::Empty) {
            Phase::Empty => {
                self.phase = Phase::Paging {
                    objects: VecDeque::new(),
                    next_page: None,
                    version: None,
                };
                Ok(Some(Event::Init))
            }
            Phase::Paging {
                mut objects,
                next_page,
                version,
            } => {
                if let Some(object) = objects.pop_front() {
                    self.phase = Phase::Paging {
                        objects,
                        next_page,
                        version,
                    };
                    return Ok(Some(Event::InitApply(object)));
                }
                if next_page.is_none()
                    && let Some(version) = version
                {
                    self.phase = Phase::Listed { version };
                    return Ok(Some(Event::InitDone));
                }
                // Any version, from the apiserver's cache where it can (kube's default);
                // a page after the first goes on from its token.
                let params = ListParams {
                    field_selector: self.fields.clone(),
                    label_selector: self.labels.clone(),
                    limit: Some(self.page_size),
                    continue_token: next_page,
                    resource_version: Some("0".to_string()),
                    version_match: Some(VersionMatch::NotOlderThan),
                    ..ListParams::default()
                };
                // An error starts the list again (a page token may have expired). The
                // request's future is boxed while it runs (as is the WATCH's below): inline,
                // it would size every watch's task for the whole time it waits for events.
                let request = kube::core::Request::new(&self.url)
                    .list(&params)
                    .map_err(kube::Error::BuildRequest)?;
                let list = Box::pin(self.calls.request::<ObjectList<K>>(request)).await?;
                let version = list.metadata.resource_version.filter(|v| !v.is_empty());
                let next_page = list.metadata.continue_.filter(|c| !c.is_empty());
                if version.is_none() && next_page.is_none() {
                    return Err(no_version());
                }
                self.phase = Phase::Paging {
                    objects: list.items.into(),
                    next_page,
                    version,
                };
                Ok(None)
            }
            Phase::Listed { version } => {
                let selectors = (&self.fields, &self.labels);
                let body = match Box::pin(open(&self.calls, &self.url, selectors, &version)).await {
                    Ok(body) => body,
                    Err(err) => {
                        self.phase = Phase::Listed { version };
                        return Err(err);
                    }
                };
                self.phase = Phase::Watching {
                    version,
                    body,
                    line: Lines::default(),
                };
                Ok(None)
            }
            Phase::Watching {
                version,
                mut body,
                mut line,
            } => {
                if let Some(event) = line.take() {
                    let parsed = parse::<K>(&event);
                    self.phase = Phase::Watching {
                        version,
                        body,
                        line,
                    };
                    return self.event(parsed);
                }
                match tokio::time::timeout(IDLE_TIMEOUT, body.frame()).await {
                    // Ended (by the server's timeout, say), or quiet past it: watch again from
                    // the last version seen.
                    Ok(None) | Err(_) => {
                        self.phase = Phase::Listed { version };
                        Ok(None)
                    }
                    Ok(Some(Err(err))) => {
                        self.phase = Phase::Listed { version };
                        Err(calls::body_error(err))
                    }
                    Ok(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            line.append(&data);
                        }
                        if line.pending() > MAX_WATCH_LINE {
                            self.phase = Phase::Listed { version };
                            return Err(kube::Error::LinesCodecMaxLineLengthExceeded);
                        }
                        self.phase = Phase::Watching {
                            version,
                            body,
                            line,
                        };
                        Ok(None)
                    }
                }
            }
        }
    }

    /// What the watch does with one line's `parsed` event: its event, if any; the watch goes
    /// on from the event's version (a 410 Gone or an object without a version lists again).
    fn event(
        &mut self,
        parsed: Result<WatchEvent<K>, kube::Error>,
    ) -> Result<Option<Event<K>>, kube::Error> {
        let go_on_from = |phase: &mut Phase<K>, v: String| {
            if let Phase::Watching { version, .. } = phase {
                *version = v;
            }
        };
        let (event, version) = match parsed? {
            WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                let version = object.resource_version();
                (Event::Apply(object), version)
            }
            WatchEvent::Deleted(object) => {
                let version = object.resource_version();
                (Event::Delete(object), version)
            }
            WatchEvent::Bookmark(mark) => {
                go_on_from(&mut self.phase, mark.metadata.resource_version);
                return Ok(None);
            }
            WatchEvent::Error(status) => {
                // 410 Gone: the version is too old to watch from; list again.
                if status.code == 410 {
                    self.phase = Phase::Empty;
                }
                return Err(kube::Error::Api(status));
            }
        };
        match version.filter(|v| !v.is_empty()) {
            Some(v) => {
                go_on_from(&mut self.phase, v);
                Ok(Some(event))
            }
            None => {
                self.phase = Phase::Empty;
                Err(no_version())
            }
        }
    }
}

/// One line of a watch: its event, or what it said instead (a `Status`: an error mid-stream).
fn parse<K: DeserializeOwned>(line: &[u8]) -> Result<WatchEvent<K>, kube::Error> {
    serde_json::from_slice::<WatchEvent<K>>(line).map_err(|err| {
        match serde_json::from_slice::<Status>(line) {
            Ok(status) => kube::Error::Api(status.boxed()),
            Err(_) => kube::Error::SerdeError(err),
        }
    })
}

/// Opens a WATCH of what `url` lists from `version`; its body, once the server said yes.
async fn open(
    calls: &Calls,
    url: &str,
    (fields, labels): (&Option<String>, &Option<String>),
    version: &str,
) -> Result<calls::Body, kube::Error> {
    let params = WatchParams {
        field_selector: fields.clone(),
        label_selector: labels.clone(),
        ..WatchParams::default()
    };
    let mut request = kube::core::Request::new(url)
        .watch(&params, version)
        .map_err(kube::Error::BuildRequest)?;
    // As kube: Kubernetes 1.37 may gzip a watch one event per member.
    request.headers_mut().insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    );
    let response = calls.send_ok(request.map(kube::client::Body::from)).await?;
    Ok(response.into_body())
}

/// An object or list without a resourceVersion: nothing to watch from, so list again.
fn no_version() -> kube::Error {
    kube::Error::Api(
        Status::failure(
            "object or list without a resourceVersion",
            "NoResourceVersion",
        )
        .boxed(),
    )
}

/// The bytes of a watch read but not yielded yet: complete lines are taken one by one, and
/// the buffer is freed once nothing is left in it, so an idle watch holds none.
#[derive(Default)]
struct Lines {
    buf: Vec<u8>,
    /// Where the first line not taken starts.
    start: usize,
    /// Bytes after the last newline: the line not complete yet (complete lines waiting to be
    /// taken do not count against the limit).
    run: usize,
}

impl Lines {
    fn append(&mut self, data: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
        self.run = match data.iter().rposition(|b| *b == b'\n') {
            Some(at) => data.len() - at - 1,
            None => self.run + data.len(),
        };
    }

    /// The next complete, non-empty line, without its newline.
    fn take(&mut self) -> Option<Vec<u8>> {
        loop {
            let end = self.start + self.buf[self.start..].iter().position(|b| *b == b'\n')?;
            let line = self.buf[self.start..end].to_vec();
            self.start = end + 1;
            if self.start == self.buf.len() {
                *self = Lines::default();
            }
            if !line.trim_ascii().is_empty() {
                return Some(line);
            }
        }
    }

    /// Bytes of a line not complete yet.
    fn pending(&self) -> usize {
        self.run
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    use super::*;

    type Chunks = Vec<Vec<u8>>;

    /// A client whose server answers each request with the next of `answers` (status, body
    /// in chunks) and records what was asked.
    fn client(answers: Vec<(u16, Chunks)>) -> (Calls, Arc<Mutex<Vec<String>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(Mutex::new(VecDeque::from(answers)));
        let seen = asked.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            seen.lock().unwrap().push(request.uri().to_string());
            let (status, chunks) = answers.lock().unwrap().pop_front().expect("an answer");
            let frames = chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from(c))));
            let body = StreamBody::new(futures::stream::iter(frames));
            async move {
                Ok::<_, Infallible>(http::Response::builder().status(status).body(body).unwrap())
            }
        });
        (Calls::new(service), asked)
    }

    fn map(name: &str, version: &str) -> serde_json::Value {
        json!({"metadata": {"name": name, "resourceVersion": version}})
    }

    fn list(items: &[(&str, &str)], version: &str, next: &str) -> Chunks {
        let items: Vec<_> = items.iter().map(|(n, v)| map(n, v)).collect();
        let body = json!({"kind": "ConfigMapList", "apiVersion": "v1",
            "metadata": {"resourceVersion": version, "continue": next}, "items": items});
        vec![serde_json::to_vec(&body).unwrap()]
    }

    fn line(kind: &str, object: serde_json::Value) -> Vec<u8> {
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
        line.push(b'\n');
        line
    }

    fn name(event: Event<ConfigMap>) -> String {
        match event {
            Event::Init => "init".to_string(),
            Event::InitDone => "done".to_string(),
            Event::InitApply(o) => format!("list {}", o.name_any()),
            Event::Apply(o) => format!("apply {}", o.name_any()),
            Event::Delete(o) => format!("delete {}", o.name_any()),
        }
    }

    #[tokio::test]
    async fn lists_in_pages_then_watches_from_the_last_version_seen() {
        // Events cut anywhere: inside a line, two in one chunk, a bookmark between them.
        let events = [
            line("ADDED", map("c", "11")),
            line(
                "BOOKMARK",
                json!({"kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"resourceVersion": "12"}}),
            ),
            line("MODIFIED", map("c", "13")),
            line("DELETED", map("a", "14")),
        ]
        .concat();
        let chunks = vec![
            events[..7].to_vec(),
            events[7..90].to_vec(),
            events[90..].to_vec(),
        ];
        let (client, asked) = client(vec![
            (200, list(&[("a", "5")], "", "page2")),
            (200, list(&[("b", "6")], "10", "")),
            (200, chunks),
            (200, vec![line("ADDED", map("d", "15"))]),
        ]);
        let mut watch = LeanWatch::<ConfigMap>::new(client, Some("x=y".into()), 1);
        let mut got = Vec::new();
        for _ in 0..8 {
            got.push(name(watch.next().await.unwrap()));
        }
        let expected = [
            "init", "list a", "list b", "done", "apply c", "apply c", "delete a", "apply d",
        ];
        assert_eq!(got, expected);
        let asked = asked.lock().unwrap().clone();
        assert!(
            asked[0].contains("limit=1") && asked[0].contains("fieldSelector=x%3Dy"),
            "{asked:?}"
        );
        assert!(asked[1].contains("continue=page2"), "{asked:?}");
        assert!(
            asked[2].contains("watch=true") && asked[2].contains("resourceVersion=10"),
            "{asked:?}"
        );
        assert!(asked[2].contains("allowWatchBookmarks=true"), "{asked:?}");
        // The first watch ended: the next goes on from the last event's version.
        assert!(asked[3].contains("resourceVersion=14"), "{asked:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn gone_lists_again_and_an_error_answer_is_its_status() {
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "status": "Failure", "reason": "Expired", "code": 410}});
        let mut gone = serde_json::to_vec(&gone).unwrap();
        gone.push(b'\n');
        let forbidden = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Forbidden", "code": 403});
        let (client, asked) = client(vec![
            (200, list(&[], "10", "")),
            (200, vec![gone]),
            (200, list(&[("a", "20")], "21", "")),
            (403, vec![serde_json::to_vec(&forbidden).unwrap()]),
            (200, vec![line("ADDED", map("b", "22"))]),
        ]);
        let mut watch = LeanWatch::<ConfigMap>::new(client, None, 100);
        assert_eq!(name(watch.next().await.unwrap()), "init");
        assert_eq!(name(watch.next().await.unwrap()), "done");
        match watch.next().await {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 410),
            other => panic!("expected 410 Gone, got {:?}", other.map(name)),
        }
        // Gone: listed again (after the wait, paused time).
        assert_eq!(name(watch.next().await.unwrap()), "init");
        assert_eq!(name(watch.next().await.unwrap()), "list a");
        assert_eq!(name(watch.next().await.unwrap()), "done");
        match watch.next().await {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 403),
            other => panic!("expected 403, got {:?}", other.map(name)),
        }
        // Refused: the watch is asked again from the same version, not listed again.
        assert_eq!(name(watch.next().await.unwrap()), "apply b");
        let asked = asked.lock().unwrap().clone();
        assert!(asked[3].contains("resourceVersion=21"), "{asked:?}");
        assert!(
            asked[4].contains("watch=true") && asked[4].contains("resourceVersion=21"),
            "{asked:?}"
        );
    }

    #[test]
    fn lines_are_taken_whole_and_an_idle_watch_holds_no_buffer() {
        let mut lines = Lines::default();
        lines.append(b"{\"a\"");
        assert_eq!(lines.take(), None);
        assert_eq!(lines.pending(), 4);
        lines.append(b":1}\n\n{\"b\":2}\r\n{\"c\"");
        assert_eq!(lines.take().as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(lines.take().as_deref(), Some(&b"{\"b\":2}\r"[..]));
        assert_eq!(lines.take(), None);
        lines.append(b":3}\n");
        assert_eq!(lines.take().as_deref(), Some(&b"{\"c\":3}"[..]));
        assert_eq!(lines.pending(), 0);
        assert_eq!(lines.buf.capacity(), 0, "nothing held between events");
    }

    #[test]
    fn only_the_line_not_complete_counts_against_the_limit() {
        let mut lines = Lines::default();
        let mut big = vec![b'x'; MAX_WATCH_LINE - 1];
        lines.append(&big);
        // The line ends, and the next begins, in one chunk: what waits is one complete line
        // under the limit and two bytes of the next.
        big.clear();
        big.extend_from_slice(b"\nab");
        lines.append(&big);
        assert_eq!(lines.pending(), 2);
        assert_eq!(lines.take().map(|l| l.len()), Some(MAX_WATCH_LINE - 1));
        lines.append(b"c");
        assert_eq!(lines.pending(), 3);
    }

    /// What a watch's next event costs to wait for, inline in the task that waits (every
    /// leaf served has three such tasks): the requests' large futures are boxed while they
    /// run, so a quiet watch's task holds little more than the body it reads and a timer.
    #[tokio::test]
    async fn waiting_for_the_next_event_is_small() {
        let (client, _) = client(Vec::new());
        let mut watch = LeanWatch::<k8s_openapi::api::core::v1::Pod>::new(client, None, 500);
        let next = watch.next();
        // 1,824 bytes with the LIST and WATCH futures inline (a debug build).
        let size = std::mem::size_of_val(&next);
        assert!(size <= 512, "waiting for a watch event takes {size} bytes");
    }
}

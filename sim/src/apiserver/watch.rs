//! Watch streams (`?watch=1`): newline-delimited JSON events in a chunked response, as
//! kube-apiserver sends them.
//!
//! Semantics follow upstream's watch cache: with no resourceVersion or "0" the stream starts
//! with the current state as ADDED events; with a resourceVersion it replays every change after
//! it, or sends one ERROR event carrying a 410 Expired Status when that history is gone;
//! `sendInitialEvents=true` sends the state then a BOOKMARK annotated
//! `k8s.io/initial-events-end`; `allowWatchBookmarks` adds periodic BOOKMARKs; objects entering
//! or leaving a selector appear as ADDED or DELETED; `timeoutSeconds` ends the stream cleanly.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::failure::Failure;
use super::kinds::Kind;
use super::render::Render;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{Change, Event, Store};

/// How often a watch that allows bookmarks gets one: about once a minute, as kube-apiserver's
/// watch cache sends them (k8s.io/apiserver storage/cacher, `defaultBookmarkFrequency`). Every
/// 2 s, as here before, a fleet of watches cost its clients 30 times the CPU a real apiserver
/// makes them spend.
pub const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// Upstream's default watch length when the client names none (its minimum request timeout).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// The longest a watch may last, whatever the client asks.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// One watch request.
pub struct Watch {
    pub kind: &'static Kind,
    /// None: all namespaces (or a cluster-scoped kind).
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// The resourceVersion to resume after; None for "start with the current state".
    pub since: Option<u64>,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
    /// How event objects are rendered (whole, Table, PartialObjectMetadata).
    pub render: Render,
}

impl Watch {
    fn selects(&self, obj: &Value) -> bool {
        let namespace_ok = self.namespace.as_deref().is_none_or(|ns| {
            obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
        });
        namespace_ok
            && self.labels.matches(obj.pointer("/metadata/labels"))
            && self.fields.matches(obj)
    }

    fn wire(&self, kind: &str, object: &Value) -> Bytes {
        let object = match (self.render, kind) {
            (_, "ERROR") | (Render::Table(..), "BOOKMARK") => object.clone(),
            (render, _) => render.one(self.kind, object),
        };
        let mut line = json!({ "type": kind, "object": object }).to_string();
        line.push('\n');
        Bytes::from(line)
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut metadata = json!({ "resourceVersion": rv.to_string(), "creationTimestamp": null });
        if initial_end {
            metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        let object = json!({
            "kind": self.kind.kind,
            "apiVersion": self.kind.api_version(),
            "metadata": metadata,
        });
        self.wire("BOOKMARK", &object)
    }

    /// The wire event for one stored change, if this watch sees it.
    fn translate(&self, event: &Event) -> Option<Bytes> {
        if event.key.group != self.kind.group || event.key.resource != self.kind.resource {
            return None;
        }
        let now = self.selects(&event.object);
        let before = event.previous.as_deref().is_some_and(|p| self.selects(p));
        let kind = match (event.change, before, now) {
            (Change::Added, _, true) => "ADDED",
            (Change::Deleted, true, _) => "DELETED",
            (Change::Modified, true, true) => "MODIFIED",
            (Change::Modified, false, true) => "ADDED",
            (Change::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some(self.wire(kind, &event.object))
    }
}

/// How many watches are open now, by request path and the client's address, for tests that
/// assert who watches what (kube-apiserver counts them in `apiserver_longrunning_requests`).
/// Cheap to clone.
#[derive(Clone, Default)]
pub struct OpenWatches(Arc<std::sync::Mutex<std::collections::HashMap<WatchKey, u64>>>);

/// What a watch is counted under: its path and where its connection came from.
type WatchKey = (String, Option<SocketAddr>);

impl OpenWatches {
    /// Counts one watch of `path` from `peer` open until the returned guard is dropped.
    fn open(&self, path: &str, peer: Option<SocketAddr>) -> OpenWatch {
        let key = (path.to_string(), peer);
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry(key.clone()).or_default() += 1;
        OpenWatch {
            watches: self.clone(),
            key,
        }
    }

    /// Open watches whose path starts with `prefix`.
    pub fn matching(&self, prefix: &str) -> u64 {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .filter(|((p, _), _)| p.starts_with(prefix))
            .map(|(_, n)| n)
            .sum()
    }

    /// The client addresses that hold at least one open watch.
    pub fn peers(&self) -> std::collections::BTreeSet<SocketAddr> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .filter(|(_, n)| **n > 0)
            .filter_map(|((_, peer), _)| *peer)
            .collect()
    }
}

/// One open watch, counted in [`OpenWatches`] while it lives.
struct OpenWatch {
    watches: OpenWatches,
    key: WatchKey,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        let mut map = self.watches.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// Starts the watch of `path` from `peer`, counted in `open` while it streams; the returned body streams
/// until the timeout, the server stopping (`stop`), or the client going away.
pub fn serve(
    store: Store,
    watch: Watch,
    stop: CancellationToken,
    open: &OpenWatches,
    path: &str,
    peer: Option<SocketAddr>,
    bookmark_every: Duration,
) -> Body {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let counted = open.open(path, peer);
    tokio::spawn(async move {
        run(store, Arc::new(watch), stop, tx, bookmark_every).await;
        drop(counted);
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Body::from_stream(stream)
}

async fn run(
    store: Store,
    watch: Arc<Watch>,
    stop: CancellationToken,
    tx: mpsc::Sender<Bytes>,
    bookmark_every: Duration,
) {
    let mut latest = store.subscribe_kind(watch.kind);
    // Capped, so an absurd timeoutSeconds cannot overflow the clock.
    let deadline =
        tokio::time::Instant::now() + watch.timeout.unwrap_or(DEFAULT_TIMEOUT).min(MAX_TIMEOUT);
    let mut cursor = match watch.since.filter(|_| !watch.send_initial_events) {
        Some(rv) => rv,
        None => {
            let (items, rv) = store.list(watch.kind, watch.namespace.as_deref());
            for item in items.iter().filter(|o| watch.selects(o)) {
                if tx.send(watch.wire("ADDED", item)).await.is_err() {
                    return;
                }
            }
            if watch.send_initial_events && tx.send(watch.bookmark(rv, true)).await.is_err() {
                return;
            }
            rv
        }
    };
    let mut bookmark_timer = tokio::time::interval(bookmark_every);
    bookmark_timer.tick().await;
    loop {
        match store.events_since(cursor) {
            Ok((events, rv)) => {
                for event in &events {
                    if let Some(line) = watch.translate(event)
                        && tx.send(line).await.is_err()
                    {
                        return;
                    }
                }
                cursor = rv;
            }
            Err(too_old) => {
                let failure = Failure::gone(format!(
                    "too old resource version: {} ({})",
                    too_old.requested, too_old.oldest
                ));
                let _ = tx.send(watch.wire("ERROR", &failure.status())).await;
                return;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tx.closed() => return,
            _ = tokio::time::sleep_until(deadline) => return,
            changed = latest.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = bookmark_timer.tick(), if watch.bookmarks => {
                if tx.send(watch.bookmark(cursor, false)).await.is_err() {
                    return;
                }
            }
        }
    }
}

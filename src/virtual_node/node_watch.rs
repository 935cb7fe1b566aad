//! One watch of the root's relaylet Nodes, shared by all of this replica's leaf loops.
//!
//! Each leaf's loop must hear at once when its Node is deleted, altered or written by another
//! replica. A watch per Node (`metadata.name=<node>`) on every replica made the root apiserver
//! serve replicas x leaves watches, and at 1,000 leaves one replica's Node watches alone were
//! more streams than its few root connections carry (16 x 80). So each replica watches the
//! Nodes labelled `app.kubernetes.io/managed-by=relaylet` once (every install's, so a Node of
//! another install under a leaf's node name is seen too; a Node that is not relaylet's at all
//! is found by the loop's own read) and hands each loop the events of its Node.
//!
//! A loop's event waits in a slot of one until the loop takes it: a newer event replaces one
//! not yet taken (the loop needs the Node as it is now, not its history), and nothing of a
//! Node is kept once its event is taken. Each loop reads its Node once when it starts
//! ([`Subscription::prime`]): a loop that starts after the shared watch listed would otherwise
//! hear nothing until the Node changes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;

use crate::model::node_ownership::MANAGED_BY_LABEL;
use crate::ops::Backoff;

/// The first and the longest wait between failed reads of a loop's Node at its start.
const PRIME_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
const PRIME_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// What the watch saw of one Node.
#[derive(Debug)]
pub enum NodeEvent {
    /// Created or changed (or listed: the watch started or started again).
    Applied(Box<Node>),
    /// Deleted, or no longer labelled as relaylet's.
    Deleted,
}

/// The Nodes' watch and the loops listening to it. Cheap to clone.
#[derive(Clone, Default)]
pub struct NodeWatch {
    slots: Arc<Mutex<HashMap<String, Arc<Slot>>>>,
}

/// One loop's waiting event, and how many events were put in it so far.
#[derive(Default)]
struct Slot {
    event: Mutex<(u64, Option<NodeEvent>)>,
    ready: Notify,
}

impl Slot {
    fn put(&self, event: NodeEvent) {
        self.put_if(|_| true, event);
    }

    /// Puts `event` if `now(events put so far)`.
    fn put_if(&self, now: impl FnOnce(u64) -> bool, event: NodeEvent) {
        let mut slot = lock(&self.event);
        if now(slot.0) {
            *slot = (slot.0 + 1, Some(event));
            self.ready.notify_one();
        }
    }

    fn take(&self) -> Option<NodeEvent> {
        lock(&self.event).1.take()
    }
}

/// The events of one Node, for its loop; stops listening when dropped.
pub struct Subscription {
    node: String,
    slot: Arc<Slot>,
    watch: NodeWatch,
}

impl Subscription {
    /// The next event of the Node: the newest one since the last taken. Cancel safe: an event
    /// not returned stays for the next call.
    pub async fn next(&self) -> NodeEvent {
        loop {
            if let Some(event) = self.slot.take() {
                return event;
            }
            self.slot.ready.notified().await;
        }
    }

    /// Reads the Node when the loop starts: the Node as read becomes the next event, unless
    /// the watch brought one meanwhile (as new or newer). A missing Node brings none. A failed
    /// read is tried again (waits growing to 10 s) until it answers or the watch has brought
    /// an event: a loop that never learns its Node names this replica would never hand it
    /// back, and its assignee would wait for a live holder forever. One GET per loop start,
    /// where a watch per Node listed once.
    pub async fn prime(&self, root: &Client) {
        let before = lock(&self.slot.event).0;
        let api: Api<Node> = Api::all(root.clone());
        let mut backoff = Backoff::new(PRIME_RETRY_FIRST, PRIME_RETRY_MAX).jittered();
        loop {
            match api.get_opt(&self.node).await {
                Ok(Some(node)) => {
                    return self
                        .slot
                        .put_if(|now| now == before, NodeEvent::Applied(Box::new(node)));
                }
                Ok(None) => return,
                Err(err) => {
                    tracing::debug!(%err, node = %self.node, "reading the virtual node (retrying)")
                }
            }
            if lock(&self.slot.event).0 != before {
                return;
            }
            tokio::time::sleep(backoff.next_wait()).await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut slots = lock(&self.watch.slots);
        if slots
            .get(&self.node)
            .is_some_and(|s| Arc::ptr_eq(s, &self.slot))
        {
            slots.remove(&self.node);
        }
    }
}

impl NodeWatch {
    /// Listens to Node `node`'s events from now on (one listener per Node: a second replaces
    /// the first).
    pub fn subscribe(&self, node: &str) -> Subscription {
        let slot = Arc::new(Slot::default());
        lock(&self.slots).insert(node.to_string(), slot.clone());
        Subscription {
            node: node.to_string(),
            slot,
            watch: self.clone(),
        }
    }

    /// Watches the root's relaylet Nodes until dropped, handing each event to its Node's loop.
    pub async fn run(self, root: Client) {
        let api: Api<Node> = Api::all(root);
        let selector = format!("{}={}", MANAGED_BY_LABEL.0, MANAGED_BY_LABEL.1);
        let mut events = watcher(api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .boxed();
        // Names listed since the watch (re)started: a Node missing from a new listing was
        // deleted while the watch was down.
        let mut listing: Option<HashSet<String>> = None;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listing = Some(HashSet::new()),
                Ok(watcher::Event::InitApply(node)) => {
                    if let (Some(seen), Some(name)) = (listing.as_mut(), node.metadata.name.clone())
                    {
                        seen.insert(name);
                    }
                    self.apply(node);
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(seen) = listing.take() {
                        self.deleted_unless(&seen);
                    }
                }
                Ok(watcher::Event::Apply(node)) => self.apply(node),
                Ok(watcher::Event::Delete(node)) => {
                    if let Some(name) = node.metadata.name.as_deref() {
                        self.send(name, NodeEvent::Deleted);
                    }
                }
                Err(err) => tracing::debug!(%err, "watching the virtual nodes (retrying)"),
            }
        }
    }

    fn apply(&self, node: Node) {
        if let Some(name) = node.metadata.name.clone() {
            self.send(&name, NodeEvent::Applied(Box::new(node)));
        }
    }

    /// Hands `event` to Node `name`'s loop, if one listens.
    fn send(&self, name: &str, event: NodeEvent) {
        let slot = lock(&self.slots).get(name).cloned();
        if let Some(slot) = slot {
            slot.put(event);
        }
    }

    /// Tells every listening loop whose Node is not in `listed` that it is gone.
    fn deleted_unless(&self, listed: &HashSet<String>) {
        let gone: Vec<Arc<Slot>> = lock(&self.slots)
            .iter()
            .filter(|(name, _)| !listed.contains(*name))
            .map(|(_, slot)| slot.clone())
            .collect();
        for slot in gone {
            slot.put(NodeEvent::Deleted);
        }
    }
}

/// The lock, even if a holder panicked (the data is a map and a slot: always consistent).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_string());
        node
    }

    #[tokio::test]
    async fn a_loop_gets_only_its_nodes_newest_event() {
        let watch = NodeWatch::default();
        let a = watch.subscribe("a");
        let b = watch.subscribe("b");
        watch.apply(node("a"));
        watch.send("a", NodeEvent::Deleted);
        watch.apply(node("c"));
        assert!(matches!(a.next().await, NodeEvent::Deleted));
        watch.apply(node("b"));
        match b.next().await {
            NodeEvent::Applied(n) => assert_eq!(n.metadata.name.as_deref(), Some("b")),
            other => panic!("{other:?}"),
        }
        // Taken: nothing waits any more.
        assert!(a.slot.take().is_none());
        assert!(b.slot.take().is_none());
    }

    #[tokio::test]
    async fn a_node_missing_from_a_new_listing_reads_as_deleted() {
        let watch = NodeWatch::default();
        let a = watch.subscribe("a");
        let b = watch.subscribe("b");
        watch.deleted_unless(&HashSet::from(["a".to_string()]));
        assert!(a.slot.take().is_none());
        assert!(matches!(b.next().await, NodeEvent::Deleted));
    }

    #[tokio::test]
    async fn a_dropped_subscription_stops_listening_and_keeps_nothing() {
        let watch = NodeWatch::default();
        let a = watch.subscribe("a");
        drop(a);
        watch.apply(node("a"));
        assert!(lock(&watch.slots).is_empty());
        // A newer listener of the same Node is not removed by an older one's drop.
        let old = watch.subscribe("n");
        let new = watch.subscribe("n");
        drop(old);
        watch.apply(node("n"));
        assert!(matches!(new.next().await, NodeEvent::Applied(_)));
    }

    #[test]
    fn a_read_older_than_a_watch_event_is_not_put() {
        let watch = NodeWatch::default();
        let a = watch.subscribe("a");
        let before = lock(&a.slot.event).0;
        watch.send("a", NodeEvent::Deleted);
        a.slot
            .put_if(|now| now == before, NodeEvent::Applied(Box::new(node("a"))));
        assert!(matches!(a.slot.take(), Some(NodeEvent::Deleted)));
        let before = lock(&a.slot.event).0;
        a.slot
            .put_if(|now| now == before, NodeEvent::Applied(Box::new(node("a"))));
        assert!(matches!(a.slot.take(), Some(NodeEvent::Applied(_))));
    }

    #[tokio::test]
    async fn next_waits_for_an_event_sent_later() {
        let watch = NodeWatch::default();
        let a = watch.subscribe("a");
        let sender = watch.clone();
        let waiting = tokio::spawn(async move { a.next().await });
        tokio::task::yield_now().await;
        sender.send("a", NodeEvent::Deleted);
        assert!(matches!(
            waiting.await.expect("the waiting task"),
            NodeEvent::Deleted
        ));
    }

    /// A loop whose first read of its Node fails reads it again until it answers: the Node
    /// may name this replica, and nothing else would tell the loop (the shared watch listed it
    /// before the loop subscribed).
    #[tokio::test(start_paused = true)]
    async fn a_failed_first_read_is_tried_again_until_it_answers() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let service = tower::service_fn({
            let calls = calls.clone();
            move |_req: http::Request<kube::client::Body>| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    let (code, body) = if n < 3 {
                        (
                            500,
                            serde_json::json!({"kind": "Status", "apiVersion": "v1",
                            "status": "Failure", "reason": "InternalError", "code": 500,
                            "message": "etcd leader changed", "metadata": {}}),
                        )
                    } else {
                        (200, serde_json::to_value(node("relaylet-a")).unwrap())
                    };
                    http::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                        .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
                }
            }
        });
        let root = Client::new(service, "default");
        let watch = NodeWatch::default();
        let sub = watch.subscribe("relaylet-a");
        sub.prime(&root).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert!(matches!(sub.next().await, NodeEvent::Applied(_)));
    }
}

//! The assignment the leader publishes, so that every replica follows one answer.
//!
//! Each replica can compute the assignment itself ([`Assignment::compute`]), but only from its
//! own view: a pod cache that lags makes a live peer look gone, and two replicas whose leaf
//! registries differ for a while (a Secret seen by one first, a rolling upgrade) spread the Nodes
//! differently, so each may believe a Node is the other's and no one serves it. So the leader
//! writes its answer into one ConfigMap (`relaylet-assignment` in relaylet's namespace: one key
//! per replica, its Nodes one per line, readable with `kubectl get -o yaml`), and every replica
//! follows it ([`effective`]) for each Node it names a live replica for. Its own computation is
//! only the fallback: for a Node the leader has not published yet, for one published to a
//! replica gone since, and while the publishing leader is not seen renewing (it died; the next
//! leader publishes once elected). Once faults stop, there is one view.
//!
//! The ConfigMap is written only while this replica leads, each write carrying the version it
//! read; it names its writer (`relaylet.io/leader`), and replicas follow it only while that
//! writer is seen renewing its presence. Every replica, the leader too, acts on a publication
//! once it has stood for `SETTLE`, so all switch together; a write by anyone else is written
//! back by the leader as soon as its watch shows it, well within that, and moves no Node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Assignment, Leadership, Peers};
use crate::model::node_ownership::MANAGED_BY_LABEL;
use crate::ops::Backoff;

/// The ConfigMap the leader publishes the assignment in, in relaylet's own namespace.
pub const ASSIGNMENT_CONFIGMAP: &str = "relaylet-assignment";
/// The annotation naming the replica that wrote it.
const LEADER: &str = "relaylet.io/leader";
/// The annotation counting its writes (for operators: it moves at every change).
const GENERATION: &str = "relaylet.io/generation";
/// The most Nodes read from it: a ConfigMap is at most 1 MiB, which a foreign writer could fill
/// with short names; far more than one install serves.
const MAX_NODES: usize = 20_000;
/// How long one write may take: a leader's term ends within its renew deadline, so a write
/// from an old term must not land much later.
const WRITE_TIMEOUT: Duration = super::leader::RENEW_DEADLINE;
/// How long a publication must stand unchanged before this replica acts on it: far longer
/// than the leader takes to write back a foreign write (one watch event and one write).
const SETTLE: Duration = Duration::from_secs(1);
/// After a failed write, the first and the longest wait before the next.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// The assignment as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The replica that wrote it.
    pub leader: Arc<str>,
    /// How many writes it has seen.
    pub generation: u64,
    pub assignment: Assignment,
}

/// The published assignment as read, and what this replica would publish were it to lead.
/// Cheap to clone.
#[derive(Clone)]
pub struct Publication {
    /// As it stands once it stood for `SETTLE` (what replicas act on).
    seen: watch::Receiver<Option<Arc<Published>>>,
    /// As it is now (what the leader compares with its answer).
    raw: watch::Receiver<Option<Arc<Published>>>,
    offered: Arc<watch::Sender<Option<Arc<Assignment>>>>,
}

impl Publication {
    /// No publication (leader election off: the only replica's own answer is the answer).
    pub fn none() -> Publication {
        let (_tx, seen) = watch::channel(None);
        Publication {
            raw: seen.clone(),
            seen,
            offered: Arc::new(watch::Sender::new(None)),
        }
    }

    /// Reads the published assignment of `namespace` as it changes and, while `leadership`
    /// holds, writes what this replica [`offer`](Self::offer)s there, until `stop` fires.
    pub fn start(
        root: Client,
        namespace: &str,
        me: Arc<str>,
        leadership: Leadership,
        stop: CancellationToken,
    ) -> Publication {
        let api: Api<ConfigMap> = Api::namespaced(root, namespace);
        let (tx, seen) = watch::channel(None);
        let (raw_tx, raw) = watch::channel(None);
        let offered = Arc::new(watch::Sender::new(None));
        let publication = Publication { seen, raw, offered };
        let reading = read(api.clone(), raw_tx, tx);
        let writing = publication.clone().write(api, me, leadership);
        tokio::spawn(async move {
            tokio::select! {
                () = async { tokio::join!(reading, writing); } => {}
                () = stop.cancelled() => {}
            }
        });
        publication
    }

    /// The published assignment as last read.
    pub fn current(&self) -> Option<Arc<Published>> {
        self.seen.borrow().clone()
    }

    /// What this replica would publish while it leads (its own answer, from its view).
    pub fn offer(&self, assignment: &Assignment) {
        self.offered.send_if_modified(|old| {
            let changed = old.as_deref() != Some(assignment);
            if changed {
                *old = Some(Arc::new(assignment.clone()));
            }
            changed
        });
    }

    /// Resolves when the published assignment read changes.
    pub async fn changed(&mut self) {
        if self.seen.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// While leading, keeps the ConfigMap what this replica offers.
    async fn write(self, api: Api<ConfigMap>, me: Arc<str>, mut leadership: Leadership) {
        let mut seen = self.raw.clone();
        let mut offered = self.offered.subscribe();
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
        loop {
            let want = offered.borrow_and_update().clone();
            let published = seen.borrow_and_update().clone();
            let stale = want.as_deref().is_some_and(|want| {
                published
                    .as_deref()
                    .is_none_or(|p| p.leader != me || p.assignment != *want)
            });
            let mut retry = None;
            if let Some(want) = want.filter(|_| stale && leadership.is_leader()) {
                match tokio::time::timeout(WRITE_TIMEOUT, put(&api, &me, &want)).await {
                    Ok(Ok(generation)) => {
                        backoff.reset();
                        tracing::info!(
                            generation,
                            nodes = want.len(),
                            "published the assignment of the virtual nodes"
                        );
                    }
                    Ok(Err(err)) => {
                        tracing::warn!(%err, "publishing the assignment of the virtual nodes failed (retrying)");
                        retry = Some(backoff.next_wait());
                    }
                    Err(_) => {
                        tracing::warn!(
                            "publishing the assignment of the virtual nodes timed out (retrying)"
                        );
                        retry = Some(backoff.next_wait());
                    }
                }
            }
            tokio::select! {
                changed = offered.changed() => if changed.is_err() { return },
                changed = seen.changed() => if changed.is_err() { return },
                _ = leadership.changed() => {}
                () = sleep_or_never(retry) => {}
            }
        }
    }
}

async fn sleep_or_never(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

/// Writes `assignment` as `me`'s over the ConfigMap as it is now (guarded by its version), or
/// creates it; the generation written.
async fn put(api: &Api<ConfigMap>, me: &str, assignment: &Assignment) -> Result<u64, kube::Error> {
    let current = api.get_opt(ASSIGNMENT_CONFIGMAP).await?;
    let generation = current
        .as_ref()
        .and_then(|cm| annotation(cm, GENERATION))
        .and_then(|g| g.parse::<u64>().ok())
        .map_or(1, |g| g.saturating_add(1));
    let mut cm = encode(me, generation, assignment);
    match current {
        Some(old) => {
            cm.metadata.resource_version = old.metadata.resource_version;
            api.replace(ASSIGNMENT_CONFIGMAP, &PostParams::default(), &cm)
                .await?;
        }
        None => {
            api.create(&PostParams::default(), &cm).await?;
        }
    }
    Ok(generation)
}

/// Follows the ConfigMap into `raw` as it comes and into `tx` once each version has stood for
/// `SETTLE` (none while it does not exist or cannot be read as one).
async fn read(
    api: Api<ConfigMap>,
    raw: watch::Sender<Option<Arc<Published>>>,
    tx: watch::Sender<Option<Arc<Published>>>,
) {
    let config =
        watcher::Config::default().fields(&format!("metadata.name={ASSIGNMENT_CONFIGMAP}"));
    follow(watcher(api, config).default_backoff().boxed(), raw, tx).await;
}

/// [`read`]'s work on the watch's events.
async fn follow(
    mut events: impl futures::Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Unpin,
    raw: watch::Sender<Option<Arc<Published>>>,
    tx: watch::Sender<Option<Arc<Published>>>,
) {
    let mut pending: Option<Option<Arc<Published>>> = None;
    // What the list in progress found (`Some(None)`: nothing yet).
    let mut relisted: Option<Option<Arc<Published>>> = None;
    let settle = tokio::time::sleep(SETTLE);
    tokio::pin!(settle);
    loop {
        let event = tokio::select! {
            event = events.next() => match event {
                Some(event) => event,
                None => return,
            },
            () = &mut settle, if pending.is_some() => {
                send_if_new(&tx, pending.take().flatten());
                continue;
            }
        };
        let published = match event {
            Ok(watcher::Event::Apply(cm)) => readable(&cm),
            Ok(watcher::Event::Delete(_)) => None,
            // A (re)list stands for itself: a ConfigMap deleted while the watch was down is
            // gone once the list says so, not kept as last seen.
            Ok(watcher::Event::Init) => {
                relisted = Some(None);
                continue;
            }
            Ok(watcher::Event::InitApply(cm)) => {
                relisted = Some(readable(&cm));
                continue;
            }
            Ok(watcher::Event::InitDone) => relisted.take().flatten(),
            Err(err) => {
                tracing::debug!(%err, "watching the published assignment (retrying)");
                continue;
            }
        };
        send_if_new(&raw, published.clone());
        pending = Some(published);
        settle.as_mut().reset(tokio::time::Instant::now() + SETTLE);
    }
}

/// The publication `cm` holds, if it can be read as one.
fn readable(cm: &ConfigMap) -> Option<Arc<Published>> {
    match decode(cm) {
        Ok(published) => Some(Arc::new(published)),
        Err(why) => {
            tracing::warn!(configmap = ASSIGNMENT_CONFIGMAP, %why, "the published assignment cannot be read: each replica follows its own until the leader writes it again");
            None
        }
    }
}

fn send_if_new(tx: &watch::Sender<Option<Arc<Published>>>, published: Option<Arc<Published>>) {
    tx.send_if_modified(|old| {
        let changed = *old != published;
        if changed {
            *old = published;
        }
        changed
    });
}

/// The ConfigMap publishing `assignment` as `me`'s `generation`th write.
fn encode(me: &str, generation: u64, assignment: &Assignment) -> ConfigMap {
    let mut data: BTreeMap<String, String> = BTreeMap::new();
    for (node, replica) in assignment.iter() {
        let nodes = data.entry(replica.to_string()).or_default();
        nodes.push_str(node);
        nodes.push('\n');
    }
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(ASSIGNMENT_CONFIGMAP.into()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.0.into(),
                MANAGED_BY_LABEL.1.into(),
            )])),
            annotations: Some(BTreeMap::from([
                (LEADER.into(), me.into()),
                (GENERATION.into(), generation.to_string()),
            ])),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// The assignment a ConfigMap publishes, or why it publishes none.
fn decode(cm: &ConfigMap) -> Result<Published, String> {
    let leader = annotation(cm, LEADER).ok_or(format!("no {LEADER} annotation"))?;
    let generation = annotation(cm, GENERATION)
        .and_then(|g| g.parse().ok())
        .ok_or(format!("no number in its {GENERATION} annotation"))?;
    let mut pairs = Vec::new();
    for (replica, nodes) in cm.data.iter().flatten() {
        for node in nodes.lines().filter(|n| !n.is_empty()) {
            if pairs.len() == MAX_NODES {
                return Err(format!("more than {MAX_NODES} nodes"));
            }
            if !is_name(node) || !is_name(replica) {
                return Err(format!(
                    "{node:?} -> {replica:?} is not a node and a replica name"
                ));
            }
            pairs.push((Arc::from(node), Arc::from(replica.as_str())));
        }
    }
    Ok(Published {
        leader: Arc::from(leader),
        generation,
        assignment: pairs.into_iter().collect(),
    })
}

fn annotation<'a>(cm: &'a ConfigMap, key: &str) -> Option<&'a str> {
    cm.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// A Kubernetes object name (DNS subdomain): Node and Pod names are.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Which replica serves each of `local`'s Nodes here: the published one while the publication
/// is followed (its writer is this replica, or is seen renewing), also where
/// this replica's own view differs (a lagging cache of relaylet's pods must not make it take a
/// live peer's Nodes; a replica the leader sees gone, it publishes without at once); otherwise,
/// and for a Node the leader has not published yet, this replica's own answer.
pub fn effective(
    published: Option<&Published>,
    local: &Assignment,
    me: &str,
    peers: &Peers,
) -> Assignment {
    let followed = published.filter(|p| &*p.leader == me || peers.is_renewing(&p.leader));
    let Some(published) = followed else {
        return local.clone();
    };
    local
        .iter()
        .map(|(node, own)| {
            let replica = published.assignment.replica_of(node).unwrap_or(own);
            (Arc::from(node), Arc::from(replica))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(pairs: &[(&str, &str)]) -> Assignment {
        pairs
            .iter()
            .map(|(n, r)| (Arc::from(*n), Arc::from(*r)))
            .collect()
    }

    /// A ConfigMap deleted while the watch was down: the relist that finds nothing withdraws
    /// the publication (before, the last one seen was followed until the next write).
    #[tokio::test(start_paused = true)]
    async fn a_relist_that_finds_nothing_withdraws_the_publication() {
        let cm = encode("relaylet-0", 3, &assignment(&[("n1", "relaylet-0")]));
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(cm)),
            Ok(watcher::Event::InitDone),
        ])
        .chain(futures::stream::pending());
        let (raw, tx) = (watch::Sender::new(None), watch::Sender::new(None));
        let mut seen = tx.subscribe();
        let task = tokio::spawn(follow(events.boxed(), raw.clone(), tx.clone()));
        tokio::time::timeout(Duration::from_secs(60), seen.changed())
            .await
            .expect("the publication is followed")
            .unwrap();
        assert_eq!(seen.borrow().as_ref().map(|p| p.generation), Some(3));
        task.abort();

        // The watch restarts; the ConfigMap is gone.
        let events =
            futures::stream::iter(vec![Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
                .chain(futures::stream::pending());
        let task = tokio::spawn(follow(events.boxed(), raw.clone(), tx.clone()));
        tokio::time::timeout(Duration::from_secs(60), seen.changed())
            .await
            .expect("the deleted publication is still followed")
            .unwrap();
        assert!(seen.borrow().is_none());
        assert!(raw.borrow().is_none());
        task.abort();
    }

    #[test]
    fn what_is_written_reads_back_the_same() {
        let a = assignment(&[("leaf-1", "r-a"), ("leaf-2", "r-b"), ("leaf-3", "r-a")]);
        let cm = encode("r-a", 7, &a);
        assert_eq!(
            cm.data
                .as_ref()
                .and_then(|d| d.get("r-a"))
                .map(String::as_str),
            Some("leaf-1\nleaf-3\n"),
            "one key per replica, its nodes one per line"
        );
        let back = decode(&cm).expect("decodes");
        assert_eq!(&*back.leader, "r-a");
        assert_eq!(back.generation, 7);
        assert_eq!(back.assignment, a);
    }

    #[test]
    fn a_configmap_that_is_not_a_publication_is_refused() {
        let a = assignment(&[("leaf-1", "r-a")]);
        let mut no_leader = encode("r-a", 1, &a);
        no_leader.metadata.annotations = None;
        assert!(decode(&no_leader).is_err());
        let mut bad_node = encode("r-a", 1, &a);
        bad_node.data = Some(BTreeMap::from([("r-a".into(), "Leaf 1\n".into())]));
        assert!(decode(&bad_node).is_err());
        let mut too_many = encode("r-a", 1, &a);
        let names: String = (0..=MAX_NODES).map(|i| format!("n{i}\n")).collect();
        too_many.data = Some(BTreeMap::from([("r-a".into(), names)]));
        assert!(decode(&too_many).is_err());
    }

    #[test]
    fn the_published_answer_wins_while_its_writer_is_alive() {
        let local = assignment(&[("leaf-1", "me"), ("leaf-2", "b"), ("leaf-3", "me")]);
        let published = Published {
            leader: "b".into(),
            generation: 3,
            assignment: assignment(&[("leaf-1", "b"), ("leaf-2", "me"), ("leaf-3", "gone")]),
        };
        let peers = Peers::seen(&["b"], &[]);
        let got = effective(Some(&published), &local, "me", &peers);
        assert_eq!(got.replica_of("leaf-1"), Some("b"), "published");
        assert_eq!(got.replica_of("leaf-2"), Some("me"), "published");
        assert_eq!(
            got.replica_of("leaf-3"),
            Some("gone"),
            "published to a replica this one does not see: the leader's view wins"
        );

        // A Node the leader has not published: its own answer.
        let more = assignment(&[("leaf-1", "me"), ("leaf-4", "me")]);
        let got = effective(Some(&published), &more, "me", &peers);
        assert_eq!(got.replica_of("leaf-4"), Some("me"));
        assert_eq!(got.len(), 2, "only the Nodes this replica knows");

        // Its writer not seen renewing (dead): not followed.
        let alone = Peers::seen(&[], &["b"]);
        let got = effective(Some(&published), &local, "me", &alone);
        assert_eq!(got, local);

        // Written by this replica (leading, or when it led: until the next leader writes).
        let mine = Published {
            leader: "me".into(),
            ..published.clone()
        };
        let got = effective(Some(&mine), &local, "me", &alone);
        assert_eq!(got.replica_of("leaf-1"), Some("b"));
    }
}

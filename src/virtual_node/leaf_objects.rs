//! One watch of one kind of leaf object (its pods, its nodes), kept within bounds: the compact
//! records a [`Kept`] makes of them, never more than a set number per leaf.
//!
//! A leaf is not trusted: it may hold (or claim to hold) more objects than relaylet should keep,
//! or send an answer past relaylet's read limits (`kube_client::read_limits`). Either way this watch is
//! dropped and what it held is freed; the watch tries again later, with a backoff of its own
//! (30 s, doubling up to 10 min) so a leaf that stays too large costs one list now and then.
//! Meanwhile [`WatchState::Dropped`] says why in a few words, which the leaf's virtual Node shows
//! (`LeafTooLarge`), and the metric `relaylet_leaf_limit_exceeded_total` counts it. Nothing here
//! touches another leaf.
//!
//! Lists are paginated (each kind's [`Kept::PAGE_SIZE`]), so a list page is a small part of the
//! read limit on one answer. A relist builds the records anew beside the old ones and swaps them
//! in when complete, stopping as soon as it passes the bound: at most twice the bound is held.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::kube_client::Calls;
use crate::kube_client::LeanWatch;
use crate::kube_client::OverLimit;
use crate::ops::{Backoff, Metrics};

/// The first wait before a dropped watch tries again.
const FIRST_RETRY: Duration = Duration::from_secs(30);
/// The longest wait; a watch that stayed within bounds this long starts again from the first.
const MAX_RETRY: Duration = Duration::from_secs(600);

/// The records kept of one kind of leaf object.
pub trait Kept: Default + Send + Sync + 'static {
    type Object: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;
    /// The kind in messages and the metric's `limit` label (`pods`, `nodes`).
    const WHAT: &'static str;
    /// The env var that sets the bound, named in messages.
    const BOUND_VAR: &'static str;
    /// Objects per LIST page.
    const PAGE_SIZE: u32;
    /// How many objects are kept.
    fn count(&self) -> usize;
    /// Keeps `object` (added or changed).
    fn apply(&mut self, object: &Self::Object);
    /// Forgets `object`.
    fn delete(&mut self, object: &Self::Object);
    /// Gives memory back when little of it is used (after deletes and relists).
    fn tidy(&mut self) {}
}

/// Where a bounded watch stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchState {
    /// Not listed yet.
    Listing,
    /// Listed, and watched since.
    Listed,
    /// Dropped, and nothing kept: why, in a few words (retried later).
    Dropped(String),
}

/// Why a watch was dropped.
enum Over {
    /// The leaf held more objects than the bound.
    Count,
    /// An answer went over a read limit (counted where it was read).
    Read(OverLimit),
}

/// Which leaf a watch belongs to, its bound, and where overflows are counted.
#[derive(Clone)]
pub struct Bound {
    pub leaf: String,
    pub max: usize,
    pub metrics: Metrics,
}

/// A live, bounded set of records of one kind of leaf object; its watch stops when this is
/// dropped.
pub struct LeafObjects<K: Kept> {
    kept: Arc<RwLock<K>>,
    state: watch::Receiver<WatchState>,
    task: JoinHandle<()>,
}

impl<K: Kept> LeafObjects<K> {
    /// Starts watching every object of its kind on the cluster `client` reaches, within `bound`.
    pub fn start(client: Calls, bound: Bound) -> LeafObjects<K> {
        let kept = Arc::new(RwLock::new(K::default()));
        let (state_tx, state) = watch::channel(WatchState::Listing);
        let task = tokio::spawn(run(client, kept.clone(), state_tx, bound));
        LeafObjects { kept, state, task }
    }

    /// `f` of the records kept now (read under a lock: keep `f` short).
    pub fn read<T>(&self, f: impl FnOnce(&K) -> T) -> T {
        f(&self.kept.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Waits until the objects have been listed once, or the watch was dropped; the state then.
    pub async fn settled(&self) -> WatchState {
        let mut state = self.state.clone();
        match state.wait_for(|s| *s != WatchState::Listing).await {
            Ok(s) => s.clone(),
            // The task ended, which it only does when aborted.
            Err(_) => WatchState::Dropped(format!("the leaf {} watch stopped", K::WHAT)),
        }
    }
}

impl<K: Kept> Drop for LeafObjects<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches until dropped; after each overflow frees the records, says why, waits, and starts
/// over.
async fn run<K: Kept>(
    client: Calls,
    kept: Arc<RwLock<K>>,
    state: watch::Sender<WatchState>,
    bound: Bound,
) {
    let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
    loop {
        let (over, listed_at) = watch_until_over(&client, &kept, &state, bound.max).await;
        *kept.write().unwrap_or_else(|e| e.into_inner()) = K::default();
        crate::ops::memory::decoded();
        if listed_at.is_some_and(|at| at.elapsed() >= MAX_RETRY) {
            backoff.reset();
        }
        let retry = backoff.next_wait();
        let why = match over {
            Over::Count => {
                bound.metrics.leaf_limit_exceeded(&bound.leaf, K::WHAT);
                format!(
                    "leaf cluster has more than {} {} ({}); relaylet stopped watching its {} and tries again in {}s",
                    bound.max,
                    K::WHAT,
                    K::BOUND_VAR,
                    K::WHAT,
                    retry.as_secs()
                )
            }
            Over::Read(over) => format!(
                "watching leaf {}: {over}; relaylet stopped watching its {} and tries again in {}s",
                K::WHAT,
                K::WHAT,
                retry.as_secs()
            ),
        };
        tracing::warn!(leaf = %bound.leaf, what = K::WHAT, "{why}");
        state.send_replace(WatchState::Dropped(why));
        tokio::time::sleep(retry).await;
    }
}

/// Runs one watch until the leaf goes past a bound: why, and since when it had been listed.
async fn watch_until_over<K: Kept>(
    client: &Calls,
    kept: &RwLock<K>,
    state: &watch::Sender<WatchState>,
    max: usize,
) -> (Over, Option<Instant>) {
    let mut events = LeanWatch::<K::Object>::new(client.clone(), None, K::PAGE_SIZE);
    // A relist builds the records anew beside the old ones, then swaps them in.
    let mut relisting: Option<K> = None;
    let mut listed_at = None;
    loop {
        let event = events.next().await;
        crate::ops::memory::decoded();
        match event {
            Ok(watcher::Event::Init) => relisting = Some(K::default()),
            Ok(watcher::Event::InitApply(object)) => {
                if let Some(fresh) = relisting.as_mut() {
                    fresh.apply(&object);
                    if fresh.count() > max {
                        return (Over::Count, listed_at);
                    }
                }
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(fresh) = relisting.take() {
                    let mut kept = kept.write().unwrap_or_else(|e| e.into_inner());
                    *kept = fresh;
                    kept.tidy();
                }
                listed_at.get_or_insert_with(Instant::now);
                state.send_replace(WatchState::Listed);
            }
            Ok(watcher::Event::Apply(object)) => {
                let mut kept = kept.write().unwrap_or_else(|e| e.into_inner());
                kept.apply(&object);
                if kept.count() > max {
                    return (Over::Count, listed_at);
                }
            }
            Ok(watcher::Event::Delete(object)) => {
                let mut kept = kept.write().unwrap_or_else(|e| e.into_inner());
                kept.delete(&object);
                kept.tidy();
            }
            Err(err) => {
                if let Some(over) = OverLimit::find(&err) {
                    return (Over::Read(over), listed_at);
                }
                // The leaf's text, if any, quoted short once.
                let err = crate::leaf::error_chain(&err);
                tracing::debug!(%err, what = K::WHAT, "leaf watch error (retrying)");
            }
        }
    }
}

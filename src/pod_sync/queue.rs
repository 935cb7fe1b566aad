//! The work queue of one leaf's pods, as client-go's: a key is queued at most once, a key being
//! worked on is never handed to a second worker (a change meanwhile queues it again when the
//! first is done), and a key can be queued for later (a coalesced status write, a retry).

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// A queue of keys. Cheap to clone.
pub struct Queue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Queue<K> {
    fn clone(&self) -> Self {
        Queue {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K> {
    state: Mutex<State<K>>,
    ready: Notify,
}

struct State<K> {
    /// Waiting to be worked on, in order.
    order: VecDeque<K>,
    /// What `order` holds.
    queued: HashSet<K>,
    /// Being worked on.
    working: HashSet<K>,
    /// Added again while being worked on: queued once the work is done.
    again: HashSet<K>,
}

impl<K: Eq + Hash> State<K> {
    /// Once a burst is worked off, gives back what it grew (a thousand pods at once would
    /// otherwise keep room for a thousand keys in each of the four, for good).
    fn shrink_if_idle(&mut self) {
        if self.order.is_empty() && self.working.is_empty() && self.again.is_empty() {
            self.order.shrink_to(IDLE_ROOM);
            self.queued.shrink_to(IDLE_ROOM);
            self.working.shrink_to(IDLE_ROOM);
            self.again.shrink_to(IDLE_ROOM);
        }
    }
}

/// The room an idle queue keeps.
const IDLE_ROOM: usize = 16;

impl<K: Clone + Eq + Hash + Send + 'static> Default for Queue<K> {
    fn default() -> Self {
        Queue {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    order: VecDeque::new(),
                    queued: HashSet::new(),
                    working: HashSet::new(),
                    again: HashSet::new(),
                }),
                ready: Notify::new(),
            }),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Queue<K> {
    /// Queues `key` (once; a key being worked on is queued again when its work is done).
    pub fn add(&self, key: K) {
        let mut state = self.lock();
        if state.working.contains(&key) {
            state.again.insert(key);
            return;
        }
        if state.queued.insert(key.clone()) {
            state.order.push_back(key);
            drop(state);
            self.inner.ready.notify_one();
        }
    }

    /// Queues `key` after `delay`, from a task of its own.
    pub fn add_after(&self, key: K, delay: Duration) {
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(key);
        });
    }

    /// The next key to work on, waiting for one; call [`Queue::done`] with it afterwards.
    pub async fn next(&self) -> K {
        loop {
            let ready = self.inner.ready.notified();
            {
                let mut state = self.lock();
                if let Some(key) = state.order.pop_front() {
                    state.queued.remove(&key);
                    state.working.insert(key.clone());
                    if !state.order.is_empty() {
                        // Another worker may take the next one.
                        self.inner.ready.notify_one();
                    }
                    return key;
                }
            }
            ready.await;
        }
    }

    /// The work on `key` is done: queued again if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let again = {
            let mut state = self.lock();
            state.working.remove(key);
            let again = state.again.remove(key);
            state.shrink_if_idle();
            again
        };
        if again {
            self.add(key.clone());
        }
    }

    /// Whether no key waits and none is being worked on.
    pub fn idle(&self) -> bool {
        let state = self.lock();
        state.order.is_empty() && state.working.is_empty()
    }

    /// How many keys wait.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_burst_worked_off_gives_its_room_back() {
        let q: Queue<u32> = Queue::default();
        for key in 0..1000 {
            q.add(key);
        }
        let room = |q: &Queue<u32>| {
            let state = q.lock();
            state.order.capacity() + state.queued.capacity() + state.working.capacity()
        };
        assert!(room(&q) >= 2000);
        for _ in 0..1000 {
            let key = q.next().await;
            q.done(&key);
        }
        assert!(q.idle());
        assert!(room(&q) <= 3 * 2 * IDLE_ROOM, "{}", room(&q));
    }

    #[tokio::test]
    async fn a_key_is_queued_once_and_worked_on_by_one_worker() {
        let q: Queue<&str> = Queue::default();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        let first = q.next().await;
        assert_eq!(first, "a");
        // Added while being worked on: not handed out again until done.
        q.add("a");
        assert_eq!(q.next().await, "b");
        assert_eq!(q.len(), 0);
        q.done(&"b");
        q.done(&"a");
        assert_eq!(q.next().await, "a");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_can_wait_before_it_is_queued() {
        let q: Queue<&str> = Queue::default();
        q.add_after("later", Duration::from_secs(1));
        tokio::task::yield_now().await;
        assert_eq!(q.len(), 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.next().await, "later");
    }
}

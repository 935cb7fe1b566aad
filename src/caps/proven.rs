//! Which certificate callers have proven themselves lately: identities one of whose calls was
//! authorized recently, so that their next connections get the large budget at once (see
//! `limits`). A small map with expiry, never cleared whole: when full, the entries closest to
//! expiring make room. Concurrent connections of an identity not known yet share one check
//! ([`ProvenCallers::prove`]), so a burst of them costs the root apiserver one review, not one
//! each.
//!
//! An identity is a certificate's user and groups (what authorization is decided on), kept as a
//! SHA-256 digest so that every entry has the same small size.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// How long an identity stays proven after its last authorized call.
pub const PROVEN_TTL: Duration = Duration::from_secs(600);
/// Most identities remembered. Only holders of a certificate of the root client CA that the
/// root's RBAC allows something can be proven, so this is far more than a cluster has.
pub const PROVEN_CAPACITY: usize = 1024;

/// A certificate caller's user and groups, digested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity([u8; 32]);

impl Identity {
    /// The identity of `user` in `groups` (in the order the certificate lists them).
    pub fn of(user: &str, groups: &[String]) -> Identity {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        // Lengths first, so that no two (user, groups) lists share a digest input.
        for part in std::iter::once(user).chain(groups.iter().map(String::as_str)) {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part.as_bytes());
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        Identity(out)
    }
}

/// The identities proven lately, and the checks in flight.
pub struct ProvenCallers {
    capacity: usize,
    ttl: Duration,
    /// Identity → when it stops being proven.
    recent: Mutex<HashMap<Identity, Instant>>,
    /// Identity → the answer of its check in flight (`None` until it is known).
    checks: Mutex<HashMap<Identity, watch::Receiver<Option<bool>>>>,
}

impl Default for ProvenCallers {
    fn default() -> Self {
        ProvenCallers::new(PROVEN_CAPACITY, PROVEN_TTL)
    }
}

impl ProvenCallers {
    pub fn new(capacity: usize, ttl: Duration) -> ProvenCallers {
        ProvenCallers {
            capacity: capacity.max(1),
            ttl,
            recent: Mutex::new(HashMap::new()),
            checks: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `who` had a call authorized within the last [`PROVEN_TTL`].
    pub fn is_proven(&self, who: &Identity) -> bool {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.get(who).is_some_and(|until| *until > Instant::now())
    }

    /// `who` has just had a call authorized.
    pub fn mark(&self, who: Identity) {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if !recent.contains_key(&who) && recent.len() >= self.capacity {
            recent.retain(|_, until| *until > now);
            // Still full: the entry closest to expiring (the least recently proven) goes.
            if recent.len() >= self.capacity
                && let Some(oldest) = recent
                    .iter()
                    .min_by_key(|(_, until)| **until)
                    .map(|(k, _)| *k)
            {
                recent.remove(&oldest);
            }
        }
        recent.insert(who, now + self.ttl);
    }

    /// Whether `who` is proven: known already, or `check` says so now (and it is then marked).
    /// Calls for one identity while its check runs wait for that check instead of making their
    /// own; `check` must end by itself (the caller bounds it with a timeout). A check that is
    /// dropped unfinished counts as a no for those waiting on it.
    pub async fn prove<F>(&self, who: Identity, check: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = bool>,
    {
        if self.is_proven(&who) {
            return true;
        }
        let waiting = {
            let mut checks = self.checks.lock().unwrap_or_else(|e| e.into_inner());
            match checks.get(&who) {
                Some(answer) => Err(answer.clone()),
                None => {
                    let (tx, rx) = watch::channel(None);
                    checks.insert(who, rx);
                    Ok(tx)
                }
            }
        };
        match waiting {
            Ok(tx) => {
                // Removes the entry however this ends, so a cancelled check does not stay.
                let _entry = CheckEntry {
                    checks: &self.checks,
                    who,
                };
                let proven = check().await;
                if proven {
                    self.mark(who);
                }
                let _ = tx.send(Some(proven));
                proven
            }
            Err(mut answer) => answer
                .wait_for(Option::is_some)
                .await
                .map(|v| *v == Some(true))
                .unwrap_or(false),
        }
    }

    /// Identities remembered now (expired ones included until they are swept).
    pub fn len(&self) -> usize {
        self.recent.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A check in flight's entry, removed when the check ends or is dropped.
struct CheckEntry<'a> {
    checks: &'a Mutex<HashMap<Identity, watch::Receiver<Option<bool>>>>,
    who: Identity,
}

impl Drop for CheckEntry<'_> {
    fn drop(&mut self) {
        self.checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.who);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn id(user: &str) -> Identity {
        Identity::of(user, &["system:authenticated".to_string()])
    }

    #[test]
    fn identities_differ_by_user_and_groups() {
        let groups = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            Identity::of("a", &groups(&["b"])),
            Identity::of("a", &groups(&["b"]))
        );
        assert_ne!(
            Identity::of("a", &groups(&["b"])),
            Identity::of("a", &groups(&[]))
        );
        assert_ne!(
            Identity::of("ab", &groups(&[])),
            Identity::of("a", &groups(&["b"]))
        );
    }

    #[test]
    fn proven_identities_expire_and_stay_bounded() {
        let proven = ProvenCallers::new(3, Duration::from_secs(60));
        assert!(!proven.is_proven(&id("apiserver")));
        proven.mark(id("apiserver"));
        assert!(proven.is_proven(&id("apiserver")));
        for user in ["b", "c", "d", "e"] {
            proven.mark(id(user));
        }
        assert_eq!(proven.len(), 3);
        // The least recently proven made room; the latest are kept.
        assert!(!proven.is_proven(&id("apiserver")));
        assert!(proven.is_proven(&id("e")));

        let gone = ProvenCallers::new(3, Duration::ZERO);
        gone.mark(id("apiserver"));
        assert!(!gone.is_proven(&id("apiserver")));
    }

    #[tokio::test]
    async fn concurrent_connections_share_one_check() {
        let proven = Arc::new(ProvenCallers::default());
        let checks = Arc::new(AtomicUsize::new(0));
        let (release, gate) = watch::channel(false);
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let (proven, checks, mut gate) = (proven.clone(), checks.clone(), gate.clone());
                tokio::spawn(async move {
                    proven
                        .prove(id("apiserver"), || async move {
                            checks.fetch_add(1, Ordering::SeqCst);
                            let _ = gate.wait_for(|open| *open).await;
                            true
                        })
                        .await
                })
            })
            .collect();
        // Let every task reach its wait before the one check answers.
        while proven.checks.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        release.send(true).unwrap();
        for task in tasks {
            assert!(task.await.unwrap());
        }
        assert_eq!(checks.load(Ordering::SeqCst), 1);
        assert!(proven.is_proven(&id("apiserver")));
        assert!(proven.checks.lock().unwrap().is_empty());
        // Known now: no further check.
        assert!(proven.prove(id("apiserver"), || async { false }).await);
    }

    #[tokio::test]
    async fn a_refused_or_abandoned_check_proves_nothing() {
        let proven = ProvenCallers::default();
        assert!(!proven.prove(id("worker"), || async { false }).await);
        assert!(!proven.is_proven(&id("worker")));
        // A check dropped unfinished leaves no entry behind.
        let pending = proven.prove(id("worker"), std::future::pending::<bool>);
        let _ = tokio::time::timeout(Duration::from_millis(10), pending).await;
        assert!(proven.checks.lock().unwrap().is_empty());
    }
}

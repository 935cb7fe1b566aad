//! Whether this replica leads (or, for a presence Lease, is present) *now*: a term with a
//! deadline on the monotonic clock.
//!
//! The election publishes a term when a round ends, but a round can hang (a black-holed root
//! connection) and a process can be paused (SIGSTOP, a starved node) past its deadline. So a
//! term carries the instant it ends (its last renewal's start plus `RENEW_DEADLINE`), and every
//! reader checks it where it acts: past the deadline, [`Leadership::is_leader`] says no even
//! before the election task has run again. Peers time a Lease from when they *saw* its change,
//! which is after the renewal's start, so the holder's deadline always comes first.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

/// What the election last published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Term {
    pub(super) leading: bool,
    /// When the term ends unless renewed; `None`: it does not end (no election).
    pub(super) until: Option<Instant>,
    /// When a fresh term starts to count (`leader::FRESH_TERM_WAIT`); `None`: at once.
    pub(super) from: Option<Instant>,
}

impl Term {
    /// Whether the term holds at `now`.
    fn holds(&self, now: Instant) -> bool {
        self.leading
            && self.from.is_none_or(|from| from <= now)
            && self.until.is_none_or(|until| now < until)
    }

    /// The next instant at which `holds` changes by itself, if any.
    fn turns(&self, now: Instant) -> Option<Instant> {
        if !self.leading {
            return None;
        }
        match self.from {
            Some(from) if now < from => Some(from),
            _ => self.until.filter(|until| now < *until),
        }
    }
}

/// Whether this replica leads now. Cheap to clone.
#[derive(Clone)]
pub struct Leadership {
    term: watch::Receiver<Term>,
    /// Holds the sender of a fixed leadership, so the value stays readable.
    _fixed: Option<Arc<watch::Sender<Term>>>,
}

impl Leadership {
    /// Always the leader (single replica, `LEADER_ELECT=false`, tests).
    pub fn always() -> Leadership {
        let (tx, rx) = watch::channel(Term {
            leading: true,
            until: None,
            from: None,
        });
        Leadership {
            term: rx,
            _fixed: Some(Arc::new(tx)),
        }
    }

    /// The only replica (`LEADER_ELECT=false`), leading once `eligible` resolves.
    pub fn once(eligible: impl std::future::Future<Output = ()> + Send + 'static) -> Leadership {
        let (tx, rx) = watch::channel(Term::default());
        let tx = Arc::new(tx);
        tokio::spawn({
            let tx = tx.clone();
            async move {
                eligible.await;
                tx.send_replace(Term {
                    leading: true,
                    until: None,
                    from: None,
                });
            }
        });
        Leadership {
            term: rx,
            _fixed: Some(tx),
        }
    }

    /// A leadership following the terms an election sends on `tx`.
    pub(super) fn elected() -> (watch::Sender<Term>, Leadership) {
        let (tx, rx) = watch::channel(Term::default());
        (
            tx,
            Leadership {
                term: rx,
                _fixed: None,
            },
        )
    }

    /// Whether this replica leads at this instant (its term published and not past its
    /// deadline).
    pub fn is_leader(&self) -> bool {
        self.term.borrow().holds(Instant::now())
    }

    /// Resolves when leadership changes (a term won or lost, or the current one reaching its
    /// deadline), with the new value; a renewal that changes nothing wakes no one. Never
    /// resolves once the election has ended and the value is final, so callers can select on
    /// it in a loop without spinning.
    pub async fn changed(&mut self) -> bool {
        let before = self.is_leader();
        loop {
            let term = *self.term.borrow_and_update();
            let deadline = term.turns(Instant::now());
            let news = async {
                if self.term.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            match deadline {
                Some(at) => tokio::select! {
                    _ = news => {}
                    _ = tokio::time::sleep_until(at) => {}
                },
                None => news.await,
            }
            let now = self.is_leader();
            if now != before {
                return now;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A term past its deadline does not hold, even when nothing has published since (the
    /// election's round hangs, or the process was paused): checked where it acts.
    #[tokio::test(start_paused = true)]
    async fn a_term_ends_at_its_deadline_without_a_new_one() {
        let (tx, leadership) = Leadership::elected();
        let until = Instant::now() + Duration::from_secs(7);
        tx.send_replace(Term {
            leading: true,
            until: Some(until),
            from: None,
        });
        assert!(leadership.is_leader());
        tokio::time::advance(Duration::from_secs(7)).await;
        assert!(!leadership.is_leader());
        drop(tx);
        // A waiter hears the end of the term (at its deadline), then waits for news only.
        let (tx, mut waiting) = Leadership::elected();
        let start = Instant::now();
        tx.send_replace(Term {
            leading: true,
            until: Some(start + Duration::from_secs(3)),
            from: None,
        });
        assert!(!waiting.changed().await);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        let next = tokio::time::timeout(Duration::from_secs(60), waiting.changed()).await;
        assert!(next.is_err(), "woke with no news");
        // Renewals (new deadlines) wake no one; losing the term does.
        tx.send_replace(Term {
            leading: true,
            until: Some(Instant::now() + Duration::from_secs(7)),
            from: None,
        });
        let mut renewing = waiting.clone();
        let woke = tokio::spawn(async move { renewing.changed().await });
        tokio::task::yield_now().await;
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(2)).await;
            tx.send_replace(Term {
                leading: true,
                until: Some(Instant::now() + Duration::from_secs(7)),
                from: None,
            });
            tokio::task::yield_now().await;
            assert!(!woke.is_finished(), "a renewal woke a waiter");
        }
        tx.send_replace(Term::default());
        assert!(!woke.await.unwrap());
    }

    /// A fresh term counts only from its `from`, and a waiter hears it begin then.
    #[tokio::test(start_paused = true)]
    async fn a_fresh_term_counts_from_its_start() {
        let (tx, mut leadership) = Leadership::elected();
        let start = Instant::now();
        tx.send_replace(Term {
            leading: true,
            until: Some(start + Duration::from_secs(7)),
            from: Some(start + Duration::from_secs(6)),
        });
        assert!(!leadership.is_leader());
        assert!(leadership.changed().await);
        assert_eq!(start.elapsed(), Duration::from_secs(6));
        assert!(!leadership.changed().await);
        assert_eq!(start.elapsed(), Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_leaderships_never_end() {
        let always = Leadership::always();
        tokio::time::advance(Duration::from_secs(86_400)).await;
        assert!(always.is_leader());
        let mut once = Leadership::once(std::future::ready(()));
        assert!(once.changed().await);
    }
}

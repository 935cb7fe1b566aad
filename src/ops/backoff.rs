//! The growing wait after an error: each failure doubles the next wait, from a first one up to
//! a most, and a success (or, where asked, a quiet spell without failures) starts over from the
//! first. One piece for every retry loop, so that they all grow and reset alike.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use tokio::time::Instant;

/// The waits of one retry loop.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    /// The wait the next failure gets, before jitter.
    next: Duration,
    /// Whether each wait gets up to half again at random.
    jitter: bool,
    /// Failures further apart than this start over from `first`.
    reset_after: Option<Duration>,
    /// When the last wait was handed out (only kept with `reset_after`).
    last: Option<Instant>,
}

impl Backoff {
    /// Waits of `first`, then twice as long after each failure, never more than `max`.
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            next: first,
            jitter: false,
            reset_after: None,
            last: None,
        }
    }

    /// Each wait up to half again at random, so that loops that failed together (a fleet's
    /// watches when an apiserver restarts) do not all come back together.
    pub const fn jittered(mut self) -> Backoff {
        self.jitter = true;
        self
    }

    /// Starts over from the first wait when the previous failure is more than `quiet` ago, for
    /// loops that have no success to report (kube-runtime's default backoff does this).
    pub const fn reset_after(mut self, quiet: Duration) -> Backoff {
        self.reset_after = Some(quiet);
        self
    }

    /// The wait after a failure now; the next failure's is twice as long (up to the most).
    pub fn next_wait(&mut self) -> Duration {
        if let Some(quiet) = self.reset_after {
            let now = Instant::now();
            if self.last.is_some_and(|at| now.duration_since(at) >= quiet) {
                self.next = self.first;
            }
            self.last = Some(now);
        }
        let base = self.next;
        self.next = base.saturating_mul(2).min(self.max);
        if self.jitter {
            // A std `RandomState` is seeded at random: enough for jitter, without a dependency.
            let random = std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish();
            base + base.mul_f64((random % 1000) as f64 / 2000.0)
        } else {
            base
        }
    }

    /// The wait the next failure gets (before jitter), to say so in a log line.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// After a success: the next failure waits the first wait again.
    pub fn reset(&mut self) {
        self.next = self.first;
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(5);

    #[test]
    fn doubles_up_to_the_most_and_resets_on_success() {
        let mut b = Backoff::new(FIRST, MAX);
        let waits: Vec<u64> = (0..5).map(|_| b.next_wait().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
        b.reset();
        assert_eq!(b.next_wait(), FIRST);
        assert_eq!(b.peek(), Duration::from_secs(2));
    }

    #[test]
    fn jitter_adds_at_most_half() {
        let mut b = Backoff::new(FIRST, MAX).jittered();
        for base in [1.0, 2.0, 4.0, 5.0, 5.0] {
            let wait = b.next_wait().as_secs_f64();
            assert!(wait >= base && wait < base * 1.5, "{wait} for {base}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_spell_starts_over() {
        let mut b = Backoff::new(FIRST, MAX).reset_after(Duration::from_secs(60));
        assert_eq!(b.next_wait(), FIRST);
        assert_eq!(b.next_wait(), Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(b.next_wait(), Duration::from_secs(4));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(b.next_wait(), FIRST);
    }
}

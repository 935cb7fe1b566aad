//! A token bucket: how relaylet budgets the work strangers can make it ask of the root
//! apiserver (TokenReviews of new tokens, lookups of pods the index lacks).

use std::time::Instant;

/// A token bucket: up to `burst` at once, refilled at `rate` a second.
pub struct TokenBucket {
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn full(burst: f64) -> TokenBucket {
        TokenBucket {
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Whether the bucket has refilled to `burst` (it is as good as a new one).
    pub fn is_full(&self, rate: f64, burst: f64) -> bool {
        self.tokens + self.at.elapsed().as_secs_f64() * rate >= burst
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, rate: f64, burst: f64) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * rate).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_refills_at_its_rate() {
        let mut bucket = TokenBucket::full(2.0);
        assert!(bucket.take(1.0, 2.0));
        assert!(bucket.take(1.0, 2.0));
        assert!(!bucket.take(1.0, 2.0));
        bucket.at -= Duration::from_secs(1);
        assert!(bucket.take(1.0, 2.0));
        assert!(!bucket.take(1.0, 2.0));
    }
}

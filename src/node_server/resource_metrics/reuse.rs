//! A node-level read done once for everyone who asks at about the same time.
//!
//! `/stats/summary`, `/metrics/resource` and `/pods` each cost LISTs in the root and the leaf,
//! and a caller with `nodes/stats` may ask as often as it likes. So a node's answer is computed
//! by one caller at a time (the others wait for it), reused while younger than the configured
//! age (`NODE_STATS_CACHE_TTL`; metrics-server scrapes every 15 s), and a caller always gets an
//! answer computed after it asked or within that age. Failures are not kept: the next caller
//! tries again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// One node's latest answer of one kind.
pub struct Reuse<T> {
    latest: Mutex<Option<(Instant, Arc<T>)>>,
}

impl<T> Default for Reuse<T> {
    fn default() -> Self {
        Reuse {
            latest: Mutex::new(None),
        }
    }
}

impl<T> Reuse<T> {
    /// The latest answer if it was computed after the call began or is younger than `max_age`;
    /// else `compute`'s, which becomes the latest. Concurrent callers wait for one `compute`
    /// (the others' are dropped unstarted).
    pub async fn get<E, F>(&self, max_age: Duration, compute: F) -> Result<Arc<T>, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        let asked = Instant::now();
        let mut latest = self.latest.lock().await;
        if let Some((at, value)) = latest.as_ref()
            && (*at >= asked || at.elapsed() < max_age)
        {
            return Ok(value.clone());
        }
        let value = Arc::new(compute.await?);
        *latest = Some((Instant::now(), value.clone()));
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const AGE: Duration = Duration::from_secs(5);

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_one_computation_and_reuse_it_while_young() {
        let reuse = Arc::new(Reuse::<usize>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let call = |reuse: Arc<Reuse<usize>>, runs: Arc<AtomicUsize>| async move {
            reuse
                .get(AGE, async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, ()>(runs.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await
        };
        let calls: Vec<_> = (0..30)
            .map(|_| tokio::spawn(call(reuse.clone(), runs.clone())))
            .collect();
        for c in calls {
            assert_eq!(*c.await.unwrap().unwrap(), 1);
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            *call(reuse.clone(), runs.clone()).await.unwrap(),
            1,
            "young"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*call(reuse.clone(), runs.clone()).await.unwrap(), 2, "old");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_not_kept() {
        let reuse = Reuse::<u8>::default();
        assert_eq!(
            reuse.get(AGE, async { Err("down") }).await.err(),
            Some("down")
        );
        assert_eq!(
            *reuse.get(AGE, async { Ok::<_, &str>(7) }).await.unwrap(),
            7
        );
    }
}

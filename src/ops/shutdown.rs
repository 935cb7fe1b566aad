//! Shutdown signals: SIGTERM or Ctrl-C first hand this replica's virtual nodes to the other
//! replicas (still accepting, since the root apiserver sends a node's new sessions here until
//! its Node names another replica; at most [`HANDOVER_LIMIT`]), then stop accepting; open
//! sessions get a grace period (`SHUTDOWN_GRACE_PERIOD`), then are cut, an exec or attach with
//! `relaylet: shutting down` on its error stream, so no client mistakes the cut for success
//! (see `relay::splice` and `relay::frames` for why a plain close or reset would lie).
//!
//! [`OpenSessions`] counts the sessions still running, so the process can exit as soon as the
//! last one ends instead of always waiting the whole grace period.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long cut sessions get to write their ending (or reset) and log before the process moves
/// on. The splice bounds its ending well within it (`relay::splice`).
const CUT_SETTLE: Duration = Duration::from_secs(2);

/// How long a replica shutting down waits for the others to take its virtual nodes before it
/// stops accepting anyway (a peer takes a released node within two of its 2 s rounds).
pub const HANDOVER_LIMIT: Duration = Duration::from_secs(8);
/// After the hand-over, how long a replica still accepts the requests the root apiserver
/// routed by its old Node address an instant before the new writer's update.
pub const HANDOVER_SETTLE: Duration = Duration::from_secs(1);

/// The three stages of shutting down, and the sessions still open.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    /// Fires first: hand the virtual nodes over (give up presence and leadership), still
    /// accepting. Whoever handed over fires `begin` (`lib::start`); `begin` implies it.
    pub hand_over: CancellationToken,
    /// Fires when relaylet must stop accepting new work.
    pub begin: CancellationToken,
    /// Fires when open sessions must end.
    pub sessions: CancellationToken,
    /// Sessions running now.
    pub open: OpenSessions,
}

/// A count of running sessions: the one count (the drain waits for it, `memory` trims by it).
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct OpenSessions(Arc<watch::Sender<usize>>);

impl Default for OpenSessions {
    fn default() -> Self {
        OpenSessions(Arc::new(watch::Sender::new(0)))
    }
}

/// Counts one session as open until dropped.
#[derive(Debug)]
pub struct SessionGuard(Arc<watch::Sender<usize>>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let mut left = 0;
        self.0.send_modify(|n| {
            *n = n.saturating_sub(1);
            left = *n;
        });
        let count = self.0.clone();
        crate::ops::memory::closed(left, move || *count.borrow());
    }
}

impl OpenSessions {
    /// Counts a session as open until the guard is dropped.
    pub fn enter(&self) -> SessionGuard {
        let mut open = 0;
        self.0.send_modify(|n| {
            *n += 1;
            open = *n;
        });
        crate::ops::memory::opened(open);
        SessionGuard(self.0.clone())
    }

    /// How many sessions are open.
    pub fn count(&self) -> usize {
        *self.0.borrow()
    }

    /// Resolves when no session is open.
    pub async fn idle(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

impl Shutdown {
    /// Once `begin` has fired, waits until every session has ended or `grace` is over; then
    /// fires `sessions` (cutting what is left) and gives the cut sessions a moment to close.
    pub async fn drain(&self, grace: Duration) {
        self.begin.cancelled().await;
        let open = self.open.count();
        if open > 0 {
            tracing::info!(open, grace = ?grace, "waiting for open sessions to finish");
        }
        tokio::select! {
            _ = self.open.idle() => {}
            _ = tokio::time::sleep(grace) => {
                tracing::warn!(open = self.open.count(), "grace period over: cutting open sessions");
            }
            _ = self.sessions.cancelled() => {}
        }
        self.sessions.cancel();
        let _ = tokio::time::timeout(CUT_SETTLE, self.open.idle()).await;
    }

    /// Waits for SIGTERM or Ctrl-C, then [`Shutdown::terminate`]s.
    pub fn on_signals(&self, grace: Duration) {
        let this = self.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            this.terminate(grace).await;
        });
    }

    /// What SIGTERM does: fires `hand_over`, waits (at most [`HANDOVER_LIMIT`]) for `begin`,
    /// fires it, and `sessions` after `grace`.
    pub async fn terminate(&self, grace: Duration) {
        tracing::info!("shutting down: handing virtual nodes to the other replicas");
        self.hand_over.cancel();
        let _ =
            tokio::time::timeout(HANDOVER_LIMIT + HANDOVER_SETTLE, self.begin.cancelled()).await;
        tracing::info!(grace = ?grace, "shutting down: no new sessions; open ones get the grace period");
        self.begin.cancel();
        tokio::select! {
            _ = tokio::time::sleep(grace) => {}
            _ = self.sessions.cancelled() => {}
        }
        self.sessions.cancel();
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGTERM; only Ctrl-C stops relaylet");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_ends_with_the_last_session() {
        let shutdown = Shutdown::default();
        let guard = shutdown.open.enter();
        assert_eq!(shutdown.open.count(), 1);
        shutdown.begin.cancel();
        let drained = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { shutdown.drain(Duration::from_secs(30)).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!shutdown.sessions.is_cancelled(), "sessions run on");
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), drained)
            .await
            .expect("drain ends with the last session")
            .unwrap();
        assert_eq!(shutdown.open.count(), 0);
    }

    #[tokio::test]
    async fn drain_cuts_at_the_end_of_the_grace_period() {
        let shutdown = Shutdown::default();
        let _stuck = shutdown.open.enter();
        shutdown.begin.cancel();
        let start = tokio::time::Instant::now();
        let grace = Duration::from_millis(300);
        tokio::time::timeout(Duration::from_secs(10), shutdown.drain(grace))
            .await
            .expect("drain gives up after the grace period");
        assert!(shutdown.sessions.is_cancelled(), "open sessions are cut");
        assert!(start.elapsed() >= grace);
    }
}

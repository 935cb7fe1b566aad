//! Shutdown signals: SIGTERM or Ctrl-C stop accepting at once; open sessions get a grace
//! period, then are cut (with a reset, so no client mistakes the cut for success).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The two stages of shutting down.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    /// Fires when relaylet must stop accepting new work.
    pub begin: CancellationToken,
    /// Fires when open sessions must end.
    pub sessions: CancellationToken,
}

impl Shutdown {
    /// Waits for SIGTERM or Ctrl-C, then fires `begin`, and `sessions` after `grace`.
    pub fn on_signals(&self, grace: Duration) {
        let this = self.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!(grace = ?grace, "shutting down: no new sessions; open ones get the grace period");
            this.begin.cancel();
            tokio::select! {
                _ = tokio::time::sleep(grace) => {}
                _ = this.sessions.cancelled() => {}
            }
            this.sessions.cancel();
        });
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

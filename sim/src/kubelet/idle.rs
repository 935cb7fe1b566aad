//! The idle timeout of a streaming connection (the kubelet's `streamingConnectionIdleTimeout`).
//!
//! Every read or write touches the connection; a watchdog ends the session (fires its `gone`
//! token) once nothing happened for the whole timeout, like upstream's read/write deadlines.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Shared "last activity" clock of one connection.
#[derive(Clone)]
pub struct Activity {
    last: Arc<Mutex<Instant>>,
}

impl Activity {
    /// Starts the watchdog; it stops when `gone` fires.
    pub fn start(timeout: Duration, gone: CancellationToken) -> Self {
        let activity = Activity {
            last: Arc::new(Mutex::new(Instant::now())),
        };
        let watched = activity.clone();
        tokio::spawn(async move {
            loop {
                let deadline = watched.last() + timeout;
                tokio::select! {
                    _ = gone.cancelled() => return,
                    _ = tokio::time::sleep_until(deadline) => {}
                }
                if watched.last() + timeout <= Instant::now() {
                    tracing::debug!(?timeout, "streaming connection idle, closing");
                    gone.cancel();
                    return;
                }
            }
        });
        activity
    }

    /// Records activity now.
    pub fn touch(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = Instant::now();
        }
    }

    fn last(&self) -> Instant {
        self.last
            .lock()
            .map(|l| *l)
            .unwrap_or_else(|_| Instant::now())
    }
}

//! One relayed call, from the moment relaylet decides to relay it until it ends: it logs one
//! line at the start and one at the end (user, verb, pod, container, leaf, bytes, duration,
//! result) and keeps the session metrics.
//!
//! The end is recorded when the [`Session`] is dropped, so no path (an early return, a failed
//! upgrade, a body the caller abandoned) can leave a session counted as open. The log lines
//! carry only what the caller asked for and who they are: never a token, an Authorization header
//! or kubeconfig contents.

use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::caps::StreamPermit;
use crate::model::kubelet_request::Kind;
use crate::ops::{Metrics, OneLabel, ResultLabels};
use crate::ops::{OpenSessions, SessionGuard};

/// Who asked for what; all of it goes into the log lines and labels.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub kind: Kind,
    pub user: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub leaf: String,
    /// The leaf pod the call reaches (proven by `counterpart`).
    pub leaf_namespace: String,
    pub leaf_pod: String,
    pub node: String,
}

impl SessionInfo {
    /// The span a kubelet call runs in; events in it carry the call's fields.
    pub fn span(&self) -> tracing::Span {
        tracing::info_span!(
            "kubelet_call",
            kind = %self.kind,
            namespace = %self.namespace,
            pod = %self.pod,
            container = %self.container,
            leaf = %self.leaf,
            leaf_namespace = %self.leaf_namespace,
            leaf_pod = %self.leaf_pod,
            user = %self.user,
        )
    }
}

/// How a session ended; the `result` label and log field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Result {
    /// The leaf ended the stream: it sent the command's exit status (exec, attach), or it
    /// closed first (port-forward, logs, untracked protocols).
    Completed,
    /// The caller went away before the leaf ended the stream.
    ClientClosed,
    /// The leaf connection ended (closed or failed) before the leaf sent the exit status;
    /// relaylet told the caller so on the error stream.
    LeafLost,
    /// Nothing moved for `STREAM_IDLE_TIMEOUT`.
    IdleTimeout,
    /// Cut at the end of the shutdown grace period.
    Shutdown,
    /// The leaf answered with an error (a refused protocol, a missing container, ...).
    Rejected,
    /// The leaf did not answer in time or could not be reached.
    LeafUnreachable,
    /// The call was malformed (e.g. a streaming call without upgrade headers).
    BadRequest,
    /// The leaf agreed to upgrade but the upgrade did not complete.
    UpgradeFailed,
}

impl Result {
    pub fn as_str(self) -> &'static str {
        match self {
            Result::Completed => "completed",
            Result::ClientClosed => "client_closed",
            Result::LeafLost => "leaf_lost",
            Result::IdleTimeout => "idle_timeout",
            Result::Shutdown => "shutdown",
            Result::Rejected => "rejected",
            Result::LeafUnreachable => "leaf_unreachable",
            Result::BadRequest => "bad_request",
            Result::UpgradeFailed => "upgrade_failed",
        }
    }
}

/// A session in progress; see the module comment.
pub struct Session {
    info: SessionInfo,
    // The two families a session updates, not a `Metrics` clone (216 bytes, held once per
    // open session for as long as it lasts).
    finished: Family<ResultLabels, Counter>,
    upgrade_latency: Family<OneLabel, Histogram>,
    active: Gauge,
    started: Instant,
    /// Until the end is known, a session that is dropped was abandoned by its caller.
    result: Result,
    to_leaf: u64,
    to_client: u64,
    _open: SessionGuard,
    /// A streaming session's place under the caps (`limits::Gate`), released with it.
    _permit: StreamPermit,
}

impl Session {
    /// Logs the start and counts the session as open; it holds `permit` until it ends.
    pub fn start(
        info: SessionInfo,
        metrics: &Metrics,
        open: &OpenSessions,
        permit: StreamPermit,
    ) -> Session {
        let active = metrics
            .sessions_active
            .get_or_create(&[("kind", info.kind.to_string()), ("leaf", info.leaf.clone())])
            .clone();
        active.inc();
        tracing::info!(
            target: "relaylet::session",
            event = "session_start",
            user = %info.user,
            verb = %info.kind,
            namespace = %info.namespace,
            pod = %info.pod,
            container = %info.container,
            leaf = %info.leaf,
            leaf_namespace = %info.leaf_namespace,
            leaf_pod = %info.leaf_pod,
            node = %info.node,
            "session started"
        );
        Session {
            info,
            finished: metrics.sessions.clone(),
            upgrade_latency: metrics.upgrade_latency.clone(),
            active,
            started: Instant::now(),
            result: Result::ClientClosed,
            to_leaf: 0,
            to_client: 0,
            _open: open.enter(),
            _permit: permit,
        }
    }

    /// Records the time until the leaf answered.
    pub fn leaf_answered(&self) {
        self.upgrade_latency
            .get_or_create(&[("kind", self.info.kind.to_string())])
            .observe(self.started.elapsed().as_secs_f64());
    }

    /// Sets how the session ended and what it moved; logged when the session is dropped.
    pub fn ended(&mut self, result: Result, to_leaf: u64, to_client: u64) {
        self.result = result;
        self.to_leaf = to_leaf;
        self.to_client = to_client;
    }

    /// Sets only the result (bytes stay as counted).
    pub fn set_result(&mut self, result: Result) {
        self.result = result;
    }

    /// The info the session was started with.
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.active.dec();
        let result = self.result.as_str();
        self.finished
            .get_or_create(&[
                ("kind", self.info.kind.to_string()),
                ("leaf", self.info.leaf.clone()),
                ("result", result.to_string()),
            ])
            .inc();
        let duration_ms = self.started.elapsed().as_millis() as u64;
        tracing::info!(
            target: "relaylet::session",
            event = "session_end",
            user = %self.info.user,
            verb = %self.info.kind,
            namespace = %self.info.namespace,
            pod = %self.info.pod,
            container = %self.info.container,
            leaf = %self.info.leaf,
            leaf_namespace = %self.info.leaf_namespace,
            leaf_pod = %self.info.leaf_pod,
            node = %self.info.node,
            bytes_to_leaf = self.to_leaf,
            bytes_to_client = self.to_client,
            duration_ms,
            result,
            "session ended"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every open session holds one `Session` in its splice task for as long as it lasts
    /// (docs/performance.md, figure 6: idle session memory). It was 512 bytes while it held a
    /// whole `Metrics` clone.
    #[test]
    fn a_session_holds_only_what_it_updates() {
        let size = std::mem::size_of::<Session>();
        assert!(size <= 336, "a Session takes {size} bytes");
    }
}

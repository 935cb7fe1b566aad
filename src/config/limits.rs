//! The caps on connections, sessions and log streams (`MAX_*`).

use super::vars::Vars;

/// Caps that keep one client (or a flood) from exhausting relaylet. Past a cap the caller gets
/// a 503 `metav1.Status` and relaylet stays up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open TCP connections in total (`MAX_CONNECTIONS`).
    pub connections: usize,
    /// Open TCP connections from one source address (`MAX_CONNECTIONS_PER_CLIENT`).
    pub connections_per_client: usize,
    /// Connections whose TLS handshake is not done yet (`MAX_PENDING_HANDSHAKES`); one address
    /// may hold an eighth of them.
    pub pending_handshakes: usize,
    /// Connections none of whose requests has been authorized yet, unless their client
    /// certificate's identity is proven (`MAX_UNAUTHENTICATED_CONNECTIONS`), from one address
    /// (`MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT`) and of one certificate user
    /// (`MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER`); see `caps::gate`.
    pub unauthenticated_connections: usize,
    pub unauthenticated_connections_per_client: usize,
    pub unauthenticated_connections_per_user: usize,
    /// Connections of proven callers that may send a large request head at once
    /// (`MAX_LARGE_HEAD_CONNECTIONS`); the others get the small head.
    pub large_head_connections: usize,
    /// Open exec/attach/port-forward streams in total (`MAX_SESSIONS`).
    pub sessions: usize,
    /// Open streams of one authenticated user (`MAX_SESSIONS_PER_USER`). All calls relayed by
    /// the root apiserver share its kubelet-client identity, so keep this generous.
    pub sessions_per_user: usize,
    /// Open streams on pods of one namespace (`MAX_SESSIONS_PER_NAMESPACE`, default a quarter
    /// of `MAX_SESSIONS`): the share one tenant may take behind the root apiserver.
    pub sessions_per_namespace: usize,
    /// Open log streams (`containerLogs`, followed or not) in total (`MAX_LOG_STREAMS`), of
    /// one authenticated user (`MAX_LOG_STREAMS_PER_USER`) and on pods of one namespace
    /// (`MAX_LOG_STREAMS_PER_NAMESPACE`, default a quarter of `MAX_LOG_STREAMS`).
    pub log_streams: usize,
    pub log_streams_per_user: usize,
    pub log_streams_per_namespace: usize,
}

/// The default share of a total cap one namespace may take.
pub fn namespace_share(total: usize) -> usize {
    (total / 4).max(1)
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 16384,
            connections_per_client: 8192,
            pending_handshakes: 1024,
            unauthenticated_connections: 256,
            unauthenticated_connections_per_client: 32,
            unauthenticated_connections_per_user: 16,
            large_head_connections: 64,
            sessions: 16384,
            sessions_per_user: 8192,
            sessions_per_namespace: namespace_share(16384),
            log_streams: 1024,
            log_streams_per_user: 1024,
            log_streams_per_namespace: namespace_share(1024),
        }
    }
}

/// The connection and session caps (`MAX_*`).
pub(super) fn limits(vars: &mut Vars<'_>) -> Limits {
    let defaults = Limits::default();
    // The namespace shares default to a quarter of the totals as set.
    let sessions = vars.count("MAX_SESSIONS", defaults.sessions);
    let log_streams = vars.count("MAX_LOG_STREAMS", defaults.log_streams);

    Limits {
        connections: vars.count("MAX_CONNECTIONS", defaults.connections),
        connections_per_client: vars.count(
            "MAX_CONNECTIONS_PER_CLIENT",
            defaults.connections_per_client,
        ),
        pending_handshakes: vars.count("MAX_PENDING_HANDSHAKES", defaults.pending_handshakes),
        unauthenticated_connections: vars.count(
            "MAX_UNAUTHENTICATED_CONNECTIONS",
            defaults.unauthenticated_connections,
        ),
        unauthenticated_connections_per_client: vars.count(
            "MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT",
            defaults.unauthenticated_connections_per_client,
        ),
        unauthenticated_connections_per_user: vars.count(
            "MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER",
            defaults.unauthenticated_connections_per_user,
        ),
        large_head_connections: vars.count(
            "MAX_LARGE_HEAD_CONNECTIONS",
            defaults.large_head_connections,
        ),
        sessions,
        sessions_per_user: vars.count("MAX_SESSIONS_PER_USER", defaults.sessions_per_user),
        sessions_per_namespace: vars.count("MAX_SESSIONS_PER_NAMESPACE", namespace_share(sessions)),
        log_streams,
        log_streams_per_user: vars.count("MAX_LOG_STREAMS_PER_USER", defaults.log_streams_per_user),
        log_streams_per_namespace: vars.count(
            "MAX_LOG_STREAMS_PER_NAMESPACE",
            namespace_share(log_streams),
        ),
    }
}

//! Counts open connections, streaming sessions and log streams against the configured caps.
//!
//! A permit is taken when a connection is accepted or a stream starts and given back when it is
//! dropped, so counts can never leak on an error path. Past a cap the caller is told so with a
//! 503, and everyone else keeps being served.
//!
//! Connections are counted in stages, so that strangers can neither crowd out the root
//! apiserver nor exhaust memory before anyone knows who they are:
//! - until its TLS handshake is done a connection holds only a *handshake* permit (a small
//!   budget, at most an eighth of it per address; over it the connection is closed at once);
//! - then a connection permit; a connection without a client certificate is *unauthenticated*
//!   until one of its requests authenticates (a bearer token), and until then it also holds an
//!   unauthenticated permit from a small budget of its own, total and per address
//!   (`MAX_UNAUTHENTICATED_CONNECTIONS[_PER_CLIENT]`), and may send only a small request head
//!   (see `node_server`). What such connections can hold is therefore bounded by those caps
//!   times the small head, and the chart derives its memory limit from every cap here.
//!
//! Streams are counted per kind: exec/attach/port-forward sessions (`MAX_SESSIONS[_PER_USER]`)
//! and log streams (`MAX_LOG_STREAMS[_PER_USER]`), each total and per authenticated user.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::model::kubelet_request::Kind;

use crate::config::Limits;

/// Why a connection or stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error(
        "relaylet is serving its maximum of {0} connections (MAX_CONNECTIONS); try again later"
    )]
    Connections(usize),
    #[error(
        "{ip} has its maximum of {max} open connections (MAX_CONNECTIONS_PER_CLIENT); try again later"
    )]
    ConnectionsPerClient { ip: IpAddr, max: usize },
    #[error(
        "relaylet holds its maximum of {0} connections whose caller is not authenticated yet (MAX_UNAUTHENTICATED_CONNECTIONS); present a client certificate, or try again later"
    )]
    Unauthenticated(usize),
    #[error(
        "{ip} holds its maximum of {max} connections whose caller is not authenticated yet (MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT)"
    )]
    UnauthenticatedPerClient { ip: IpAddr, max: usize },
    #[error("{0} has its maximum of pending TLS handshakes (MAX_PENDING_HANDSHAKES)")]
    Handshakes(IpAddr),
    #[error("relaylet is relaying its maximum of {0} streams (MAX_SESSIONS); try again later")]
    Sessions(usize),
    #[error(
        "user {user:?} has its maximum of {max} open streams (MAX_SESSIONS_PER_USER); try again later"
    )]
    SessionsPerUser { user: String, max: usize },
    #[error("relaylet is streaming its maximum of {0} logs (MAX_LOG_STREAMS); try again later")]
    LogStreams(usize),
    #[error(
        "user {user:?} has its maximum of {max} open log streams (MAX_LOG_STREAMS_PER_USER); try again later"
    )]
    LogStreamsPerUser { user: String, max: usize },
}

impl LimitError {
    /// The cap's name in the `relaylet_limit_refusals_total` metric.
    pub fn cap(&self) -> &'static str {
        match self {
            LimitError::Connections(_) | LimitError::ConnectionsPerClient { .. } => "connections",
            LimitError::Unauthenticated(_) | LimitError::UnauthenticatedPerClient { .. } => {
                "unauthenticated_connections"
            }
            LimitError::Handshakes(_) => "handshakes",
            LimitError::Sessions(_) | LimitError::SessionsPerUser { .. } => "sessions",
            LimitError::LogStreams(_) | LimitError::LogStreamsPerUser { .. } => "log_streams",
        }
    }
}

/// The counters. Shared by every connection.
pub struct Gate {
    limits: Limits,
    handshakes: Tally<IpAddr>,
    connections: Tally<IpAddr>,
    unauthenticated: Tally<IpAddr>,
    sessions: Tally<String>,
    log_streams: Tally<String>,
}

/// An open connection's permits. The unauthenticated permit, held until the caller is known,
/// sits in a slot its requests share, so the first request that authenticates can give it back
/// ([`Unauthenticated::authenticated`]).
pub struct ConnectionPermit {
    _connection: Permit<IpAddr>,
    pub unauthenticated: Unauthenticated,
}

/// The place of a connection whose caller is not known yet, in the unauthenticated budget;
/// empty for a connection that presented a client certificate or has authenticated. Cheap to
/// clone (its requests share it).
#[derive(Clone, Default)]
pub struct Unauthenticated(Arc<Mutex<Option<Permit<IpAddr>>>>);

impl Unauthenticated {
    /// The caller has authenticated: the connection leaves the unauthenticated budget.
    pub fn authenticated(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Whether the connection still counts as unauthenticated.
    pub fn is_pending(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl Gate {
    pub fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            handshakes: Tally::default(),
            connections: Tally::default(),
            unauthenticated: Tally::default(),
            sessions: Tally::default(),
            log_streams: Tally::default(),
        })
    }

    /// A permit for one more connection from `ip` that has not finished its TLS handshake.
    pub fn handshake(self: &Arc<Self>, ip: IpAddr) -> Result<Permit<IpAddr>, LimitError> {
        let total = self.limits.pending_handshakes;
        self.handshakes
            .take(ip, total, (total / 8).max(1))
            .map_err(|_| LimitError::Handshakes(ip))?;
        Ok(Permit {
            gate: self.clone(),
            key: ip,
            tally: |gate| &gate.handshakes,
        })
    }

    /// The permits for one more connection from `ip` whose handshake is done; `certified` when
    /// it presented a verified client certificate (its caller is known), else it also takes an
    /// unauthenticated permit.
    pub fn tls_connection(
        self: &Arc<Self>,
        ip: IpAddr,
        certified: bool,
    ) -> Result<ConnectionPermit, LimitError> {
        let unauthenticated = if certified {
            None
        } else {
            let (total, per_client) = (
                self.limits.unauthenticated_connections,
                self.limits.unauthenticated_connections_per_client,
            );
            self.unauthenticated
                .take(ip, total, per_client)
                .map_err(|over| match over {
                    Over::Total => LimitError::Unauthenticated(total),
                    Over::PerKey => LimitError::UnauthenticatedPerClient {
                        ip,
                        max: per_client,
                    },
                })?;
            Some(Permit {
                gate: self.clone(),
                key: ip,
                tally: |gate| &gate.unauthenticated,
            })
        };
        Ok(ConnectionPermit {
            _connection: self.connection(ip)?,
            unauthenticated: Unauthenticated(Arc::new(Mutex::new(unauthenticated))),
        })
    }

    /// A permit for one more connection from `ip`.
    pub fn connection(self: &Arc<Self>, ip: IpAddr) -> Result<Permit<IpAddr>, LimitError> {
        self.connections
            .take(
                ip,
                self.limits.connections,
                self.limits.connections_per_client,
            )
            .map_err(|over| match over {
                Over::Total => LimitError::Connections(self.limits.connections),
                Over::PerKey => LimitError::ConnectionsPerClient {
                    ip,
                    max: self.limits.connections_per_client,
                },
            })?;
        Ok(Permit {
            gate: self.clone(),
            key: ip,
            tally: |gate| &gate.connections,
        })
    }

    /// A permit for one more stream of `kind` (a streaming session or a log stream) of `user`.
    pub fn stream(self: &Arc<Self>, kind: Kind, user: &str) -> Result<Permit<String>, LimitError> {
        if kind.is_streaming() {
            self.session(user)
        } else {
            self.log_stream(user)
        }
    }

    /// A permit for one more streaming session of `user`.
    pub fn session(self: &Arc<Self>, user: &str) -> Result<Permit<String>, LimitError> {
        let (total, per_user) = (self.limits.sessions, self.limits.sessions_per_user);
        self.user_stream(
            user,
            |gate| &gate.sessions,
            (total, per_user),
            |over, user| match over {
                Over::Total => LimitError::Sessions(total),
                Over::PerKey => LimitError::SessionsPerUser {
                    user,
                    max: per_user,
                },
            },
        )
    }

    /// A permit for one more log stream of `user`.
    pub fn log_stream(self: &Arc<Self>, user: &str) -> Result<Permit<String>, LimitError> {
        let (total, per_user) = (self.limits.log_streams, self.limits.log_streams_per_user);
        self.user_stream(
            user,
            |gate| &gate.log_streams,
            (total, per_user),
            |over, user| match over {
                Over::Total => LimitError::LogStreams(total),
                Over::PerKey => LimitError::LogStreamsPerUser {
                    user,
                    max: per_user,
                },
            },
        )
    }

    /// A permit from the per-user tally `tally` picks, under `(total, per_user)` caps.
    fn user_stream(
        self: &Arc<Self>,
        user: &str,
        tally: fn(&Gate) -> &Tally<String>,
        (total, per_user): (usize, usize),
        refusal: impl FnOnce(Over, String) -> LimitError,
    ) -> Result<Permit<String>, LimitError> {
        let key = user.to_string();
        tally(self)
            .take(key.clone(), total, per_user)
            .map_err(|over| refusal(over, key.clone()))?;
        Ok(Permit {
            gate: self.clone(),
            key,
            tally,
        })
    }

    /// Open connections now.
    pub fn open_connections(&self) -> usize {
        self.connections.total.load(Ordering::Relaxed)
    }

    /// Open connections whose caller is not authenticated yet.
    pub fn open_unauthenticated(&self) -> usize {
        self.unauthenticated.total.load(Ordering::Relaxed)
    }

    /// Open streaming sessions now.
    pub fn open_sessions(&self) -> usize {
        self.sessions.total.load(Ordering::Relaxed)
    }

    /// Open log streams now.
    pub fn open_log_streams(&self) -> usize {
        self.log_streams.total.load(Ordering::Relaxed)
    }
}

/// Given back to the gate when dropped.
pub struct Permit<K: Hash + Eq> {
    gate: Arc<Gate>,
    key: K,
    /// The tally it was taken from.
    tally: fn(&Gate) -> &Tally<K>,
}

impl<K: Hash + Eq> Drop for Permit<K> {
    fn drop(&mut self) {
        (self.tally)(&self.gate).give(&self.key);
    }
}

enum Over {
    Total,
    PerKey,
}

/// A total and per-key counts.
struct Tally<K> {
    total: AtomicUsize,
    per_key: Mutex<HashMap<K, usize>>,
}

impl<K> Default for Tally<K> {
    fn default() -> Self {
        Tally {
            total: AtomicUsize::new(0),
            per_key: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq> Tally<K> {
    fn take(&self, key: K, max_total: usize, max_per_key: usize) -> Result<(), Over> {
        let mut per_key = self.per_key.lock().unwrap_or_else(|e| e.into_inner());
        if self.total.load(Ordering::Relaxed) >= max_total {
            return Err(Over::Total);
        }
        let count = per_key.entry(key).or_insert(0);
        if *count >= max_per_key {
            return Err(Over::PerKey);
        }
        *count += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn give(&self, key: &K) {
        let mut per_key = self.per_key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = per_key.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                per_key.remove(key);
            }
            self.total.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_hold_and_permits_give_back() {
        let gate = Gate::new(Limits {
            connections: 3,
            connections_per_client: 2,
            sessions: 2,
            sessions_per_user: 1,
            ..Limits::default()
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = gate.connection(a).unwrap();
        let _a2 = gate.connection(a).unwrap();
        assert!(matches!(
            gate.connection(a),
            Err(LimitError::ConnectionsPerClient { .. })
        ));
        let _b1 = gate.connection(b).unwrap();
        assert!(matches!(
            gate.connection(b),
            Err(LimitError::Connections(3))
        ));
        drop(a1);
        assert_eq!(gate.open_connections(), 2);
        let _b2 = gate.connection(b).unwrap();

        let alice = gate.session("alice").unwrap();
        assert!(matches!(
            gate.session("alice"),
            Err(LimitError::SessionsPerUser { .. })
        ));
        let _bob = gate.session("bob").unwrap();
        assert!(matches!(
            gate.session("carol"),
            Err(LimitError::Sessions(2))
        ));
        drop(alice);
        assert_eq!(gate.open_sessions(), 1);
        assert!(gate.session("alice").is_ok());
    }

    #[test]
    fn handshakes_have_a_small_budget_per_address() {
        let gate = Gate::new(Limits {
            pending_handshakes: 16,
            ..Limits::default()
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let held: Vec<_> = (0..2).map(|_| gate.handshake(a).unwrap()).collect();
        assert_eq!(gate.handshake(a).err(), Some(LimitError::Handshakes(a)));
        assert!(gate.handshake(b).is_ok(), "another address is not held up");
        drop(held);
        assert!(gate.handshake(a).is_ok());
    }

    #[test]
    fn unauthenticated_connections_have_a_budget_of_their_own() {
        let gate = Gate::new(Limits {
            connections: 8,
            connections_per_client: 8,
            unauthenticated_connections: 3,
            unauthenticated_connections_per_client: 2,
            ..Limits::default()
        });
        let stranger: IpAddr = "10.0.0.9".parse().unwrap();
        let other: IpAddr = "10.0.0.8".parse().unwrap();
        let apiserver: IpAddr = "10.0.0.1".parse().unwrap();
        let s1 = gate.tls_connection(stranger, false).unwrap();
        let _s2 = gate.tls_connection(stranger, false).unwrap();
        assert_eq!(
            gate.tls_connection(stranger, false).err(),
            Some(LimitError::UnauthenticatedPerClient {
                ip: stranger,
                max: 2
            })
        );
        let _o1 = gate.tls_connection(other, false).unwrap();
        assert_eq!(
            gate.tls_connection(other, false).err(),
            Some(LimitError::Unauthenticated(3))
        );
        // Callers with a certificate are not held up by strangers.
        let _a1 = gate.tls_connection(apiserver, true).unwrap();
        assert!(!_a1.unauthenticated.is_pending());
        assert_eq!(gate.open_unauthenticated(), 3);
        // A connection whose caller authenticates leaves the budget, and stays open.
        assert!(s1.unauthenticated.is_pending());
        s1.unauthenticated.authenticated();
        assert!(!s1.unauthenticated.is_pending());
        assert_eq!(gate.open_unauthenticated(), 2);
        assert_eq!(gate.open_connections(), 4);
        assert!(gate.tls_connection(other, false).is_ok());
    }

    #[test]
    fn log_streams_are_capped_apart_from_sessions() {
        let gate = Gate::new(Limits {
            sessions: 1,
            sessions_per_user: 1,
            log_streams: 2,
            log_streams_per_user: 1,
            ..Limits::default()
        });
        let _exec = gate.stream(Kind::Exec, "alice").unwrap();
        let alice = gate.stream(Kind::ContainerLogs, "alice").unwrap();
        assert_eq!(
            gate.stream(Kind::ContainerLogs, "alice").err(),
            Some(LimitError::LogStreamsPerUser {
                user: "alice".into(),
                max: 1
            })
        );
        let _bob = gate.stream(Kind::ContainerLogs, "bob").unwrap();
        assert_eq!(
            gate.stream(Kind::ContainerLogs, "carol").err(),
            Some(LimitError::LogStreams(2))
        );
        assert_eq!(gate.open_log_streams(), 2);
        assert_eq!(gate.open_sessions(), 1);
        drop(alice);
        assert!(gate.stream(Kind::ContainerLogs, "carol").is_ok());
    }
}

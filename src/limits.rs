//! Counts open connections and streaming sessions against the configured caps.
//!
//! A permit is taken when a connection is accepted or a session starts and given back when it is
//! dropped, so counts can never leak on an error path. Past a cap the caller is told so with a
//! 503, and everyone else keeps being served.
//!
//! Connections are counted in two stages, so that strangers cannot crowd out the root
//! apiserver: until its TLS handshake is done a connection holds only a *handshake* permit (a
//! small budget, at most an eighth of it per address; over it the connection is closed at once),
//! and then a connection permit, where connections without a client certificate may hold at
//! most half of `MAX_CONNECTIONS`; the rest is kept for callers with one.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::Limits;

/// Why a connection or session was refused.
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
        "relaylet is serving its maximum of {0} connections without a client certificate (half of MAX_CONNECTIONS); try again later"
    )]
    ConnectionsWithoutCertificate(usize),
    #[error("{0} has its maximum of pending TLS handshakes (MAX_PENDING_HANDSHAKES)")]
    Handshakes(IpAddr),
    #[error("relaylet is relaying its maximum of {0} streams (MAX_SESSIONS); try again later")]
    Sessions(usize),
    #[error(
        "user {user:?} has its maximum of {max} open streams (MAX_SESSIONS_PER_USER); try again later"
    )]
    SessionsPerUser { user: String, max: usize },
}

/// The counters. Shared by every connection.
pub struct Gate {
    limits: Limits,
    handshakes: Tally<IpAddr>,
    connections: Tally<IpAddr>,
    uncertified: Tally<()>,
    sessions: Tally<String>,
}

/// An open connection's permits.
pub struct ConnectionPermit {
    _connection: Permit<IpAddr>,
    _uncertified: Option<Permit<()>>,
}

impl Gate {
    pub fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            handshakes: Tally::default(),
            connections: Tally::default(),
            uncertified: Tally::default(),
            sessions: Tally::default(),
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
            release: |gate, key| gate.handshakes.give(key),
        })
    }

    /// The permits for one more connection from `ip` whose handshake is done; `certified` when
    /// it presented a verified client certificate.
    pub fn tls_connection(
        self: &Arc<Self>,
        ip: IpAddr,
        certified: bool,
    ) -> Result<ConnectionPermit, LimitError> {
        let uncertified = if certified {
            None
        } else {
            let half = (self.limits.connections / 2).max(1);
            self.uncertified
                .take((), half, half)
                .map_err(|_| LimitError::ConnectionsWithoutCertificate(half))?;
            Some(Permit {
                gate: self.clone(),
                key: (),
                release: |gate, key| gate.uncertified.give(key),
            })
        };
        Ok(ConnectionPermit {
            _connection: self.connection(ip)?,
            _uncertified: uncertified,
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
            release: |gate, key| gate.connections.give(key),
        })
    }

    /// A permit for one more streaming session of `user`.
    pub fn session(self: &Arc<Self>, user: &str) -> Result<Permit<String>, LimitError> {
        let key = user.to_string();
        self.sessions
            .take(
                key.clone(),
                self.limits.sessions,
                self.limits.sessions_per_user,
            )
            .map_err(|over| match over {
                Over::Total => LimitError::Sessions(self.limits.sessions),
                Over::PerKey => LimitError::SessionsPerUser {
                    user: key.clone(),
                    max: self.limits.sessions_per_user,
                },
            })?;
        Ok(Permit {
            gate: self.clone(),
            key,
            release: |gate, key| gate.sessions.give(key),
        })
    }

    /// Open connections now.
    pub fn open_connections(&self) -> usize {
        self.connections.total.load(Ordering::Relaxed)
    }

    /// Open streaming sessions now.
    pub fn open_sessions(&self) -> usize {
        self.sessions.total.load(Ordering::Relaxed)
    }
}

/// Given back to the gate when dropped.
pub struct Permit<K> {
    gate: Arc<Gate>,
    key: K,
    release: fn(&Gate, &K),
}

impl<K> Drop for Permit<K> {
    fn drop(&mut self) {
        (self.release)(&self.gate, &self.key);
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
    fn half_the_connections_are_kept_for_certified_callers() {
        let gate = Gate::new(Limits {
            connections: 4,
            connections_per_client: 4,
            ..Limits::default()
        });
        let stranger: IpAddr = "10.0.0.9".parse().unwrap();
        let apiserver: IpAddr = "10.0.0.1".parse().unwrap();
        let s1 = gate.tls_connection(stranger, false).unwrap();
        let _s2 = gate.tls_connection(stranger, false).unwrap();
        assert_eq!(
            gate.tls_connection(stranger, false).err(),
            Some(LimitError::ConnectionsWithoutCertificate(2))
        );
        let _a1 = gate.tls_connection(apiserver, true).unwrap();
        let _a2 = gate.tls_connection(apiserver, true).unwrap();
        assert_eq!(gate.open_connections(), 4);
        drop(s1);
        assert!(gate.tls_connection(stranger, false).is_ok());
    }
}

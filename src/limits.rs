//! Counts open connections and streaming sessions against the configured caps.
//!
//! A permit is taken when a connection is accepted or a session starts and given back when it is
//! dropped, so counts can never leak on an error path. Past a cap the caller is told so with a
//! 503, and everyone else keeps being served.

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
    connections: Tally<IpAddr>,
    sessions: Tally<String>,
}

impl Gate {
    pub fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            connections: Tally::default(),
            sessions: Tally::default(),
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
}

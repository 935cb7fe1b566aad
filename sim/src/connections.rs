//! The connections a stand-in server has accepted and still has open, by who made them (the
//! user their client certificate names) and the protocol they agreed on by ALPN: what a test
//! reads to see how many connections relaylet holds to an apiserver, and that a client offered
//! HTTP/1.1 only.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The protocol a connection agreed on by ALPN: `"h2"`, `"http/1.1"`, or `""` when the client
/// offered none (the server then speaks HTTP/1.1).
pub type Alpn = String;

/// Counts kept by one server. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Connections {
    by_peer: Arc<Mutex<BTreeMap<(String, Alpn), Count>>>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Count {
    accepted: usize,
    open: usize,
}

impl Connections {
    /// Counts a connection from `user` (`""` without a client certificate) speaking `alpn`
    /// until the returned guard is dropped.
    pub fn accepted(&self, user: &str, alpn: &str) -> Open {
        let key = (user.to_string(), alpn.to_string());
        if let Ok(mut map) = self.by_peer.lock() {
            let count = map.entry(key.clone()).or_default();
            count.accepted += 1;
            count.open += 1;
        }
        Open {
            connections: self.clone(),
            key,
        }
    }

    /// Connections from `user` open now, whatever their protocol.
    pub fn open(&self, user: &str) -> usize {
        self.sum(|(u, _)| u == user, |c| c.open)
    }

    /// Connections from `user` that agreed on `alpn` and are open now.
    pub fn open_with(&self, user: &str, alpn: &str) -> usize {
        self.sum(|(u, a)| u == user && a == alpn, |c| c.open)
    }

    /// Connections ever accepted from anyone that agreed on `alpn`.
    pub fn accepted_with(&self, alpn: &str) -> usize {
        self.sum(|(_, a)| a == alpn, |c| c.accepted)
    }

    /// Connections ever accepted from `user`, by protocol.
    pub fn accepted_by(&self, user: &str) -> BTreeMap<Alpn, usize> {
        self.by_peer
            .lock()
            .map(|map| {
                map.iter()
                    .filter(|((u, _), _)| u == user)
                    .map(|((_, a), c)| (a.clone(), c.accepted))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn sum(&self, key: impl Fn(&(String, Alpn)) -> bool, field: impl Fn(&Count) -> usize) -> usize {
        self.by_peer
            .lock()
            .map(|map| {
                map.iter()
                    .filter(|(k, _)| key(k))
                    .map(|(_, c)| field(c))
                    .sum()
            })
            .unwrap_or(0)
    }
}

/// One open connection, counted until dropped.
pub struct Open {
    connections: Connections,
    key: (String, Alpn),
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Ok(mut map) = self.connections.by_peer.lock()
            && let Some(count) = map.get_mut(&self.key)
        {
            count.open = count.open.saturating_sub(1);
        }
    }
}

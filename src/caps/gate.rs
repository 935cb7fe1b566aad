//! Counts open connections, streaming sessions and log streams against the configured caps.
//!
//! A permit is taken when a connection is accepted or a stream starts and given back when it is
//! dropped, so counts can never leak on an error path. Past a cap the caller is told so with a
//! 503, and everyone else keeps being served. (A namespace over its share gets a 503 too, not a
//! 429: the root apiserver turns a kubelet's 429 for `pods/log` into a generic "too many
//! requests" and drops the message, while it passes a 503's on.)
//!
//! # Connections: small until authorized
//!
//! What a connection can make relaylet hold is decided before anything about its caller is
//! proven, so connections are counted in stages:
//! - until its TLS handshake is done a connection holds only a *handshake* permit (a small
//!   budget, at most an eighth of it per address; over it the connection is closed at once);
//! - then a connection permit (`MAX_CONNECTIONS[_PER_CLIENT]`), and, until one of its requests
//!   is *authorized* (a SubjectAccessReview, or `X509_ALLOWED_USERS`, said yes), an *unproven*
//!   permit from a small budget of its own: in total, per source address and, for a client
//!   certificate, per user (`MAX_UNAUTHENTICATED_CONNECTIONS[_PER_CLIENT|_PER_USER]`; the name
//!   is older than the rule: "not authorized yet" is meant). Such a connection may send only a
//!   small request head (`node_server`), for as long as it lives.
//!
//! Authentication is not enough to leave that budget: a bearer token that authenticates but is
//! allowed nothing, and every certificate of the root client CA (every worker's kubelet
//! certificate, and in `x509` mode every name not on the allow-list), would otherwise hold
//! large heads on as many connections as the connection caps allow (seen: 2,000 partial heads of
//! 120 KB took 480 MB). So certificates are not trusted for being valid, only for being allowed.
//!
//! The root apiserver must not pay for it: it opens one connection per exec, attach,
//! port-forward or logs call, in bursts (a hundred at once is an ordinary case), all from one
//! address with one identity, and none of them may be refused in normal use. Hence *proven*
//! identities ([`ProvenCallers`]): a certificate identity (its user and groups) one of whose
//! calls was authorized in the last ten minutes is proven, and its connections skip the unproven
//! budget from their handshake on. An identity not known yet is checked once as the connection
//! opens (`node_server` asks whether it may run commands on the node: the check a kubelet call
//! of the apiserver needs anyway, then cached), concurrent connections of that identity waiting
//! for the same answer; so even the first burst after a restart is not refused. A certificate
//! the check refuses, an anonymous connection and a token (which is read from the request head,
//! so after the head) stay in the small budget until a request of theirs is authorized.
//!
//! A proven connection may send a large request head, but only while fewer than
//! `MAX_LARGE_HEAD_CONNECTIONS` connections have one (the rest get the small head, never a
//! refusal): a partial large head costs about 140 KiB (a small one under 40), and a proven
//! identity is still a caller, not the apiserver (any identity the root allows something on the
//! node can be proven). A log stream's connection gives its large head back when the stream
//! starts (`node_server` closes it after the stream), an upgraded one when it upgrades. So every kind of caller's memory is bounded by caps: handshakes, connections
//! (each at most a small head), large heads, sessions and log streams; the chart derives its
//! memory limit from exactly these.
//!
//! # Streams: fair shares behind the apiserver
//!
//! Streams are counted per kind: exec/attach/port-forward sessions and log streams, each in
//! total (`MAX_SESSIONS`, `MAX_LOG_STREAMS`), per authenticated user (`..._PER_USER`) and per
//! namespace of the pod (`..._PER_NAMESPACE`). The per-user caps cannot tell end users apart:
//! every call the root apiserver relays carries the apiserver's own identity. The namespace can:
//! it is part of every call's path, and it is where the root's RBAC grants `pods/exec` and
//! `pods/log`. So one namespace (one tenant, usually) can take at most its share (a quarter by
//! default) of either kind, and the others are still served.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::caps::proven::{Identity, ProvenCallers};
use crate::config::Limits;
use crate::model::kubelet_request::Kind;

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
        "relaylet holds its maximum of {0} connections whose caller is not authorized yet (MAX_UNAUTHENTICATED_CONNECTIONS); try again later"
    )]
    Unauthenticated(usize),
    #[error(
        "{ip} holds its maximum of {max} connections whose caller is not authorized yet (MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT)"
    )]
    UnauthenticatedPerClient { ip: IpAddr, max: usize },
    #[error(
        "user {user:?} holds its maximum of {max} connections not authorized yet (MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER)"
    )]
    UnauthenticatedPerUser { user: String, max: usize },
    #[error("{0} has its maximum of pending TLS handshakes (MAX_PENDING_HANDSHAKES)")]
    Handshakes(IpAddr),
    #[error("relaylet is relaying its maximum of {0} streams (MAX_SESSIONS); try again later")]
    Sessions(usize),
    #[error(
        "user {user:?} has its maximum of {max} open streams (MAX_SESSIONS_PER_USER); try again later"
    )]
    SessionsPerUser { user: String, max: usize },
    #[error(
        "namespace {namespace:?} has its maximum of {max} open exec, attach and port-forward streams (MAX_SESSIONS_PER_NAMESPACE); try again later"
    )]
    SessionsPerNamespace { namespace: String, max: usize },
    #[error("relaylet is streaming its maximum of {0} logs (MAX_LOG_STREAMS); try again later")]
    LogStreams(usize),
    #[error(
        "user {user:?} has its maximum of {max} open log streams (MAX_LOG_STREAMS_PER_USER); try again later"
    )]
    LogStreamsPerUser { user: String, max: usize },
    #[error(
        "namespace {namespace:?} has its maximum of {max} open log streams (MAX_LOG_STREAMS_PER_NAMESPACE); try again later"
    )]
    LogStreamsPerNamespace { namespace: String, max: usize },
}

impl LimitError {
    /// The cap's name in the `relaylet_limit_refusals_total` metric.
    pub fn cap(&self) -> &'static str {
        match self {
            LimitError::Connections(_) | LimitError::ConnectionsPerClient { .. } => "connections",
            LimitError::Unauthenticated(_)
            | LimitError::UnauthenticatedPerClient { .. }
            | LimitError::UnauthenticatedPerUser { .. } => "unauthenticated_connections",
            LimitError::Handshakes(_) => "handshakes",
            LimitError::Sessions(_) | LimitError::SessionsPerUser { .. } => "sessions",
            LimitError::SessionsPerNamespace { .. } => "sessions_per_namespace",
            LimitError::LogStreams(_) | LimitError::LogStreamsPerUser { .. } => "log_streams",
            LimitError::LogStreamsPerNamespace { .. } => "log_streams_per_namespace",
        }
    }
}

/// The counters, and the identities proven lately. Shared by every connection of every port.
pub struct Gate {
    limits: Limits,
    handshakes: Tally<IpAddr>,
    connections: Tally<IpAddr>,
    unproven: Tally<IpAddr>,
    unproven_users: Tally<String>,
    large_heads: Tally<()>,
    sessions: Tally<String>,
    session_namespaces: Tally<String>,
    log_streams: Tally<String>,
    log_stream_namespaces: Tally<String>,
    proven: ProvenCallers,
}

/// A caller that presented a verified client certificate, as the connection caps see it.
#[derive(Debug, Clone)]
pub struct CertCaller {
    /// The certificate's user (CN): the per-user caps' key and what refusals name.
    pub user: String,
    /// User and groups: what a proof is about.
    pub identity: Identity,
}

impl CertCaller {
    pub fn new(user: &str, groups: &[String]) -> CertCaller {
        CertCaller {
            user: user.to_string(),
            identity: Identity::of(user, groups),
        }
    }
}

/// An open connection's permits.
pub struct ConnectionPermit {
    _connection: Permit<IpAddr>,
    /// Shared with its requests, which give the unproven permit back once one is authorized.
    pub standing: Standing,
    large_head: bool,
}

impl ConnectionPermit {
    /// Whether the connection may send large request heads (a proven caller's, while there
    /// is room under `MAX_LARGE_HEAD_CONNECTIONS`).
    pub fn large_head(&self) -> bool {
        self.large_head
    }
}

/// Where a connection stands: its unproven permit until one of its requests is authorized,
/// the certificate identity that an authorization proves, and its large head permit while it
/// may still read request heads. Cheap to clone (its requests share it); the default stands for
/// nothing (a refused connection).
#[derive(Clone, Default)]
pub struct Standing(Option<Arc<StandingInner>>);

struct StandingInner {
    gate: Arc<Gate>,
    identity: Option<Identity>,
    unproven: Mutex<Option<UnprovenPermit>>,
    large_head: Mutex<Option<Permit<()>>>,
}

/// A place in the unproven budget: per source, and per user for a certificate.
struct UnprovenPermit {
    _source: Permit<IpAddr>,
    _user: Option<Permit<String>>,
}

impl Standing {
    /// A request of this connection was authorized: the connection leaves the unproven budget,
    /// and its certificate identity (if any) is proven for its next connections.
    pub fn authorized(&self) {
        let Some(inner) = &self.0 else { return };
        inner
            .unproven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(identity) = inner.identity {
            inner.gate.proven.mark(identity);
        }
    }

    /// The connection carries a stream now and reads no further request head (its answer
    /// closes it after the stream): its large head permit goes to another connection.
    pub fn streaming(&self) {
        if let Some(inner) = &self.0 {
            inner
                .large_head
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
        }
    }

    /// Whether the connection still counts as not authorized.
    pub fn is_unproven(&self) -> bool {
        self.0.as_ref().is_some_and(|inner| {
            inner
                .unproven
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
        })
    }
}

/// A stream's places under the caps: in total and per user, and per namespace. Boxed: every
/// open session holds one for as long as it lasts, and keeps only a pointer of it inline.
pub struct StreamPermit {
    _held: Box<(Permit<String>, Permit<String>)>,
}

impl Gate {
    pub fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            handshakes: Tally::default(),
            connections: Tally::default(),
            unproven: Tally::default(),
            unproven_users: Tally::default(),
            large_heads: Tally::default(),
            sessions: Tally::default(),
            session_namespaces: Tally::default(),
            log_streams: Tally::default(),
            log_stream_namespaces: Tally::default(),
            proven: ProvenCallers::default(),
        })
    }

    /// The certificate identities proven lately (see the module comment).
    pub fn proven(&self) -> &ProvenCallers {
        &self.proven
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

    /// The permits for one more connection from `ip` whose handshake is done. `cert` is the
    /// caller of a verified client certificate, and `proven` whether that caller is proven (see
    /// the module comment): a proven connection takes only a connection permit (and a large
    /// head if there is room); any other also an unproven permit, refused past its caps.
    pub fn tls_connection(
        self: &Arc<Self>,
        ip: IpAddr,
        cert: Option<&CertCaller>,
        proven: bool,
    ) -> Result<ConnectionPermit, LimitError> {
        let connection = self.connection(ip)?;
        self.admit(connection, ip, cert, proven)
    }

    /// [`Gate::tls_connection`] for a connection that holds its connection permit already
    /// (taken before its caller is proven, so that the proof's wait is counted too).
    pub fn admit(
        self: &Arc<Self>,
        connection: Permit<IpAddr>,
        ip: IpAddr,
        cert: Option<&CertCaller>,
        proven: bool,
    ) -> Result<ConnectionPermit, LimitError> {
        let unproven = if proven && cert.is_some() {
            None
        } else {
            Some(self.unproven_permit(ip, cert.map(|c| c.user.as_str()))?)
        };
        let large_head = if unproven.is_none() {
            let max = self.limits.large_head_connections;
            self.large_heads.take((), max, max).ok().map(|()| Permit {
                gate: self.clone(),
                key: (),
                tally: |gate| &gate.large_heads,
            })
        } else {
            None
        };
        Ok(ConnectionPermit {
            _connection: connection,
            large_head: large_head.is_some(),
            standing: Standing(Some(Arc::new(StandingInner {
                gate: self.clone(),
                identity: cert.map(|c| c.identity),
                unproven: Mutex::new(unproven),
                large_head: Mutex::new(large_head),
            }))),
        })
    }

    /// A place in the unproven budget for a connection from `ip` (of certificate `user`).
    fn unproven_permit(
        self: &Arc<Self>,
        ip: IpAddr,
        user: Option<&str>,
    ) -> Result<UnprovenPermit, LimitError> {
        let (total, per_client) = (
            self.limits.unauthenticated_connections,
            self.limits.unauthenticated_connections_per_client,
        );
        self.unproven
            .take(ip, total, per_client)
            .map_err(|over| match over {
                Over::Total => LimitError::Unauthenticated(total),
                Over::PerKey => LimitError::UnauthenticatedPerClient {
                    ip,
                    max: per_client,
                },
            })?;
        let source = Permit {
            gate: self.clone(),
            key: ip,
            tally: |gate| &gate.unproven,
        };
        let user = match user {
            None => None,
            Some(user) => {
                let max = self.limits.unauthenticated_connections_per_user;
                // Dropping `source` on a refusal gives its place back.
                self.unproven_users
                    .take(user.to_string(), usize::MAX, max)
                    .map_err(|_| LimitError::UnauthenticatedPerUser {
                        user: user.to_string(),
                        max,
                    })?;
                Some(Permit {
                    gate: self.clone(),
                    key: user.to_string(),
                    tally: |gate| &gate.unproven_users,
                })
            }
        };
        Ok(UnprovenPermit {
            _source: source,
            _user: user,
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

    /// A permit for one more stream of `kind` (a streaming session or a log stream) of `user`
    /// on a pod of `namespace`.
    pub fn stream(
        self: &Arc<Self>,
        kind: Kind,
        user: &str,
        namespace: &str,
    ) -> Result<StreamPermit, LimitError> {
        if kind.is_streaming() {
            self.session(user, namespace)
        } else {
            self.log_stream(user, namespace)
        }
    }

    /// A permit for one more streaming session of `user` in `namespace`.
    pub fn session(
        self: &Arc<Self>,
        user: &str,
        namespace: &str,
    ) -> Result<StreamPermit, LimitError> {
        let (total, per_user) = (self.limits.sessions, self.limits.sessions_per_user);
        let per_namespace = self.limits.sessions_per_namespace;
        let user = self.keyed(
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
        )?;
        let namespace = self.keyed(
            namespace,
            |gate| &gate.session_namespaces,
            (usize::MAX, per_namespace),
            |_, namespace| LimitError::SessionsPerNamespace {
                namespace,
                max: per_namespace,
            },
        )?;
        Ok(StreamPermit {
            _held: Box::new((user, namespace)),
        })
    }

    /// A permit for one more log stream of `user` in `namespace`.
    pub fn log_stream(
        self: &Arc<Self>,
        user: &str,
        namespace: &str,
    ) -> Result<StreamPermit, LimitError> {
        let (total, per_user) = (self.limits.log_streams, self.limits.log_streams_per_user);
        let per_namespace = self.limits.log_streams_per_namespace;
        let user = self.keyed(
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
        )?;
        let namespace = self.keyed(
            namespace,
            |gate| &gate.log_stream_namespaces,
            (usize::MAX, per_namespace),
            |_, namespace| LimitError::LogStreamsPerNamespace {
                namespace,
                max: per_namespace,
            },
        )?;
        Ok(StreamPermit {
            _held: Box::new((user, namespace)),
        })
    }

    /// A permit from the tally `tally` picks, under `(total, per_key)` caps.
    fn keyed(
        self: &Arc<Self>,
        key: &str,
        tally: fn(&Gate) -> &Tally<String>,
        (total, per_key): (usize, usize),
        refusal: impl FnOnce(Over, String) -> LimitError,
    ) -> Result<Permit<String>, LimitError> {
        let key = key.to_string();
        tally(self)
            .take(key.clone(), total, per_key)
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

    /// Open connections whose caller is not authorized yet.
    pub fn open_unauthenticated(&self) -> usize {
        self.unproven.total.load(Ordering::Relaxed)
    }

    /// Open connections that may send a large request head.
    pub fn open_large_heads(&self) -> usize {
        self.large_heads.total.load(Ordering::Relaxed)
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

    fn cert(user: &str) -> CertCaller {
        CertCaller::new(user, &["system:authenticated".to_string()])
    }

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

        let alice = gate.session("alice", "default").unwrap();
        assert!(matches!(
            gate.session("alice", "default"),
            Err(LimitError::SessionsPerUser { .. })
        ));
        let _bob = gate.session("bob", "default").unwrap();
        assert!(matches!(
            gate.session("carol", "default"),
            Err(LimitError::Sessions(2))
        ));
        drop(alice);
        assert_eq!(gate.open_sessions(), 1);
        assert!(gate.session("alice", "default").is_ok());
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
    fn connections_not_authorized_yet_have_a_budget_of_their_own() {
        let gate = Gate::new(Limits {
            connections: 16,
            connections_per_client: 16,
            unauthenticated_connections: 3,
            unauthenticated_connections_per_client: 2,
            ..Limits::default()
        });
        let stranger: IpAddr = "10.0.0.9".parse().unwrap();
        let other: IpAddr = "10.0.0.8".parse().unwrap();
        let apiserver: IpAddr = "10.0.0.1".parse().unwrap();
        let s1 = gate.tls_connection(stranger, None, false).unwrap();
        let _s2 = gate.tls_connection(stranger, None, false).unwrap();
        assert_eq!(
            gate.tls_connection(stranger, None, false).err(),
            Some(LimitError::UnauthenticatedPerClient {
                ip: stranger,
                max: 2
            })
        );
        let _o1 = gate.tls_connection(other, None, false).unwrap();
        assert_eq!(
            gate.tls_connection(other, None, false).err(),
            Some(LimitError::Unauthenticated(3))
        );
        // A valid certificate is not enough: an unproven one counts like a stranger.
        assert_eq!(
            gate.tls_connection(apiserver, Some(&cert("worker")), false)
                .err(),
            Some(LimitError::Unauthenticated(3))
        );
        // A proven caller is not held up by strangers, and gets a large head.
        let a1 = gate
            .tls_connection(apiserver, Some(&cert("apiserver")), true)
            .unwrap();
        assert!(!a1.standing.is_unproven());
        assert!(a1.large_head());
        assert_eq!(gate.open_unauthenticated(), 3);
        // A connection one of whose requests is authorized leaves the budget, and stays open.
        assert!(s1.standing.is_unproven());
        assert!(!s1.large_head());
        s1.standing.authorized();
        assert!(!s1.standing.is_unproven());
        assert_eq!(gate.open_unauthenticated(), 2);
        assert_eq!(gate.open_connections(), 4);
        assert!(gate.tls_connection(other, None, false).is_ok());
    }

    #[test]
    fn a_certificate_user_has_a_small_unproven_budget_wherever_it_connects_from() {
        let gate = Gate::new(Limits {
            unauthenticated_connections: 100,
            unauthenticated_connections_per_client: 100,
            unauthenticated_connections_per_user: 2,
            ..Limits::default()
        });
        let worker = cert("system:node:worker-1");
        let held: Vec<_> = (1..=2)
            .map(|i| {
                let ip = IpAddr::from([10, 0, 0, i]);
                gate.tls_connection(ip, Some(&worker), false).unwrap()
            })
            .collect();
        assert_eq!(
            gate.tls_connection("10.0.0.3".parse().unwrap(), Some(&worker), false)
                .err(),
            Some(LimitError::UnauthenticatedPerUser {
                user: "system:node:worker-1".into(),
                max: 2
            })
        );
        // The refusal gave back the place it took from its source.
        assert_eq!(gate.open_unauthenticated(), 2);
        assert!(
            gate.tls_connection("10.0.0.3".parse().unwrap(), Some(&cert("other")), false)
                .is_ok()
        );
        drop(held);
        assert!(
            gate.tls_connection("10.0.0.3".parse().unwrap(), Some(&worker), false)
                .is_ok()
        );
    }

    #[test]
    fn an_authorized_request_proves_its_certificate_for_the_next_connections() {
        let gate = Gate::new(Limits::default());
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let apiserver = cert("apiserver");
        assert!(!gate.proven().is_proven(&apiserver.identity));
        let first = gate.tls_connection(ip, Some(&apiserver), false).unwrap();
        first.standing.authorized();
        assert!(gate.proven().is_proven(&apiserver.identity));
        // An anonymous connection proves nobody.
        let anonymous = gate.tls_connection(ip, None, false).unwrap();
        anonymous.standing.authorized();
        assert_eq!(gate.proven().len(), 1);
    }

    #[test]
    fn large_heads_are_few_and_never_a_refusal() {
        let gate = Gate::new(Limits {
            large_head_connections: 2,
            ..Limits::default()
        });
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let apiserver = cert("apiserver");
        let held: Vec<_> = (0..3)
            .map(|_| gate.tls_connection(ip, Some(&apiserver), true).unwrap())
            .collect();
        let large: Vec<bool> = held.iter().map(ConnectionPermit::large_head).collect();
        assert_eq!(large, [true, true, false]);
        assert_eq!(gate.open_large_heads(), 2);
        // A connection that carries a stream reads no further head: its permit moves on.
        held[0].standing.streaming();
        assert_eq!(gate.open_large_heads(), 1);
        assert!(
            gate.tls_connection(ip, Some(&apiserver), true)
                .unwrap()
                .large_head()
        );
        drop(held);
        assert_eq!(gate.open_large_heads(), 0);
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
        let _exec = gate.stream(Kind::Exec, "alice", "a").unwrap();
        let alice = gate.stream(Kind::ContainerLogs, "alice", "a").unwrap();
        assert_eq!(
            gate.stream(Kind::ContainerLogs, "alice", "a").err(),
            Some(LimitError::LogStreamsPerUser {
                user: "alice".into(),
                max: 1
            })
        );
        let _bob = gate.stream(Kind::ContainerLogs, "bob", "b").unwrap();
        assert_eq!(
            gate.stream(Kind::ContainerLogs, "carol", "c").err(),
            Some(LimitError::LogStreams(2))
        );
        assert_eq!(gate.open_log_streams(), 2);
        assert_eq!(gate.open_sessions(), 1);
        drop(alice);
        assert!(gate.stream(Kind::ContainerLogs, "carol", "c").is_ok());
    }

    #[test]
    fn one_namespace_takes_at_most_its_share() {
        let gate = Gate::new(Limits {
            sessions: 10,
            sessions_per_namespace: 2,
            log_streams: 10,
            log_streams_per_namespace: 1,
            ..Limits::default()
        });
        // One identity (the apiserver's) for every call, as behind the root apiserver.
        let apiserver = "kube-apiserver-kubelet-client";
        let held: Vec<_> = (0..2)
            .map(|_| gate.stream(Kind::Exec, apiserver, "team-a").unwrap())
            .collect();
        let refused = gate.stream(Kind::Attach, apiserver, "team-a").err();
        assert_eq!(
            refused,
            Some(LimitError::SessionsPerNamespace {
                namespace: "team-a".into(),
                max: 2
            })
        );
        assert_eq!(refused.unwrap().cap(), "sessions_per_namespace");
        // The refusal took nothing: the total still counts two.
        assert_eq!(gate.open_sessions(), 2);
        assert!(gate.stream(Kind::PortForward, apiserver, "team-b").is_ok());

        let _log = gate
            .stream(Kind::ContainerLogs, apiserver, "team-a")
            .unwrap();
        assert_eq!(
            gate.stream(Kind::ContainerLogs, apiserver, "team-a").err(),
            Some(LimitError::LogStreamsPerNamespace {
                namespace: "team-a".into(),
                max: 1
            })
        );
        assert!(
            gate.stream(Kind::ContainerLogs, apiserver, "team-b")
                .is_ok()
        );
        drop(held);
        assert!(gate.stream(Kind::Exec, apiserver, "team-a").is_ok());
    }
}

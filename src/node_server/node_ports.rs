//! One extra kubelet port per virtual node, so node-level requests can tell nodes apart.
//!
//! Every virtual node has relaylet's address, so a scraper that dials
//! `https://<address>:<port>/metrics/resource` (metrics-server; the root apiserver for
//! `nodes/{name}/proxy/...`, with `Host: <address>:<port>` and no SNI for an IP) names no node:
//! neither the path, the Host header nor SNI says which node it means. The port can: each
//! virtual node gets its own listener, and the node's `status.daemonEndpoints.kubeletEndpoint.Port`
//! should name it. The listener serves the full kubelet API (exec and logs work on it too),
//! with node-level paths answered for its node.
//!
//! It is also a boundary: a node's port serves only that node's pods (`node_server::pod_calls`), and
//! a Node always names its own port, never the shared one, because the root apiserver's node
//! proxy calls the port a Node names with its own, all-powerful identity on behalf of a user who
//! was authorized for that node alone.
//!
//! A replica listens only for the nodes it writes: the leaf's loop claims the port before it
//! writes the Node (`virtual_node::leaf_loop`) and releases it once another replica writes the
//! Node or the leaf is gone: listening for every leaf of the fleet on every replica would cost
//! a socket and a task per leaf on each, and `NODE_PORTS` is then the most Nodes one replica
//! serves at once, not the most leaves an install has. A released port keeps
//! listening for [`LINGER`], so a session the root apiserver sent just before the Node moved
//! still lands.
//!
//! Ports are taken from `NODE_SERVER_PORT + 1` upwards, the first free one for each node, so
//! they may differ between replicas: the replica that writes a Node writes its own port together
//! with its own address. At most `NODE_PORTS` of them (the chart's NetworkPolicy opens that
//! range): a node past it gets no listener, and its Node is not written, with one error logged
//! that names the setting, until a port frees.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::connection;
use super::connection::Listeners;

/// How long a released node port still accepts connections: sessions the root apiserver
/// addressed from the Node before it named another replica (or, handed back, before the next
/// replica wrote it; that takes a round, 2 s) are still served.
pub const LINGER: Duration = Duration::from_secs(30);

/// Which port serves which virtual node on this replica. Cheap to clone.
#[derive(Clone, Default)]
pub struct NodePorts {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    ports: RwLock<BTreeMap<String, Bound>>,
    /// What a node's listener needs, once the node server listens.
    server: watch::Sender<Option<Arc<Server>>>,
    /// Nodes whose missing port was reported: once each, not at every retry.
    reported: Mutex<HashSet<String>>,
    /// Released ports whose listeners still linger: not tried by a claim until they stop.
    lingering: Mutex<HashSet<u16>>,
}

/// One node's listener.
struct Bound {
    addr: SocketAddr,
    stop: CancellationToken,
}

/// Where nodes' listeners are bound and what serves them.
struct Server {
    /// The shared port's address: the nodes' ports are the `window` above it.
    shared: SocketAddr,
    window: u16,
    tls: Arc<rustls::ServerConfig>,
    listeners: Listeners,
    /// The node server's shutdown: it stops every node's listener too.
    stop: CancellationToken,
}

/// Why a node has no port of its own.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct NoPort(#[from] std::io::Error);

impl NodePorts {
    /// The address of `node`'s own listener, while it has one.
    pub fn addr_of(&self, node: &str) -> Option<SocketAddr> {
        self.inner
            .ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .map(|b| b.addr)
    }

    /// Every node's listener.
    pub fn all(&self) -> BTreeMap<String, SocketAddr> {
        self.inner
            .ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(node, b)| (node.clone(), b.addr))
            .collect()
    }

    /// Starts serving nodes' ports: the `window` above `shared`, with `tls` and `listeners`,
    /// until `stop` fires. Claims made before wait for it.
    pub fn serve(
        &self,
        shared: SocketAddr,
        window: u16,
        tls: Arc<rustls::ServerConfig>,
        listeners: Listeners,
        stop: CancellationToken,
    ) {
        let server = Server {
            shared,
            window,
            tls,
            listeners,
            stop,
        };
        self.inner.server.send_replace(Some(Arc::new(server)));
    }

    /// `node`'s own port, bound now if it has none: the first free one above the shared
    /// port. Waits until the node server listens. A node past `NODE_PORTS` gets none (one
    /// error logged per node until it gets one).
    pub async fn claim(&self, node: &str) -> Result<SocketAddr, NoPort> {
        if let Some(addr) = self.addr_of(node) {
            return Ok(addr);
        }
        let mut server = self.inner.server.subscribe();
        let server = match server.wait_for(Option::is_some).await {
            Ok(server) => server.clone(),
            Err(_) => None,
        }
        .ok_or_else(|| NoPort(std::io::Error::other("the node server is not listening")))?;
        let mut ports = self.inner.ports.write().unwrap_or_else(|e| e.into_inner());
        if let Some(bound) = ports.get(node) {
            return Ok(bound.addr);
        }
        // Ports this replica's listeners hold are not tried again: trying each from the bottom
        // of the window made a fleet's start a million failed binds.
        let held: HashSet<u16> = ports
            .values()
            .map(|b| b.addr.port())
            .chain(self.lingering().iter().copied())
            .collect();
        let bound = bind_free(
            server.shared.ip(),
            server.shared.port(),
            server.window,
            &held,
        )
        .and_then(|listener| {
            let addr = listener.local_addr()?;
            Ok((listener, addr))
        });
        let (listener, addr) = match bound {
            Ok(bound) => bound,
            Err(err) => {
                // The Node is not written without its own port (see `leaf_loop`).
                if self.reported().insert(node.to_string()) {
                    tracing::error!(%node, %err, "no port for the node's own listener: its Node is not written until one frees; retrying");
                }
                return Err(NoPort(err));
            }
        };
        self.reported().remove(node);
        tracing::info!(%node, %addr, "node listener up");
        let stop = server.stop.child_token();
        tokio::spawn(connection::serve(
            listener,
            server.tls.clone(),
            server.listeners.clone(),
            Some(node.to_string()),
            stop.clone(),
        ));
        ports.insert(node.to_string(), Bound { addr, stop });
        Ok(addr)
    }

    /// Gives up `node`'s port: it is no longer this replica's to name, and it stops accepting
    /// [`LINGER`] later (sessions already on it carry on).
    pub fn release(&self, node: &str) {
        if self.addr_of(node).is_none() {
            return;
        }
        let bound = self
            .inner
            .ports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(node);
        let Some(bound) = bound else { return };
        tracing::info!(%node, addr = %bound.addr, "node listener released");
        let port = bound.addr.port();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                self.lingering().insert(port);
                let ports = self.clone();
                runtime.spawn(async move {
                    tokio::select! {
                        () = tokio::time::sleep(LINGER) => bound.stop.cancel(),
                        () = bound.stop.cancelled() => {}
                    }
                    ports.lingering().remove(&port);
                });
            }
            Err(_) => bound.stop.cancel(),
        }
    }

    fn lingering(&self) -> std::sync::MutexGuard<'_, HashSet<u16>> {
        self.inner
            .lingering
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn reported(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.inner
            .reported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// The first free port of the `window` above `base` on `ip`, not trying those in `held`.
fn bind_free(
    ip: IpAddr,
    base: u16,
    window: u16,
    held: &HashSet<u16>,
) -> std::io::Result<TcpListener> {
    for offset in 1..=window {
        let Some(port) = base.checked_add(offset) else {
            break;
        };
        if held.contains(&port) {
            continue;
        }
        if let Ok(listener) = bind((ip, port).into()) {
            return Ok(listener);
        }
    }
    let last = base.saturating_add(window);
    Err(std::io::Error::other(format!(
        "every port of {}-{last} is taken (NODE_PORTS={window} above NODE_SERVER_PORT: \
         one per virtual node; raise it, and the chart's nodeServer.nodePorts, for more leaves)",
        base.saturating_add(1).min(last),
    )))
}

/// A listener on `addr`, bound in place (a few system calls, no waiting): a claim holds the map
/// meanwhile, so two claims never take one port. As `TcpListener::bind` does: `SO_REUSEADDR`,
/// so a port released a moment ago (connections in `TIME_WAIT`) can be bound again, and a
/// backlog of 1,024.
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_node_past_the_window_gets_a_clear_refusal() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        // A base whose two ports above are both held here.
        let (base, _held) = loop {
            let shared = TcpListener::bind((ip, 0)).await.unwrap();
            let base = shared.local_addr().unwrap().port();
            let (Some(p1), Some(p2), Some(p3)) = (
                base.checked_add(1),
                base.checked_add(2),
                base.checked_add(3),
            ) else {
                continue;
            };
            let (Ok(a), Ok(b), Ok(free)) = (
                TcpListener::bind((ip, p1)).await,
                TcpListener::bind((ip, p2)).await,
                TcpListener::bind((ip, p3)).await,
            ) else {
                continue;
            };
            drop(free);
            break (base, [shared, a, b]);
        };
        let none = HashSet::new();
        let err = bind_free(ip, base, 2, &none).unwrap_err();
        let want = format!(
            "every port of {}-{} is taken (NODE_PORTS=2 above NODE_SERVER_PORT",
            base + 1,
            base + 2
        );
        assert!(err.to_string().starts_with(&want), "{err}");
        // One more port in the window: found.
        let listener = bind_free(ip, base, 3, &none).unwrap();
        assert_eq!(listener.local_addr().unwrap().port(), base + 3);
    }

    #[tokio::test]
    async fn ports_this_replica_holds_are_passed_over() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        // A base whose two ports above are free.
        let base = loop {
            let shared = TcpListener::bind((ip, 0)).await.unwrap();
            let base = shared.local_addr().unwrap().port();
            let (Some(p1), Some(p2)) = (base.checked_add(1), base.checked_add(2)) else {
                continue;
            };
            if let (Ok(_), Ok(_)) = (
                TcpListener::bind((ip, p1)).await,
                TcpListener::bind((ip, p2)).await,
            ) {
                break base;
            }
        };
        let held = HashSet::from([base + 1]);
        let listener = bind_free(ip, base, 2, &held).unwrap();
        assert_eq!(listener.local_addr().unwrap().port(), base + 2);
        let err = bind_free(ip, base, 1, &held).unwrap_err();
        assert!(err.to_string().starts_with("every port of"), "{err}");
    }
}

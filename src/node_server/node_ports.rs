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
//! It is also a boundary: a node's port serves only that node's pods (`node_server::calls`), and
//! a Node always names its own port, never the shared one, because the root apiserver's node
//! proxy calls the port a Node names with its own, all-powerful identity on behalf of a user who
//! was authorized for that node alone.
//!
//! Ports are taken from `NODE_SERVER_PORT + 1` upwards, the first free one for each node, so
//! they may differ between replicas: the replica that writes a Node writes its own port together
//! with its own address. At most `NODE_PORTS` of them (the chart's NetworkPolicy opens that
//! range): a node past it gets no listener, and its Node is not written, with one error logged
//! that names the setting, until a port frees.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::connection;
use super::connection::Listeners;
use crate::leaf::Registry;

/// How long to wait before trying again to bind a node's port when none was free.
const BIND_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Which port serves which virtual node on this replica. Cheap to clone.
#[derive(Clone, Default)]
pub struct NodePorts {
    ports: Arc<RwLock<BTreeMap<String, SocketAddr>>>,
}

impl NodePorts {
    /// The address of `node`'s own listener, once it is bound.
    pub fn addr_of(&self, node: &str) -> Option<SocketAddr> {
        self.ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .copied()
    }

    /// Every node's listener.
    pub fn all(&self) -> BTreeMap<String, SocketAddr> {
        self.ports.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Keeps one listener per registered virtual node, following the registry, until `stop`
    /// fires. `make` builds the server for a node; `shared` is the shared port's address, and
    /// the nodes' ports are the `window` above it.
    pub async fn run(
        self,
        registry: Registry,
        shared: SocketAddr,
        window: u16,
        tls: Arc<rustls::ServerConfig>,
        listeners: Listeners,
        stop: CancellationToken,
    ) {
        let mut leaves = registry.subscribe();
        let mut running: HashMap<String, CancellationToken> = HashMap::new();
        // Nodes whose missing port was reported: once each, not at every retry.
        let mut reported: HashSet<String> = HashSet::new();
        loop {
            // A set: at 1,000 nodes a list's lookups were a million comparisons per change.
            let nodes: HashSet<String> = leaves
                .borrow_and_update()
                .values()
                .map(|l| l.node_name.clone())
                .collect();
            reported.retain(|node| nodes.contains(node));
            running.retain(|node, token| {
                let keep = nodes.contains(node);
                if !keep {
                    token.cancel();
                    self.ports
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(node);
                }
                keep
            });
            let mut unbound = false;
            // Ports this replica's listeners hold are not tried again: trying each from the
            // bottom of the window made a fleet's start a million failed binds.
            let mut held: HashSet<u16> = self
                .ports
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(SocketAddr::port)
                .collect();
            for node in nodes {
                if running.contains_key(&node) {
                    continue;
                }
                let listener = match bind_free(shared.ip(), shared.port(), window, &held).await {
                    Ok(listener) => listener,
                    Err(err) => {
                        // The Node is not written without its own port (see `leaf_loop`).
                        if reported.insert(node.clone()) {
                            tracing::error!(%node, %err, "no port for the node's own listener: its Node is not written until one frees; retrying");
                        }
                        unbound = true;
                        continue;
                    }
                };
                reported.remove(&node);
                let Ok(addr) = listener.local_addr() else {
                    continue;
                };
                held.insert(addr.port());
                tracing::info!(%node, %addr, "node listener up");
                let token = stop.child_token();
                tokio::spawn(connection::serve(
                    listener,
                    tls.clone(),
                    listeners.clone(),
                    Some(node.clone()),
                    token.clone(),
                ));
                self.ports
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(node.clone(), addr);
                running.insert(node, token);
            }
            tokio::select! {
                changed = leaves.changed() => if changed.is_err() { break },
                _ = tokio::time::sleep(BIND_RETRY), if unbound => {}
                _ = stop.cancelled() => break,
            }
        }
        for token in running.values() {
            token.cancel();
        }
    }
}

/// The first free port of the `window` above `base` on `ip`, not trying those in `held`.
async fn bind_free(
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
        if let Ok(listener) = TcpListener::bind((ip, port)).await {
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
        let err = bind_free(ip, base, 2, &none).await.unwrap_err();
        let want = format!(
            "every port of {}-{} is taken (NODE_PORTS=2 above NODE_SERVER_PORT",
            base + 1,
            base + 2
        );
        assert!(err.to_string().starts_with(&want), "{err}");
        // One more port in the window: found.
        let listener = bind_free(ip, base, 3, &none).await.unwrap();
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
        let listener = bind_free(ip, base, 2, &held).await.unwrap();
        assert_eq!(listener.local_addr().unwrap().port(), base + 2);
        let err = bind_free(ip, base, 1, &held).await.unwrap_err();
        assert!(err.to_string().starts_with("every port of"), "{err}");
    }
}

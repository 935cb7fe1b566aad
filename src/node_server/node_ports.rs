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
//! with its own address.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::connection;
use super::server::NodeServer;
use crate::leaf::Registry;

/// How many ports above the shared one are tried for each node.
pub const PORT_SEARCH: u16 = 1000;
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
    /// fires. `make` builds the server for a node; `shared` is the shared port's address.
    pub async fn run(
        self,
        registry: Registry,
        shared: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        make: impl Fn(String) -> Arc<NodeServer>,
        stop: CancellationToken,
    ) {
        let mut leaves = registry.subscribe();
        let mut running: HashMap<String, CancellationToken> = HashMap::new();
        loop {
            let nodes: Vec<String> = leaves
                .borrow_and_update()
                .values()
                .map(|l| l.node_name.clone())
                .collect();
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
            for node in nodes {
                if running.contains_key(&node) {
                    continue;
                }
                let listener = match bind_free(shared.ip(), shared.port()).await {
                    Ok(listener) => listener,
                    Err(err) => {
                        // The Node is not written without its own port (see `leaf_loop`).
                        tracing::warn!(%node, %err, "no port for the node's own listener; retrying");
                        unbound = true;
                        continue;
                    }
                };
                let Ok(addr) = listener.local_addr() else {
                    continue;
                };
                tracing::info!(%node, %addr, "node listener up");
                let token = stop.child_token();
                tokio::spawn(connection::serve(
                    listener,
                    tls.clone(),
                    make(node.clone()),
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

/// The first free port above `base` on `ip`.
async fn bind_free(ip: IpAddr, base: u16) -> std::io::Result<TcpListener> {
    let mut last = None;
    for offset in 1..=PORT_SEARCH {
        let Some(port) = base.checked_add(offset) else {
            break;
        };
        match TcpListener::bind((ip, port)).await {
            Ok(listener) => return Ok(listener),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port left above NODE_SERVER_PORT")))
}

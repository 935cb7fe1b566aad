//! The one place that picks a free port number instead of binding port 0.
//!
//! Binding port 0 and passing the listener (or its bound address) on is always preferred: the
//! kernel's choice cannot be taken by anyone else. A number picked here (bound, read, released)
//! can in principle be taken by another process before its user binds it, so it is only for
//! users that must be told a number and cannot be handed a listener:
//! - a separate process configured by a port number (a pod's process, reading `PORT_<n>`; a
//!   `relaylet serve` child, reading `NODE_SERVER_PORT`, which must be 1-65535);
//! - relaylet's `NODE_SERVER_PORT` in process: it must be 1-65535, and the virtual node's Node
//!   status names it as the kubelet port until the node's own listener is bound.

use std::net::SocketAddr;

/// A loopback port no one listens on at the time of the call.
pub fn free_loopback_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()
}

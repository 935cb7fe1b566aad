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
//!
//! The numbers come from below the kernel's ephemeral range (`ip_local_port_range`, 32768-60999
//! by default), in turn from a start picked by the process ID: port 0 would hand out a number
//! from that range, where any outgoing connection on the machine (an apiserver's, kubectl's) can
//! be given it before its user binds it ("Address already in use" in a loaded CI run).

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The lowest port handed out; the highest is just below the ephemeral range.
const LOWEST: u16 = 16384;

/// How far apart two numbers handed out in one process lie. relaylet binds a listener per
/// virtual node on the first free port above `NODE_SERVER_PORT`; were the next number handed out
/// just above the last, a test's replica would take the port another test was just told (seen
/// as "Address already in use" when the second replica starts).
const STRIDE: u16 = 32;

/// Where this process's next number comes from: one cursor for ports and windows alike, so
/// nothing handed out in one process overlaps anything else it handed out.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A loopback port no one listens on at the time of the call, with the `STRIDE - 1` ports
/// above it free too (room for the listeners of the virtual nodes it serves).
pub fn free_loopback_port() -> std::io::Result<SocketAddr> {
    match claim(STRIDE - 1) {
        Some(port) => Ok(SocketAddr::from(([127, 0, 0, 1], port))),
        None => TcpListener::bind(("127.0.0.1", 0))?.local_addr(),
    }
}

/// The first port of a window of `len + 1` loopback ports (`first..=first + len`) that lies
/// below the ephemeral range, every one of them free at the time of the call: for a listener
/// per virtual node above `NODE_SERVER_PORT` (`NODE_PORTS`). A window from a single free port
/// could reach into the ephemeral range, where the fleet's own connections and port-0
/// listeners had taken 79 of 1,000 ports.
pub fn free_loopback_window(len: u16) -> std::io::Result<u16> {
    claim(len).ok_or_else(|| {
        std::io::Error::other(format!(
            "no free window of {len} loopback ports below the ephemeral range"
        ))
    })
}

/// The first port of `first..=first + len`, all free and below the ephemeral range, taken from
/// this process's cursor (which then moves past it, rounded up to the stride). Ports and
/// windows share one mapping from the cursor to port numbers, whatever their length, so what
/// one claim handed out never overlaps another's; a window that would reach into the
/// ephemeral range where the mapping wraps is skipped.
fn claim(len: u16) -> Option<u16> {
    let top = ephemeral_start();
    if top <= LOWEST.saturating_add(len) {
        return None;
    }
    let span = usize::from(top - LOWEST);
    let step = (usize::from(len) + 1).div_ceil(usize::from(STRIDE)) * usize::from(STRIDE);
    let start = std::process::id() as usize * 7919 % span;
    for _ in 0..=span.div_ceil(step) {
        let offset = (start + NEXT.fetch_add(step, Ordering::Relaxed)) % span;
        let first = LOWEST + offset as u16;
        if usize::from(first) + usize::from(len) >= usize::from(top) {
            continue;
        }
        let free = (first..=first + len).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok());
        if free {
            return Some(first);
        }
    }
    None
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_below_the_ephemeral_range_and_differ() {
        let a = free_loopback_port().unwrap().port();
        let b = free_loopback_port().unwrap().port();
        assert!(a >= LOWEST && a < ephemeral_start(), "{a}");
        assert!(b >= LOWEST && b < ephemeral_start(), "{b}");
        assert!(a.abs_diff(b) >= STRIDE, "{a} {b}");
    }

    #[test]
    fn a_window_and_the_ports_around_it_do_not_overlap() {
        let before = free_loopback_port().unwrap().port();
        let first = free_loopback_window(100).unwrap();
        let after = free_loopback_port().unwrap().port();
        for port in [before, after] {
            assert!(
                !(first..=first + 100).contains(&port),
                "{port} in {first}+100"
            );
        }
    }

    #[test]
    fn ports_and_windows_of_every_length_never_overlap() {
        // Each length once had its own mapping from the cursor to port numbers.
        let mut taken: Vec<(u16, u16)> = Vec::new();
        for round in 0..5 {
            for len in [STRIDE - 1, 100, 1000, STRIDE - 1] {
                let first = if len == STRIDE - 1 {
                    free_loopback_port().unwrap().port()
                } else {
                    free_loopback_window(len).unwrap()
                };
                for &(other, other_len) in &taken {
                    assert!(
                        first + len < other || other + other_len < first,
                        "round {round}: {first}+{len} overlaps {other}+{other_len}"
                    );
                }
                taken.push((first, len));
            }
        }
    }

    #[test]
    fn a_window_lies_below_the_ephemeral_range_and_is_free() {
        let first = free_loopback_window(1000).unwrap();
        assert!(
            first >= LOWEST && first + 1000 < ephemeral_start(),
            "{first}"
        );
        for port in first..=first + 1000 {
            TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }
}

//! Counts one process's established TCP connections to given listeners, from `/proc`.
//!
//! `/proc/<pid>/net/tcp` (and `tcp6`) lists every socket of the process's network namespace,
//! not only its own; the process's own are those whose inode is one of its descriptors
//! (`/proc/<pid>/fd/* -> socket:[inode]`). The fleet benchmark uses this to count a replica's
//! connections to the root apiserver and to each leaf apiserver, without asking relaylet.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use anyhow::Context;

/// `st` of an established connection in `/proc/net/tcp`.
const ESTABLISHED: u8 = 0x01;

/// One line of `/proc/net/tcp` or `/proc/net/tcp6`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpEntry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: u8,
    pub inode: u64,
}

/// Parses the text of `/proc/net/tcp` or `/proc/net/tcp6` (the header line is skipped, as is
/// any line that does not parse: the kernel's format, not input to trust blindly).
pub fn parse_tcp_table(text: &str) -> Vec<TcpEntry> {
    text.lines().skip(1).filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<TcpEntry> {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    let fields: Vec<&str> = line.split_whitespace().collect();
    let local = parse_addr(fields.get(1)?)?;
    let remote = parse_addr(fields.get(2)?)?;
    let state = u8::from_str_radix(fields.get(3)?, 16).ok()?;
    let inode = fields.get(9)?.parse().ok()?;
    Some(TcpEntry {
        local,
        remote,
        state,
        inode,
    })
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6). The kernel prints each 32-bit
/// word of the address as the host reads it, so the bytes come back with `to_ne_bytes`.
fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(ip.get(i * 8..i * 8 + 8)?)?);
            }
            let v6 = Ipv6Addr::from(bytes);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The inodes of the sockets `pid` holds open.
pub fn socket_inodes(pid: u32) -> anyhow::Result<BTreeSet<u64>> {
    let dir = format!("/proc/{pid}/fd");
    let mut inodes = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        // A descriptor may close between listing and reading: skip it.
        let Ok(entry) = entry else { continue };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if let Some(inode) = socket_inode(&target.to_string_lossy()) {
            inodes.insert(inode);
        }
    }
    Ok(inodes)
}

/// `socket:[12345]` -> 12345.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// `pid`'s established TCP connections (IPv4 and IPv6).
pub fn established(pid: u32) -> anyhow::Result<Vec<TcpEntry>> {
    let mine = socket_inodes(pid)?;
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let path = format!("/proc/{pid}/net/{table}");
        // A kernel without IPv6 has no tcp6.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        out.extend(
            parse_tcp_table(&text)
                .into_iter()
                .filter(|e| e.state == ESTABLISHED && mine.contains(&e.inode)),
        );
    }
    Ok(out)
}

/// How many of `connections` go to each of `listeners` (every listener present, 0 if none).
pub fn count_to(connections: &[TcpEntry], listeners: &[SocketAddr]) -> BTreeMap<SocketAddr, usize> {
    let mut counts: BTreeMap<SocketAddr, usize> = listeners.iter().map(|l| (*l, 0)).collect();
    for c in connections {
        if let Some(n) = counts.get_mut(&c.remote) {
            *n += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as a little-endian kernel prints them.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0000000000000000 100 0 0 10 0
   1: 0200007F:A3F2 0100007F:1F90 01 00000000:00000000 02:000A7C1B 00000000  1000        0 222 2 0000000000000000 20 4 30 10 -1
   2: 0300007F:B000 0100007F:1F91 06 00000000:00000000 03:00000F2C 00000000     0        0 0 3 0000000000000000
garbage line
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:C350 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 333 1 0000000000000000 20 4 0 10 -1
   1: 00000000000000000000000001000000:1F92 00000000000000000000000001000000:D431 01 00000000:00000000 00:00000000 00000000  1000        0 444 1 0000000000000000 20 4 0 10 -1
";

    #[test]
    fn parses_the_kernels_tables() {
        if cfg!(target_endian = "big") {
            return; // The lines above are a little-endian kernel's.
        }
        let v4 = parse_tcp_table(TCP);
        assert_eq!(v4.len(), 3, "{v4:?}");
        assert_eq!(v4[0].local, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(v4[0].state, 0x0A);
        assert_eq!(
            v4[1],
            TcpEntry {
                local: "127.0.0.2:41970".parse().unwrap(),
                remote: "127.0.0.1:8080".parse().unwrap(),
                state: ESTABLISHED,
                inode: 222,
            }
        );
        assert_eq!(v4[2].remote, "127.0.0.1:8081".parse().unwrap());
        let v6 = parse_tcp_table(TCP6);
        // An IPv4-mapped address counts as the IPv4 one.
        assert_eq!(v6[0].remote, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(v6[0].inode, 333);
        assert_eq!(v6[1].local, "[::1]:8082".parse().unwrap());
    }

    #[test]
    fn counts_connections_per_listener() {
        if cfg!(target_endian = "big") {
            return;
        }
        let mut all = parse_tcp_table(TCP);
        all.extend(parse_tcp_table(TCP6));
        let established: Vec<TcpEntry> =
            all.into_iter().filter(|e| e.state == ESTABLISHED).collect();
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:8081".parse().unwrap();
        let counts = count_to(&established, &[a, b]);
        // 222 and 333 go to :8080; the one to :8081 is TIME_WAIT, not established.
        assert_eq!(counts[&a], 2);
        assert_eq!(counts[&b], 0);
    }

    #[test]
    fn socket_links_are_read() {
        assert_eq!(socket_inode("socket:[12345]"), Some(12345));
        assert_eq!(socket_inode("pipe:[12345]"), None);
        assert_eq!(socket_inode("/dev/null"), None);
    }

    /// Through the real /proc: a connection this process opens to its own listener is found,
    /// to that listener, and only while it is open.
    #[test]
    fn finds_this_process_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let pid = std::process::id();
        let before = count_to(&established(pid).unwrap(), &[addr])[&addr];
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        let during = count_to(&established(pid).unwrap(), &[addr])[&addr];
        assert_eq!(during, before + 1);
        drop(client);
        drop(server);
        assert_eq!(before, 0);
    }
}

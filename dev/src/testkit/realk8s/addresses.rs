//! The addresses relaylet replicas listen on in a real-Kubernetes world, as a pod's IP.
//!
//! By default each replica gets a loopback address of its own (127.0.0.2, .3, ...). The root
//! apiserver's node proxy (`nodes/<name>/proxy/...`) refuses to dial those ("address not
//! allowed": it proxies only to global unicast addresses), so a world that tests the node proxy
//! gives its replicas routable ones instead: addresses from 198.18.0.0/15 (set aside for
//! benchmarking networks, RFC 2544, so never a real host's) that this process adds to the
//! loopback interface, labelled with its pid, and removes at exit. The apiserver checks the
//! address, not the interface, and traffic to them stays on this machine. Addresses left by a
//! process that was killed are removed by the next one.

use std::net::IpAddr;
use std::process::Command;

/// Where replica addresses come from.
pub enum ReplicaAddresses {
    /// 127.0.0.{i+2}.
    Loopback,
    /// 198.18.0.0/15 addresses `base.{i+2}` on the loopback interface.
    Routable { base: [u8; 3] },
}

impl ReplicaAddresses {
    /// Adds an address for each of `replicas` to the loopback interface (needs root).
    pub fn routable(replicas: usize) -> ReplicaAddresses {
        remove_stale_addresses();
        let pid = std::process::id();
        // From the pid: concurrent test processes (other checkouts' too) use other addresses.
        let base = [198, 18 + ((pid >> 8) & 1) as u8, (pid & 0xff) as u8];
        let addresses = ReplicaAddresses::Routable { base };
        let label = format!("lo:rlt{pid}");
        for i in 0..replicas {
            let addr = format!("{}/32", addresses.ip(i));
            ip(&["addr", "add", &addr, "dev", "lo", "label", &label]);
            crate::testkit::run_at_exit(Box::new(move || {
                let _ = Command::new(IP)
                    .args(["addr", "del", &addr, "dev", "lo"])
                    .status();
            }));
        }
        addresses
    }

    /// Replica `i`'s address.
    pub fn ip(&self, i: usize) -> IpAddr {
        match self {
            ReplicaAddresses::Loopback => format!("127.0.0.{}", i + 2),
            ReplicaAddresses::Routable { base, .. } => {
                format!("{}.{}.{}.{}", base[0], base[1], base[2], i + 2)
            }
        }
        .parse()
        .expect("an IP address")
    }
}

/// `ip` (iproute2), by absolute path: processes started with a cleared environment use it too.
pub(super) const IP: &str = "/usr/sbin/ip";

/// Runs `ip args`, panicking with its error (a test that needs the interface cannot go on).
pub(super) fn ip(args: &[&str]) {
    let out = Command::new(IP)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running ip {args:?} (iproute2): {e}"));
    assert!(
        out.status.success(),
        "ip {args:?} failed (addresses, links and network namespaces need root): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Removes loopback addresses labelled `lo:rlt<pid>` whose process is gone.
fn remove_stale_addresses() {
    let Ok(out) = Command::new(IP)
        .args(["-o", "-4", "addr", "show", "dev", "lo"])
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `1: lo    inet 198.18.1.2/32 scope global lo:rlt123\ ...`
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(addr) = words
            .iter()
            .position(|w| *w == "inet")
            .and_then(|i| words.get(i + 1))
        else {
            continue;
        };
        let Some(pid) = words
            .iter()
            .find_map(|w| w.trim_end_matches('\\').strip_prefix("lo:rlt"))
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new(IP)
                .args(["addr", "del", addr, "dev", "lo"])
                .status();
        }
    }
}

//! A network namespace of its own for relaylet, as a pod network that cannot dial the leaf
//! clusters: its only link is a veth pair to this machine (a /30, no other route), so relaylet
//! reaches the root apiserver and the konnectivity server on the host's end of the pair, the
//! root reaches relaylet on the namespace's end, and `127.0.0.1` inside is the namespace's own
//! loopback, where no leaf apiserver listens. Made by `ip` (needs root); removed at exit, and
//! one left by a killed test process is removed by the next.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;

use super::addresses::{IP, ip};

/// A namespace and its veth pair.
pub struct Netns {
    pub name: String,
    /// This machine's end of the pair: what the namespace dials to reach the root and proxy.
    pub host_ip: IpAddr,
    /// The namespace's end: relaylet's "pod IP".
    pub ns_ip: IpAddr,
}

impl Netns {
    /// Creates `rlt<pid>` with addresses from 198.18.0.0/15 (set aside for benchmarking
    /// networks, RFC 2544, so never a real host's), picked from the pid so that concurrent test
    /// processes do not collide.
    pub fn create() -> Netns {
        remove_stale();
        let pid = std::process::id();
        let name = format!("rlt{pid}");
        let subnet = format!("198.19.{}.{}", (pid >> 6) & 0xff, (pid & 0x3f) << 2);
        let base: std::net::Ipv4Addr = subnet.parse().expect("an IPv4 subnet");
        let [a, b, c, d] = base.octets();
        let host_ip = IpAddr::from([a, b, c, d + 1]);
        let ns_ip = IpAddr::from([a, b, c, d + 2]);
        let host_end = format!("{name}h");
        let ns_end = format!("{name}n");
        ip(&["netns", "add", &name]);
        {
            let name = name.clone();
            crate::testkit::run_at_exit(Box::new(move || {
                // Deleting the namespace deletes the pair too.
                let _ = Command::new(IP).args(["netns", "del", &name]).status();
            }));
        }
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", &ns_end,
        ]);
        ip(&["link", "set", &ns_end, "netns", &name]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_end]);
        ip(&["link", "set", &host_end, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &name, IP];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{ns_ip}/30"), "dev", &ns_end]);
        inside(&["link", "set", &ns_end, "up"]);
        inside(&["link", "set", "lo", "up"]);
        Netns {
            name,
            host_ip,
            ns_ip,
        }
    }

    /// `ip netns exec <name> <program>`: the program and arguments to run `program` inside.
    pub fn wrap(&self, program: &Path, args: &[String]) -> (std::path::PathBuf, Vec<String>) {
        let mut all = vec![
            "netns".to_string(),
            "exec".to_string(),
            self.name.clone(),
            program.display().to_string(),
        ];
        all.extend_from_slice(args);
        (IP.into(), all)
    }

    /// Whether a TCP connection from inside the namespace to `host:port` succeeds.
    pub fn can_dial(&self, host: &str, port: u16) -> bool {
        Command::new(IP)
            .args(["netns", "exec", &self.name, "bash", "-c"])
            .arg(format!("exec 3<>/dev/tcp/{host}/{port}"))
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

/// Removes namespaces `rlt<pid>` whose process is gone.
fn remove_stale() {
    let Ok(out) = Command::new(IP).args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name.strip_prefix("rlt") else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new(IP).args(["netns", "del", name]).status();
        }
    }
}

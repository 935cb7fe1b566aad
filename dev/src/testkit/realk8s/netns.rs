//! A network namespace of its own for relaylet, as a pod network that cannot dial the leaf
//! clusters: its only link is a veth pair to this machine (a /30, no other route), so relaylet
//! reaches the root apiserver and the konnectivity server on the host's end of the pair, the
//! root reaches relaylet on the namespace's end, and `127.0.0.1` inside is the namespace's own
//! loopback, where no leaf apiserver listens. Made by `ip` (needs root); removed at exit, and
//! one left by a killed test process is removed by the next.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

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
    /// Creates `rlt<pid>` (the process's first) or `rlt<pid>n<k>` with a /30 from
    /// 198.18.0.0/15 (set aside for benchmarking networks, RFC 2544, so never a real host's),
    /// picked from the pid and `k` so that concurrent test processes do not collide; at most
    /// eight per process.
    pub fn create() -> Netns {
        static CREATED: AtomicU32 = AtomicU32::new(0);
        remove_stale();
        let pid = std::process::id();
        let k = CREATED.fetch_add(1, Ordering::Relaxed);
        assert!(k < 8, "at most eight network namespaces per test process");
        let name = if k == 0 {
            format!("rlt{pid}")
        } else {
            format!("rlt{pid}n{k}")
        };
        // 32,768 /30s in 198.18.0.0/15: eight per pid modulo 4,096.
        let index = (pid % 4096) * 8 + k;
        let base = u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0)) + index * 4;
        let host_ip = IpAddr::from(std::net::Ipv4Addr::from(base + 1));
        let ns_ip = IpAddr::from(std::net::Ipv4Addr::from(base + 2));
        let host_end = format!("{name}h");
        let ns_end = format!("{name}n");
        ip(&["netns", "add", &name]);
        {
            let name = name.clone();
            crate::testkit::run_at_exit(Box::new(move || {
                // Deleting the namespace deletes the pair (and routes through it) too.
                let _ = Command::new(IP).args(["netns", "del", &name]).status();
            }));
        }
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", &ns_end,
        ]);
        ip(&["link", "set", &ns_end, "netns", &name]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_end]);
        ip(&["link", "set", &host_end, "up"]);
        let netns = Netns {
            name,
            host_ip,
            ns_ip,
        };
        netns.ip_inside(&["addr", "add", &format!("{ns_ip}/30"), "dev", &ns_end]);
        netns.ip_inside(&["link", "set", &ns_end, "up"]);
        netns.ip_inside(&["link", "set", "lo", "up"]);
        netns
    }

    /// `ip <args>` inside the namespace.
    fn ip_inside(&self, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.name, IP];
        all.extend_from_slice(args);
        ip(&all);
    }

    /// Makes `cidr` (the pods inside) reachable from this machine, as a pod network is from
    /// the control plane: the namespace forwards, and this machine routes `cidr` through the
    /// pair. Pods answer through their gateway inside; no address is translated.
    pub fn route_pods(&self, cidr: &str) {
        self.run_inside("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
        ip(&["route", "replace", cidr, "via", &self.ns_ip.to_string()]);
    }

    /// Sends TCP connections inside the namespace to `service` (a ClusterIP and port) on to
    /// `target`: the one rule kube-proxy would write for the `kubernetes` Service, which is all
    /// a pod of relaylet's needs of Services (the root apiserver reaches relaylet by its pod
    /// IP, not by a Service).
    pub fn forward_service(&self, service: (&str, u16), target: std::net::SocketAddr) {
        self.run_inside(
            "iptables",
            &[
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-d",
                &format!("{}/32", service.0),
                "-p",
                "tcp",
                "--dport",
                &service.1.to_string(),
                "-j",
                "DNAT",
                "--to-destination",
                &target.to_string(),
            ],
        );
    }

    /// Runs `program args` inside the namespace; panics with its error if it fails.
    fn run_inside(&self, program: &str, args: &[&str]) {
        let out = Command::new(IP)
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} in {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
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

/// Removes namespaces `rlt<pid>` and `rlt<pid>n<k>` whose process is gone.
fn remove_stale() {
    let Ok(out) = Command::new(IP).args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix("rlt")
            .map(|rest| rest.split_once('n').map_or(rest, |(pid, _)| pid))
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new(IP).args(["netns", "del", name]).status();
        }
    }
}

//! A real Kubernetes node for a leaf cluster: the kubelet built from Kubernetes' own module and
//! Debian's containerd, runc and CNI plugins (`tests/tools/build-node.sh`), so pods run in real
//! containers and `exec`, `attach`, `port-forward` and `logs` take the kubelet's real path
//! (kubelet → CRI → containerd's streaming server → the container).
//!
//! The node lives in a network namespace of its own ([`Netns`]: one veth to this machine, no
//! other route), so the kubelet listens on the namespace's address like a node on its own
//! network, and pods get addresses from a CNI bridge inside it; nothing leaves the machine. It
//! also has a mount namespace of its own, held by a `sleep` process that containerd and the
//! kubelet join with `nsenter` (`ip netns exec` would remount /sys and lose the cgroup mounts),
//! so container mounts never appear on the host. Settings this machine needs (hybrid cgroups,
//! root without CAP_SYS_RESOURCE, a disk that may be mostly full) are in the configurations
//! below, each with its reason.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::harness::{ControlPlane, Process, kubeconfig, kubectl_path, wait_until};
use super::netns::Netns;

/// The port the kubelet serves on, inside the node's namespace.
pub const KUBELET_PORT: u16 = 10250;
/// The images build-node.sh makes, as pods name them (`imagePullPolicy: Never`).
pub const BUSYBOX_IMAGE: &str = "localhost/busybox:relaylet";
const PAUSE_IMAGE: &str = "localhost/pause:relaylet";

/// What build-node.sh built: the kubelet's version and the directory of the node's parts.
pub fn built() -> &'static (String, PathBuf) {
    static BUILT: OnceLock<(String, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let script = crate::workspace_root().join("tests/tools/build-node.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .expect("running tests/tools/build-node.sh");
        assert!(
            out.status.success(),
            "tests/tools/build-node.sh failed (its output is above): the real node's parts did not build"
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let (version, dir) = text
            .trim()
            .split_once(' ')
            .expect("build-node.sh prints `version dir`");
        (version.to_string(), PathBuf::from(dir))
    })
}

/// One real node, registered in a cluster. Dropping it stops the kubelet, containerd, the
/// containers and the namespaces.
pub struct RealNode {
    pub name: String,
    /// The node's address (its InternalIP), where the kubelet listens.
    pub ip: IpAddr,
    /// The kubelet (a test may kill it and start it again).
    kubelet: std::sync::Mutex<Process>,
    /// How it was started: nsenter's arguments.
    kubelet_args: Vec<String>,
    pub containerd: Process,
    /// Holds the node's mount namespace while the daemons come and go.
    holder: Process,
    dir: PathBuf,
    /// What stops the node's processes and removes its cgroups: when dropped, or when the test
    /// process exits (a world kept in a static is never dropped).
    leftovers: Leftovers,
    _netns: Netns,
}

/// What a node leaves behind unless removed: its pods' processes (children of containerd's
/// shims, which outlive containerd), its daemons and its cgroups.
#[derive(Clone)]
struct Leftovers {
    /// The cgroup under which the kubelet puts every pod.
    cgroup_root: String,
    /// The node's mount namespace (`mnt:[inode]`): containerd, its shims and the kubelet.
    mount_ns: Option<PathBuf>,
}

impl Leftovers {
    /// Kills every process of the node's pods, then its daemons; removes its cgroups.
    fn remove(&self) {
        for pid in self.pod_pids().into_iter().chain(self.daemon_pids()) {
            // SAFETY: kill(2) on a process of this node; at worst it is already gone.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        // SIGKILL takes effect a moment later; a cgroup with tasks cannot be removed.
        for _ in 0..50 {
            if self.pod_pids().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        remove_cgroup(&self.cgroup_root);
    }

    /// Every process of the node's pods (their cgroups' members).
    fn pod_pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let base = Path::new("/sys/fs/cgroup/pids").join(self.cgroup_root.trim_start_matches('/'));
        let mut stack = vec![base];
        while let Some(dir) = stack.pop() {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        pids
    }

    /// Every process in the node's mount namespace (never this process's own).
    fn daemon_pids(&self) -> Vec<i32> {
        let own = std::fs::read_link("/proc/self/ns/mnt").ok();
        let Some(ours) = self
            .mount_ns
            .as_ref()
            .filter(|ns| Some(*ns) != own.as_ref())
        else {
            return Vec::new();
        };
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                    .ok()
                    .as_ref()
                    == Some(ours)
            })
            .filter_map(|pid| pid.parse().ok())
            .collect()
    }
}

/// Where a node's pods live on the network.
pub enum Pods {
    /// 10.88.0.0/16, reachable only inside the node's namespace: pods that only the kubelet
    /// reaches (a leaf's pods, whose traffic comes through the kubelet's streaming server).
    Private,
    /// This range, reachable from this machine as a pod network is from its control plane,
    /// and the cluster's `kubernetes` Service forwarded to the apiserver: pods that serve the
    /// apiserver and call it (relaylet's own).
    Routed(String),
}

impl RealNode {
    /// Starts containerd and a kubelet for `plane` as node `name`, in a new namespace
    /// `netns` whose host end `plane`'s apiserver serves on (`Options::also_serve_on`), with
    /// its pods on `pods`; waits until the node is Ready.
    pub fn start(plane: &mut ControlPlane, name: &str, netns: Netns, pods: Pods) -> RealNode {
        let (_, parts) = built();
        let dir = plane.dir.join(name);
        std::fs::create_dir_all(&dir).expect("node dir");
        let write = |file: &str, text: &str| {
            let path = dir.join(file);
            std::fs::write(&path, text).expect("writing a node file");
            path
        };
        remove_stale_nodes();
        let tag = format!("{}-{}", std::process::id(), netns.ns_ip).replace(['.', ':'], "-");
        let cgroup_root = format!("/relaylet-node-{tag}");
        make_cgroup(&cgroup_root);

        // The mount namespace's holder; the daemons join it and the network namespace.
        let holder = Process::spawn(
            &format!("{name}-namespaces"),
            &dir,
            Path::new("/usr/bin/nsenter"),
            &[
                format!("--net=/run/netns/{}", netns.name),
                "--".into(),
                "/usr/bin/unshare".into(),
                "--mount".into(),
                "--propagation=private".into(),
                "--".into(),
                "/bin/sleep".into(),
                "infinity".into(),
            ],
        );
        // The holder's own mount namespace, once unshare has made it (before, it is ours).
        let mount_ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        let mut holder = holder;
        let pid = holder.pid().to_string();
        let mut node_ns = None;
        wait_until(
            "the node's mount namespace",
            Duration::from_secs(30),
            &mut [&mut holder],
            || {
                node_ns = mount_ns(&pid).filter(|ns| Some(ns) != mount_ns("self").as_ref());
                node_ns.is_some()
            },
        );
        let leftovers = Leftovers {
            cgroup_root: cgroup_root.clone(),
            mount_ns: node_ns,
        };
        {
            let leftovers = leftovers.clone();
            crate::testkit::run_at_exit(Box::new(move || leftovers.remove()));
        }
        let joined = |program: &Path, args: &[String]| -> Vec<String> {
            let mut all = vec![
                "-t".to_string(),
                holder.pid().to_string(),
                "--mount".into(),
                "--net".into(),
                "--".into(),
                program.display().to_string(),
            ];
            all.extend_from_slice(args);
            all
        };

        let pod_cidr = match &pods {
            Pods::Private => "10.88.0.0/16".to_string(),
            Pods::Routed(cidr) => {
                netns.route_pods(cidr);
                let port = plane
                    .url
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .expect("the apiserver URL has a port");
                netns.forward_service(
                    (super::harness::SERVICE_IP, 443),
                    std::net::SocketAddr::new(netns.host_ip, port),
                );
                cidr.clone()
            }
        };
        // containerd: its own root, state and socket under the node's directory.
        let sock = dir.join("containerd.sock");
        let cni_dir = dir.join("cni");
        std::fs::create_dir_all(&cni_dir).expect("cni dir");
        std::fs::write(
            cni_dir.join("10-bridge.conflist"),
            serde_json::json!({
                "cniVersion": "1.0.0",
                "name": format!("relaylet-{tag}"),
                "plugins": [{
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    // No masquerading: pod traffic never leaves the namespace.
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": pod_cidr }]],
                        // A default route through the bridge: pods reach the namespace's
                        // veth (and, routed, this machine) through their gateway.
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": dir.join("cni-ipam").display().to_string(),
                    },
                }],
            })
            .to_string(),
        )
        .expect("cni config");
        let config = write(
            "containerd.toml",
            &format!(
                r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE: without this runc fails with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Pod network namespaces in the node's own directory, not /run/netns, which the host sees.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"#,
                root = dir.join("containerd/root").display(),
                state = dir.join("containerd/state").display(),
                sock = sock.display(),
                cni = cni_dir.display(),
                opt = dir.join("containerd/opt").display(),
            ),
        );
        let mut containerd = Process::spawn(
            &format!("{name}-containerd"),
            &dir,
            Path::new("/usr/bin/nsenter"),
            &joined(
                Path::new("/usr/bin/containerd"),
                &[format!("--config={}", config.display())],
            ),
        );
        wait_until(
            "containerd answers",
            Duration::from_secs(60),
            &mut [&mut containerd],
            || ctr(&sock, &["version"]).is_ok(),
        );
        for image in ["pause", "busybox"] {
            let archive = parts.join(format!("{image}.tar"));
            ctr(&sock, &["images", "import", &archive.display().to_string()])
                .unwrap_or_else(|err| panic!("importing {image}: {err}"));
        }

        // The kubelet: a serving certificate for the node's address from the cluster CA, the
        // cluster reached on the host's end of the pair.
        let serving = plane
            .ca
            .issue_server(&[&netns.ns_ip.to_string(), name])
            .expect("kubelet serving certificate");
        let cert = write("kubelet.crt", &serving.cert_pem);
        let key = write("kubelet.key", &serving.key_pem);
        let admin = plane
            .ca
            .issue_client(
                &format!("system:node:{name}"),
                &["system:nodes", "system:masters"],
            )
            .expect("kubelet client certificate");
        let port = plane
            .url
            .rsplit(':')
            .next()
            .expect("the apiserver URL has a port");
        let kubelet_kubeconfig = write(
            "kubelet.kubeconfig",
            &kubeconfig(
                name,
                &format!("https://{}:{port}", netns.host_ip),
                &plane.ca.cert_pem(),
                &admin.cert_pem,
                &admin.key_pem,
            ),
        );
        let resolv = write("resolv.conf", "nameserver 127.0.0.1\n");
        let kubelet_config = write(
            "kubelet.yaml",
            &serde_json::json!({
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                // This machine's cgroups are hybrid v1: the kubelet refuses them unless told.
                "failCgroupV1": false,
                "cgroupDriver": "cgroupfs",
                "cgroupRoot": cgroup_root,
                "containerRuntimeEndpoint": format!("unix://{}", sock.display()),
                "address": netns.ns_ip.to_string(),
                "port": KUBELET_PORT,
                "readOnlyPort": 0,
                "healthzPort": 0,
                "tlsCertFile": cert.display().to_string(),
                "tlsPrivateKeyFile": key.display().to_string(),
                "authentication": {
                    "anonymous": { "enabled": false },
                    "webhook": { "enabled": true },
                    "x509": { "clientCAFile": plane.dir.join("ca.crt").display().to_string() },
                },
                "authorization": { "mode": "Webhook" },
                "failSwapOn": false,
                // The disk may be mostly full: evict and collect images only when it is
                // really out.
                "evictionHard": {
                    "memory.available": "1%",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                    "nodefs.inodesFree": "1%",
                },
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "resolvConf": resolv.display().to_string(),
                "podLogsDir": dir.join("pod-logs").display().to_string(),
                "serializeImagePulls": false,
                "localStorageCapacityIsolation": false,
            })
            .to_string(),
        );
        let kubelet_args = joined(
            &parts.join("kubelet"),
            &[
                format!("--config={}", kubelet_config.display()),
                format!("--kubeconfig={}", kubelet_kubeconfig.display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--hostname-override={name}"),
                format!("--node-ip={}", netns.ns_ip),
                "--v=1".into(),
            ],
        );
        let mut kubelet = spawn_kubelet(name, &dir, &kubelet_args);
        let admin_kubeconfig = plane.admin_kubeconfig.clone();
        wait_until(
            &format!("real node {name} Ready"),
            Duration::from_secs(120),
            &mut [&mut kubelet, &mut containerd],
            || {
                Command::new(kubectl_path())
                    .args([
                        "get",
                        "node",
                        name,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ])
                    .env("KUBECONFIG", &admin_kubeconfig)
                    .output()
                    .is_ok_and(|o| o.stdout == b"True")
            },
        );
        RealNode {
            name: name.to_string(),
            ip: netns.ns_ip,
            kubelet: std::sync::Mutex::new(kubelet),
            kubelet_args,
            containerd,
            holder,
            dir,
            leftovers,
            _netns: netns,
        }
    }

    /// Kills the kubelet (SIGKILL, as a crash): containerd and the containers keep running.
    pub fn kill_kubelet(&self) {
        self.kubelet
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .kill();
    }

    /// Starts the kubelet again (after [`kill_kubelet`](Self::kill_kubelet)); waits until it
    /// serves its port.
    pub fn restart_kubelet(&self) {
        let mut kubelet = self.kubelet.lock().unwrap_or_else(|e| e.into_inner());
        kubelet.kill();
        *kubelet = spawn_kubelet(&self.name, &self.dir, &self.kubelet_args);
        let ip = self.ip.to_string();
        wait_until(
            &format!("the kubelet of {} serves again", self.name),
            Duration::from_secs(60),
            &mut [&mut kubelet],
            || self._netns.can_dial(&ip, KUBELET_PORT),
        );
    }

    /// Imports an image archive (docker-archive or OCI) into the node's containerd, where
    /// pods with `imagePullPolicy: Never` find it.
    pub fn import_image(&self, archive: &Path) {
        ctr(
            &self.dir.join("containerd.sock"),
            &["images", "import", &archive.display().to_string()],
        )
        .unwrap_or_else(|err| panic!("importing {}: {err}", archive.display()));
    }

    /// The containerd version the node runs (`ctr version`'s server line).
    pub fn containerd_version(&self) -> String {
        let out = ctr(&self.dir.join("containerd.sock"), &["version"]).unwrap_or_default();
        out.lines()
            .skip_while(|l| !l.starts_with("Server"))
            .find_map(|l| l.trim().strip_prefix("Version:"))
            .unwrap_or("unknown")
            .trim()
            .to_string()
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.kill_kubelet();
        self.leftovers.remove();
        self.containerd.kill();
        self.holder.kill();
    }
}

/// Removes what nodes of test processes that are gone left (a test killed before its exit
/// handlers ran): their pods' processes and their cgroups, `relaylet-node-<pid>-...`.
fn remove_stale_nodes() {
    let stale = hierarchies(false)
        .into_iter()
        .flat_map(|h| std::fs::read_dir(h).into_iter().flatten().flatten())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|name| {
            name.strip_prefix("relaylet-node-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect::<std::collections::BTreeSet<_>>();
    for name in stale {
        Leftovers {
            cgroup_root: format!("/{name}"),
            mount_ns: None,
        }
        .remove();
    }
}

/// The hierarchies this machine mounts (its cgroups are hybrid: v1 controllers beside a
/// unified tree, which runc writes to as well), with or without the unified one.
fn hierarchies(unified: bool) -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && (unified || !p.ends_with("unified")))
        .collect()
}

/// Makes the kubelet's `cgroupRoot` in every hierarchy (the kubelet checks it exists), with
/// the cpuset of its parent so that tasks may join it.
fn make_cgroup(root: &str) {
    for hierarchy in hierarchies(false) {
        let dir = hierarchy.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|err| panic!("making cgroup {}: {err}", dir.display()));
        if hierarchy.ends_with("cpuset") {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = std::fs::read_to_string(hierarchy.join(file)).unwrap_or_default();
                let _ = std::fs::write(dir.join(file), parent.trim());
            }
        }
    }
}

/// Removes `root` and what the kubelet made under it, deepest first, once its tasks are gone.
fn remove_cgroup(root: &str) {
    for hierarchy in hierarchies(true) {
        let mut dirs = Vec::new();
        let mut stack = vec![hierarchy.join(root.trim_start_matches('/'))];
        while let Some(dir) = stack.pop() {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
            dirs.push(dir);
        }
        for dir in dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The kubelet of node `name`, joined to the node's namespaces by nsenter's `args`.
fn spawn_kubelet(name: &str, dir: &Path, args: &[String]) -> Process {
    Process::spawn(
        &format!("{name}-kubelet"),
        dir,
        Path::new("/usr/bin/nsenter"),
        args,
    )
}

/// `ctr --address <sock> -n k8s.io <args>`: its output, or its error text.
fn ctr(sock: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(sock)
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

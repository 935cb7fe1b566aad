//! Real Kubernetes for the end-to-end tests: etcd, kube-apiserver and kube-controller-manager
//! built from their Go modules at the pinned versions (`tests/tools/build-k8s.sh`), plus
//! `leafkubelet`, a kubelet of ours on the kubelet's own streaming code, all on loopback.
//!
//! A root cluster runs like a production control plane: `--authorization-mode=Node,RBAC`, a
//! client CA, a front-proxy (requestheader) CA so `extension-apiserver-authentication` is real,
//! service-account issuer and keys, the kubelet client certificate (bound to
//! `system:kubelet-api-admin`, as kubeadm binds it) and a chosen
//! `--kubelet-preferred-address-types`, with kube-controller-manager beside it. A leaf cluster is
//! etcd and kube-apiserver with one leafkubelet node. Every process's output goes to a file in
//! the cluster's directory and is printed when the process fails to start.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use relaylet_sim::tls::Ca;

/// A Kubernetes version the real suites run, each built from its own module by
/// `tests/tools/build-k8s.sh` (`tests/realk8s/k8s` is 1.35, `tests/realk8s/k8s-1.37` 1.37). A
/// world picks one for its root and one for its leaves, so the suites test each version at both
/// ends without running twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum K8s {
    V1_35,
    V1_37,
}

impl K8s {
    /// `1.35`, as the world's first output line names it.
    pub fn minor(self) -> &'static str {
        match self {
            K8s::V1_35 => "1.35",
            K8s::V1_37 => "1.37",
        }
    }

    /// The exact version built (`v1.35.4`), as build-k8s.sh reports it.
    pub fn version(self) -> &'static str {
        &self.built().0
    }

    /// The directory holding this version's components (built or reused on first call).
    pub fn bin_dir(self) -> &'static Path {
        &self.built().1
    }

    /// What build-k8s.sh built for this version (only this one, so a test of 1.35 does not
    /// wait for 1.37 to compile): its `version directory` line.
    fn built(self) -> &'static (String, PathBuf) {
        static BUILT: [OnceLock<(String, PathBuf)>; 2] = [OnceLock::new(), OnceLock::new()];
        BUILT[self as usize].get_or_init(|| {
            let minor = self.minor();
            let script = crate::workspace_root().join("tests/tools/build-k8s.sh");
            let out = Command::new("bash")
                .arg(&script)
                .arg(minor)
                .stderr(Stdio::inherit())
                .output()
                .expect("running tests/tools/build-k8s.sh");
            assert!(
                out.status.success(),
                "tests/tools/build-k8s.sh {minor} failed (its output is above): the real Kubernetes components did not build"
            );
            let prefix = format!("v{minor}.");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|line| line.split_once(' '))
                .find(|(version, _)| version.starts_with(&prefix))
                .map(|(version, dir)| (version.to_string(), PathBuf::from(dir.trim())))
                .unwrap_or_else(|| panic!("tests/tools/build-k8s.sh built no Kubernetes {prefix}x"))
        })
    }
}

/// Tells the run's output which versions a world runs, before anything is built or started;
/// written to the process's stderr directly, past the test harness's capture.
pub fn announce(root: K8s, leaves: K8s) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr().lock(),
        "real Kubernetes: root {}, leaves {} (built by tests/tools/build-k8s.sh)",
        root.minor(),
        leaves.minor()
    );
}

/// A free loopback port for a component that binds it a moment later (see
/// `relaylet_sim::ports` for where the numbers come from).
pub fn free_port() -> u16 {
    relaylet_sim::ports::free_loopback_port()
        .expect("a free port")
        .port()
}

/// A child process killed (and reaped) when dropped, its output in `log`.
pub struct Process {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Process {
    pub(super) fn spawn(name: &str, dir: &Path, program: &Path, args: &[String]) -> Process {
        Process::spawn_with_env(name, dir, program, args, &BTreeMap::new())
    }

    /// [`spawn`](Self::spawn) with exactly `env` as the environment.
    pub fn spawn_with_env(
        name: &str,
        dir: &Path,
        program: &Path,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> Process {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut command = Command::new(program);
        if !env.is_empty() {
            command.env_clear().envs(env);
        }
        let child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({}): {e}", program.display()));
        kill_at_exit(child.id());
        Process {
            name: name.to_string(),
            log,
            child,
        }
    }

    /// Its process ID (to read its CPU time from `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with the process's output if it has exited.
    pub(super) fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let output = std::fs::read_to_string(&self.log).unwrap_or_default();
            // Without the flag dump a kubelet opens with (its error comes after).
            let tail: String = output
                .lines()
                .filter(|l| !l.contains("] FLAG: --"))
                .rev()
                .take(60)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            panic!("{} exited ({status}); its last output:\n{tail}", self.name);
        }
    }

    /// Stops the process as a rollout does (SIGTERM) and waits for it to exit.
    pub fn terminate(&mut self) {
        // SAFETY: kill(2) on our own child, which has not been waited for yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }

    /// Stops the process as a crash would (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Processes to kill when the test process exits: the clusters live in a static that is never
/// dropped, and must not outlive the tests.
static AT_EXIT: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn kill_at_exit(pid: u32) {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    extern "C" fn kill_all() {
        let pids = std::mem::take(&mut *AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()));
        for pid in pids {
            // SAFETY: kill(2) on a child's pid; at worst the child is already gone.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    }
    AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
    // SAFETY: `kill_all` only takes a lock and sends signals; registered once.
    REGISTERED.call_once(|| unsafe {
        libc::atexit(kill_all);
    });
}

/// Waits until `ready` holds, checking `processes` are alive; fails loudly after `within`.
pub(super) fn wait_until(
    what: &str,
    within: Duration,
    processes: &mut [&mut Process],
    mut ready: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        for p in processes.iter_mut() {
            p.assert_running();
        }
        if ready() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One cluster's control plane.
pub struct ControlPlane {
    pub name: String,
    pub dir: PathBuf,
    pub ca: Ca,
    pub url: String,
    /// The admin kubeconfig (client certificate in `system:masters`).
    pub admin_kubeconfig: PathBuf,
    pub etcd: Process,
    pub apiserver: Process,
    pub controller_manager: Option<Process>,
    /// kube-scheduler, once [`start_scheduler`](Self::start_scheduler) ran (pods of
    /// controllers on real nodes need it; the stand-in kubelets' pods set `nodeName`).
    pub scheduler: Option<Process>,
    /// The Kubernetes version of every process here.
    pub version: K8s,
    pub kubelets: Vec<Process>,
    apiserver_args: Vec<String>,
}

/// How a control plane is set up.
pub struct Options {
    pub name: String,
    /// `--kubelet-preferred-address-types`.
    pub preferred_address_types: String,
    pub controller_manager: bool,
    /// `--kubelet-certificate-authority` set to the cluster CA: the apiserver verifies every
    /// kubelet's serving certificate, as a hardened control plane (CIS 1.2.5) does.
    pub verify_kubelet_certificates: bool,
    /// The Kubernetes version of the control plane and its kubelets.
    pub version: K8s,
    /// Other addresses the apiserver serves on (besides loopback, with them in its
    /// certificate), for clients in other network namespaces.
    pub also_serve_on: Vec<std::net::IpAddr>,
}

/// The clusters' Service range, and the first address in it: the `kubernetes` Service's
/// ClusterIP, where a pod finds the apiserver (`KUBERNETES_SERVICE_HOST`).
pub const SERVICE_RANGE: &str = "10.96.0.0/16";
pub const SERVICE_IP: &str = "10.96.0.1";

impl ControlPlane {
    /// Starts etcd, kube-apiserver (and kube-controller-manager) under `parent/name`.
    pub fn start(parent: &Path, options: Options) -> ControlPlane {
        let bin = options.version.bin_dir();
        let dir = parent.join(&options.name);
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("writing a cluster file");
            path.display().to_string()
        };

        // PKI: the cluster CA (serving, clients, kubelets), the front-proxy CA and the
        // service-account signing key.
        let ca = Ca::new(&format!("{}-ca", options.name)).expect("CA");
        let front = Ca::new(&format!("{}-front-proxy-ca", options.name)).expect("front CA");
        let also: Vec<String> = options
            .also_serve_on
            .iter()
            .map(|ip| ip.to_string())
            .collect();
        let mut names = vec![
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default.svc",
            // The `kubernetes` Service's ClusterIP: what a pod's in-cluster client dials.
            SERVICE_IP,
        ];
        names.extend(also.iter().map(String::as_str));
        let serving = ca.issue_server(&names).expect("apiserver certificate");
        let kubelet_client = ca
            .issue_client("kube-apiserver-kubelet-client", &[])
            .expect("kubelet client certificate");
        let proxy_client = front
            .issue_client("front-proxy-client", &[])
            .expect("front proxy client");
        let admin = ca
            .issue_client("admin", &["system:masters"])
            .expect("admin");
        let kcm = ca
            .issue_client("system:kube-controller-manager", &[])
            .expect("controller manager certificate");
        let sa = rcgen::KeyPair::generate().expect("service account key");

        let ca_file = write("ca.crt", &ca.cert_pem());
        let ca_key_file = write("ca.key", &ca.key_pem());
        let front_ca_file = write("front-proxy-ca.crt", &front.cert_pem());
        let serving_cert = write("apiserver.crt", &serving.cert_pem);
        let serving_key = write("apiserver.key", &serving.key_pem);
        let kc_cert = write("kubelet-client.crt", &kubelet_client.cert_pem);
        let kc_key = write("kubelet-client.key", &kubelet_client.key_pem);
        let pc_cert = write("front-proxy-client.crt", &proxy_client.cert_pem);
        let pc_key = write("front-proxy-client.key", &proxy_client.key_pem);
        let sa_key = write("sa.key", &sa.serialize_pem());
        let sa_pub = write("sa.pub", &sa.public_key_pem());

        let etcd_client = free_port();
        let etcd_peer = free_port();
        let mut etcd = Process::spawn(
            "etcd",
            &dir,
            &bin.join("etcd"),
            &[
                "--name=default".to_string(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer}"),
                "--log-level=warn".to_string(),
            ],
        );
        wait_until(
            "etcd answers",
            Duration::from_secs(60),
            &mut [&mut etcd],
            || std::net::TcpStream::connect(("127.0.0.1", etcd_client)).is_ok(),
        );

        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let mut apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            format!("--secure-port={port}"),
            // All addresses only when asked to serve on another one as well.
            format!(
                "--bind-address={}",
                if !also.is_empty() {
                    "0.0.0.0"
                } else {
                    "127.0.0.1"
                }
            ),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--tls-cert-file={serving_cert}"),
            format!("--tls-private-key-file={serving_key}"),
            format!("--client-ca-file={ca_file}"),
            "--authorization-mode=Node,RBAC".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc".to_string(),
            format!("--service-account-key-file={sa_pub}"),
            format!("--service-account-signing-key-file={sa_key}"),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            format!("--kubelet-client-certificate={kc_cert}"),
            format!("--kubelet-client-key={kc_key}"),
            format!(
                "--kubelet-preferred-address-types={}",
                options.preferred_address_types
            ),
            format!("--requestheader-client-ca-file={front_ca_file}"),
            "--requestheader-allowed-names=front-proxy-client".to_string(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
            "--requestheader-group-headers=X-Remote-Group".to_string(),
            "--requestheader-username-headers=X-Remote-User".to_string(),
            format!("--proxy-client-cert-file={pc_cert}"),
            format!("--proxy-client-key-file={pc_key}"),
            "--allow-privileged=true".to_string(),
            "--endpoint-reconciler-type=none".to_string(),
        ];
        if options.verify_kubelet_certificates {
            apiserver_args.push(format!("--kubelet-certificate-authority={ca_file}"));
        }
        if !options.controller_manager {
            // Without kube-controller-manager no ServiceAccount objects are made; pods are
            // created without them, as in a cluster whose admission allows it.
            apiserver_args.push("--disable-admission-plugins=ServiceAccount".to_string());
        }
        let mut apiserver = Process::spawn(
            "kube-apiserver",
            &dir,
            &bin.join("kube-apiserver"),
            &apiserver_args,
        );

        let admin_kubeconfig = dir.join("admin.kubeconfig");
        std::fs::write(
            &admin_kubeconfig,
            kubeconfig(
                &options.name,
                &url,
                &ca.cert_pem(),
                &admin.cert_pem,
                &admin.key_pem,
            ),
        )
        .expect("admin kubeconfig");
        let ready = {
            let kubeconfig = admin_kubeconfig.clone();
            move || {
                Command::new(kubectl_path())
                    .args(["get", "--raw", "/readyz"])
                    .env("KUBECONFIG", &kubeconfig)
                    .output()
                    .is_ok_and(|o| o.status.success())
            }
        };
        wait_until(
            &format!("{} kube-apiserver ready", options.name),
            Duration::from_secs(120),
            &mut [&mut etcd, &mut apiserver],
            ready,
        );
        let mut plane = ControlPlane {
            name: options.name.clone(),
            dir: dir.clone(),
            ca,
            url,
            admin_kubeconfig,
            etcd,
            apiserver,
            controller_manager: None,
            scheduler: None,
            version: options.version,
            kubelets: Vec::new(),
            apiserver_args,
        };
        // The kubelet client may use every kubelet API, as kubeadm binds it.
        plane.kubectl_ok(&[
            "create",
            "clusterrolebinding",
            "kube-apiserver-kubelet-client",
            "--clusterrole=system:kubelet-api-admin",
            "--user=kube-apiserver-kubelet-client",
        ]);

        if options.controller_manager {
            let kcm_kubeconfig = write(
                "controller-manager.kubeconfig",
                &kubeconfig(
                    &options.name,
                    &plane.url,
                    &plane.ca.cert_pem(),
                    &kcm.cert_pem,
                    &kcm.key_pem,
                ),
            );
            let args = vec![
                format!("--kubeconfig={kcm_kubeconfig}"),
                format!("--authentication-kubeconfig={kcm_kubeconfig}"),
                format!("--authorization-kubeconfig={kcm_kubeconfig}"),
                "--bind-address=127.0.0.1".to_string(),
                format!("--secure-port={}", free_port()),
                format!("--cluster-signing-cert-file={ca_file}"),
                format!("--cluster-signing-key-file={ca_key_file}"),
                format!("--service-account-private-key-file={sa_key}"),
                format!("--root-ca-file={ca_file}"),
                "--use-service-account-credentials=true".to_string(),
                "--leader-elect=false".to_string(),
                "--controllers=*,csrsigning,csrapproving".to_string(),
            ];
            plane.controller_manager = Some(Process::spawn(
                "kube-controller-manager",
                &dir,
                &bin.join("kube-controller-manager"),
                &args,
            ));
            // The default ServiceAccount appears once the controllers run.
            let kubeconfig = plane.admin_kubeconfig.clone();
            let mut kcm = plane.controller_manager.take();
            {
                let mut procs: Vec<&mut Process> = vec![&mut plane.apiserver];
                if let Some(k) = kcm.as_mut() {
                    procs.push(k);
                }
                wait_until(
                    "the controller manager's default ServiceAccount",
                    Duration::from_secs(120),
                    &mut procs,
                    || {
                        Command::new(kubectl_path())
                            .args(["get", "serviceaccount", "default", "-n", "default"])
                            .env("KUBECONFIG", &kubeconfig)
                            .output()
                            .is_ok_and(|o| o.status.success())
                    },
                );
            }
            plane.controller_manager = kcm;
        }
        plane
    }

    /// Starts kube-scheduler (`binary`, of this plane's version) with the identity kubeadm
    /// gives it (`system:kube-scheduler`, bound by the bootstrap RBAC).
    pub fn start_scheduler(&mut self, binary: &Path) {
        let path = self.user_kubeconfig("system:kube-scheduler", &[]);
        let kubeconfig = path.display();
        self.scheduler = Some(Process::spawn(
            "kube-scheduler",
            &self.dir,
            binary,
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--bind-address=127.0.0.1".to_string(),
                format!("--secure-port={}", free_port()),
                "--leader-elect=false".to_string(),
            ],
        ));
    }

    /// Adds a node served by a leafkubelet; waits until it is registered. A kubelet that
    /// `declares_websockets` declares `ExtendWebSocketsToKubelet` and translates WebSocket calls
    /// itself, as a 1.36+ kubelet does (1.37 builds only).
    pub fn add_kubelet(&mut self, node: &str, declares_websockets: bool) {
        let serving = self
            .ca
            .issue_server(&["127.0.0.1", "localhost"])
            .expect("kubelet serving certificate");
        let dir = self.dir.join(node);
        std::fs::create_dir_all(&dir).expect("kubelet dir");
        let cert = dir.join("kubelet.crt");
        let key = dir.join("kubelet.key");
        std::fs::write(&cert, &serving.cert_pem).expect("kubelet cert");
        std::fs::write(&key, &serving.key_pem).expect("kubelet key");
        let mut args = vec![
            format!("--kubeconfig={}", self.admin_kubeconfig.display()),
            format!("--node-name={node}"),
            format!("--tls-cert={}", cert.display()),
            format!("--tls-key={}", key.display()),
            format!("--client-ca={}", self.dir.join("ca.crt").display()),
            format!("--data-dir={}", dir.join("data").display()),
        ];
        if declares_websockets {
            args.push("--declare-websockets".to_string());
        }
        let mut kubelet = Process::spawn(
            &format!("leafkubelet-{node}"),
            &self.dir,
            &self.version.bin_dir().join("leafkubelet"),
            &args,
        );
        let kubeconfig = self.admin_kubeconfig.clone();
        wait_until(
            &format!("node {node} registered"),
            Duration::from_secs(60),
            &mut [&mut kubelet, &mut self.apiserver],
            || {
                Command::new(kubectl_path())
                    .args(["get", "node", node])
                    .env("KUBECONFIG", &kubeconfig)
                    .output()
                    .is_ok_and(|o| o.status.success())
            },
        );
        self.kubelets.push(kubelet);
    }

    /// Runs kubectl (1.35) as admin; panics with its output on failure. Returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        self.kubectl_stdin_ok(args, None)
    }

    /// Like [`kubectl_ok`], feeding `stdin`.
    pub fn kubectl_stdin_ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write;
        let mut child = Command::new(kubectl_path())
            .args(args)
            .env("KUBECONFIG", &self.admin_kubeconfig)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("kubectl stdin");
        }
        let out = child.wait_with_output().expect("kubectl output");
        assert!(
            out.status.success(),
            "{}: kubectl {args:?} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops kube-apiserver as a crash would.
    pub fn stop_apiserver(&mut self) {
        self.apiserver.kill();
    }

    /// Starts kube-apiserver again with the same flags; waits until it is ready.
    pub fn restart_apiserver(&mut self) {
        self.apiserver = Process::spawn(
            "kube-apiserver",
            &self.dir,
            &self.version.bin_dir().join("kube-apiserver"),
            &self.apiserver_args,
        );
        let kubeconfig = self.admin_kubeconfig.clone();
        wait_until(
            "kube-apiserver ready again",
            Duration::from_secs(120),
            &mut [&mut self.etcd, &mut self.apiserver],
            || {
                Command::new(kubectl_path())
                    .args(["get", "--raw", "/readyz"])
                    .env("KUBECONFIG", &kubeconfig)
                    .output()
                    .is_ok_and(|o| o.status.success())
            },
        );
    }

    /// The apiserver's `--kubelet-preferred-address-types`.
    pub fn preferred_address_types(&self) -> String {
        self.apiserver_args
            .iter()
            .find_map(|a| a.strip_prefix("--kubelet-preferred-address-types="))
            .unwrap_or_default()
            .to_string()
    }

    /// Restarts kube-apiserver with another `--kubelet-preferred-address-types`.
    pub fn restart_apiserver_with_address_order(&mut self, order: &str) {
        self.stop_apiserver();
        for arg in &mut self.apiserver_args {
            if arg.starts_with("--kubelet-preferred-address-types=") {
                *arg = format!("--kubelet-preferred-address-types={order}");
            }
        }
        self.restart_apiserver();
    }

    /// A kubeconfig for `user` in `groups` with a client certificate from this cluster's CA.
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> PathBuf {
        let id = self
            .ca
            .issue_client(user, groups)
            .expect("user certificate");
        let path = self
            .dir
            .join(format!("{}.kubeconfig", user.replace(':', "-")));
        std::fs::write(
            &path,
            kubeconfig(
                &self.name,
                &self.url,
                &self.ca.cert_pem(),
                &id.cert_pem,
                &id.key_pem,
            ),
        )
        .expect("user kubeconfig");
        path
    }
}

/// kubectl 1.35, used to set clusters up.
pub fn kubectl_path() -> PathBuf {
    relaylet_sim::tools::kubectl("1.35")
        .expect("kubectl 1.35: run tests/tools/install.sh")
        .path
}

/// A kubeconfig with embedded certificates.
pub fn kubeconfig(name: &str, url: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {url}\n    certificate-authority-data: {}\nusers:\n- name: {name}-user\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-user\ncurrent-context: {name}\n",
        b64(ca_pem),
        b64(cert_pem),
        b64(key_pem)
    )
}

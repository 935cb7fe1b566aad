//! The end-to-end tests' shared kit: one sandbox per test module (root and leaf stand-ins plus
//! relaylet, as `relaylet-dev sandbox` starts them) and helpers to run real `kubectl` binaries
//! against it; `metrics` reads relaylet's operations ports, `realk8s` starts real Kubernetes,
//! `image` builds the container image as it ships.

pub mod forwarder;
pub mod image;
pub mod metrics;
pub mod port_forward;
pub mod process;
pub mod raw_http;
pub mod realk8s;
pub mod scratch;
pub mod ws_exec;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::LazyLock;
use std::time::Duration;

use crate::sandbox::{Sandbox, Settings};
use relaylet_sim::cluster::APISERVER_KUBELET_CLIENT;
use relaylet_sim::tls::Identity;
use relaylet_sim::tools::Kubectl;
use tokio::runtime::Runtime;

/// A runtime that outlives every test in the binary, so the sandbox's servers stay up.
pub static RT: LazyLock<Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("test runtime")
});

/// A started sandbox and the path of its root admin kubeconfig.
pub struct Env {
    pub sandbox: Sandbox,
    pub kubeconfig: PathBuf,
}

/// Starts the sandbox of the calling test module (its source file) with `settings` once; later
/// calls from the same module return the same one. A test binary holds many modules, each with
/// its sandbox, as each held one when every module was a binary of its own.
#[track_caller]
pub fn env(settings: impl FnOnce() -> Settings) -> &'static Env {
    sandbox_of(
        std::panic::Location::caller().file(),
        settings,
        None::<fn() -> tracing::Dispatch>,
    )
}

/// Like [`env`], with everything the sandbox's relaylet logs going to the subscriber `log`
/// makes (one of the module's own, so a module reads its relaylet's log lines and no other
/// module's).
#[track_caller]
pub fn env_logged(
    settings: impl FnOnce() -> Settings,
    log: impl FnOnce() -> tracing::Dispatch,
) -> &'static Env {
    // tracing-core works out whether a log line is wanted from the calling thread's subscriber
    // alone while a single one exists; with a second, silent one it asks every live
    // subscriber, so a line first logged on another module's threads is not dismissed for all.
    static SECOND: std::sync::LazyLock<tracing::Dispatch> = std::sync::LazyLock::new(|| {
        tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default())
    });
    std::sync::LazyLock::force(&SECOND);
    sandbox_of(std::panic::Location::caller().file(), settings, Some(log))
}

/// The sandbox of module `file`: started once, on a runtime of its own, so the modules'
/// sandboxes share no worker threads (and a module's log subscriber hears only its own).
fn sandbox_of(
    file: &'static str,
    settings: impl FnOnce() -> Settings,
    log: Option<impl FnOnce() -> tracing::Dispatch>,
) -> &'static Env {
    type Cells = std::collections::HashMap<&'static str, &'static std::sync::OnceLock<Env>>;
    static SANDBOXES: std::sync::Mutex<Option<Cells>> = std::sync::Mutex::new(None);
    let cell: &'static std::sync::OnceLock<Env> = SANDBOXES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(Default::default)
        .entry(file)
        .or_insert_with(|| Box::leak(Box::default()));
    cell.get_or_init(|| {
        let settings = settings();
        let log = log.map(|make| make());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sandbox")
            .on_thread_start(move || {
                if let Some(log) = &log {
                    // For the thread's whole life: the runtime outlives every test.
                    std::mem::forget(tracing::dispatcher::set_default(log));
                }
            })
            .enable_all()
            .build()
            .expect("sandbox runtime");
        let runtime: &'static Runtime = Box::leak(Box::new(runtime));
        runtime.block_on(async {
            let sandbox = Sandbox::start(settings).await.expect("sandbox starts");
            remove_at_exit(sandbox.files().to_path_buf());
            remove_at_exit(sandbox.root.data_dir());
            for leaf in sandbox.leaves.values() {
                remove_at_exit(leaf.data_dir());
            }
            let kubeconfig = sandbox.files().join("root-admin.kubeconfig");
            sandbox
                .write_kubeconfig(&kubeconfig)
                .expect("kubeconfig written");
            Env {
                sandbox,
                kubeconfig,
            }
        })
    })
}

/// Cleanups to run when the test process exits (see [`remove_at_exit`] for why at exit).
type Cleanup = Box<dyn FnOnce() + Send>;
static CLEANUPS: std::sync::Mutex<Vec<Cleanup>> = std::sync::Mutex::new(Vec::new());

/// Runs `cleanup` when the test process exits normally.
pub(crate) fn run_at_exit(cleanup: Cleanup) {
    CLEANUPS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(cleanup);
    // Registered through the same atexit hook as the directories.
    remove_at_exit_hook();
}

/// Directories to remove when the test process exits: the binary's sandbox lives in a static,
/// which is never dropped, so its temporary directories would otherwise stay behind.
static AT_EXIT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

pub(crate) fn remove_at_exit(dir: PathBuf) {
    AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()).push(dir);
    remove_at_exit_hook();
}

fn remove_at_exit_hook() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    extern "C" fn remove_all() {
        let cleanups = std::mem::take(&mut *CLEANUPS.lock().unwrap_or_else(|e| e.into_inner()));
        for cleanup in cleanups {
            cleanup();
        }
        let dirs = std::mem::take(&mut *AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()));
        for dir in dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    // SAFETY: `remove_all` is a plain function that only takes locks, runs the registered
    // cleanups and removes files; it is registered once and runs at normal process exit.
    REGISTERED.call_once(|| unsafe {
        libc::atexit(remove_all);
    });
}

impl Env {
    /// The client certificate the root apiserver presents to kubelets (`system:masters`).
    pub fn kubelet_client_identity(&self) -> Identity {
        self.sandbox
            .root
            .ca
            .issue_client(APISERVER_KUBELET_CLIENT, &["system:masters"])
            .expect("kubelet client certificate")
    }

    /// TLS settings for relaylet's kubelet API: the root CA, and `identity` if given.
    pub fn kubelet_api_tls(
        &self,
        identity: Option<&Identity>,
    ) -> std::sync::Arc<rustls::ClientConfig> {
        relaylet_sim::tls::client_config(self.sandbox.root.ca.root_store(), identity)
            .expect("client TLS settings")
    }

    /// A TLS connection to relaylet's kubelet API, presenting `identity` if given.
    pub async fn connect_kubelet_api(
        &self,
        identity: Option<&Identity>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(self.sandbox.relaylet.addr).await?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("server name");
        tokio_rustls::TlsConnector::from(self.kubelet_api_tls(identity))
            .connect(name, tcp)
            .await
    }

    /// A kube client of the sandbox's root apiserver as its admin.
    pub async fn root_client(&self) -> kube::Client {
        crate::sandbox::kube_client(
            &self
                .sandbox
                .root
                .admin_kubeconfig()
                .expect("admin kubeconfig"),
        )
        .await
        .expect("root client")
    }

    /// A kube client of relaylet's kubelet API holding the root apiserver's kubelet client
    /// certificate. No client-side retries: kube's default policy retries a 503 for minutes.
    pub async fn kubelet_api_client(&self) -> kube::Client {
        let kubeconfig = self
            .sandbox
            .root
            .kubeconfig(APISERVER_KUBELET_CLIENT, &["system:masters"])
            .expect("kubeconfig")
            .replace(
                &self.sandbox.root.api.url(),
                &format!("https://{}", self.sandbox.relaylet.addr),
            );
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&kubeconfig).expect("kubeconfig");
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("client config");
        config.default_retry = false;
        kube::Client::try_from(config).expect("client")
    }
}

/// kubectl `version` (`1.27` ... `1.35`), found or installed by `tests/tools/install.sh`.
pub fn kubectl(version: &str) -> Kubectl {
    relaylet_sim::tools::kubectl(version)
        .unwrap_or_else(|| panic!("kubectl {version} is not available: run tests/tools/install.sh"))
}

/// The kubectl versions the end-to-end tests use: an old SPDY-only one, a WebSocket-first one
/// from the machine, and the pinned newest.
pub fn kubectls() -> Vec<Kubectl> {
    ["1.27", "1.33", "1.35"].into_iter().map(kubectl).collect()
}

/// Every kubectl of [`kubectls`] with its default protocol, and the WebSocket-first ones also
/// with WebSockets turned off (`true` = SPDY only): 1.27 SPDY, 1.33 and 1.35 both ways.
pub fn kubectl_variants() -> Vec<(Kubectl, bool)> {
    let mut out = Vec::new();
    for k in kubectls() {
        if k.websocket_first() {
            out.push((k.clone(), false));
        }
        out.push((k, true));
    }
    out
}

/// A kubectl running in the background; its stdout is read line by line as it comes.
pub struct Background {
    pub what: String,
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    stdout_reader: std::thread::JoinHandle<()>,
    stderr: std::thread::JoinHandle<String>,
}

/// How a background kubectl ended.
#[derive(Debug)]
pub struct Ended {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Background {
    /// Starts `run` with stdin closed.
    pub fn spawn(run: Run<'_>, what: impl Into<String>) -> Background {
        use std::io::{BufRead, Read};
        let mut cmd = run.command();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl starts");
        let out = child.stdout.take().expect("stdout");
        let mut err = child.stderr.take().expect("stderr");
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let collected = stdout.clone();
        let stdout_reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Ok(mut all) = collected.lock() {
                    all.push_str(&line);
                    all.push('\n');
                }
                let _ = tx.send(line);
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        });
        Background {
            what: what.into(),
            child,
            lines,
            stdout,
            stdout_reader,
            stderr,
        }
    }

    /// Waits up to `within` for the next stdout line.
    pub fn next_line(&self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// Waits for kubectl to exit; `within` only turns a hang into a failure (kills it and
    /// panics).
    pub fn finish(self, within: Duration) -> Ended {
        let what = self.what.clone();
        let status = wait_exit(self.child, within)
            .unwrap_or_else(|| panic!("{what}: kubectl still running after {within:?}"));
        let stderr = self.stderr.join().unwrap_or_default();
        // The reader thread ends with the pipe, which closed with the process.
        let _ = self.stdout_reader.join();
        let stdout = self.stdout.lock().map(|s| s.clone()).unwrap_or_default();
        Ended {
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

/// `run` is a `kubectl attach -i` to a pod whose main process logs `tick ...` lines and answers
/// each stdin line with `got <line>`: sends `marker` once the first tick shows the attach is live
/// (so the process reads it), and returns the lines seen up to the answer (or to the end).
pub fn attach_round_trip(run: Run<'_>, marker: &str) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let mut child = run
        .command()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl attach");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = Vec::new();
    let mut sent = false;
    for line in stdout.lines().map_while(Result::ok) {
        if !sent && line.starts_with("tick ") {
            writeln!(stdin, "{marker}").expect("attach stdin");
            stdin.flush().expect("flush");
            sent = true;
        }
        let done = line == format!("got {marker}");
        seen.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

/// Waits for `child` to exit, on a thread blocked in `wait` (no polling); after `within` kills
/// it and returns `None`. The bound only turns a hang into a failure.
pub fn wait_exit(
    mut child: std::process::Child,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(within) {
        Ok(status) => {
            let _ = waiter.join();
            Some(status.expect("wait for the child"))
        }
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid. The waiter has not reported an exit, so
            // the child is still ours (unreaped) unless it exited in this very instant.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            let _ = waiter.join();
            None
        }
    }
}

/// Runs `check` every 100 ms until it holds, for conditions a command reads (kubectl against a
/// real cluster); panics naming `what` after a minute.
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    eventually_some(what, || check().then_some(()))
}

/// Like [`eventually`], for the value `value` gives once it is there.
pub fn eventually_some<T>(what: &str, mut value: impl FnMut() -> Option<T>) -> T {
    for _ in 0..600 {
        if let Some(v) = value() {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what}: never happened");
}

/// Checks `check` until it holds, for conditions no channel reports (a metric's value, a
/// server's state); `within` only turns a hang into a failure.
pub fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How to run one kubectl command.
pub struct Run<'a> {
    pub kubectl: &'a Kubectl,
    pub kubeconfig: &'a Path,
    pub args: Vec<String>,
    pub stdin: Option<Vec<u8>>,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
}

impl<'a> Run<'a> {
    pub fn new(kubectl: &'a Kubectl, kubeconfig: &'a Path, args: &[&str]) -> Run<'a> {
        Run {
            kubectl,
            kubeconfig,
            args: args.iter().map(|s| s.to_string()).collect(),
            stdin: None,
            env: Vec::new(),
            timeout: Duration::from_secs(60),
        }
    }

    pub fn stdin(mut self, data: &[u8]) -> Self {
        self.stdin = Some(data.to_vec());
        self
    }

    pub fn spdy_only(mut self) -> Self {
        self.env
            .push(("KUBECTL_REMOTE_COMMAND_WEBSOCKETS".into(), "false".into()));
        self.env
            .push(("KUBECTL_PORT_FORWARD_WEBSOCKETS".into(), "false".into()));
        self
    }

    pub fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.kubectl.path);
        cmd.args(&self.args)
            .env("KUBECONFIG", self.kubeconfig)
            .env(
                "HOME",
                self.kubeconfig.parent().unwrap_or(Path::new("/tmp")),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs to completion (killed at the timeout).
    pub fn output(self) -> Output {
        use std::io::Write;
        let mut cmd = self.command();
        cmd.stdin(if self.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl runs");
        if let Some(data) = &self.stdin {
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(data).expect("write stdin");
        }
        // Both pipes are read while waiting, so a chatty kubectl cannot block on a full pipe.
        let (out, err) = (
            child.stdout.take().expect("stdout"),
            child.stderr.take().expect("stderr"),
        );
        let read = |mut pipe: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                bytes
            })
        };
        let (out, err) = (read(Box::new(out)), read(Box::new(err)));
        // Killed at the timeout, as before: the output then shows what it had printed.
        let status = match wait_exit(child, self.timeout) {
            Some(status) => status,
            None => std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL),
        };
        Output {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A finished command's exit code and output, for assertion messages.
pub fn shown(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// Describes a kubectl run for assertion messages.
pub fn describe(k: &Kubectl, out: &Output) -> String {
    format!(
        "kubectl {}: status {:?}\nstdout: {}\nstderr: {}",
        k.version,
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// `kubectl exec -it <pod> -- sh -c "stty size; read x; stty size; exit 5"` under
/// [`PTY_DRIVER`] with `kubeconfig` (WebSockets off when `spdy`): asserts the remote tty saw the
/// initial size 40x100, then the resize to 50x132, and the exit code 5.
pub fn assert_tty_size_and_resize(k: &Kubectl, kubeconfig: &Path, pod: &str, spdy: bool) {
    assert_tty_size_and_resize_of(
        k,
        kubeconfig,
        pod,
        spdy,
        "stty size; read x; stty size; exit 5",
    );
}

/// [`assert_tty_size_and_resize`] on a container runtime that sets the first size a moment
/// after the command starts (containerd: the resize goes to the process once it runs, so a
/// command asking at once may still see 0x0): the command waits until it has a size.
pub fn assert_tty_size_and_resize_on_a_runtime(
    k: &Kubectl,
    kubeconfig: &Path,
    pod: &str,
    spdy: bool,
) {
    assert_tty_size_and_resize_of(
        k,
        kubeconfig,
        pod,
        spdy,
        // busybox's stty prints an error and exits 0 while the size is 0x0.
        "until stty size 2>/dev/null | grep -q .; do sleep 0.1; done; stty size; read x; stty size; exit 5",
    );
}

fn assert_tty_size_and_resize_of(
    k: &Kubectl,
    kubeconfig: &Path,
    pod: &str,
    spdy: bool,
    script: &str,
) {
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", PTY_DRIVER])
        .arg(&k.path)
        .args(["exec", "-it", pod, "--", "sh", "-c"])
        .arg(script)
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if spdy {
        cmd.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false");
    }
    let out = cmd.output().expect("python3 pty driver runs");
    let got = text(&out.stdout);
    let what = format!(
        "kubectl {} spdy={spdy}: {got:?} {}",
        k.version,
        text(&out.stderr)
    );
    assert!(got.contains("40 100"), "initial size: {what}");
    assert!(got.contains("50 132"), "resized: {what}");
    assert_eq!(out.status.code(), Some(5), "{what}");
}

/// Runs the program in its arguments under a real PTY (python's pty module) sized 40x100; once
/// the program prints "40 100" the PTY is resized to 50x132 and "go" is typed. Prints what the
/// program printed and exits with its exit code. Proves a tty's initial size and a resize.
pub const PTY_DRIVER: &str = r#"
import fcntl, os, pty, select, struct, sys, termios, time
def setsize(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
setsize(fd, 40, 100)
out = b""
resized = False
deadline = time.time() + 40
while time.time() < deadline:
    r, _, _ = select.select([fd], [], [], 0.2)
    if r:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    if not resized and b"40 100" in out:
        setsize(fd, 50, 132)
        time.sleep(0.5)
        os.write(fd, b"go\r")
        resized = True
done, status = os.waitpid(pid, os.WNOHANG)
if done == 0:
    os.kill(pid, 9)
    out += b"\n[pty driver: killed the program after 40 s]\n"
    _, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode("utf-8", "replace"))
sys.exit(os.waitstatus_to_exitcode(status))
"#;

/// What kubectl prints for an exec of a missing binary, as the real kube-apiserver and kubelet
/// make it: the kubelet's `error executing command in container: <runtime error>` as an
/// InternalError; with WebSockets (kubectl 1.30+ by default) the apiserver's v5 translator wraps
/// that in an InternalError of its own, so "Internal error occurred:" comes twice.
pub fn assert_missing_binary_error(k: &Kubectl, spdy: bool, out: &Output, binary: &str) {
    // client-go's WebSocket executor reads frames before it has made its streams, so the empty
    // "connected" frame the apiserver sends on stdout (upstream `webSocketServerStreams`) is now
    // and then dropped with this klog line: an upstream race, the same against a real apiserver.
    let stderr: String = text(&out.stderr)
        .lines()
        .filter(|line| !(line.contains("Unknown stream id") && line.contains("discarding message")))
        .map(|line| format!("{line}\n"))
        .collect();
    let translated = k.websocket_first() && !spdy;
    let prefix = if translated {
        "error: Internal error occurred: Internal error occurred: error executing command in container: "
    } else {
        "error: Internal error occurred: error executing command in container: "
    };
    assert!(
        stderr.starts_with(prefix) && stderr.contains(binary),
        "expected {prefix:?}...{binary:?}: {}",
        describe(k, out)
    );
}

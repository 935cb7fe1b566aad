//! relaylet in front of a leaf whose node is real: the kubelet built from Kubernetes' module
//! and containerd from Debian, pods in real containers (runc), in a network namespace of their
//! own (`testkit::realk8s::real_node`). Every kubectl streaming call goes the whole way a user's
//! does: kubectl → real root apiserver → relaylet → real leaf apiserver → real kubelet → CRI →
//! containerd's streaming server → the container.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use relaylet_dev::testkit as support;
use relaylet_sim::tools::Kubectl;
use support::realk8s::harness::K8s;
use support::realk8s::pods::busybox_pod;
use support::realk8s::websocket_calls;
use support::realk8s::world::{Setup, World};
use support::{Run, describe, text};

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let w = World::start(Setup {
            leaves: &["leaf-1"],
            real_node_leaves: &["leaf-1"],
            root_version: K8s::V1_35,
            leaf_version: K8s::V1_35,
            ..Setup::default()
        });
        let node = &w.real_nodes["leaf-1"];
        eprintln!(
            "real node {} at {}: containerd {}",
            node.name,
            node.ip,
            node.containerd_version()
        );
        w.sync_pod_from("leaf-1", "default", "box", busybox_pod);
        // attach writes to its pod's log; the log checks read box's.
        w.sync_pod_from("leaf-1", "default", "attached", busybox_pod);
        w
    })
}

/// The cut test kills the node's kubelet: the other tests wait for it to be back.
static KUBELET_UP: RwLock<()> = RwLock::new(());

/// exec (stdin, stderr, exit code, a tty with its size and a resize), attach, cp both ways,
/// port-forward (two connections) and logs, with WebSocket-first kubectl 1.35, kubectl 1.35
/// forced to SPDY and SPDY-only kubectl 1.27, into a container on a real kubelet.
#[test]
fn every_streaming_call_reaches_a_real_container() {
    let w = world();
    let _up = KUBELET_UP.read().unwrap_or_else(|e| e.into_inner());
    for (version, spdy) in [("1.35", false), ("1.35", true), ("1.27", false)] {
        let k = support::kubectl(version);
        if spdy {
            // SPDY only (KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false): the tty; the rest of the
            // calls are the same bytes relaylet already relays for 1.27.
            support::assert_tty_size_and_resize_on_a_runtime(&k, w.root_kubeconfig(), "box", true);
            continue;
        }
        websocket_calls::exec_with_stdin_stderr_and_exit_code(w, &k, "box");
        // containerd sets a tty's first size just after the command starts (directly against
        // the leaf apiserver too), so the command waits for it; then the resize.
        support::assert_tty_size_and_resize_on_a_runtime(&k, w.root_kubeconfig(), "box", false);
        websocket_calls::attach_with_stdin(w, &k, "attached");
        websocket_calls::cp_both_ways(w, &k, "box");
        websocket_calls::port_forward_two_connections(w, &k, "box");
        websocket_calls::logs(w, &k, "box");
    }
}

/// The container's own processes answer: exec sees the container's root file system (busybox,
/// not this machine's) and its hostname is the pod's name.
#[test]
fn exec_runs_in_the_container_not_on_this_machine() {
    let w = world();
    let _up = KUBELET_UP.read().unwrap_or_else(|e| e.into_inner());
    let k = support::kubectl("1.35");
    let out = sh_in_box(w, &k, "hostname; readlink /bin/sh; ls /");
    assert!(out.status.success(), "{}", describe(&k, &out));
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("box"), "{}", describe(&k, &out));
    assert_eq!(lines.next(), Some("busybox"), "{}", describe(&k, &out));
    let root: Vec<&str> = lines.collect();
    assert!(
        root.contains(&"www") && !root.contains(&"usr"),
        "the container's root, not the host's: {root:?}"
    );
}

/// A command killed by a signal in the container: the session ends with the exit code the
/// runtime reports (128 + 9), not success.
#[test]
fn a_command_killed_in_the_container_does_not_read_as_success() {
    let w = world();
    let _up = KUBELET_UP.read().unwrap_or_else(|e| e.into_inner());
    let k = support::kubectl("1.35");
    let out = sh_in_box(w, &k, "kill -9 $$");
    assert_eq!(out.status.code(), Some(137), "{}", describe(&k, &out));
}

/// `kubectl exec box -- sh -c <script>` through the root, to its end.
fn sh_in_box(w: &World, k: &Kubectl, script: &str) -> std::process::Output {
    Run::new(
        k,
        w.root_kubeconfig(),
        &["exec", "box", "--", "sh", "-c", script],
    )
    .output()
}

/// Starts `kubectl exec <pod> -- sh -c 'echo started; exec sleep 300'` through the root and
/// waits until the command runs; the running kubectl.
fn long_exec(w: &World, k: &Kubectl, pod: &str) -> std::process::Child {
    let mut child = Run::new(
        k,
        w.root_kubeconfig(),
        &[
            "exec",
            pod,
            "--",
            "sh",
            "-c",
            "echo started; exec sleep 300",
        ],
    )
    .command()
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("kubectl exec");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let first = stdout.lines().next().and_then(Result::ok);
    assert_eq!(first.as_deref(), Some("started"), "the command runs");
    child
}

/// The process of this machine whose environment holds `POD=<pod>` and whose command line
/// holds `needle`: a container's process, seen from the host.
fn container_process(pod: &str, needle: &str) -> Option<i32> {
    let env = format!("POD={pod}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let has = |hay: &[u8], n: &[u8]| hay.windows(n.len()).any(|w| w == n);
        (environ.split(|b| *b == 0).any(|v| v == env.as_bytes())
            && has(&cmdline, needle.as_bytes()))
        .then_some(pid)
    })
}

/// Sessions cut under the real kubelet never read as success: the container killed while a
/// command runs in it (its init dies, the kernel kills the rest of its PID namespace), and the
/// node's kubelet killed while a session runs through it. kubectl exits non-zero both times.
#[test]
fn sessions_cut_by_the_container_or_the_kubelet_fail_in_kubectl() {
    let w = world();
    let _down = KUBELET_UP.write().unwrap_or_else(|e| e.into_inner());
    let k = support::kubectl("1.35");
    const HANG: Duration = Duration::from_secs(90);

    w.sync_pod_from("leaf-1", "default", "cut", busybox_pod);
    let session = long_exec(w, &k, "cut");
    let init = container_process("default/cut", "tmp/www").expect("the container's init process");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &init.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(killed, "kill -KILL {init}");
    let status = support::wait_exit(session, HANG).expect("kubectl exits once its container dies");
    assert!(
        !status.success(),
        "an exec whose container was killed exited {status:?}"
    );

    let session = long_exec(w, &k, "box");
    let node = &w.real_nodes["leaf-1"];
    node.kill_kubelet();
    let status = support::wait_exit(session, HANG).expect("kubectl exits once the kubelet dies");
    node.restart_kubelet();
    assert!(
        !status.success(),
        "an exec whose kubelet was killed exited {status:?}"
    );
    // Back: a new session works.
    let mut ok = false;
    for _ in 0..100 {
        let out = sh_in_box(w, &k, "true");
        if out.status.success() {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(ok, "exec works again once the kubelet is back");
}

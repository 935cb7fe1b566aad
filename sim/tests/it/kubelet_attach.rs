//! attach to containers' main processes through kube-rs (WebSocket), and the kubelet's
//! lifecycle duties: no process survives a removed pod or a stopped kubelet.

use crate::kubelet_support as support;

use std::time::Duration;

use futures::SinkExt;
use kube::api::AttachParams;
use kube::core::kubelet_debug::KubeletDebugParams;
use support::{Harness, pod, shell_container};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

const T: Duration = Duration::from_secs(20);

fn params(name: &str) -> KubeletDebugParams<'_> {
    KubeletDebugParams {
        name,
        namespace: "default",
        pod_uid: None,
    }
}

/// Reads from `r` until the text seen so far contains `want`.
async fn read_until<R: AsyncReadExt + Unpin>(r: &mut R, want: &str) -> String {
    let mut seen = String::new();
    let mut buf = [0u8; 512];
    while !seen.contains(want) {
        let n = r.read(&mut buf).await.unwrap();
        assert!(n > 0, "stream ended before {want:?}: {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    seen
}

#[tokio::test]
async fn attach_streams_live_output_and_stdin() {
    support::init_crypto();
    let h = Harness::start("attach-stdin").await;
    let mut repl = shell_container(
        "repl",
        "echo before-attach; while read line; do echo \"got $line\"; echo \"err $line\" >&2; done",
    );
    repl.stdin = true;
    h.kubelet.run_pod(pod("app", vec![repl])).await.unwrap();
    timeout(T, async {
        // Let the greeting happen before anyone attaches.
        loop {
            let (_, log) = h.get("/containerLogs/default/app/repl").await;
            if log.contains("before-attach") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let client = h.kube_client().await;
        let ap = AttachParams::default()
            .stdin(true)
            .stdout(true)
            .stderr(true);
        let mut attached = client
            .kubelet_node_attach(&params("app"), "repl", &ap)
            .await
            .unwrap();
        let mut stdin = attached.stdin().unwrap();
        let mut stdout = attached.stdout().unwrap();
        let mut stderr = attached.stderr().unwrap();
        let status = attached.take_status().unwrap();
        stdin.write_all(b"ping\n").await.unwrap();
        let out = read_until(&mut stdout, "got ping\n").await;
        // Output from before the attach is not replayed.
        assert_eq!(out, "got ping\n");
        assert_eq!(read_until(&mut stderr, "err ping\n").await, "err ping\n");
        // What went through attach is in the container log too.
        let (_, log) = h.get("/containerLogs/default/app/repl").await;
        assert!(
            log.contains("got ping\n") && log.contains("err ping\n"),
            "{log}"
        );
        // Closing stdin ends the session with success; the container keeps running.
        stdin.shutdown().await.unwrap();
        assert_eq!(status.await.unwrap().status.as_deref(), Some("Success"));
        assert!(
            h.kubelet
                .container_status("default", "app", "repl")
                .unwrap()
                .running
        );
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn attach_ends_when_the_process_exits_and_tty_resizes_reach_it() {
    support::init_crypto();
    let h = Harness::start("attach-tty").await;
    let mut tty = shell_container(
        "term",
        "trap 'stty size; exit 0' WINCH; echo ready; while true; do sleep 0.05; done",
    );
    tty.tty = true;
    tty.stdin = true;
    h.kubelet.run_pod(pod("tty", vec![tty])).await.unwrap();
    timeout(T, async {
        loop {
            let (_, log) = h.get("/containerLogs/default/tty/term").await;
            if log.contains("ready") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let client = h.kube_client().await;
        let ap = AttachParams::default()
            .stdin(true)
            .stdout(true)
            .stderr(false)
            .tty(true);
        let mut attached = client
            .kubelet_node_attach(&params("tty"), "term", &ap)
            .await
            .unwrap();
        let mut resize = attached.terminal_size().unwrap();
        let mut stdout = attached.stdout().unwrap();
        let _stdin = attached.stdin().unwrap();
        let status = attached.take_status().unwrap();
        resize
            .send(kube::api::TerminalSize {
                width: 70,
                height: 20,
            })
            .await
            .unwrap();
        // The main process prints the size it sees on SIGWINCH, then exits: the attach ends.
        read_until(&mut stdout, "20 70\r\n").await;
        assert_eq!(status.await.unwrap().status.as_deref(), Some("Success"));
        let st = h
            .kubelet
            .container_status("default", "tty", "term")
            .unwrap();
        assert_eq!((st.running, st.exit_code), (false, Some(0)));
        // Attaching to (or exec in) a container that is not running fails before any upgrade.
        for verb in ["attach", "exec"] {
            let (code, body) = h
                .get(&format!("/{verb}/default/tty/term?output=1&command=true"))
                .await;
            assert_eq!(code.as_u16(), 500);
            assert!(body.contains("CONTAINER_EXITED"), "{body}");
        }
    })
    .await
    .unwrap();
}

/// Reads a pid the container's script wrote into `file` in its working directory.
fn read_pid(h: &Harness, pod: &str, file: &str) -> nix::unistd::Pid {
    let file = h
        .data_dir
        .join(format!("containers/default_{pod}_uid-{pod}/main/{file}"));
    let text = std::fs::read_to_string(file).unwrap_or_default();
    nix::unistd::Pid::from_raw(text.trim().parse().unwrap_or(0))
}

async fn wait_for_pid(h: &Harness, pod: &str, file: &str) -> nix::unistd::Pid {
    loop {
        let pid = read_pid(h, pod, file);
        if pid.as_raw() > 0 {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_gone(pid: nix::unistd::Pid) {
    while support::is_alive(pid.as_raw()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn removing_pods_and_stopping_the_kubelet_leave_no_processes() {
    let h = Harness::start("lifecycle").await;
    // The main process starts a child of its own; both must go.
    let script = "sleep 1000 & echo $! > pid.child; echo $$ > pid; wait";
    h.kubelet
        .run_pod(pod("a", vec![shell_container("main", script)]))
        .await
        .unwrap();
    h.kubelet
        .run_pod(pod("b", vec![shell_container("main", script)]))
        .await
        .unwrap();
    timeout(T, async {
        let a_child = wait_for_pid(&h, "a", "pid.child").await;
        let a = wait_for_pid(&h, "a", "pid").await;
        let b = wait_for_pid(&h, "b", "pid").await;
        let b_child = wait_for_pid(&h, "b", "pid.child").await;
        h.kubelet.remove_pod("default", "a").await;
        wait_gone(a).await;
        wait_gone(a_child).await;
        assert!(support::is_alive(b.as_raw()), "other pods keep running");
        let (code, _) = h.get("/containerLogs/default/a/main").await;
        assert_eq!(code.as_u16(), 404);
        h.kubelet.stop();
        wait_gone(b).await;
        wait_gone(b_child).await;
    })
    .await
    .unwrap();
}

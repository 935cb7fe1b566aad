//! relaylet as it ships, on real nodes at both ends: the image built from the Dockerfile
//! (`tests/tools/build-image.sh`), imported into a real root node's containerd and installed
//! with `helm install` from `charts/relaylet`, two replicas placed by the real kube-scheduler
//! and run by the real kubelet; the downward API gives each pod its IP, which becomes its
//! virtual Nodes' address, and the root apiserver reaches it over the pod network. Sessions go
//! the whole way: kubectl → real root apiserver → the chart's pod → real leaf apiserver → real
//! leaf kubelet → containerd → a busybox container (`tests/real/node.rs` runs the same calls
//! with relaylet in this process).
//!
//! `leaf-1`'s node is real; `leaf-2` has the stand-in kubelet: two virtual Nodes, so that the
//! two replicas have Nodes to share and hand over.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use relaylet_dev::testkit as support;
use relaylet_sim::tools::Kubectl;
use support::realk8s::harness::K8s;
use support::realk8s::pods::busybox_pod;
use support::realk8s::websocket_calls;
use support::realk8s::world::{RELAYLET_NAMESPACE, ROOT_NODE, Setup, World, virtual_node};
use support::{Run, describe, text};

const LEAVES: [&str; 2] = ["leaf-1", "leaf-2"];

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let w = World::start(Setup {
            leaves: &LEAVES,
            real_node_leaves: &["leaf-1"],
            replicas: 0,
            helm_replicas: 2,
            root_version: K8s::V1_35,
            leaf_version: K8s::V1_35,
            ..Setup::default()
        });
        if let Some(node) = &w.root_node {
            eprintln!(
                "root node {} at {}: containerd {}",
                node.name,
                node.ip,
                node.containerd_version()
            );
        }
        w.sync_pod_from("leaf-1", "default", "box", busybox_pod);
        w.sync_pod_from("leaf-1", "default", "attached", busybox_pod);
        w
    })
}

/// The tests that delete relaylet's pods take it alone; the others share it.
static PODS_STAY: Mutex<()> = Mutex::new(());

/// `kubectl get <args> -o jsonpath=<path>` in the root, trimmed.
fn root_get(w: &World, args: &[&str], path: &str) -> String {
    let jsonpath = format!("jsonpath={path}");
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", &jsonpath]);
    w.root.kubectl_ok(&all).trim().to_string()
}

/// Who writes `node` (its `relaylet.io/served-by`: the pod's name) and the first address it
/// gives the root.
fn writer_and_address(w: &World, node: &str) -> (String, String) {
    let out = root_get(
        w,
        &["node", node],
        "{.metadata.annotations.relaylet\\.io/served-by} {.status.addresses[0].address}",
    );
    let (writer, address) = out.split_once(' ').unwrap_or((&out, ""));
    (writer.to_string(), address.to_string())
}

/// Waits until every virtual Node is written by one of the chart's live pods, with that pod's
/// IP first, and Ready.
fn wait_nodes_on_live_pods(w: &World) {
    let mut last = String::new();
    for _ in 0..300 {
        let pods = w.chart_pods();
        let settled = LEAVES.iter().all(|leaf| {
            let node = virtual_node(leaf);
            let (writer, address) = writer_and_address(w, &node);
            last = format!("{node}: served by {writer:?} at {address:?}; live pods {pods:?}");
            pods.iter()
                .any(|(name, ip)| *name == writer && *ip == address)
                && w.node_ready(&node) == "True"
        });
        if settled {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the virtual Nodes did not settle on live relaylet pods: {last}");
}

/// The chart's Deployment runs from the image on the real root node: its pods Running and Ready
/// (the readiness probe passed through the kubelet), never restarted (liveness), placed by the
/// scheduler, each Node written by one of them with that pod's IP (the downward API's
/// `status.podIP`) first, and Ready.
#[test]
fn the_charts_pods_run_from_the_image_and_their_ips_are_the_nodes_addresses() {
    let w = world();
    let _stay = PODS_STAY.lock().unwrap_or_else(|e| e.into_inner());
    w.wait_for_rollout();
    // Pods of an earlier test's rollout may still be going.
    let mut lines = Vec::new();
    for _ in 0..300 {
        let pods = root_get(
            w,
            &["pods", "-n", RELAYLET_NAMESPACE],
            "{range .items[*]}{.spec.nodeName} {.spec.containers[0].image} {.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].imageID} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        );
        lines = pods.lines().map(str::to_string).collect();
        if lines.len() == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(lines.len(), 2, "two replicas: {lines:?}");
    for line in &lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            fields.get(..4),
            Some(&[ROOT_NODE, support::image::IMAGE, "true", "0"][..]),
            "scheduled to the real node, from the image built here, Ready, never restarted: {line}"
        );
        assert!(
            fields.get(4).is_some_and(|id| id.contains("sha256:")),
            "containerd ran a stored image: {line}"
        );
    }
    wait_nodes_on_live_pods(w);
    let pod_network = w.chart_pods();
    for leaf in LEAVES {
        let (_, address) = writer_and_address(w, &virtual_node(leaf));
        let root_node_ip = w.root_node.as_ref().map(|n| n.ip.to_string());
        assert_ne!(
            Some(address.clone()),
            root_node_ip,
            "the pod's own IP, not its node's"
        );
        assert!(
            pod_network.iter().any(|(_, ip)| *ip == address),
            "{leaf}'s Node names a pod IP: {address} of {pod_network:?}"
        );
    }
}

/// exec (stdin, stderr, exit code, a tty and a resize), attach, cp both ways, port-forward (two
/// connections), logs and logs -f through the chart's pod into a real container, with kubectl
/// 1.35 (WebSocket), 1.35 forced to SPDY (the tty) and 1.27 (SPDY).
#[test]
fn every_streaming_call_goes_through_the_charts_pod_into_a_real_container() {
    let w = world();
    let _stay = PODS_STAY.lock().unwrap_or_else(|e| e.into_inner());
    wait_nodes_on_live_pods(w);
    for (version, spdy) in [("1.35", false), ("1.35", true), ("1.27", false)] {
        let k = support::kubectl(version);
        if spdy {
            support::assert_tty_size_and_resize_on_a_runtime(&k, w.root_kubeconfig(), "box", true);
            continue;
        }
        websocket_calls::exec_with_stdin_stderr_and_exit_code(w, &k, "box");
        support::assert_tty_size_and_resize_on_a_runtime(&k, w.root_kubeconfig(), "box", false);
        websocket_calls::attach_with_stdin(w, &k, "attached");
        websocket_calls::cp_both_ways(w, &k, "box");
        websocket_calls::port_forward_two_connections(w, &k, "box");
        websocket_calls::logs(w, &k, "box");
        logs_follow_sees_new_lines(w, &k, "box");
    }
}

/// `kubectl logs -f`: lines the container writes after the stream opened arrive.
fn logs_follow_sees_new_lines(w: &World, k: &Kubectl, pod: &str) {
    let mut child = Run::new(k, w.root_kubeconfig(), &["logs", "-f", pod, "--tail=1"])
        .command()
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let lines = lines_of(child.stdout.take().expect("stdout"));
    let tick = |n: &str| n.strip_prefix("tick ").and_then(|t| t.parse::<u64>().ok());
    let first = lines.recv_timeout(Duration::from_secs(60)).ok();
    let first_tick = first.as_deref().and_then(tick);
    assert!(
        first_tick.is_some(),
        "kubectl {}: first line {first:?}",
        k.version
    );
    let mut later = None;
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(60)) {
        if let Some(n) = tick(&line).filter(|n| Some(*n) > first_tick) {
            later = Some(n);
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        later.is_some(),
        "kubectl {}: no line after {first:?} arrived",
        k.version
    );
}

/// The lines of `from`, read on a thread of their own (so that a test can wait with a timeout).
fn lines_of(from: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// An open `kubectl exec -i` into the box that answers each line it is sent.
struct Echo {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Echo {
    fn open(w: &World, k: &Kubectl, pod: &str) -> Echo {
        let mut child = Run::new(
            k,
            w.root_kubeconfig(),
            &[
                "exec",
                "-i",
                pod,
                "--",
                "sh",
                "-c",
                "while read l; do echo \"got $l\"; done",
            ],
        )
        .command()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl exec -i");
        let stdin = child.stdin.take().expect("stdin");
        let lines = lines_of(child.stdout.take().expect("stdout"));
        let mut echo = Echo {
            child,
            stdin,
            lines,
        };
        assert_eq!(echo.round_trip("hello"), Ok("got hello".into()));
        echo
    }

    /// Sends `line`; the answer, or why none came.
    fn round_trip(&mut self, line: &str) -> Result<String, String> {
        writeln!(self.stdin, "{line}").map_err(|e| format!("writing: {e}"))?;
        self.stdin.flush().map_err(|e| format!("writing: {e}"))?;
        match self.lines.recv_timeout(Duration::from_secs(60)) {
            Ok(answer) => Ok(answer),
            Err(RecvTimeoutError::Timeout) => Err("no answer in 60 s".into()),
            Err(RecvTimeoutError::Disconnected) => {
                Err(format!("the session ended ({:?})", self.child.try_wait()))
            }
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads every virtual Node's Ready condition until dropped; what was not `True` is kept.
struct ReadyWatch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReadyWatch {
    fn start(w: &'static World) -> ReadyWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let nodes: Vec<String> = LEAVES.iter().map(|l| virtual_node(l)).collect();
        let thread = {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let out = std::process::Command::new(support::realk8s::harness::kubectl_path())
                        .arg("get")
                        .arg("nodes")
                        .args(&nodes)
                        .args([
                            "-o",
                            "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}",
                        ])
                        .env("KUBECONFIG", &w.root.admin_kubeconfig)
                        .output();
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    match out {
                        Ok(out) if out.status.success() => {
                            let text = String::from_utf8_lossy(&out.stdout);
                            let states: Vec<&str> = text.split_whitespace().collect();
                            if states.len() != nodes.len() {
                                seen.push(format!("nodes missing: {text:?}"));
                            }
                            seen.extend(
                                states
                                    .iter()
                                    .filter(|s| !s.ends_with("=True"))
                                    .map(|s| s.to_string()),
                            );
                        }
                        Ok(out) => seen.push(format!(
                            "kubectl get nodes: {}",
                            String::from_utf8_lossy(&out.stderr)
                        )),
                        Err(e) => seen.push(format!("kubectl get nodes: {e}")),
                    }
                    drop(seen);
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        };
        ReadyWatch {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// What was seen not Ready, after a last look.
    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Deletes pod `name` as an administrator or an eviction does (SIGTERM, the grace period),
/// without waiting for it to go.
fn delete_pod(w: &World, name: &str) {
    w.root.kubectl_ok(&[
        "delete",
        "pod",
        name,
        "-n",
        RELAYLET_NAMESPACE,
        "--wait=false",
    ]);
}

/// Two replicas, each pod deleted in turn, then a rolling update (`helm upgrade`): the
/// Deployment replaces them, a session served by the replica that stays keeps working while
/// the other is deleted, every virtual Node stays Ready throughout and moves to a live pod's
/// IP, and exec works through the new pods.
#[test]
fn deleting_pods_and_a_rolling_update_keep_sessions_and_nodes_ready() {
    let w = world();
    let _stay = PODS_STAY.lock().unwrap_or_else(|e| e.into_inner());
    let k = support::kubectl("1.35");
    w.wait_for_rollout();
    wait_nodes_on_live_pods(w);
    let watch = ReadyWatch::start(w);

    // A session through the pod that writes leaf-1's Node; the other pod is deleted.
    let (serving, _) = writer_and_address(w, &virtual_node("leaf-1"));
    let mut session = Echo::open(w, &k, "box");
    let other: Vec<String> = w
        .chart_pods()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| *name != serving)
        .collect();
    assert_eq!(
        other.len(),
        1,
        "one other replica than {serving}: {other:?}"
    );
    delete_pod(w, &other[0]);
    w.wait_for_rollout();
    wait_nodes_on_live_pods(w);
    assert_eq!(
        session.round_trip("after the other pod went"),
        Ok("got after the other pod went".into()),
        "a session of the replica that stays is not touched"
    );
    drop(session);

    // The pod that writes leaf-1's Node is deleted: the Node moves to a live pod and exec
    // works through it.
    delete_pod(w, &serving);
    w.wait_for_rollout();
    wait_nodes_on_live_pods(w);
    let (writer, _) = writer_and_address(w, &virtual_node("leaf-1"));
    assert_ne!(writer, serving, "leaf-1's Node moved off the deleted pod");
    exec_works(w, &k);

    // A rolling update replaces every pod, one at a time (maxSurge 1, maxUnavailable 0).
    let before: Vec<String> = w.chart_pods().into_iter().map(|(n, _)| n).collect();
    w.helm(&[
        "upgrade".into(),
        "relaylet".into(),
        support::realk8s::world::repo()
            .join("charts/relaylet")
            .display()
            .to_string(),
        "--namespace".into(),
        RELAYLET_NAMESPACE.into(),
        "--reuse-values".into(),
        "--set-string".into(),
        "podAnnotations.relaylet\\.test/rollout=2".into(),
    ]);
    w.wait_for_rollout();
    wait_nodes_on_live_pods(w);
    let after: Vec<String> = w.chart_pods().into_iter().map(|(n, _)| n).collect();
    assert!(
        after.iter().all(|n| !before.contains(n)),
        "every pod replaced: {before:?} -> {after:?}"
    );
    exec_works(w, &k);

    let not_ready = watch.finish();
    assert!(
        not_ready.is_empty(),
        "a virtual Node read not Ready while relaylet's pods were replaced: {not_ready:?}"
    );
}

/// `kubectl exec box -- echo ok` succeeds through the root.
fn exec_works(w: &World, k: &Kubectl) {
    let out = Run::new(k, w.root_kubeconfig(), &["exec", "box", "--", "echo", "ok"]).output();
    assert!(out.status.success(), "{}", describe(k, &out));
    assert_eq!(text(&out.stdout), "ok\n", "{}", describe(k, &out));
}

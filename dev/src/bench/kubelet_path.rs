//! What declaring `ExtendWebSocketsToKubelet` saves (`bench --only kubelet-path`), on real
//! Kubernetes 1.37 (root and leaves built by `tests/tools/build-k8s.sh`): the CPU seconds each
//! process on the path spends per GiB of `kubectl exec` stdout, and the throughput, for the four
//! combinations of relaylet declaring the feature on its virtual Node (the root then proxies
//! kubectl's WebSocket v5 session to relaylet instead of translating it to SPDY) and the leaf
//! kubelet declaring it (the leaf apiserver then proxies relaylet's re-issued session to the
//! kubelet, which translates it itself, as a 1.36+ kubelet does).
//!
//! One world: a 1.37 root and two 1.37 leaves, leaf-1's kubelet declaring and leaf-2's not.
//! relaylet runs as its own process (`relaylet-dev serve`) so its CPU is its own; it is restarted
//! with and without the setting, and the rounds interleave the four combinations. kubectl's CPU
//! is what the exited child used (`getrusage(RUSAGE_CHILDREN)`); the container's (`head`) is not
//! counted. Every process's CPU is its threads' time on CPU (`procfs::cpu_time`).

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::procfs;
use crate::testkit::realk8s::harness::{self, K8s, Process};
use crate::testkit::realk8s::world::{Setup, World, virtual_node};

/// The processes on the path, in the order of the table.
pub const PROCESSES: [&str; 5] = [
    "root apiserver",
    "relaylet",
    "leaf apiserver",
    "leaf kubelet",
    "kubectl",
];

/// One combination's samples.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub relaylet_declares: bool,
    pub kubelet_declares: bool,
    /// Per sample: CPU seconds per GiB of each of [`PROCESSES`].
    pub cpu_per_gib: Vec<[f64; 5]>,
    /// Per sample: MiB/s end to end.
    pub throughput: Vec<f64>,
}

/// Runs `rounds` rounds of the four combinations, `bytes` of stdout per sample.
pub fn run(rounds: usize, bytes: u64) -> anyhow::Result<Vec<Row>> {
    let world = World::start(Setup {
        replicas: 0,
        wait_for_nodes: false,
        leaves: &["leaf-1", "leaf-2"],
        declaring_leaves: &["leaf-1"],
        root_version: K8s::V1_37,
        leaf_version: K8s::V1_37,
        ..Setup::default()
    });
    let kubectl = relaylet_sim::tools::kubectl("1.35")
        .context("kubectl 1.35 is not available: run tests/tools/install.sh")?;
    let program = std::env::current_exe().context("the relaylet-dev binary")?;
    let mut rows: Vec<Row> = [(true, true), (true, false), (false, true), (false, false)]
        .map(|(relaylet_declares, kubelet_declares)| Row {
            relaylet_declares,
            kubelet_declares,
            ..Row::default()
        })
        .to_vec();
    let mut replica = 0;
    for round in 0..rounds {
        // Alternate which setting goes first, so neither always runs on a warmer machine.
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for relaylet_declares in order {
            let relaylet = start_relaylet(&world, &program, replica, relaylet_declares)?;
            replica += 1;
            if round == 0 && relaylet_declares == order[0] {
                for leaf in ["leaf-1", "leaf-2"] {
                    world.sync_pod(leaf, "default", &format!("demo-{leaf}"));
                }
            }
            for leaf in ["leaf-1", "leaf-2"] {
                let kubelet_declares = leaf == "leaf-1";
                let sample =
                    measure(&world, &kubectl, &relaylet, leaf, bytes).with_context(|| {
                        format!("exec through {leaf}, relaylet declaring: {relaylet_declares}")
                    })?;
                eprintln!(
                    "kubelet-path: round {round}, relaylet declares {relaylet_declares}, {leaf}'s kubelet declares {kubelet_declares}: {:.0} MiB/s, CPU s/GiB {:?}",
                    sample.1, sample.0
                );
                let row = rows
                    .iter_mut()
                    .find(|r| {
                        r.relaylet_declares == relaylet_declares
                            && r.kubelet_declares == kubelet_declares
                    })
                    .context("a row per combination")?;
                row.cpu_per_gib.push(sample.0);
                row.throughput.push(sample.1);
            }
            stop(relaylet);
        }
    }
    Ok(rows)
}

/// Starts relaylet as replica `i` (its own address and name, so it never waits for a
/// predecessor's leases), with or without the declaration, and waits until both virtual Nodes
/// name it, are Ready and declare what it should.
fn start_relaylet(
    world: &World,
    program: &std::path::Path,
    i: usize,
    declares: bool,
) -> anyhow::Result<Process> {
    let setting = if declares { "true" } else { "false" };
    let process = world.spawn_relaylet_command(
        i,
        program,
        &["serve".to_string()],
        &[("EXTEND_WEBSOCKETS_TO_KUBELET", setting)],
    );
    let want = if declares {
        r#"["ExtendWebSocketsToKubelet"]"#
    } else {
        ""
    };
    let ip = world.replica_ip(i).to_string();
    for leaf in ["leaf-1", "leaf-2"] {
        let node = virtual_node(leaf);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            // Not kubectl_ok: the Node may not exist yet.
            let out = std::process::Command::new(harness::kubectl_path())
                .args([
                    "get",
                    "node",
                    &node,
                    "-o",
                    "jsonpath={.status.addresses[0].address} {.status.conditions[?(@.type==\"Ready\")].status} {.status.declaredFeatures}",
                ])
                .env("KUBECONFIG", world.root_kubeconfig())
                .output()
                .context("kubectl get node")?;
            let state = String::from_utf8_lossy(&out.stdout).into_owned();
            if state.trim() == format!("{ip} True {want}").trim() {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{node} did not move to relaylet replica {i} (declaring: {declares}); it says {state:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(process)
}

/// Stops relaylet as a rollout does (SIGTERM: it hands its Nodes back and releases its leases).
fn stop(mut relaylet: Process) {
    relaylet.terminate();
}

/// One `kubectl exec` of `bytes` bytes of stdout through `leaf`: CPU s/GiB per process, MiB/s.
fn measure(
    world: &World,
    kubectl: &relaylet_sim::tools::Kubectl,
    relaylet: &Process,
    leaf: &str,
    bytes: u64,
) -> anyhow::Result<([f64; 5], f64)> {
    let leaf_plane = world.leaf(leaf);
    let kubelet = leaf_plane
        .kubelets
        .first()
        .context("the leaf has a kubelet")?;
    let pids = [
        world.root.apiserver.pid(),
        relaylet.pid(),
        leaf_plane.apiserver.pid(),
        kubelet.pid(),
    ];
    let pod = format!("demo-{leaf}");
    let command = format!("head -c {bytes} /dev/zero");
    let cpu_before = pids.map(procfs::cpu_time);
    let children_before = children_cpu();
    let started = Instant::now();
    let mut child = std::process::Command::new(&kubectl.path)
        .args(["exec", &pod, "--", "sh", "-c", &command])
        .env("KUBECONFIG", world.root_kubeconfig())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("kubectl exec")?;
    let mut stdout = child.stdout.take().context("kubectl's stdout")?;
    let mut received: u64 = 0;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = stdout.read(&mut buf).context("reading kubectl's stdout")?;
        if n == 0 {
            break;
        }
        received += n as u64;
    }
    let output = child.wait_with_output().context("kubectl exits")?;
    let elapsed = started.elapsed();
    let children = children_cpu() - children_before;
    anyhow::ensure!(
        output.status.success() && received == bytes,
        "kubectl exec through {leaf}: {} after {received} of {bytes} bytes: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let mut cpu = [0.0; 5];
    for (i, (before, pid)) in cpu_before.into_iter().zip(pids).enumerate() {
        let used = procfs::cpu_time(pid)? - before?;
        cpu[i] = used.as_secs_f64() / gib;
    }
    cpu[4] = children.as_secs_f64() / gib;
    let throughput = bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64();
    Ok((cpu, throughput))
}

/// User + system CPU of this process's waited-for children.
fn children_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given; a zeroed rusage is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage owned by this frame.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

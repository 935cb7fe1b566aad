//! Replicas under faults, on real Kubernetes: three relaylet replicas (each its own process,
//! the shipped binary) serve four leaves while `kubectl exec` runs against every leaf without
//! pause, and one fault after another hits them: a pause shorter than a replica's deadline
//! (SIGSTOP 3 s), a pause longer than its presence (SIGSTOP 15 s), a crash with a restart under
//! the same name at once, a crash whose Nodes the others take over before it comes back, and a
//! leaf Secret replaced. Watching the root's Nodes throughout,
//! it checks what must hold whatever happens: a Node's first address changes only to the
//! address of the replica the same version names (no stale writer lands a write), no Node goes
//! NotReady (every takeover is well inside the node lifecycle controller's 40 s), an exec that
//! succeeds prints what it was asked to (a session never ends as a false success), and after
//! each fault the Nodes settle where `Assignment::compute` puts them. It prints, per fault, the
//! longest time any Node was unserved, as the Nodes show it (named no running replica, or not
//! at its address) and as the execs show it (first to last failure on one leaf), and the
//! execs that failed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::realk8s::replica_process::ReplicaProcess;
use support::{Run, text};

use super::k8s_replicas::{binary, nodes, pod, spread_over_leaves, world_of_processes};

const LEAVES: &[&str] = &["leaf-1", "leaf-2", "leaf-3", "leaf-4"];
const REPLICAS: usize = 3;

/// Each Node as one look at the root saw it: (writer, first address, Ready).
type Look = BTreeMap<String, (String, String, bool)>;

/// Which replicas could serve at an instant: not paused, not killed.
#[derive(Default)]
struct Running(Mutex<[bool; REPLICAS]>);

impl Running {
    fn set(&self, i: usize, up: bool) {
        self.0.lock().expect("running")[i] = up;
    }
    fn get(&self) -> [bool; REPLICAS] {
        *self.0.lock().expect("running")
    }
}

/// One exec's outcome and when it ran.
struct Exec {
    from: Instant,
    to: Instant,
    leaf: &'static str,
    ok: bool,
}

impl Exec {
    fn during(&self, from: Instant, to: Instant) -> bool {
        self.from <= to && self.to >= from
    }
}

#[test]
fn replicas_keep_every_node_served_through_pauses_crashes_and_replaced_secrets() {
    let (w, mut replicas) = world_of_processes(LEAVES, REPLICAS);
    let binary = binary();
    let all: Vec<usize> = (0..REPLICAS).collect();
    let mut owners = spread_over_leaves(&w, LEAVES, &all);
    let ips: Vec<String> = (0..REPLICAS).map(|i| w.replica_ip(i).to_string()).collect();
    let running = Arc::new(Running(Mutex::new([true; REPLICAS])));
    let stop = Arc::new(AtomicBool::new(false));

    std::thread::scope(|scope| {
        // The root's Nodes, looked at without pause; the invariants checked on every look.
        let looks = scope.spawn(|| {
            let mut looks: Vec<(Instant, Look, [bool; REPLICAS])> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let look = nodes(&w);
                let up = running.get();
                if let Some((_, last, _)) = looks.last() {
                    for (node, (writer, address, ready)) in &look {
                        assert!(ready, "{node} went NotReady: {look:?}");
                        let moved = last.get(node).is_some_and(|(_, a, _)| a != address);
                        let writers_ip = writer
                            .strip_prefix("relaylet-")
                            .and_then(|i| i.parse::<usize>().ok())
                            .map(|i| ips[i].as_str());
                        assert!(
                            !moved || writers_ip == Some(address.as_str()),
                            "{node}'s address moved to {address} while it named {writer:?}"
                        );
                    }
                }
                looks.push((Instant::now(), look, up));
            }
            looks
        });
        // kubectl exec against every leaf in turn, without pause.
        let execs = scope.spawn(|| {
            let k = support::kubectl("1.35");
            let mut execs = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for leaf in LEAVES {
                    n += 1;
                    let word = format!("chaos-{n}");
                    let from = Instant::now();
                    let mut run = Run::new(
                        &k,
                        w.root_kubeconfig(),
                        &["exec", &pod(leaf), "--", "echo", &word],
                    );
                    // One sent to a paused replica hangs: killed (and counted failed).
                    run.timeout = Duration::from_secs(20);
                    let out = run.output();
                    let ok = out.status.success();
                    assert!(
                        !ok || text(&out.stdout) == format!("{word}\n"),
                        "{leaf}: an exec succeeded without its output: {:?}",
                        text(&out.stdout)
                    );
                    execs.push(Exec {
                        from,
                        to: Instant::now(),
                        leaf,
                        ok,
                    });
                }
            }
            execs
        });

        let mut faults: Vec<(&str, Instant, Instant)> = Vec::new();
        let held_by = |owners: &BTreeMap<String, usize>| -> usize {
            // A replica that holds a Node, so the fault has something to move.
            owners.values().copied().next().expect("a served node")
        };
        for kind in [
            "pause 3 s",
            "pause 15 s",
            "kill, restart at once",
            "kill, peers take over",
            "secret replaced",
        ] {
            let victim = held_by(&owners);
            let started = Instant::now();
            match kind {
                "pause 3 s" | "pause 15 s" => {
                    let pause = if kind == "pause 3 s" { 3 } else { 15 };
                    replicas[victim].signal("STOP");
                    running.set(victim, false);
                    std::thread::sleep(Duration::from_secs(pause));
                    replicas[victim].signal("CONT");
                    running.set(victim, true);
                }
                "kill, restart at once" | "kill, peers take over" => {
                    replicas[victim].signal("KILL");
                    replicas[victim].wait();
                    running.set(victim, false);
                    if kind == "kill, peers take over" {
                        let rest: Vec<usize> =
                            all.iter().copied().filter(|i| *i != victim).collect();
                        spread_over_leaves(&w, LEAVES, &rest);
                    }
                    replicas[victim] = ReplicaProcess::start(&w, victim, &binary);
                    running.set(victim, true);
                }
                _ => {
                    let leaf = owners
                        .iter()
                        .find(|(_, o)| **o == victim)
                        .map(|(node, _)| node.trim_start_matches("relaylet-").to_string())
                        .expect("the victim's leaf");
                    w.register_leaf(&leaf, &leaf, &[]);
                }
            }
            owners = spread_over_leaves(&w, LEAVES, &all);
            // Over once every replica serves what its Nodes say (a restarted replica's Nodes
            // name it before it serves them again).
            support::eventually("every replica serves its Nodes", || {
                (0..REPLICAS).all(|i| {
                    let mine = owners.values().filter(|o| **o == i).count();
                    replicas[i].metric("relaylet_leaves_served", &[]) == mine as f64
                })
            });
            faults.push((kind, started, Instant::now()));
        }
        stop.store(true, Ordering::SeqCst);
        let looks = looks.join().expect("the looks hold every invariant");
        let execs = execs
            .join()
            .expect("every exec that succeeded printed its word");

        println!(
            "fault                  | unserved, Node view (s) | unserved, exec view (s) | execs failed / run"
        );
        for (kind, from, to) in &faults {
            let during: Vec<&(Instant, Look, [bool; REPLICAS])> = looks
                .iter()
                .filter(|(at, _, _)| at >= from && at <= to)
                .collect();
            // Node view: the longest a Node named no running replica, or not at its address.
            let mut by_nodes = Duration::ZERO;
            for node in owners.keys() {
                // A replica back under its name looks serving here before it serves again (its
                // fresh term's wait): the exec view below tells that part.
                let mut since: Option<Instant> = None;
                for (at, look, up) in &during {
                    let served = look.get(node).is_some_and(|(writer, address, ready)| {
                        let i = writer
                            .strip_prefix("relaylet-")
                            .and_then(|i| i.parse::<usize>().ok());
                        i.is_some_and(|i| up[i] && ips[i] == *address) && *ready
                    });
                    match (served, since) {
                        (false, None) => since = Some(*at),
                        (true, Some(s)) => {
                            by_nodes = by_nodes.max(at.duration_since(s));
                            since = None;
                        }
                        _ => {}
                    }
                }
                if let Some(s) = since {
                    by_nodes = by_nodes.max(to.duration_since(s));
                }
            }
            // Exec view: per leaf, from the start of its first failed exec to the end of its
            // last one.
            let run: Vec<&Exec> = execs.iter().filter(|e| e.during(*from, *to)).collect();
            let mut by_execs = Duration::ZERO;
            for leaf in LEAVES {
                let failed: Vec<&&Exec> = run.iter().filter(|e| e.leaf == *leaf && !e.ok).collect();
                if let (Some(first), Some(last)) = (failed.first(), failed.last()) {
                    by_execs = by_execs.max(last.to.duration_since(first.from));
                }
            }
            let failed = run.iter().filter(|e| !e.ok).count();
            println!(
                "{kind:<22} | {:>23.1} | {:>23.1} | {failed} / {}",
                by_nodes.as_secs_f64(),
                by_execs.as_secs_f64(),
                run.len()
            );
        }
        // Outside the faults, every exec succeeds.
        let outside: Vec<&Exec> = execs
            .iter()
            .filter(|e| !faults.iter().any(|(_, from, to)| e.during(*from, *to)))
            .filter(|e| !e.ok)
            .collect();
        assert!(
            outside.is_empty(),
            "execs failed outside any fault: {:?}",
            outside.iter().map(|e| e.leaf).collect::<Vec<_>>()
        );
    });
}

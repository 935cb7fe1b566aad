//! Replicas under faults, on real Kubernetes: three relaylet replicas (each its own process,
//! the shipped binary, its root apiserver calls through a forwarder of its own) serve four leaves
//! while `kubectl exec` runs against every leaf without pause, and one fault after another hits
//! them: a pause shorter than a replica's deadline (SIGSTOP 3 s), a pause longer than its
//! presence (SIGSTOP 15 s), one replica cut from the root for 15 s both ways (a partition: no
//! error, no answer), a crash with a restart under the same name at once, a crash whose Nodes
//! the others take over before it comes back, a leaf Secret replaced, and the root apiserver
//! killed and restarted after an outage longer than presence. Watching the root's Nodes
//! throughout, it checks what must hold whatever happens: a Node's first address changes only to
//! the address of the replica the same version names (no stale writer lands a write), no Node
//! goes NotReady (every takeover is well inside the node lifecycle controller's grace), an exec
//! that succeeds prints what it was asked to (a session never ends as a false success), the
//! replica cut from the root lets its Nodes go before a peer serves them (never two at once),
//! the root outage moves no Node, and after each fault the Nodes settle where
//! `Assignment::compute` puts them. It prints, per fault, the longest time any Node was
//! unserved, as the Nodes show it (named no running replica, or not at its address) and as the
//! execs show it (first to last failure on one leaf), and the execs that failed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::forwarder::Forwarder;
use relaylet_dev::testkit::realk8s::replica_process::ReplicaProcess;
use relaylet_dev::testkit::realk8s::world::World;
use support::{Run, text};

use super::k8s_replicas::{
    binary, nodes_read_with, pod, spread_over_leaves, world_of_processes_started,
};

const LEAVES: &[&str] = &["leaf-1", "leaf-2", "leaf-3", "leaf-4"];
const REPLICAS: usize = 3;

/// Each Node as one look at the root saw it: (writer, first address, Ready).
type Look = BTreeMap<String, (String, String, bool)>;

/// Which replicas could serve at an instant: not paused, not killed, not cut from the root.
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

/// Starts replica `i` with its root apiserver calls through `forwarder`.
fn start_via(w: &World, i: usize, forwarder: &Forwarder) -> ReplicaProcess {
    ReplicaProcess::start_via(w, i, &binary(), Some(forwarder.addr))
}

/// `relaylet_virtual_nodes_served` of each replica.
fn served(replicas: &[ReplicaProcess]) -> Vec<f64> {
    replicas
        .iter()
        .map(|r| r.metric("relaylet_virtual_nodes_served", &[]))
        .collect()
}

#[test]
fn replicas_keep_every_node_served_through_pauses_crashes_cuts_and_outages() {
    let mut forwarders: Vec<Forwarder> = Vec::new();
    let (mut w, mut replicas) = world_of_processes_started(LEAVES, REPLICAS, |w, i| {
        let root: SocketAddr = w
            .root
            .url
            .trim_start_matches("https://")
            .parse()
            .expect("the root apiserver's address");
        let forwarder = support::RT.block_on(Forwarder::start(root));
        let replica = start_via(w, i, &forwarder);
        forwarders.push(forwarder);
        replica
    });
    let root_kubeconfig = w.root_kubeconfig().to_path_buf();
    // Whether each leaf's `kubectl logs -f` streams now.
    let flowing: [AtomicBool; LEAVES.len()] = Default::default();
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
                let Some(look) = nodes_read_with(&root_kubeconfig) else {
                    // The root apiserver is down (restarted): nothing to look at.
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                };
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
                        &root_kubeconfig,
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

        // kubectl logs -f on every leaf, started again whenever one ends: when each ended, and
        // whether it had streamed.
        let streams = scope.spawn(|| {
            let k = support::kubectl("1.35");
            std::thread::scope(|each| {
                let followers: Vec<_> = LEAVES
                    .iter()
                    .zip(&flowing)
                    .map(|(leaf, flowing)| {
                        let (k, stop, root_kubeconfig) = (&k, &stop, &root_kubeconfig);
                        each.spawn(move || follow_logs(k, root_kubeconfig, leaf, flowing, stop))
                    })
                    .collect();
                followers
                    .into_iter()
                    .flat_map(|f| f.join().expect("every streamed line is the pod's"))
                    .collect::<Vec<(Instant, &str, bool)>>()
            })
        });

        let mut faults: Vec<(&str, Instant, Instant)> = Vec::new();
        // Per fault, the leaves whose log streams it may end: those its victim served (a killed
        // or paused replica's sessions), every one when the root apiserver restarts.
        let mut may_end: Vec<Vec<&str>> = Vec::new();
        // When the root outage began, and who served each Node then.
        let mut outage: Option<(Instant, BTreeMap<String, usize>)> = None;
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
            "root cut 15 s",
            "root apiserver restarted",
        ] {
            // Every leaf's log stream flows before a fault, so each fault meets one per leaf.
            support::eventually("every kubectl logs -f streams", || {
                flowing.iter().all(|f| f.load(Ordering::SeqCst))
            });
            let victim = held_by(&owners);
            let before = owners.clone();
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
                    replicas[victim] = start_via(&w, victim, &forwarders[victim]);
                    running.set(victim, true);
                }
                "root cut 15 s" => {
                    // Both ways: its calls to the root apiserver held, the root apiserver's
                    // calls to it dropped.
                    forwarders[victim].black_hole(true);
                    let node_server: u16 = w.replica_env(victim)["NODE_SERVER_PORT"]
                        .parse()
                        .expect("NODE_SERVER_PORT");
                    let dropped = Dropped::start(&ips[victim], node_server);
                    running.set(victim, false);
                    // Its metrics port is not cut: what each replica serves, looked at
                    // throughout. The cut replica must let its Nodes go at its own deadline,
                    // before its peers (which wait for its presence to expire) take them.
                    let (mut most, mut let_go) = (0.0f64, false);
                    let cut = Instant::now();
                    while cut.elapsed() < Duration::from_secs(15) {
                        let now = served(&replicas);
                        most = most.max(now.iter().sum());
                        let_go |= now[victim] == 0.0;
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    drop(dropped);
                    forwarders[victim].black_hole(false);
                    running.set(victim, true);
                    assert!(
                        most <= LEAVES.len() as f64,
                        "{most} Nodes served at once: one by two replicas"
                    );
                    assert!(
                        let_go,
                        "relaylet-{victim}, cut from the root, kept its Nodes"
                    );
                }
                "root apiserver restarted" => {
                    // Longer than a presence Lease: no one could renew, so no one may count
                    // as gone for it.
                    w.root.stop_apiserver();
                    std::thread::sleep(Duration::from_secs(12));
                    w.root.restart_apiserver();
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
            if kind == "root apiserver restarted" {
                assert_eq!(owners, before, "the root outage moved Nodes");
                outage = Some((started, before.clone()));
            }
            // Over once every replica serves what its Nodes say (a restarted replica's Nodes
            // name it before it serves them again).
            support::eventually("every replica serves its Nodes", || {
                (0..REPLICAS).all(|i| {
                    let mine = owners.values().filter(|o| **o == i).count();
                    replicas[i].metric("relaylet_leaves_served", &[]) == mine as f64
                })
            });
            faults.push((kind, started, Instant::now()));
            may_end.push(match kind {
                "root apiserver restarted" => LEAVES.to_vec(),
                "kill, restart at once" | "kill, peers take over" | "pause 3 s" | "pause 15 s" => {
                    LEAVES
                        .iter()
                        .copied()
                        .filter(|leaf| before.get(&format!("relaylet-{leaf}")) == Some(&victim))
                        .collect()
                }
                _ => Vec::new(),
            });
        }
        stop.store(true, Ordering::SeqCst);
        let looks = looks.join().expect("the looks hold every invariant");
        let execs = execs
            .join()
            .expect("every exec that succeeded printed its word");
        let ended = streams.join().expect("the log streams");
        // Not even for a moment did a Node change hands around the root outage.
        let (outage_began, outage_owners) = outage.expect("the root outage ran");
        for (_, look, _) in looks.iter().filter(|(at, _, _)| *at >= outage_began) {
            for (node, owner) in &outage_owners {
                let writer = look.get(node).map(|(writer, _, _)| writer.as_str());
                assert_eq!(
                    writer,
                    Some(format!("relaylet-{owner}").as_str()),
                    "{node} changed hands around the root outage: {look:?}"
                );
            }
        }

        println!(
            "fault                    | unserved, Node view (s) | unserved, exec view (s) | execs failed / run | logs -f ended"
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
            let streams_ended = ended
                .iter()
                .filter(|(at, _, streamed)| *streamed && at >= from && at <= to)
                .count();
            println!(
                "{kind:<24} | {:>23.1} | {:>23.1} | {:>18} | {streams_ended}",
                by_nodes.as_secs_f64(),
                by_execs.as_secs_f64(),
                format!("{failed} / {}", run.len()),
            );
        }
        // A log stream ends (or is refused) only in a fault that may end it.
        for (at, leaf, _) in &ended {
            let allowed = faults
                .iter()
                .zip(&may_end)
                .any(|((_, from, to), leaves)| at >= from && at <= to && leaves.contains(leaf));
            assert!(
                allowed,
                "{leaf}'s kubectl logs -f ended outside a fault that may end it"
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

/// Follows `leaf`'s pod with `kubectl logs -f` until `stop`, starting again whenever a stream
/// ends, `flowing` while one streams; when each ended, and whether it had streamed (or was
/// refused). Every line must be one the pod logged.
fn follow_logs(
    k: &relaylet_sim::tools::Kubectl,
    kubeconfig: &std::path::Path,
    leaf: &'static str,
    flowing: &AtomicBool,
    stop: &AtomicBool,
) -> Vec<(Instant, &'static str, bool)> {
    use std::io::BufRead;
    let mut ended = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let mut child = std::process::Command::new(&k.path)
            .args(["logs", "-f", "--tail=1", &pod(leaf)])
            .env("KUBECONFIG", kubeconfig)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("kubectl logs -f");
        let stdout = child.stdout.take().expect("its stdout");
        let mut lines = 0;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            assert!(
                line.contains("tick"),
                "{leaf}: a streamed line not the pod's: {line:?}"
            );
            lines += 1;
            flowing.store(true, Ordering::SeqCst);
            if stop.load(Ordering::SeqCst) {
                let _ = child.kill();
                let _ = child.wait();
                return ended;
            }
        }
        let _ = child.wait();
        flowing.store(false, Ordering::SeqCst);
        // Refused at once (its replica down, the root restarting) when it streamed nothing.
        ended.push((Instant::now(), leaf, lines > 0));
        if lines == 0 {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    ended
}

/// While it lives, TCP to `ip`'s node server ports (the shared one and the `STRIDE` above it,
/// where its Nodes' own listeners are) is dropped on this machine by an iptables rule, as a
/// partition drops the root apiserver's calls to a replica. A rule left by a test process that
/// was killed is removed by the next.
struct Dropped {
    rule: Vec<String>,
}

/// The comment on the rules, followed by the owning process's ID.
const DROPPED_MARK: &str = "relaylet-test-drop-";

impl Dropped {
    fn start(ip: &str, node_server: u16) -> Dropped {
        for stale in iptables(&["-S", "INPUT"]).lines() {
            let Some(pid) = stale
                .split(DROPPED_MARK)
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            else {
                continue;
            };
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let rule: Vec<&str> = stale.split_whitespace().skip(2).collect();
                let mut args = vec!["-D", "INPUT"];
                args.extend(rule.iter().map(|part| part.trim_matches('"')));
                iptables(&args);
            }
        }
        let rule: Vec<String> = [
            "INPUT",
            "-d",
            ip,
            "-p",
            "tcp",
            "--dport",
            &format!("{node_server}:{}", node_server + 31),
            "-m",
            "comment",
            "--comment",
            &format!("{DROPPED_MARK}{}", std::process::id()),
            "-j",
            "DROP",
        ]
        .iter()
        .map(|part| part.to_string())
        .collect();
        let mut args = vec!["-I"];
        args.extend(rule.iter().map(String::as_str));
        iptables(&args);
        Dropped { rule }
    }
}

impl Drop for Dropped {
    fn drop(&mut self) {
        let mut args = vec!["-D"];
        args.extend(self.rule.iter().map(String::as_str));
        iptables(&args);
    }
}

/// Runs iptables; its output. Panics if it fails.
fn iptables(args: &[&str]) -> String {
    let out = std::process::Command::new("iptables")
        .args(args)
        .output()
        .expect("iptables runs");
    assert!(
        out.status.success(),
        "iptables {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

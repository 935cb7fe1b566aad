//! Every replica serves, on real Kubernetes (issue 29): three relaylet replicas, each its own
//! process (the shipped binary), and six leaf clusters. Each replica writes an even share of the
//! virtual Nodes with its own address, so the real root apiserver sends each node's `kubectl
//! exec` to that node's replica (counted by the replicas' own metrics). A replica SIGKILLed: its
//! nodes move to the others and stay Ready, and exec works on all of them. A replica sent SIGTERM:
//! it hands its nodes over before it stops accepting, and every exec sent to its nodes meanwhile
//! succeeds. Each replica is a Running Pod of the chart's labels; Leases written by someone else
//! (40 renewed ghost presence Leases, the leader Lease written over) take no Node from its
//! replica (issue 37 item 3).

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::realk8s::{harness, replica_process::ReplicaProcess, world};

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use support::{Run, describe, text};
use world::{Setup, World};

const LEAVES: &[&str] = &["leaf-1", "leaf-2", "leaf-3", "leaf-4", "leaf-5", "leaf-6"];

fn kubectl() -> relaylet_sim::tools::Kubectl {
    support::kubectl("1.35")
}

/// Each virtual node's (writer, first address, Ready) as the root has them.
pub(super) fn nodes(w: &World) -> BTreeMap<String, (String, String, bool)> {
    nodes_read_with(w.root_kubeconfig()).expect("the root's Nodes")
}

/// [`nodes`] as read with `kubeconfig`; `None` while the root apiserver does not answer.
pub(super) fn nodes_read_with(
    kubeconfig: &Path,
) -> Option<BTreeMap<String, (String, String, bool)>> {
    let out = std::process::Command::new(harness::kubectl_path())
        .args(["get", "nodes", "-o", "json", "--request-timeout=5s"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("kubectl runs");
    if !out.status.success() {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let nodes = json["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let name = n["metadata"]["name"].as_str().unwrap_or("").to_string();
            let writer = n["metadata"]["annotations"]["relaylet.io/served-by"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let address = n["status"]["addresses"][0]["address"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let ready = n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (name, (writer, address, ready))
        })
        .filter(|(name, _)| name.starts_with("relaylet-leaf-"))
        .collect();
    Some(nodes)
}

/// Waits until the virtual node of each of `leaves` is Ready and written by the replica the
/// assignment over `live` (replica indexes) gives it, with that replica's address first; each
/// node's replica. The expected spread comes from `Assignment::compute`, never from what the running system
/// shows. Panics if a node is seen NotReady meanwhile.
pub(super) fn spread_over_leaves(
    w: &World,
    leaves: &[&str],
    live: &[usize],
) -> BTreeMap<String, usize> {
    let names: Vec<String> = live.iter().map(|i| format!("relaylet-{i}")).collect();
    let nodes_expected: Vec<String> = leaves.iter().map(|l| format!("relaylet-{l}")).collect();
    let assignment = relaylet::replicas::Assignment::compute(
        nodes_expected.iter().map(String::as_str),
        names.iter().map(String::as_str),
    );
    let expected: BTreeMap<String, usize> = nodes_expected
        .iter()
        .map(|node| {
            let replica = assignment.replica_of(node).expect("assigned");
            let i = live
                .iter()
                .copied()
                .find(|i| replica == format!("relaylet-{i}"))
                .expect("a live replica");
            (node.clone(), i)
        })
        .collect();
    let mut last = BTreeMap::new();
    for _ in 0..1200 {
        let seen = nodes(w);
        for (node, (_, _, ready)) in &seen {
            assert!(ready, "{node} went NotReady: {seen:?}");
        }
        let settled = expected.iter().all(|(node, i)| {
            seen.get(node).is_some_and(|(writer, address, _)| {
                *writer == format!("relaylet-{i}") && *address == w.replica_ip(*i).to_string()
            })
        });
        // And it is the assignment the leader published (its Role lets it write that one
        // ConfigMap on a real apiserver).
        if settled && published(w) == assignment {
            return expected;
        }
        last = seen;
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the nodes never reached the assignment {expected:?} over replicas {live:?}: {last:?}");
}

/// The assignment published in the `relaylet-assignment` ConfigMap (empty while there is none).
fn published(w: &World) -> relaylet::replicas::Assignment {
    let json = w.root.kubectl_ok(&[
        "get",
        "--ignore-not-found",
        "configmap",
        relaylet::replicas::ASSIGNMENT_CONFIGMAP,
        "-n",
        world::RELAYLET_NAMESPACE,
        "-o",
        "jsonpath={.data}",
    ]);
    let data: BTreeMap<String, String> = serde_json::from_str(&json).unwrap_or_default();
    data.iter()
        .flat_map(|(replica, nodes)| {
            nodes
                .lines()
                .map(move |n| (n.into(), replica.as_str().into()))
        })
        .collect()
}

/// [`spread_over_leaves`] of this suite's leaves.
fn spread_over(w: &World, live: &[usize]) -> BTreeMap<String, usize> {
    spread_over_leaves(w, LEAVES, live)
}

/// `kubectl exec` in leaf `leaf`'s pod, which must succeed.
fn exec(w: &World, leaf: &str, word: &str) {
    let k = kubectl();
    let out = Run::new(
        &k,
        w.root_kubeconfig(),
        &["exec", &pod(leaf), "--", "echo", word],
    )
    .output();
    assert!(out.status.success(), "{leaf}: {}", describe(&k, &out));
    assert_eq!(
        text(&out.stdout),
        format!("{word}\n"),
        "{}",
        describe(&k, &out)
    );
}

pub(super) fn pod(leaf: &str) -> String {
    format!("demo-{}", leaf.trim_start_matches("leaf-"))
}

/// Execs on every node and checks that each session was counted by the node's replica only.
fn sessions_go_to_their_nodes_replica(
    w: &World,
    replicas: &BTreeMap<usize, ReplicaProcess>,
    owners: &BTreeMap<String, usize>,
) {
    for (node, owner) in owners {
        let leaf = node.trim_start_matches("relaylet-");
        let before: BTreeMap<usize, f64> = replicas
            .iter()
            .map(|(i, r)| (*i, r.sessions_of(leaf)))
            .collect();
        exec(w, leaf, "counted");
        let mut grew = Vec::new();
        for _ in 0..100 {
            grew = replicas
                .iter()
                .filter(|(i, r)| r.sessions_of(leaf) > before[*i])
                .map(|(i, _)| *i)
                .collect();
            if !grew.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(grew, [*owner], "{node}'s session was served by {grew:?}");
    }
}

/// Each virtual node's Lease renewTime in `kube-node-lease`.
fn node_lease_renewals(w: &World) -> BTreeMap<String, String> {
    let json: serde_json::Value = serde_json::from_str(&w.root.kubectl_ok(&[
        "get",
        "leases",
        "-n",
        "kube-node-lease",
        "-o",
        "json",
    ]))
    .expect("json");
    json["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            let name = l["metadata"]["name"].as_str()?;
            name.starts_with("relaylet-leaf-")
                .then(|| (name.to_string(), l["spec"]["renewTime"].to_string()))
        })
        .collect()
}

/// Leases `names` held by their ghost (the name after `relaylet-replica-`, or `ghost` for the
/// leader Lease), claiming a year, renewed now: what someone who may write Leases in relaylet's
/// namespace (not relaylet) applies.
fn ghost_claims(names: &[String]) -> String {
    let now = serde_json::to_string(&k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .expect("time");
    names
        .iter()
        .map(|name| {
            let holder = name.strip_prefix("relaylet-replica-").unwrap_or("ghost");
            format!(
                "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: {name}\n  namespace: {}\nspec:\n  holderIdentity: {holder}\n  leaseDurationSeconds: 31536000\n  renewTime: {now}\n",
                world::RELAYLET_NAMESPACE
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Issue 37 item 3 on a real apiserver: 40 ghost presence Leases (more than one page of
/// relaylet's listing) claiming a year, applied again every second, and the leader Lease written
/// over once by a ghost. Through two renewals of every node Lease no Node changes hands (no
/// replica takes one over), the leader Lease is a replica's again, and every replica counts the
/// ghosts.
fn ghosts_take_no_node_away(
    w: &World,
    replicas: &BTreeMap<usize, ReplicaProcess>,
    owners: &BTreeMap<String, usize>,
) {
    let takeovers: BTreeMap<usize, f64> = replicas
        .iter()
        .map(|(i, r)| (*i, r.metric("relaylet_virtual_node_takeovers_total", &[])))
        .collect();
    let ghosts: Vec<String> = (0..40)
        .map(|i| format!("relaylet-replica-ghost-{i}"))
        .collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                w.root
                    .kubectl_stdin_ok(&["apply", "-f", "-"], Some(&ghost_claims(&ghosts)));
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        let leader = relaylet::replicas::LEADER_LEASE.to_string();
        w.root.kubectl_stdin_ok(
            &["apply", "-f", "-"],
            Some(&ghost_claims(std::slice::from_ref(&leader))),
        );
        // Two renewals of every node Lease (every 10 s) while the ghosts are renewed.
        let first = node_lease_renewals(w);
        let mut seen: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        let mut renewed_twice = false;
        // Only a bound on a hang (each round is a kubectl call and 100 ms: over two minutes).
        for _ in 0..400 {
            for (node, time) in node_lease_renewals(w) {
                if first.get(&node) != Some(&time) {
                    seen.entry(node).or_default().insert(time);
                }
            }
            renewed_twice = owners
                .keys()
                .all(|n| seen.get(n).is_some_and(|times| times.len() >= 2));
            if renewed_twice {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            renewed_twice,
            "node Leases stopped being renewed under ghosts: {seen:?}"
        );
    });
    for (node, (writer, address, ready)) in nodes(w) {
        let owner = owners[&node];
        assert_eq!(writer, format!("relaylet-{owner}"), "{node} changed hands");
        assert_eq!(address, w.replica_ip(owner).to_string(), "{node}'s address");
        assert!(ready, "{node} Ready");
    }
    for (i, r) in replicas {
        assert_eq!(
            r.metric("relaylet_virtual_node_takeovers_total", &[]),
            takeovers[i],
            "relaylet-{i} took a Node over under ghosts"
        );
        assert!(
            r.metric(
                "relaylet_ignored_leases_total",
                &[("reason", "not_a_live_pod")]
            ) >= 40.0,
            "relaylet-{i} counts the ghosts"
        );
    }
    let leader = w.root.kubectl_ok(&[
        "get",
        "lease",
        relaylet::replicas::LEADER_LEASE,
        "-n",
        world::RELAYLET_NAMESPACE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(
        replicas.keys().any(|i| leader == format!("relaylet-{i}")),
        "the leader Lease is a replica's again: {leader:?}"
    );
    // Leave the namespace as relaylet would have it for what follows.
    let mut delete = vec!["delete", "lease", "-n", world::RELAYLET_NAMESPACE];
    delete.extend(ghosts.iter().map(String::as_str));
    w.root.kubectl_ok(&delete);
}

/// A world of `leaves` served by `replicas` relaylet processes (the shipped binary), every Node
/// up and each leaf's demo pod synced.
pub(super) fn world_of_processes(
    leaves: &'static [&'static str],
    replicas: usize,
) -> (World, Vec<ReplicaProcess>) {
    world_of_processes_started(leaves, replicas, |w, i| {
        ReplicaProcess::start(w, i, &binary())
    })
}

/// [`world_of_processes`], each replica started by `start` (given the world and its index).
pub(super) fn world_of_processes_started(
    leaves: &'static [&'static str],
    replicas: usize,
    mut start: impl FnMut(&World, usize) -> ReplicaProcess,
) -> (World, Vec<ReplicaProcess>) {
    let w = World::start(Setup {
        replicas: 0,
        leaves,
        wait_for_nodes: false,
        ..Setup::default()
    });
    let processes = (0..replicas).map(|i| start(&w, i)).collect();
    w.wait_for_nodes(leaves);
    for leaf in leaves {
        w.sync_pod(leaf, "default", &pod(leaf));
    }
    (w, processes)
}

/// The relaylet binary the replica processes run.
pub(super) fn binary() -> std::path::PathBuf {
    Path::new(env!("CARGO_BIN_EXE_relaylet")).to_path_buf()
}

#[test]
fn three_replicas_serve_six_leaves_and_survive_a_kill_and_a_sigterm() {
    let (w, processes) = world_of_processes(LEAVES, 3);
    let mut replicas: BTreeMap<usize, ReplicaProcess> = processes.into_iter().enumerate().collect();

    // Every replica writes two Nodes, and each node's sessions reach its replica.
    let owners = spread_over(&w, &[0, 1, 2]);
    sessions_go_to_their_nodes_replica(&w, &replicas, &owners);
    ghosts_take_no_node_away(&w, &replicas, &owners);

    // SIGKILL: the victim's nodes move to the others and stay Ready.
    let victim = owners["relaylet-leaf-1"];
    let mut killed = replicas.remove(&victim).expect("victim");
    killed.signal("KILL");
    killed.wait();
    let live: Vec<usize> = replicas.keys().copied().collect();
    let owners = spread_over(&w, &live);
    sessions_go_to_their_nodes_replica(&w, &replicas, &owners);

    // SIGTERM: the leaving replica hands its nodes over, serving until the others have them;
    // every exec sent to its nodes meanwhile succeeds.
    let leaving = live[0];
    let its_leaves: Vec<String> = owners
        .iter()
        .filter(|(_, o)| **o == leaving)
        .map(|(node, _)| node.trim_start_matches("relaylet-").to_string())
        .collect();
    assert!(!its_leaves.is_empty());
    let mut term = replicas.remove(&leaving).expect("leaving");
    term.signal("TERM");
    let mut served = 0;
    while term.child.try_wait().expect("try_wait").is_none() {
        for leaf in &its_leaves {
            exec(&w, leaf, "during-handover");
            served += 1;
        }
    }
    assert!(term.wait(), "relaylet exits 0 after SIGTERM");
    assert!(served > 0);
    let live: Vec<usize> = replicas.keys().copied().collect();
    let owners = spread_over(&w, &live);
    sessions_go_to_their_nodes_replica(&w, &replicas, &owners);
}

//! A deterministic simulation of the replica protocol: N replicas against a model apiserver
//! (resourceVersion compare-and-swap on Nodes, presence Leases), on virtual time, under faults
//! proptest generates (pauses, a replica's root traffic cut, restarts under the same name, slow
//! writes and listings, late Node events). Each replica runs the real pieces: its presence is
//! judged by the real `presence::Seen`, the Nodes are spread by the real `Assignment::compute`,
//! and every round's choice for a Node is the real `served_by::choose` over `served_by::may_take`.
//! The I/O around them is modelled after `leader` (a term ends at its last renewal's start plus
//! `RENEW_DEADLINE`; a round that cannot finish by then fails) and `virtual_node::leaf_loop`
//! (rounds every 2 s; a Node read before a claim, guarded writes). One replica at a time leads
//! (a leader Lease taken once its holder's last renewal is 10 s old) and publishes its answer;
//! every replica follows the published one by the real `published::effective`. A replica may
//! learn a Node's leaf Secret late (its registry differs from the others' until then), or its
//! cache of relaylet's pods may miss a live peer (its Lease then looks forged, and the
//! apiserver is asked before that peer's Node is taken).
//!
//! Checked after every step: (S3) no two replicas serve one Node within their terms, and a
//! replica serving a Node is the one the Node names; (L1) once the faults are over, within
//! `SETTLE` every Node is named by and served by the replica `Assignment::compute` gives it over
//! all replicas, which is what the leader has published, and (L3) nothing changes hands after
//! that.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use tokio::time::Instant;

use super::assignment::Assignment;
use super::ignored::IgnoredLeases;
use super::leader::{FRESH_TERM_WAIT, RENEW_DEADLINE, RETRY_PERIOD};
use super::live_pods::LivePods;
use super::presence::{Judges, LIST_EVERY, PRESENCE_PREFIX, Peers, Seen};
use super::published::{Published, effective};
use super::served_by::{Choice, Facts, choose, may_take};
use crate::ops::Metrics;

/// The simulation's step.
const STEP: Duration = Duration::from_millis(100);
/// A leaf loop's round.
const ROUND: Duration = Duration::from_secs(2);
/// How long after the last fault every Node must be where the assignment puts it.
const SETTLE: Duration = Duration::from_secs(20);

/// A fault on one replica, from `start` for `len`.
#[derive(Debug, Clone)]
enum Fault {
    /// SIGSTOP: the replica does nothing; calls it had made land or not as they would.
    Pause {
        replica: usize,
        start: u64,
        len: u64,
    },
    /// Its root traffic is black-holed: every call it makes fails at its deadline.
    Cut {
        replica: usize,
        start: u64,
        len: u64,
    },
    /// Killed at `start` and started again (same name, nothing remembered) `len` later.
    Restart {
        replica: usize,
        start: u64,
        len: u64,
    },
    /// Its cache of relaylet's pods misses peer `peer` (a lagging watch): it ignores that
    /// peer's presence Lease as not a live replica's.
    Blind {
        replica: usize,
        peer: usize,
        start: u64,
        len: u64,
    },
    /// Its registry lacks Node `node` until `start + len` (the leaf's Secret seen late).
    Late {
        replica: usize,
        node: usize,
        start: u64,
        len: u64,
    },
}

impl Fault {
    fn replica(&self) -> usize {
        match self {
            Fault::Pause { replica, .. }
            | Fault::Cut { replica, .. }
            | Fault::Restart { replica, .. }
            | Fault::Blind { replica, .. }
            | Fault::Late { replica, .. } => *replica,
        }
    }
    /// When it is over, in steps.
    fn end(&self) -> u64 {
        match self {
            Fault::Pause { start, len, .. }
            | Fault::Cut { start, len, .. }
            | Fault::Restart { start, len, .. }
            | Fault::Blind { start, len, .. }
            | Fault::Late { start, len, .. } => start + len,
        }
    }
    fn covers(&self, t: u64) -> bool {
        let (start, len) = match self {
            Fault::Pause { start, len, .. }
            | Fault::Cut { start, len, .. }
            | Fault::Restart { start, len, .. }
            | Fault::Blind { start, len, .. } => (*start, *len),
            // From the replica's start: it has never seen the Secret before.
            Fault::Late { start, len, .. } => (0, start + len),
        };
        (start..start + len).contains(&t)
    }
}

/// One simulation's world: how many replicas and Nodes, the faults, and each replica's delays
/// (in steps): its presence writes, its listings, the Node events it hears.
#[derive(Debug, Clone)]
struct Schedule {
    replicas: usize,
    nodes: usize,
    faults: Vec<Fault>,
    write_delay: Vec<u64>,
    list_delay: Vec<u64>,
    event_delay: Vec<u64>,
}

/// A Node as the model apiserver keeps it.
#[derive(Debug, Clone)]
struct NodeRec {
    version: u64,
    served_by: String,
}

/// The model apiserver.
#[derive(Default)]
struct Api {
    version: u64,
    nodes: BTreeMap<String, NodeRec>,
    presence: BTreeMap<String, Lease>,
    /// The leader Lease: its holder and the step it expires at.
    leader: Option<(String, u64)>,
    /// The published assignment.
    published: Option<Published>,
    /// Node writes as (node, served_by after), for the events replicas hear.
    log: Vec<(u64, String, String)>,
}

impl Api {
    /// A guarded write of `node`'s writer (or, with `to` its current writer, a status write).
    fn write(&mut self, t: u64, node: &str, expected: u64, to: &str) -> Option<u64> {
        let rec = self.nodes.get_mut(node)?;
        if rec.version != expected {
            return None;
        }
        self.version += 1;
        rec.version = self.version;
        rec.served_by = to.to_string();
        self.log.push((t, node.to_string(), to.to_string()));
        Some(self.version)
    }

    fn renew(&mut self, name: &str, t: u64) {
        self.version += 1;
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(format!("{PRESENCE_PREFIX}{name}")),
                resource_version: Some(self.version.to_string()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.to_string()),
                renew_time: Timestamp::from_millisecond(1_800_000_000_000 + t as i64 * 100)
                    .ok()
                    .map(MicroTime),
                lease_duration_seconds: Some(10),
                ..Default::default()
            }),
        };
        self.presence.insert(name.to_string(), lease);
        // The leader renews its Lease with the same rhythm, deadline and expiry.
        if let Some((holder, expires)) = &mut self.leader
            && holder == name
        {
            *expires = t + steps(Duration::from_secs(10));
        }
    }

    /// Whether `name` may take the leader Lease at `t` (no one holds it, or it expired), or
    /// holds it.
    fn lead(&mut self, name: &str, t: u64) -> bool {
        match &self.leader {
            Some((holder, _)) if holder == name => true,
            Some((_, expires)) if *expires > t => false,
            _ => {
                self.leader = Some((name.to_string(), t + steps(Duration::from_secs(10))));
                true
            }
        }
    }
}

/// What one replica knows of one Node.
#[derive(Debug, Default, Clone)]
struct Local {
    /// Serving it (its claim landed, nothing took it since).
    held: bool,
    /// The version its next write is guarded by, while held.
    version: Option<u64>,
    /// The writer its last event named.
    heard: String,
    /// The loop's first read of the Node (`node_watch`'s prime, tried until it answers) done.
    primed: bool,
}

/// One replica.
struct Replica {
    name: String,
    /// The start (in steps) of its last presence renewal that landed in time.
    renewed: Option<u64>,
    /// When the renewal that began its current term was answered.
    fresh: Option<u64>,
    /// A presence write under way: (landing step, the round's start).
    writing: Option<(u64, u64)>,
    listed: bool,
    seen: Seen,
    peers: Peers,
    /// Listings under way: (arrival step, asked step, the Leases as they were when asked).
    listings: VecDeque<(u64, u64, Vec<Lease>)>,
    /// Node events under way: (arrival step, node, writer).
    events: VecDeque<(u64, String, String)>,
    nodes: BTreeMap<String, Local>,
    /// The published assignment as last read.
    published: Option<Published>,
    next_presence: u64,
    next_list: u64,
    next_round: u64,
}

impl Replica {
    fn new(name: &str, t: u64, nodes: &[String]) -> Replica {
        Replica {
            name: name.to_string(),
            renewed: None,
            fresh: None,
            writing: None,
            listed: false,
            seen: Seen::default(),
            peers: Peers::default(),
            listings: VecDeque::new(),
            events: VecDeque::new(),
            nodes: nodes
                .iter()
                .map(|n| (n.clone(), Local::default()))
                .collect(),
            published: None,
            next_presence: t,
            next_list: t,
            next_round: t,
        }
    }

    /// Its term holds at `t` (and it has listed its peers once, as `Replicas::join` asks): as
    /// `leader` publishes it, from its fresh start plus `FRESH_TERM_WAIT` to its last
    /// renewal's start plus `RENEW_DEADLINE`.
    fn present(&self, t: u64) -> bool {
        self.listed
            && self
                .fresh
                .is_some_and(|at| t >= at + steps(FRESH_TERM_WAIT))
            && self
                .renewed
                .is_some_and(|at| t < at + steps(RENEW_DEADLINE))
    }

    fn serving(&self, node: &str, t: u64) -> bool {
        self.present(t) && self.nodes.get(node).is_some_and(|l| l.held)
    }
}

fn steps(d: Duration) -> u64 {
    (d.as_millis() / STEP.as_millis()) as u64
}

/// The simulation of one schedule; `Err` names the first invariant broken.
fn run(s: &Schedule) -> Result<(), String> {
    run_logged(s).map(|_| ())
}

/// [`run`], and every Node write: (step, Node, its writer after).
fn run_logged(s: &Schedule) -> Result<Vec<(u64, String, String)>, String> {
    let base = Instant::now();
    let at = |t: u64| base + STEP * t as u32;
    let names: Vec<String> = (0..s.replicas).map(|i| format!("relaylet-{i}")).collect();
    let nodes: Vec<String> = (0..s.nodes).map(|i| format!("relaylet-leaf-{i}")).collect();
    let metrics = Metrics::new();
    let judges_of = |blind: Option<usize>| Judges {
        live: LivePods::fixed(
            names
                .iter()
                .enumerate()
                .filter(|(j, _)| Some(*j) != blind)
                .map(|(_, n)| n.as_str()),
        ),
        ignored: IgnoredLeases::counting(metrics.clone()),
    };
    // What every replica judges by, and what one blind to peer j does.
    let judges = judges_of(None);
    let blind_to: Vec<Judges> = (0..s.replicas).map(|j| judges_of(Some(j))).collect();
    let mut api = Api::default();
    for node in &nodes {
        api.version += 1;
        let version = api.version;
        api.nodes.insert(
            node.clone(),
            NodeRec {
                version,
                served_by: String::new(),
            },
        );
    }
    let mut replicas: Vec<Replica> = names.iter().map(|n| Replica::new(n, 0, &nodes)).collect();
    let last_fault = s.faults.iter().map(Fault::end).max().unwrap_or(0);
    let settled_by = last_fault + steps(SETTLE);
    let end = settled_by + steps(Duration::from_secs(20));
    let want = Assignment::compute(
        nodes.iter().map(String::as_str),
        names.iter().map(String::as_str),
    );
    let mut log_seen = 0;
    for t in 0..end {
        // Node events reach each replica after its delay.
        for (_, node, writer) in &api.log[log_seen..] {
            for (i, r) in replicas.iter_mut().enumerate() {
                r.events
                    .push_back((t + s.event_delay[i], node.clone(), writer.clone()));
            }
        }
        log_seen = api.log.len();
        for i in 0..s.replicas {
            let faults: Vec<&Fault> = s
                .faults
                .iter()
                .filter(|f| f.replica() == i && f.covers(t))
                .collect();
            let paused = faults
                .iter()
                .any(|f| matches!(f, Fault::Pause { .. } | Fault::Restart { .. }));
            let cut = faults.iter().any(|f| matches!(f, Fault::Cut { .. }));
            let restarting = s
                .faults
                .iter()
                .any(|f| matches!(f, Fault::Restart { replica, start, len } if *replica == i && start + len == t));
            if restarting {
                replicas[i] = Replica::new(&names[i], t, &nodes);
            }
            // A presence write lands at the server whether or not its writer is paused.
            let r = &mut replicas[i];
            if let Some((lands, started)) = r.writing
                && lands <= t
            {
                r.writing = None;
                if !cut && lands - started < steps(RENEW_DEADLINE) {
                    api.renew(&r.name, t);
                    if !paused {
                        if r.renewed.is_none_or(|at| t >= at + steps(RENEW_DEADLINE)) {
                            r.fresh = Some(t);
                        }
                        r.renewed = Some(started);
                    }
                }
            }
            if paused {
                continue;
            }
            step_replica(
                &mut replicas[i],
                &mut api,
                s,
                i,
                t,
                cut,
                &nodes,
                faults
                    .iter()
                    .find_map(|f| match f {
                        Fault::Blind { peer, .. } => blind_to.get(*peer),
                        _ => None,
                    })
                    .unwrap_or(&judges),
                &at,
            );
        }
        check(&replicas, &api, &nodes, t)?;
        if t >= settled_by {
            // One view: the leader has published the assignment over every replica and Node.
            if api.published.as_ref().map(|p| &p.assignment) != Some(&want) {
                return Err(format!(
                    "at {t}: published {:?}, not {want:?} (last fault over at {last_fault})",
                    api.published
                ));
            }
            for node in &nodes {
                let owner = want.replica_of(node).unwrap_or("");
                let rec = &api.nodes[node];
                let serving = replicas
                    .iter()
                    .any(|r| r.name == owner && r.serving(node, t));
                if rec.served_by != owner || !serving {
                    return Err(format!(
                        "{node} at {t}: named {:?}, assigned {owner:?}, served by it: {serving} \
                         (last fault over at {last_fault})",
                        rec.served_by
                    ));
                }
            }
        }
    }
    Ok(api.log)
}

/// S3: within their terms, no two replicas serve one Node, and one that serves it is the one
/// the Node names.
fn check(replicas: &[Replica], api: &Api, nodes: &[String], t: u64) -> Result<(), String> {
    for node in nodes {
        let serving: Vec<&str> = replicas
            .iter()
            .filter(|r| r.serving(node, t))
            .map(|r| r.name.as_str())
            .collect();
        if serving.len() > 1 {
            return Err(format!("{node} at {t}: served by {serving:?} at once"));
        }
        if let Some(r) = serving.first()
            && api.nodes[node].served_by != *r
        {
            return Err(format!(
                "{node} at {t}: served by {r} but names {:?}",
                api.nodes[node].served_by
            ));
        }
    }
    Ok(())
}

/// One step of one replica that is not paused.
#[allow(clippy::too_many_arguments)]
fn step_replica(
    r: &mut Replica,
    api: &mut Api,
    s: &Schedule,
    i: usize,
    t: u64,
    cut: bool,
    nodes: &[String],
    judges: &Judges,
    at: &impl Fn(u64) -> Instant,
) {
    if !cut {
        for (node, local) in r.nodes.iter_mut().filter(|(_, l)| !l.primed) {
            local.heard = api.nodes[node].served_by.clone();
            local.primed = true;
        }
    }
    while r.events.front().is_some_and(|(when, _, _)| *when <= t) {
        if let Some((_, node, writer)) = r.events.pop_front()
            && let Some(local) = r.nodes.get_mut(&node)
        {
            // Another replica writes it now: this one has lost it.
            if local.held && writer != r.name {
                local.held = false;
                local.version = None;
            }
            local.heard = writer;
        }
    }
    if r.writing.is_none() && t >= r.next_presence {
        r.next_presence = t + steps(RETRY_PERIOD);
        r.writing = Some((t + s.write_delay[i], t));
    }
    if t >= r.next_list {
        r.next_list = t + steps(LIST_EVERY);
        if !cut {
            let leases: Vec<Lease> = api.presence.values().cloned().collect();
            r.listings.push_back((t + s.list_delay[i], t, leases));
        }
    }
    while r.listings.front().is_some_and(|(when, _, _)| *when <= t) {
        if let Some((_, asked, leases)) = r.listings.pop_front() {
            r.seen.begin();
            for lease in &leases {
                r.seen.observe(lease, at(t), judges);
            }
            r.peers = r.seen.finish(at(asked), at(t));
            r.listed = true;
        }
    }
    if t < r.next_round {
        return;
    }
    r.next_round = t + steps(ROUND);
    let present = r.present(t);
    // Its registry: the Nodes whose Secret it has seen.
    let known: Vec<&String> = nodes
        .iter()
        .enumerate()
        .filter(|(k, _)| {
            !s.faults.iter().any(|f| {
                matches!(f, Fault::Late { replica, node, .. } if *replica == i && node == k)
                    && f.covers(t)
            })
        })
        .map(|(_, n)| n)
        .collect();
    let local = Assignment::compute(
        known.iter().map(|n| n.as_str()),
        r.peers.candidates(&r.name, present),
    );
    let leading = present && !cut && api.lead(&r.name, t);
    if leading
        && api
            .published
            .as_ref()
            .is_none_or(|p| *p.leader != *r.name || p.assignment != local)
    {
        let generation = api.published.as_ref().map_or(1, |p| p.generation + 1);
        api.published = Some(Published {
            leader: r.name.as_str().into(),
            generation,
            assignment: local.clone(),
        });
    }
    if !cut {
        r.published.clone_from(&api.published);
    }
    let assignment = effective(r.published.as_ref(), &local, &r.name, &r.peers);
    for node in known {
        let assigned = present && assignment.replica_of(node) == Some(r.name.as_str());
        let me = r.name.clone();
        let peers = r.peers.clone();
        let local = r.nodes.entry(node.clone()).or_default();
        // The Node as read: before a claim (not held), or once a write was refused.
        let read = (assigned && (!local.held || local.version.is_none()) && !cut)
            .then(|| api.nodes[node].clone());
        let (names_me, holder_gone) = match &read {
            // As `leaf_loop::take`: a writer whose Lease is written but whose pod this
            // replica's cache misses is asked about; every replica's pod runs (a paused or cut
            // one's too), so the apiserver says it runs.
            Some(rec) => (
                rec.served_by == me,
                may_take(&rec.served_by, &me, &peers, at(t)) && !peers.unconfirmed(&rec.served_by),
            ),
            None => (local.held || local.heard == me, false),
        };
        if assigned && read.is_none() && (!local.held || local.version.is_none()) {
            // Cut: the read fails, nothing is done this round.
            continue;
        }
        let choice = choose(Facts {
            present,
            assigned,
            held: local.held,
            names_me,
            holder_gone,
        });
        if std::env::var_os("PROTOCOL_SIM_TRACE").is_some() {
            eprintln!(
                "t={t} {me} {node} present={present} assigned={assigned} held={} names_me={names_me} gone={holder_gone} read={:?} -> {choice:?} peers={:?}",
                local.held,
                read.as_ref().map(|r| r.served_by.clone()),
                peers
            );
        }
        match choice {
            Choice::LetGo => {
                local.held = false;
                local.version = None;
            }
            Choice::Serve => {
                let version = match (local.version, &read) {
                    (_, Some(rec)) => rec.version,
                    (Some(v), None) => v,
                    (None, None) => continue,
                };
                local.held = true;
                if cut {
                    continue;
                }
                match api.write(t, node, version, &me) {
                    Some(v) => local.version = Some(v),
                    None => local.version = None,
                }
            }
            Choice::Take => {
                if let Some(rec) = &read
                    && let Some(v) = api.write(t, node, rec.version, &me)
                {
                    local.held = true;
                    local.version = Some(v);
                }
            }
            Choice::HandBack => {
                if cut {
                    continue;
                }
                let rec = api.nodes[node].clone();
                if rec.served_by != me || api.write(t, node, rec.version, "").is_some() {
                    local.held = false;
                    local.version = None;
                    local.heard = String::new();
                }
            }
            Choice::Wait | Choice::Idle => {}
        }
    }
}

fn schedules() -> impl Strategy<Value = Schedule> {
    (2usize..=3, 1usize..=4).prop_flat_map(|(replicas, nodes)| {
        let fault = (
            0..replicas,
            0u8..5,
            0u64..600,
            5u64..250,
            0..nodes,
            1..replicas,
        )
            .prop_map(move |(replica, kind, start, len, node, other)| match kind {
                0 => Fault::Pause {
                    replica,
                    start,
                    len,
                },
                1 => Fault::Cut {
                    replica,
                    start,
                    len,
                },
                2 => Fault::Restart {
                    replica,
                    start,
                    len,
                },
                3 => Fault::Late {
                    replica,
                    node,
                    start,
                    len,
                },
                _ => Fault::Blind {
                    replica,
                    peer: (replica + other) % replicas,
                    start,
                    len,
                },
            });
        (
            proptest::collection::vec(fault, 0..4),
            proptest::collection::vec(0u64..30, replicas),
            proptest::collection::vec(0u64..30, replicas),
            proptest::collection::vec(0u64..30, replicas),
        )
            .prop_map(
                move |(faults, write_delay, list_delay, event_delay)| Schedule {
                    replicas,
                    nodes,
                    faults,
                    write_delay,
                    list_delay,
                    event_delay,
                },
            )
    })
}

/// Schedules per run: `PROTOCOL_SIM_CASES`, 2,000 unless set. Failures are shrunk and kept in
/// `proptest-regressions/` (checked first on every later run).
#[test]
fn no_node_is_served_twice_and_every_node_settles_with_its_assignee() {
    use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
    let cases = std::env::var("PROTOCOL_SIM_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2000);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        source_file: Some(file!()),
        ..Config::default()
    });
    let ran = std::sync::atomic::AtomicU32::new(0);
    let result = runner.run(&schedules(), |s| {
        ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        run(&s).map_err(|broken| TestCaseError::fail(format!("{broken}\n{s:#?}")))
    });
    println!(
        "protocol simulation: {} schedules run (2-3 replicas, 1-4 Nodes, up to 3 faults each: pauses, cuts, restarts, Secrets seen late, pod caches blind to a peer)",
        ran.into_inner()
    );
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// With no fault, every Node is served by its assignee within a few rounds.
#[test]
fn a_cut_at_start_with_slow_listings() {
    let s = Schedule {
        replicas: 3,
        nodes: 4,
        faults: vec![Fault::Cut {
            replica: 1,
            start: 3,
            len: 48,
        }],
        write_delay: vec![0, 0, 0],
        list_delay: vec![0, 21, 0],
        event_delay: vec![0, 0, 0],
    };
    run(&s).unwrap();
}

#[test]
fn a_restart_with_slow_listings() {
    let s = Schedule {
        replicas: 2,
        nodes: 1,
        faults: vec![Fault::Restart {
            replica: 1,
            start: 25,
            len: 108,
        }],
        write_delay: vec![0, 17],
        list_delay: vec![21, 0],
        event_delay: vec![0, 0],
    };
    run(&s).unwrap();
}

#[test]
fn a_restart_after_a_long_pause() {
    let s = Schedule {
        replicas: 2,
        nodes: 1,
        faults: vec![
            Fault::Restart {
                replica: 0,
                start: 381,
                len: 5,
            },
            Fault::Pause {
                replica: 1,
                start: 166,
                len: 181,
            },
        ],
        write_delay: vec![0, 3],
        list_delay: vec![21, 0],
        event_delay: vec![0, 0],
    };
    run(&s).unwrap();
}

#[test]
fn without_faults_every_node_settles() {
    let s = Schedule {
        replicas: 3,
        nodes: 4,
        faults: Vec::new(),
        write_delay: vec![1, 1, 1],
        list_delay: vec![1, 1, 1],
        event_delay: vec![1, 1, 1],
    };
    run(&s).unwrap();
}

/// Claims of a Node from another replica (not from no one) in steps `from..to`.
fn takeovers(log: &[(u64, String, String)], from: u64, to: u64) -> usize {
    let mut last: BTreeMap<&str, &str> = BTreeMap::new();
    let mut count = 0;
    for (t, node, writer) in log {
        if writer.is_empty() {
            continue;
        }
        if let Some(before) = last.insert(node, writer)
            && before != writer
            && (from..to).contains(t)
        {
            count += 1;
        }
    }
    count
}

/// A replica whose cache of relaylet's pods misses a live peer for a minute takes none of that
/// peer's Nodes: it follows the leader's published assignment, not its own view. (Each replica
/// following its own view, relaylet-2 took relaylet-1's Nodes, and both served one for as long
/// as the Node's event took to reach relaylet-1.) A blind *leader* is among the generated
/// faults: it publishes without the peer, which hands its Nodes back, but takes none from it
/// while it serves them (the apiserver is asked about a peer whose Lease is written but whose
/// pod the cache misses).
#[test]
fn a_pod_cache_blind_to_a_live_peer_moves_no_node() {
    let s = Schedule {
        replicas: 3,
        nodes: 6,
        faults: vec![Fault::Blind {
            replica: 2,
            peer: 1,
            start: 200,
            len: 600,
        }],
        write_delay: vec![1, 1, 1],
        list_delay: vec![1, 1, 1],
        event_delay: vec![1, 1, 1],
    };
    let log = run_logged(&s).unwrap();
    assert_eq!(takeovers(&log, 200, 800), 0, "{log:?}");
}

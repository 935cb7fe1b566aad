//! relaylet against real Kubernetes where the tests change the clusters themselves: the root
//! apiserver's address order (kubeadm's, then upstream's default), the replica that writes the
//! virtual Node stopped (failover), a leaf apiserver stopped and restarted, and the idle timeout. relaylet runs two
//! replicas advertising `InternalIP`, as a kubeadm cluster needs. The tests change shared
//! state, so they take turns.

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::realk8s::harness::K8s;
use relaylet_dev::testkit::realk8s::world;

use std::sync::{LazyLock, Mutex, MutexGuard};

use support::{Run, describe, text};
use world::{Setup, World};

const VIRTUAL_NODE: &str = "relaylet-leaf-1";
const KUBEADM_ORDER: &str = "InternalIP,ExternalIP,Hostname";
const UPSTREAM_DEFAULT_ORDER: &str = "Hostname,InternalDNS,InternalIP,ExternalDNS,ExternalIP";

fn world() -> MutexGuard<'static, World> {
    static WORLD: LazyLock<Mutex<World>> = LazyLock::new(|| {
        let w = World::start(Setup {
            root_address_order: KUBEADM_ORDER,
            preferred_address_type: Some("InternalIP"),
            replicas: 2,
            leaves: &["leaf-1"],
            env: &[("STREAM_IDLE_TIMEOUT", "3s")],
            root_version: K8s::V1_35,
            leaf_version: K8s::V1_37,
            ..Setup::default()
        });
        w.sync_pod("leaf-1", "default", "demo");
        Mutex::new(w)
    });
    WORLD.lock().unwrap_or_else(|e| e.into_inner())
}

/// `kubectl exec demo -- echo <word>` with kubectl 1.35 succeeds and prints the word.
fn assert_exec_works(w: &World, word: &str) {
    let k = support::kubectl("1.35");
    let out = Run::new(
        &k,
        w.root_kubeconfig(),
        &["exec", "demo", "--", "echo", word],
    )
    .output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(
        text(&out.stdout),
        format!("{word}\n"),
        "{}",
        describe(&k, &out)
    );
}

/// Under kubeadm's order the root dials the writing replica's InternalIP (relaylet's address comes
/// first; the leaf node's InternalIP, where nothing of relaylet listens, second); under
/// upstream's default order, which puts Hostname and InternalDNS first, relaylet's InternalIP
/// still wins because no leaf address of those types is copied to the Node.
#[test]
fn the_root_dials_relaylet_under_kubeadms_and_upstreams_address_order() {
    let mut w = world();
    let writer = w.writer_of(VIRTUAL_NODE);
    let writer_ip = w.replica_ip(writer).to_string();
    support::eventually("the Node carries its writer's address", || {
        w.node_address(VIRTUAL_NODE) == writer_ip
    });
    let node: serde_json::Value =
        serde_json::from_str(
            &w.root
                .kubectl_ok(&["get", "node", VIRTUAL_NODE, "-o", "json"]),
        )
        .expect("node json");
    let addresses = node["status"]["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(addresses[0]["type"], "InternalIP", "{addresses:?}");
    assert!(
        addresses
            .iter()
            .all(|a| a["type"] != "Hostname" && a["type"] != "InternalDNS"),
        "no leaf address may outrank relaylet's under the default order: {addresses:?}"
    );
    assert_exec_works(&w, "kubeadm-order");

    w.root
        .restart_apiserver_with_address_order(UPSTREAM_DEFAULT_ORDER);
    assert_exec_works(&w, "upstream-default-order");
    w.root.restart_apiserver_with_address_order(KUBEADM_ORDER);
    assert_exec_works(&w, "kubeadm-order-again");
}

/// The Node's replica stops as a rollout stops it: the other replica takes over, writes its own
/// address into the Node, the Node stays Ready throughout, and exec goes to the new writer.
#[test]
fn failover_moves_the_node_to_the_other_replica_and_it_stays_ready() {
    let w = world();
    let old = w.writer_of(VIRTUAL_NODE);
    assert_exec_works(&w, "before-failover");
    // A test that stopped the leaf may just have ended: exec works again at once, the Node
    // shows Ready only after relaylet's next probe of the leaf.
    w.wait_for_node_ready(VIRTUAL_NODE);
    w.stop_replica(old);
    let new = 1 - old;
    let new_ip = w.replica_ip(new).to_string();
    support::eventually("the Node moves to the other replica's address", || {
        assert_eq!(
            w.node_ready(VIRTUAL_NODE),
            "True",
            "the Node left Ready during failover"
        );
        w.node_address(VIRTUAL_NODE) == new_ip
    });
    assert_exec_works(&w, "after-failover");
    assert_eq!(w.node_ready(VIRTUAL_NODE), "True");
    w.restart_replica(old);
}

/// A leaf apiserver that stops: exec fails with an error naming the leaf; once it is back,
/// exec works again without restarting relaylet.
#[test]
fn a_leaf_apiserver_stopped_and_restarted() {
    let mut w = world();
    assert_exec_works(&w, "before-leaf-stop");
    w.leaves.get_mut("leaf-1").expect("leaf-1").stop_apiserver();
    let k = support::kubectl("1.35");
    let out = Run::new(
        &k,
        w.root_kubeconfig(),
        &["exec", "demo", "--", "echo", "x"],
    )
    .output();
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        text(&out.stderr).contains("leaf-1"),
        "{}",
        describe(&k, &out)
    );
    w.leaves
        .get_mut("leaf-1")
        .expect("leaf-1")
        .restart_apiserver();
    support::eventually("exec works again once the leaf apiserver is back", || {
        Run::new(&k, w.root_kubeconfig(), &["exec", "demo", "--", "true"])
            .output()
            .status
            .success()
    });
    assert_exec_works(&w, "after-leaf-restart");
    // The tests take turns on one world: leave the Node Ready, as the next one expects.
    w.wait_for_node_ready(VIRTUAL_NODE);
}

/// An exec that sends nothing for longer than STREAM_IDLE_TIMEOUT (3 s here) is cut, and
/// kubectl, over SPDY and over WebSocket (which the apiserver translates to SPDY towards
/// relaylet), prints relaylet's reason and fails.
#[test]
fn an_idle_exec_is_cut_and_fails_with_relaylets_reason() {
    let w = world();
    for (version, spdy) in [("1.27", false), ("1.35", false), ("1.35", true)] {
        let k = support::kubectl(version);
        let mut run = Run::new(
            &k,
            w.root_kubeconfig(),
            &["exec", "demo", "--", "sleep", "60"],
        );
        if spdy {
            run = run.spdy_only();
        }
        let out = run.output();
        assert!(!out.status.success(), "{}", describe(&k, &out));
        assert!(
            text(&out.stderr).contains("relaylet: idle timeout after 3s"),
            "{}",
            describe(&k, &out)
        );
    }
}

/// The leaf apiserver dies in the middle of a session: kubectl prints that relaylet lost the
/// leaf and fails, instead of exiting 0 as if the command had finished.
#[test]
fn a_session_whose_leaf_dies_fails_with_relaylets_reason() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut w = world();
    for (version, spdy) in [("1.27", false), ("1.35", false), ("1.35", true)] {
        let k = support::kubectl(version);
        let mut run = Run::new(
            &k,
            w.root_kubeconfig(),
            &[
                "exec",
                "demo",
                "--",
                "sh",
                "-c",
                "while true; do echo x; sleep 0.2; done",
            ],
        );
        if spdy {
            run = run.spdy_only();
        }
        let mut child = run
            .command()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl exec");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("first line");
        assert_eq!(line, "x\n", "kubectl {version} spdy={spdy}");
        w.leaves.get_mut("leaf-1").expect("leaf-1").stop_apiserver();
        std::thread::spawn(
            move || while stdout.read_line(&mut String::new()).is_ok_and(|n| n > 0) {},
        );
        let out = child.wait_with_output().expect("kubectl ends");
        w.leaves
            .get_mut("leaf-1")
            .expect("leaf-1")
            .restart_apiserver();
        assert!(
            !out.status.success(),
            "kubectl {version} spdy={spdy}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("relaylet: connection to leaf cluster leaf-1 lost"),
            "kubectl {version} spdy={spdy}: {}",
            text(&out.stderr)
        );
        support::eventually("exec works again once the leaf apiserver is back", || {
            Run::new(&k, w.root_kubeconfig(), &["exec", "demo", "--", "true"])
                .output()
                .status
                .success()
        });
    }
    // The tests take turns on one world: leave the Node Ready, as the next one expects.
    w.wait_for_node_ready(VIRTUAL_NODE);
}

//! A leaf that relaylet cannot dial, reached through the real Kubernetes network proxy: relaylet
//! (the shipped binary) runs in a network namespace of its own whose only link is a veth pair
//! to this machine, so the leaf apiserver on this machine's loopback is out of its reach, as a
//! leaf behind NAT is out of a pod network's. The konnectivity agent runs beside the leaf and
//! dials out to the proxy server; the leaf's Secret names the server (`--proxy-url`, HTTP
//! CONNECT over mutual TLS, `destHost` strategy). Everything else is real: the root and leaf
//! apiservers, kubectl through the root, metrics-servers for `kubectl top`. A second Secret for
//! the same leaf without the proxy is the control: its virtual Node never becomes Ready.

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::realk8s::harness::Process;
use relaylet_dev::testkit::realk8s::konnectivity::{self, Konnectivity};
use relaylet_dev::testkit::realk8s::netns::Netns;
use relaylet_dev::testkit::realk8s::world;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use support::{Run, describe, text};
use world::{Setup, World};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(90);

struct Nat {
    world: World,
    netns: Netns,
    konnectivity: Mutex<Konnectivity>,
    _relaylet: Process,
}

fn nat() -> &'static Nat {
    static NAT: OnceLock<Nat> = OnceLock::new();
    NAT.get_or_init(|| {
        let netns = Netns::create();
        let version = konnectivity::version();
        let k = Konnectivity::start("127.0.0.1", Some(netns.host_ip)).expect("konnectivity");
        // Straight to stderr, not captured: the run's first lines name the versions.
        let _ = writeln!(
            std::io::stderr(),
            "konnectivity: proxy-server {version}, proxy-agent {version} (--mode=http-connect, --proxy-strategies=destHost,default, mTLS); relaylet in network namespace {} ({}), root and proxy at {}",
            netns.name,
            netns.ns_ip,
            netns.host_ip
        );
        let world = World::start(Setup {
            replicas: 0,
            wait_for_nodes: false,
            leaves: &["leaf-1"],
            root_also_on: Some(netns.host_ip),
            ..Setup::default()
        });
        // The leaf's Secret names the proxy; "direct" is the same leaf without it.
        let file = |name: &str, pem: &str| {
            let path = world.dir.path().join(name);
            std::fs::write(&path, pem).expect("write a proxy file");
            path.display().to_string()
        };
        let proxy = vec![
            "--proxy-url".to_string(),
            format!("https://{}:{}", netns.host_ip, k.server_port),
            "--proxy-ca".to_string(),
            file("proxy-ca.crt", &k.ca_pem),
            "--proxy-client-cert".to_string(),
            file("proxy-client.crt", &k.client_cert_pem),
            "--proxy-client-key".to_string(),
            file("proxy-client.key", &k.client_key_pem),
        ];
        world.register_leaf("leaf-1", "leaf-1", &proxy);
        world.register_leaf("leaf-1", "direct", &[]);
        let relaylet = world.spawn_relaylet_in(
            &netns,
            std::path::Path::new(env!("CARGO_BIN_EXE_relaylet")),
        );
        world.wait_for_nodes(&["leaf-1"]);
        world.sync_pod("leaf-1", "default", "demo");
        world.sync_pod("leaf-1", "default", "attached");
        Nat {
            world,
            netns,
            konnectivity: Mutex::new(k),
            _relaylet: relaylet,
        }
    })
}

fn konnectivity(n: &Nat) -> MutexGuard<'_, Konnectivity> {
    n.konnectivity.lock().unwrap_or_else(|e| e.into_inner())
}

/// The port of a control plane's URL (`https://127.0.0.1:PORT`).
fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

/// The Ready condition of `node` in the root: status, reason, message.
fn ready_condition(w: &World, node: &str) -> (String, String, String) {
    let node: serde_json::Value =
        serde_json::from_str(&w.root.kubectl_ok(&["get", "node", node, "-o", "json"]))
            .expect("node json");
    let conditions = node["status"]["conditions"].as_array().cloned();
    let ready = conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c["type"] == "Ready")
        .unwrap_or_default();
    let field = |f: &str| ready[f].as_str().unwrap_or_default().to_string();
    (field("status"), field("reason"), field("message"))
}

/// The control: from relaylet's namespace the leaf apiserver cannot be dialled (the root and the
/// proxy can), and the same leaf's Secret without the proxy gives a virtual Node that says why
/// it is not Ready.
#[test]
fn without_the_proxy_the_leaf_cannot_be_reached() {
    let n = nat();
    let w = &n.world;
    let leaf_port = port_of(&w.leaf("leaf-1").url);
    assert!(
        !n.netns.can_dial("127.0.0.1", leaf_port),
        "relaylet's namespace must not reach the leaf apiserver"
    );
    assert!(
        n.netns
            .can_dial(&n.netns.host_ip.to_string(), port_of(&w.root.url)),
        "relaylet's namespace reaches the root apiserver"
    );
    let mut last = Default::default();
    support::wait_until(
        "the direct leaf's virtual node reports the leaf unreachable",
        HANG,
        || {
            last = ready_condition(w, "relaylet-direct");
            last.1 == "LeafUnreachable"
        },
    );
    let (status, _, message) = last;
    assert_eq!(status, "False", "{message}");
    // What failed, not hyper's bare "client error (Connect)".
    assert!(
        message.contains("Connection refused"),
        "the message says why the leaf could not be dialled: {message}"
    );
}

/// The virtual Node of the proxied leaf is Ready with the leaf node's capacity.
#[test]
fn the_proxied_leafs_node_is_ready_with_its_capacity() {
    let n = nat();
    let w = &n.world;
    let (status, reason, message) = ready_condition(w, "relaylet-leaf-1");
    assert_eq!(status, "True", "{reason}: {message}");
    let json = |kubeconfig_owner: &relaylet_dev::testkit::realk8s::harness::ControlPlane,
                node: &str| {
        serde_json::from_str::<serde_json::Value>(
            &kubeconfig_owner.kubectl_ok(&["get", "node", node, "-o", "json"]),
        )
        .expect("node json")
    };
    let virtual_node = json(&w.root, "relaylet-leaf-1");
    let leaf_node = json(w.leaf("leaf-1"), "leaf-1-node");
    for resource in ["cpu", "memory", "pods"] {
        let (got, want) = (
            &virtual_node["status"]["capacity"][resource],
            &leaf_node["status"]["allocatable"][resource],
        );
        // Two spellings of one quantity ("8Gi", "8589934592") compare by value.
        let value = |q: &serde_json::Value| {
            relaylet::model::quantity::Milli::parse(q.as_str().unwrap_or_default())
                .unwrap_or_else(|err| panic!("{resource}: {q} is not a quantity: {err}"))
        };
        assert_eq!(value(got), value(want), "{resource}: {got} vs {want}");
    }
    assert_eq!(
        virtual_node["status"]["addresses"][0]["address"],
        n.netns.ns_ip.to_string(),
        "the root dials relaylet in its namespace"
    );
}

/// Sessions through the root, relaylet and the tunnel, with kubectl 1.27 (SPDY) and 1.35
/// (WebSockets to the root, and forced to SPDY): exec with stdin and exit codes, a tty with its
/// size, attach, logs -f and port-forward; then `kubectl top`; then the agent dies under an
/// open session (kubectl fails naming the leaf), new sessions fail naming the proxy, and come
/// back with the agent. One test: the cut must not land under another's session.
#[test]
fn sessions_through_the_proxy_an_honest_cut_and_recovery() {
    let n = nat();
    let w = &n.world;
    let kubeconfig = w.root_kubeconfig();
    for (version, spdy) in [("1.27", false), ("1.35", false), ("1.35", true)] {
        let k = support::kubectl(version);
        let what = format!("kubectl {version} spdy={spdy}");

        let mut run = Run::new(
            &k,
            kubeconfig,
            &["exec", "-i", "demo", "--", "sh", "-c", "cat; exit 3"],
        )
        .stdin(b"through the tunnel\n");
        if spdy {
            run = run.spdy_only();
        }
        let out = run.output();
        assert_eq!(out.status.code(), Some(3), "{what}: {}", describe(&k, &out));
        assert_eq!(text(&out.stdout), "through the tunnel\n", "{what}");

        support::assert_tty_size_and_resize(&k, kubeconfig, "demo", spdy);

        let mut attach = Run::new(&k, kubeconfig, &["attach", "-i", "attached"]);
        if spdy {
            attach = attach.spdy_only();
        }
        let seen = support::attach_round_trip(attach, "ok");
        assert_eq!(
            seen.last().map(String::as_str),
            Some("got ok"),
            "{what}: {seen:?}"
        );

        for body in world::port_forward_answers(&k, kubeconfig, "demo", 2) {
            assert!(
                body.ends_with("hello from default/demo\n"),
                "{what}: {body:?}"
            );
        }
    }

    let k = support::kubectl("1.35");
    // logs -f from the last line on: the lines after it are logged while following.
    let mut follow = Run::new(&k, kubeconfig, &["logs", "-f", "--tail=1", "demo"]).command();
    follow
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    let mut child = follow.spawn().expect("kubectl logs -f");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        if lines.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        seen.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.iter().all(|l| l.starts_with("tick ")), "{seen:?}");

    kubectl_top(n);

    // The agent dies under an open session.
    let session = support::Background::spawn(
        Run::new(
            &k,
            kubeconfig,
            &["exec", "demo", "--", "sh", "-c", "echo ready; sleep 3600"],
        ),
        "kubectl exec across the cut",
    );
    assert_eq!(session.next_line(HANG).as_deref(), Some("ready"));
    konnectivity(n).kill_agent();
    let ended = session.finish(HANG);
    assert_ne!(
        ended.code,
        Some(0),
        "a cut session must not exit 0: {ended:?}"
    );
    assert!(ended.stderr.contains("leaf-1"), "{ended:?}");

    // Without the agent, a new session fails naming the leaf and the proxy.
    let out = Run::new(&k, kubeconfig, &["exec", "demo", "--", "true"]).output();
    assert_ne!(out.status.code(), Some(0), "{}", describe(&k, &out));
    let proxy = format!("{}:{}", n.netns.host_ip, konnectivity(n).server_port);
    assert!(
        text(&out.stderr).contains("leaf-1") && text(&out.stderr).contains(&proxy),
        "{}",
        describe(&k, &out)
    );

    // The agent comes back: so do sessions.
    konnectivity(n).start_agent();
    let mut last = String::new();
    support::wait_until("exec works again once the agent is back", HANG, || {
        let out = Run::new(&k, kubeconfig, &["exec", "demo", "--", "echo", "back"]).output();
        last = describe(&k, &out);
        out.status.code() == Some(0) && text(&out.stdout) == "back\n"
    });
}

/// `kubectl top pod` and `top node` in the root: the leaf's metrics-server scrapes its kubelet,
/// relaylet reads the leaf's metrics API through the tunnel, the root's metrics-server scrapes
/// relaylet in its namespace.
fn kubectl_top(n: &Nat) {
    use relaylet_dev::testkit::realk8s::metrics_server::Scraping;
    let w = &n.world;
    let _leaf = w.leaf("leaf-1").start_metrics_server(Scraping {
        client_certificate: true,
        verify_kubelets: true,
    });
    let _root = w.root.start_metrics_server(Scraping {
        client_certificate: false,
        verify_kubelets: false,
    });
    let k = support::kubectl("1.35");
    let mut last = String::new();
    // Two scrapes in the leaf, then two of relaylet in the root.
    support::wait_until(
        "kubectl top pod in the root lists demo",
        Duration::from_secs(150),
        || {
            let out = Run::new(&k, w.root_kubeconfig(), &["top", "pod", "--no-headers"]).output();
            last = describe(&k, &out);
            text(&out.stdout).lines().any(|l| l.starts_with("demo "))
        },
    );
    let out = Run::new(&k, w.root_kubeconfig(), &["top", "node", "--no-headers"]).output();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&k, &out));
    assert!(
        text(&out.stdout).contains("relaylet-leaf-1"),
        "{}",
        describe(&k, &out)
    );
}

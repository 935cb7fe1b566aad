//! relaylet against real Kubernetes: a root cluster (etcd, kube-apiserver with Node,RBAC, the
//! front-proxy CA and a kubelet client certificate, kube-controller-manager) and two leaf
//! clusters (etcd, kube-apiserver, a leafkubelet node each), all built from their Go modules at
//! the pinned versions (`tests/tools/build-k8s.sh`), with relaylet installed as a user installs
//! it (`tests/realk8s/world.rs`). Real kubectl binaries and kube-rs go through the real root
//! apiserver. The root dials `InternalDNS` first, as Kosmos installs do, and relaylet keeps the
//! chart's default address type.

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::realk8s::harness::K8s;
use relaylet_dev::testkit::realk8s::{pods, world};

use std::process::Stdio;
use std::sync::OnceLock;

use support::{Run, describe, text};
use world::{RELAYLET_NAMESPACE, Setup, World};

const VIRTUAL_NODE: &str = "relaylet-leaf-1";

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let w = World::start(Setup {
            root_address_order: "InternalDNS,Hostname,InternalIP,ExternalDNS,ExternalIP",
            preferred_address_type: None,
            replicas: 1,
            leaves: &["leaf-1", "leaf-2"],
            env: &[],
            // The node proxy tests need an address the apiserver proxies to (not loopback).
            routable_replicas: true,
            root_version: K8s::V1_37,
            leaf_version: K8s::V1_35,
            ..Setup::default()
        });
        w.sync_pod("leaf-1", "default", "demo");
        w.sync_pod("leaf-2", "default", "other");
        // attach writes to its pod's log; the log tests read demo's.
        w.sync_pod("leaf-1", "default", "attached");
        w
    })
}

/// Every kubectl version with its default protocol, and the WebSocket-first ones with WebSockets
/// off (SPDY), as the sim suite runs them.
const VARIANTS: [(&str, bool); 5] = [
    ("1.27", false),
    ("1.33", false),
    ("1.33", true),
    ("1.35", false),
    ("1.35", true),
];

/// kubectl exec through the real root apiserver: argv, stdin, stdout, stderr and the exit
/// code, with SPDY-only kubectl 1.27 and WebSocket-first 1.33 and 1.35 (and 1.35 forced to
/// SPDY).
#[test]
fn exec_argv_stdin_stderr_and_exit_codes_with_every_kubectl() {
    let w = world();
    for (version, spdy) in VARIANTS {
        let k = support::kubectl(version);
        let mut run = Run::new(
            &k,
            w.root_kubeconfig(),
            &[
                "exec",
                "-i",
                "demo",
                "--",
                "sh",
                "-c",
                "cat; echo \"argv: $0 $1\" >&2; exit 3",
                "two words",
                "x",
            ],
        )
        .stdin(b"from stdin\n");
        if spdy {
            run = run.spdy_only();
        }
        let out = run.output();
        assert_eq!(out.status.code(), Some(3), "{}", describe(&k, &out));
        assert_eq!(text(&out.stdout), "from stdin\n", "{}", describe(&k, &out));
        assert!(
            text(&out.stderr).contains("argv: two words x"),
            "{}",
            describe(&k, &out)
        );
    }
}

/// A binary that does not exist: kubectl reports the runtime's error and fails. With
/// WebSockets the real apiserver's translator wraps the kubelet's InternalError in its own, so
/// kubectl says "Internal error occurred:" twice; over SPDY once.
#[test]
fn exec_of_a_missing_binary_fails_with_the_kubelets_error() {
    let w = world();
    for (version, spdy) in VARIANTS {
        let k = support::kubectl(version);
        let mut run = Run::new(
            &k,
            w.root_kubeconfig(),
            &["exec", "demo", "--", "no-such-binary"],
        );
        if spdy {
            run = run.spdy_only();
        }
        let out = run.output();
        assert!(!out.status.success(), "{}", describe(&k, &out));
        support::assert_missing_binary_error(&k, spdy, &out, "no-such-binary");
    }
}

/// Logs with options through the real root apiserver, and the leaf's refusal as a message.
#[test]
fn logs_with_options_and_errors() {
    let w = world();
    w.wait_for_log_lines("leaf-1", "default", "demo", 3);
    for version in ["1.27", "1.33", "1.35"] {
        let k = support::kubectl(version);
        let out = Run::new(&k, w.root_kubeconfig(), &["logs", "demo", "--tail=2"]).output();
        assert!(out.status.success(), "{}", describe(&k, &out));
        let lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
        assert_eq!(lines.len(), 2, "{}", describe(&k, &out));
        assert!(lines.iter().all(|l| l.starts_with("tick ")), "{lines:?}");
        let out = Run::new(
            &k,
            w.root_kubeconfig(),
            &["logs", "demo", "--timestamps", "--limit-bytes=40"],
        )
        .output();
        assert!(out.status.success(), "{}", describe(&k, &out));
        assert_eq!(out.stdout.len(), 40, "{}", describe(&k, &out));
        let out = Run::new(&k, w.root_kubeconfig(), &["logs", "demo", "--previous"]).output();
        assert!(!out.status.success());
        assert_eq!(
            text(&out.stderr).trim_end(),
            "Error from server (BadRequest): previous terminated container \"main\" in pod \"demo\" not found",
            "{}",
            describe(&k, &out)
        );
    }
}

/// kubectl port-forward (SPDY with 1.27, WebSocket-tunnelled with 1.35) to the pod's HTTP port,
/// two connections each.
#[test]
fn port_forward_with_both_protocols() {
    let w = world();
    for version in ["1.27", "1.33", "1.35"] {
        let k = support::kubectl(version);
        for body in world::port_forward_answers(&k, w.root_kubeconfig(), "demo", 2) {
            assert!(
                body.ends_with("hello from default/demo\n"),
                "kubectl {version}: {body:?}"
            );
        }
    }
}

/// The virtual Node and its Lease as the real apiserver validated and stored them, with the
/// address the root dials first.
#[test]
fn the_real_apiserver_stores_the_virtual_node_and_lease() {
    let w = world();
    let node: serde_json::Value =
        serde_json::from_str(
            &w.root
                .kubectl_ok(&["get", "node", VIRTUAL_NODE, "-o", "json"]),
        )
        .expect("node json");
    assert_eq!(node["status"]["addresses"][0]["type"], "InternalDNS");
    assert_eq!(
        node["status"]["addresses"][0]["address"],
        w.replica_ip(0).to_string()
    );
    assert_eq!(
        node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
            .as_u64()
            .map(|p| p > 0),
        Some(true)
    );
    assert_eq!(
        node["metadata"]["labels"]["relaylet.io/owner"],
        RELAYLET_NAMESPACE
    );
    let lease: serde_json::Value = serde_json::from_str(&w.root.kubectl_ok(&[
        "get",
        "lease",
        VIRTUAL_NODE,
        "-n",
        "kube-node-lease",
        "-o",
        "json",
    ]))
    .expect("lease json");
    assert_eq!(lease["spec"]["holderIdentity"], VIRTUAL_NODE);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
}

/// Authorization by the real apiserver: a user with only `get nodes/proxy` cannot exec on
/// relaylet's port (a WebSocket exec is a GET, but needs `create`); the root's own kubelet
/// client identity can.
#[test]
fn get_nodes_proxy_is_not_enough_to_exec_on_relaylets_port() {
    let w = world();
    w.root.kubectl_ok(&[
        "create",
        "clusterrole",
        "node-proxy-reader",
        "--verb=get",
        "--resource=nodes/proxy",
    ]);
    w.root.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "viewer-node-proxy",
        "--clusterrole=node-proxy-reader",
        "--user=viewer",
    ]);
    let viewer = w.root.user_kubeconfig("viewer", &[]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = world::kubelet_client(w.kubelet_addr(0), &w.root.url, &viewer).await;
        let exec = http::Request::get("/exec/default/demo/main?command=true&output=1")
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
            .body(Vec::new())
            .unwrap();
        match client.request_text(exec).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 403, "{status:?}");
                assert!(
                    status
                        .message
                        .contains("cannot create resource \"nodes/proxy\""),
                    "{status:?}"
                );
            }
            other => panic!("exec by a get-only user: {other:?}"),
        }
        // Logs are a GET: allowed.
        let logs = http::Request::get("/containerLogs/default/demo/main?tailLines=1")
            .body(Vec::new())
            .unwrap();
        let body = client.request_text(logs).await.expect("logs");
        assert!(body.starts_with("tick "), "{body}");
    });
}

/// A user who may `get nodes/proxy` on virtual node relaylet-leaf-1 only.
const NODE_1_PROXY_READER: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: node-1-proxy-reader
rules:
  - apiGroups: [""]
    resources: ["nodes/proxy"]
    resourceNames: ["relaylet-leaf-1"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: node-1-proxy-reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: node-1-proxy-reader
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: node-1-proxy-user
"#;

/// The root apiserver's node proxy (`/api/v1/nodes/<node>/proxy/...`) authorizes its user for
/// that one node, then calls the port that Node names with the apiserver's own kubelet client
/// certificate. A virtual node's port serves only that node's pods, so a user scoped to
/// relaylet-leaf-1 reaches nothing of relaylet-leaf-2 through it: not its pods' logs, not by
/// naming relaylet-leaf-2's port explicitly; and no exec through the proxy carries a command.
/// Through the real root apiserver, with relaylet on a routable address (the node proxy refuses
/// loopback).
#[test]
fn the_node_proxy_reaches_only_the_nodes_own_pods() {
    let w = world();
    w.root
        .kubectl_stdin_ok(&["apply", "-f", "-"], Some(NODE_1_PROXY_READER));
    let user = w.root.user_kubeconfig("node-1-proxy-user", &[]);
    let raw = |path: &str| {
        let out =
            std::process::Command::new(relaylet_dev::testkit::realk8s::harness::kubectl_path())
                .args(["get", "--raw", path])
                .env("KUBECONFIG", &user)
                .output()
                .expect("kubectl runs");
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let proxy = "/api/v1/nodes/relaylet-leaf-1/proxy";

    // The node's own pod: its logs, through the proxy.
    let (ok, out, err) = raw(&format!(
        "{proxy}/containerLogs/default/demo/main?tailLines=1"
    ));
    assert!(ok && out.starts_with("tick "), "{out}{err}");

    // relaylet-leaf-2's pod through relaylet-leaf-1's proxy: a kubelet's 404, the same as for a
    // pod that exists nowhere.
    for pod in ["other", "no-such-pod"] {
        let (ok, out, err) = raw(&format!(
            "{proxy}/containerLogs/default/{pod}/main?tailLines=1"
        ));
        assert!(!ok && !out.contains("tick"), "{pod}: {out}{err}");
        assert!(err.contains("NotFound"), "{pod}: {err}");
    }
    // Asked of relaylet-leaf-2 itself, the apiserver forbids it.
    let (ok, _, err) = raw("/api/v1/nodes/relaylet-leaf-2/proxy/containerLogs/default/other/main");
    assert!(!ok && err.contains("Forbidden"), "{err}");
    // Naming relaylet-leaf-2's port (or the shared port) on relaylet-leaf-1: the apiserver
    // authorizes the name with the port ("https:relaylet-leaf-1:<port>"), which the user's
    // role does not name; and even for an admin it dials such a port without its kubelet
    // client certificate (its general proxy transport), which relaylet refuses.
    let port2 = w.root.kubectl_ok(&[
        "get",
        "node",
        "relaylet-leaf-2",
        "-o",
        "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
    ]);
    let shared = w.kubelet_addr(0).port().to_string();
    for port in [port2.trim(), shared.as_str()] {
        let path = format!(
            "/api/v1/nodes/https:relaylet-leaf-1:{port}/proxy/containerLogs/default/other/main"
        );
        let (ok, out, err) = raw(&path);
        assert!(!ok && !out.contains("tick"), "port {port}: {out}{err}");
        assert!(err.contains("Forbidden"), "port {port}: {err}");
        let admin =
            std::process::Command::new(relaylet_dev::testkit::realk8s::harness::kubectl_path())
                .args(["get", "--raw", &path])
                .env("KUBECONFIG", &w.root.admin_kubeconfig)
                .output()
                .expect("kubectl runs");
        let (out, err) = (text(&admin.stdout), text(&admin.stderr));
        assert!(
            !admin.status.success() && !out.contains("tick"),
            "admin, port {port}: {out}{err}"
        );
        // relaylet's 401, as kubectl words it.
        assert!(
            err.contains("the server has asked for the client to provide credentials"),
            "admin, port {port}: {err}"
        );
    }

    // An exec over WebSocket is a GET, which `get nodes/proxy` passes. But the apiserver's node
    // proxy forwards an upgrade without its query (upstream `UpgradeAwareHandler` copies only
    // the query of plain requests), so no command reaches relaylet: the kubelet API's 400,
    // for the node's own pod and any other alike.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let yaml = std::fs::read_to_string(&user).expect("kubeconfig");
        let client = relaylet_dev::sandbox::kube_client(&yaml)
            .await
            .expect("client");
        for pod in ["demo", "other"] {
            let exec = http::Request::get(format!(
                "{proxy}/exec/default/{pod}/main?command=echo&command=ran&output=1&error=1"
            ))
            .body(Vec::new())
            .expect("request");
            match client.connect(exec).await {
                Err(kube::Error::Api(status)) => {
                    assert_eq!(status.code, 400, "{pod}: {status:?}");
                    assert_eq!(
                        status.message, "bad query: exec needs at least one command argument",
                        "{pod}"
                    );
                }
                Err(other) => panic!("{pod}: {other}"),
                Ok(_) => panic!("{pod}: an exec through the node proxy was upgraded"),
            }
        }
    });
}

/// `kubectl exec -it` under a real PTY: the remote terminal has the PTY's size, and a resize
/// reaches it (SPDY resize stream and WebSocket resize channel).
#[test]
fn exec_tty_gets_initial_size_and_resize() {
    let w = world();
    for (version, spdy) in VARIANTS {
        support::assert_tty_size_and_resize(
            &support::kubectl(version),
            w.root_kubeconfig(),
            "demo",
            spdy,
        );
    }
}

/// `kubectl attach -i`: stdin reaches the container's main process and its output streams back.
#[test]
fn attach_sends_stdin_to_the_main_process_and_streams_its_output() {
    let w = world();
    for (version, spdy) in VARIANTS {
        let k = support::kubectl(version);
        let marker = format!("attach-{version}-{spdy}");
        let mut run = Run::new(&k, w.root_kubeconfig(), &["attach", "-i", "attached"]);
        if spdy {
            run = run.spdy_only();
        }
        let seen = support::attach_round_trip(run, &marker);
        assert!(
            seen.last() == Some(&format!("got {marker}")),
            "kubectl {version} spdy={spdy}: {seen:?}"
        );
    }
}

/// Each leaf's pods are reached through their own virtual node.
#[test]
fn pods_of_both_leaves_are_reached() {
    let w = world();
    let k = support::kubectl("1.35");
    for (pod, expected) in [("demo", "default/demo"), ("other", "default/other")] {
        let out = Run::new(
            &k,
            w.root_kubeconfig(),
            &["exec", pod, "--", "sh", "-c", "echo $POD"],
        )
        .output();
        assert!(out.status.success(), "{}", describe(&k, &out));
        assert_eq!(text(&out.stdout).trim(), expected, "{}", describe(&k, &out));
    }
    let nodes = w.root.kubectl_ok(&["get", "nodes", "-o", "name"]);
    assert!(
        nodes.contains("node/relaylet-leaf-1") && nodes.contains("node/relaylet-leaf-2"),
        "{nodes}"
    );
}

/// A root pod whose same-named leaf pod was not made for it (no marker with its UID) is refused
/// through the real apiserver, and nothing runs in the leaf pod.
#[test]
fn a_leaf_pod_that_is_not_the_counterpart_is_refused() {
    let w = world();
    let leaf = w.leaf("leaf-2");
    leaf.kubectl_stdin_ok(
        &["create", "-f", "-"],
        Some(&pods::demo_pod(
            "default",
            "impostor",
            &world::leaf_node("leaf-2"),
            None,
        )),
    );
    w.root.kubectl_stdin_ok(
        &["create", "-f", "-"],
        Some(&pods::demo_pod(
            "default",
            "impostor",
            &world::virtual_node("leaf-2"),
            None,
        )),
    );
    w.wait_for_log_lines("leaf-2", "default", "impostor", 1);
    let k = support::kubectl("1.35");
    let out = Run::new(
        &k,
        w.root_kubeconfig(),
        &["exec", "impostor", "--", "touch", "pwned"],
    )
    .output();
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        text(&out.stderr).contains("is not the counterpart of root pod default/impostor"),
        "{}",
        describe(&k, &out)
    );
    let out = Run::new(&k, w.root_kubeconfig(), &["logs", "impostor"]).output();
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        !text(&out.stdout).contains("tick"),
        "{}",
        describe(&k, &out)
    );
}

/// kube-rs exec (WebSocket, as library users call it) through the real root apiserver.
#[test]
fn kube_rs_exec_through_the_real_root() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::AttachParams;
    use tokio::io::AsyncReadExt;
    let w = world();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = relaylet_dev::sandbox::kube_client(
            &std::fs::read_to_string(w.root_kubeconfig()).expect("kubeconfig"),
        )
        .await
        .expect("client");
        let pods: kube::Api<Pod> = kube::Api::namespaced(client, "default");
        let mut process = pods
            .exec(
                "demo",
                vec!["sh", "-c", "echo via-kube-rs; echo oops >&2; exit 4"],
                &AttachParams::default().stdout(true).stderr(true),
            )
            .await
            .expect("exec");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut stdout = process.stdout().expect("stdout");
        let mut stderr = process.stderr().expect("stderr");
        let status = process.take_status().expect("status");
        let (a, b) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        a.expect("stdout");
        b.expect("stderr");
        let status = status.await.expect("a status");
        process.join().await.expect("join");
        assert_eq!(
            (out.as_slice(), err.as_slice()),
            (&b"via-kube-rs\n"[..], &b"oops\n"[..])
        );
        assert_eq!(status.status.as_deref(), Some("Failure"), "{status:?}");
        let code = status
            .details
            .and_then(|d| d.causes)
            .and_then(|c| {
                c.into_iter()
                    .find(|c| c.reason.as_deref() == Some("ExitCode"))
            })
            .and_then(|c| c.message);
        assert_eq!(code.as_deref(), Some("4"));
    });
}

/// A shell spinning on a CPU; logs one `tick` first (what `sync_pod_from` waits for).
fn spinner(namespace: &str, name: &str, node: &str, root_uid: Option<&str>) -> String {
    pods::pod_manifest(
        namespace,
        name,
        node,
        root_uid,
        serde_json::json!({
            "name": "main", "image": "local/sh",
            "command": ["sh", "-c", "echo tick; while :; do :; done"],
        }),
    )
}

/// CPU nanocores and memory bytes of a PodMetrics' first container, and its timestamp.
fn pod_metrics(kubeconfig: &std::path::Path, pod: &str) -> Option<(String, u64, u64)> {
    let k = support::kubectl("1.35");
    let out = Run::new(
        &k,
        kubeconfig,
        &[
            "get",
            "--raw",
            &format!("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/{pod}"),
        ],
    )
    .output();
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let usage = &m["containers"][0]["usage"];
    let cpu = usage["cpu"].as_str()?;
    let nanocores = match cpu.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        None => cpu.parse::<u64>().ok()? * 1_000_000_000,
        Some((i, _)) => {
            let n: u64 = cpu[..i].parse().ok()?;
            n * match &cpu[i..] {
                "m" => 1_000_000,
                "u" => 1_000,
                "n" => 1,
                _ => return None,
            }
        }
    };
    let memory = usage["memory"].as_str()?;
    let bytes = match memory.find(|c: char| c.is_ascii_alphabetic()) {
        None => memory.parse().ok()?,
        Some(i) => {
            let n: u64 = memory[..i].parse().ok()?;
            n << match &memory[i..] {
                "Ki" => 10,
                "Mi" => 20,
                "Gi" => 30,
                _ => return None,
            }
        }
    };
    Some((m["timestamp"].as_str()?.to_string(), nanocores, bytes))
}

/// `kubectl top` in the root through real metrics-servers: one in each leaf scraping its
/// leafkubelet (`/metrics/resource` from the containers' processes) and serving the leaf's
/// `metrics.k8s.io` through the leaf apiserver's aggregation, where relaylet reads it with its
/// least-privilege leaf identity; one in the root scraping relaylet's per-node kubelet ports
/// with its ServiceAccount token (relaylet authenticates it with a TokenReview and authorizes
/// `nodes/metrics` with a SubjectAccessReview), aggregated by the root apiserver.
#[test]
fn kubectl_top_through_real_metrics_servers() {
    use relaylet_dev::testkit::realk8s::metrics_server::Scraping;
    let w = world();
    let _leaf_metrics: Vec<_> = ["leaf-1", "leaf-2"]
        .iter()
        .map(|leaf| {
            w.leaf(leaf).start_metrics_server(Scraping {
                client_certificate: true,
                verify_kubelets: true,
            })
        })
        .collect();
    let _root_metrics = w.root.start_metrics_server(Scraping {
        client_certificate: false,
        verify_kubelets: false,
    });
    w.sync_pod_from("leaf-1", "default", "spinner", spinner);

    // Metrics need two scrapes in a leaf, then two of relaylet in the root (10 s apart).
    let leaf_1 = &w.leaf("leaf-1").admin_kubeconfig;
    for kubectl_version in ["1.27", "1.35"] {
        let k = support::kubectl(kubectl_version);
        let mut rows = std::collections::BTreeMap::new();
        support::wait_until(
            &format!("kubectl {kubectl_version} top pod in the root lists spinner, demo and other"),
            std::time::Duration::from_secs(150),
            || {
                let out =
                    Run::new(&k, w.root_kubeconfig(), &["top", "pod", "--no-headers"]).output();
                rows = text(&out.stdout)
                    .lines()
                    .filter_map(|l| {
                        let f: Vec<&str> = l.split_whitespace().collect();
                        let cpu: u64 = f.get(1)?.strip_suffix('m')?.parse().ok()?;
                        let mem: u64 = f.get(2)?.strip_suffix("Mi")?.parse().ok()?;
                        Some((f[0].to_string(), (cpu, mem)))
                    })
                    .collect();
                ["spinner", "demo", "other"]
                    .iter()
                    .all(|p| rows.contains_key(*p))
            },
        );
        assert!(
            rows["spinner"].0 > rows["demo"].0 && rows["spinner"].0 >= 100,
            "kubectl {kubectl_version}: the spinner's CPU shows through the chain: {rows:?}"
        );
        assert!(
            rows["demo"].1 >= 5,
            "a Python process holds megabytes: {rows:?}"
        );
        let out = Run::new(&k, w.root_kubeconfig(), &["top", "node", "--no-headers"]).output();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&k, &out));
        for node in ["relaylet-leaf-1", "relaylet-leaf-2"] {
            assert!(text(&out.stdout).contains(node), "{}", describe(&k, &out));
        }
    }

    // The root's numbers are the leaf's: once both report the same leaf measurement, the
    // memory is the same and the CPU the leaf's rate (relaylet reads it in millicores).
    let mut last = None;
    support::wait_until(
        "the root and leaf-1 PodMetrics of demo from the same leaf measurement",
        std::time::Duration::from_secs(60),
        || {
            let (root, leaf) = (
                pod_metrics(w.root_kubeconfig(), "demo"),
                pod_metrics(leaf_1, "demo"),
            );
            last = Some((root.clone(), leaf.clone()));
            matches!((root, leaf), (Some(r), Some(l)) if r.0 == l.0)
        },
    );
    let Some((Some(root), Some(leaf))) = last else {
        unreachable!()
    };
    assert_eq!(root.2, leaf.2, "memory: root {root:?}, leaf {leaf:?}");
    assert!(
        root.1.abs_diff(leaf.1) <= 2_000_000,
        "CPU within 2m: root {root:?}, leaf {leaf:?}"
    );

    w.root
        .kubectl_ok(&["delete", "pod", "spinner", "--wait=false"]);
    w.leaf("leaf-1")
        .kubectl_ok(&["delete", "pod", "spinner", "--wait=false"]);
}

/// `kubectl debug -i` through the real root apiserver: the ephemeral container is validated
/// and stored by the real `pods/ephemeralcontainers`; the test then does a syncer's part (the
/// leaf copy gets the container through the leaf apiserver's own subresource, and the leaf
/// kubelet's status is copied up), and kubectl attaches to the container through the real
/// root apiserver, relaylet and the real leaf apiserver.
#[test]
fn kubectl_debug_through_the_real_root_and_leaf_apiservers() {
    use std::io::{BufRead, Write};
    let w = world();
    let leaf = w.leaf("leaf-1");
    // A pod of its own: ephemeral containers stay in a pod's spec for good.
    w.sync_pod("leaf-1", "default", "debugged");
    for (version, container) in [("1.27", "dbg-127"), ("1.35", "dbg-135")] {
        let k = support::kubectl(version);
        let mut cmd = Run::new(
            &k,
            w.root_kubeconfig(),
            &[
                "debug",
                "debugged",
                "-i",
                "--image=busybox",
                "-c",
                container,
                "--",
                "sh",
                "-c",
                "read line; echo got $line",
            ],
        )
        .command();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl debug runs");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"ping\n").expect("stdin");

        // The syncer's part, down: the root pod's new ephemeral container to the leaf copy.
        let jsonpath =
            format!("jsonpath={{.spec.ephemeralContainers[?(@.name==\"{container}\")]}}");
        let mut spec = String::new();
        support::wait_until(
            &format!("the root apiserver stores ephemeral container {container}"),
            std::time::Duration::from_secs(60),
            || {
                spec = w
                    .root
                    .kubectl_ok(&["get", "pod", "debugged", "-o", &jsonpath]);
                !spec.trim().is_empty()
            },
        );
        leaf.kubectl_ok(&[
            "patch",
            "pod",
            "debugged",
            "--subresource=ephemeralcontainers",
            "--type=strategic",
            "-p",
            &format!("{{\"spec\":{{\"ephemeralContainers\":[{}]}}}}", spec.trim()),
        ]);
        // Up: the leaf kubelet's status of it, once running.
        let status_path =
            format!("jsonpath={{.status.ephemeralContainerStatuses[?(@.name==\"{container}\")]}}");
        let mut status = String::new();
        support::wait_until(
            &format!("leafkubelet runs {container}"),
            std::time::Duration::from_secs(60),
            || {
                status = leaf.kubectl_ok(&["get", "pod", "debugged", "-o", &status_path]);
                status.contains("running")
            },
        );
        let all = leaf.kubectl_ok(&[
            "get",
            "pod",
            "debugged",
            "-o",
            "jsonpath={.status.ephemeralContainerStatuses}",
        ]);
        w.root.kubectl_ok(&[
            "patch",
            "pod",
            "debugged",
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                "{{\"status\":{{\"ephemeralContainerStatuses\":{}}}}}",
                all.trim()
            ),
        ]);

        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("kubectl's output");
        assert_eq!(line, "got ping\n", "kubectl {version}");
        // Closing stdin ends the attach (the container has exited by now anyway).
        drop(stdin);
        let status = support::wait_exit(child, std::time::Duration::from_secs(60));
        assert!(
            status.is_some_and(|s| s.success()),
            "kubectl {version} debug ended with {status:?}"
        );
    }
}

/// With `ExtendWebSocketsToKubelet` declared on the virtual Node (the default; the leaves are
/// 1.35, which take WebSocket calls), the 1.37 root proxies kubectl 1.35's WebSocket calls to
/// relaylet unchanged and relaylet relays them to the leaf apiserver: every call works and the
/// root counts exec, attach and port-forward as `proxied_to_kubelet`, none as translated.
/// (tests/real/k8s_websockets.rs runs the same calls with the setting off.)
#[test]
fn websocket_calls_are_proxied_to_relaylet_by_the_1_37_root() {
    use relaylet_dev::testkit::realk8s::websocket_calls::{
        counted_since, run_all, streaming_counts,
    };
    let w = world();
    let declared = w.root.kubectl_ok(&[
        "get",
        "node",
        VIRTUAL_NODE,
        "-o",
        "jsonpath={.status.declaredFeatures}",
    ]);
    assert_eq!(declared.trim(), r#"["ExtendWebSocketsToKubelet"]"#);
    let before = streaming_counts(&w.root);
    run_all(w, &support::kubectl("1.35"), "demo", "attached");
    let after = streaming_counts(&w.root);
    for subresource in ["exec", "attach", "portforward"] {
        assert!(
            counted_since(&before, &after, subresource, "proxied_to_kubelet") > 0,
            "{subresource}: {after:?}"
        );
        assert_eq!(
            counted_since(&before, &after, subresource, "translated_at_apiserver"),
            0,
            "{subresource}: {after:?}"
        );
    }
}

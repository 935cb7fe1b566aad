//! `relaylet join`, `status` and `unjoin` (issue 58) against real clusters: a real root
//! apiserver with relaylet (the chart's RBAC and CRD), and real leaf control planes that the
//! world does not register; the binary is the one cargo built, run as a user runs it, with the
//! user's kubeconfig holding both contexts. Join makes a Ready Node and says so; a leaf
//! relaylet cannot reach, or a Secret relaylet refuses, makes it exit non-zero saying why;
//! status prints the same rows; unjoin leaves no Node, Secret or row in the root and nothing of
//! relaylet's in the leaf, including the copies of the pods relaylet ran there. A short-lived
//! token is renewed by relaylet before it expires, while a session through it carries on.
//! Joined with namespaced access, relaylet may stream and run pods only in the namespaces
//! named (what an earlier full join granted is taken back), and unjoin removes that too.

use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

use relaylet_dev::testkit as support;
use support::realk8s::harness::{ControlPlane, K8s, Options};
use support::realk8s::pods::demo_pod;
use support::realk8s::world::{RELAYLET_NAMESPACE, Setup, World, leaf_node, virtual_node};
use support::{eventually, shown, text};

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        World::start(Setup {
            leaves: &["leaf-1"],
            replicas: 1,
            pod_sync: true,
            // A 10-minute token (the least a leaf issues) is renewed 30 s after it was issued
            // (the world's own 24 h tokens after 72 minutes: never here).
            env: &[("LEAF_CREDENTIAL_RENEW_AT", "5")],
            ..Setup::default()
        })
    })
}

/// The tests join leaves of their own; one at a time keeps their Nodes apart in `status`.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A leaf control plane (with the controller-manager and a scheduler, as pod sync needs)
/// and a stand-in kubelet, not registered with relaylet.
fn unregistered_leaf(w: &World, name: &str) -> ControlPlane {
    let mut leaf = ControlPlane::start(
        w.dir.path(),
        Options {
            name: name.to_string(),
            preferred_address_types: "InternalIP,Hostname".into(),
            controller_manager: true,
            verify_kubelet_certificates: false,
            version: K8s::V1_35,
            also_serve_on: Vec::new(),
        },
    );
    leaf.add_kubelet(&leaf_node(name), false);
    leaf.start_scheduler(
        &support::realk8s::real_node::built()
            .1
            .join("kube-scheduler"),
    );
    leaf
}

/// `relaylet <args>` with a kubeconfig holding the root's and `leaf`'s admin contexts.
fn relaylet(w: &World, leaf: &ControlPlane, args: &[&str]) -> Output {
    let kubeconfig = format!(
        "{}:{}",
        w.root.admin_kubeconfig.display(),
        leaf.admin_kubeconfig.display()
    );
    Command::new(env!("CARGO_BIN_EXE_relaylet"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("relaylet runs")
}

/// `relaylet <args>` naming `leaf`'s and the root's contexts and relaylet's namespace.
fn joined_with(w: &World, leaf: &ControlPlane, args: &[&str]) -> Output {
    let mut all = args.to_vec();
    all.extend([
        "--leaf-context",
        &leaf.name,
        "--root-context",
        &w.root.name,
        "--namespace",
        RELAYLET_NAMESPACE,
    ]);
    relaylet(w, leaf, &all)
}

/// The Ready condition's status of Node `node`.
fn node_ready(w: &World, node: &str) -> String {
    w.root.kubectl_ok(&[
        "get",
        "node",
        node,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ])
}

/// Whether `kubectl get <what>` finds anything in `cluster` (`-A` for every namespace).
fn exists(cluster: &ControlPlane, args: &[&str]) -> bool {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "name", "--ignore-not-found"]);
    !cluster.kubectl_ok(&all).trim().is_empty()
}

#[test]
fn join_makes_a_ready_node_status_shows_it_and_unjoin_leaves_nothing_behind() {
    let w = world();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let leaf = unregistered_leaf(w, "joined");
    let node = virtual_node("joined");
    let out = joined_with(w, &leaf, &["join", "--name", "joined", "--timeout", "120s"]);
    eprintln!("{}", shown(&out));
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let said = text(&out.stderr);
    assert!(
        said.contains(&format!("leaf joined: Node {node} Ready after ")),
        "{said}"
    );
    // Not a line per poll: plain lines, each said once (stderr is not a terminal here).
    let lines: Vec<&str> = said.lines().collect();
    let unique: std::collections::BTreeSet<&&str> = lines.iter().collect();
    assert_eq!(lines.len(), unique.len(), "{said}");
    assert_eq!(node_ready(w, &node), "True");
    // The Secret holds relaylet's token, bounded, never the admin's certificate.
    let kubeconfig = w.root.kubectl_ok(&[
        "get",
        "secret",
        "-n",
        RELAYLET_NAMESPACE,
        "relaylet-leaf-joined",
        "-o",
        "jsonpath={.data.kubeconfig}",
    ]);
    let kubeconfig = text(
        &base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            kubeconfig.trim(),
        )
        .unwrap(),
    );
    assert!(kubeconfig.contains("\"token\""), "{kubeconfig}");
    assert!(!kubeconfig.contains("client-certificate"), "{kubeconfig}");

    let status_args = [
        "status",
        "--root-context",
        &w.root.name,
        "--namespace",
        RELAYLET_NAMESPACE,
    ];
    let out = relaylet(w, &leaf, &status_args);
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let table = text(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("relaylet-leaf-joined "))
        .unwrap_or_else(|| panic!("no row for the joined leaf:\n{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[1..3], ["True", "LeafReady"], "{table}");
    assert!(cells[3].starts_with("v1.35."), "{table}");
    assert_eq!(cells[4], node, "{table}");
    // The token's expiry, a week out (the default --token-duration) less the time since: a
    // whole week while `status` runs in the second the token was issued in (kubectl's
    // HumanDuration truncates), 6d23h after.
    assert_eq!(cells[7], "in", "{table}");
    assert!(["7d", "6d23h"].contains(&cells[8]), "{table}");
    // As a kubectl plugin: kubectl runs `kubectl-relaylet` from the PATH with the rest.
    let plugins = w.dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let plugin = plugins.join("kubectl-relaylet");
    if !plugin.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_relaylet"), &plugin).unwrap();
    }
    let path = format!(
        "{}:{}",
        plugins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut plugin_args = vec!["relaylet"];
    plugin_args.extend(&status_args);
    let out = Command::new(support::realk8s::harness::kubectl_path())
        .args(&plugin_args)
        .env("PATH", path)
        .env(
            "KUBECONFIG",
            format!(
                "{}:{}",
                w.root.admin_kubeconfig.display(),
                leaf.admin_kubeconfig.display()
            ),
        )
        .output()
        .expect("kubectl relaylet status");
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let as_plugin = text(&out.stdout);
    assert!(
        as_plugin
            .lines()
            .any(|l| l.split_whitespace().take(5).eq(cells[..5].iter().copied())),
        "kubectl relaylet status:\n{as_plugin}"
    );
    // The same rows kubectl shows (the CRD's printer columns on the real apiserver).
    let kubectl_rows = w.root.kubectl_ok(&[
        "get",
        "leafclusters",
        "-n",
        RELAYLET_NAMESPACE,
        "--no-headers",
    ]);
    assert!(
        kubectl_rows
            .lines()
            .any(|l| l.split_whitespace().take(5).eq(cells[..5].iter().copied())),
        "{kubectl_rows}\nvs\n{table}"
    );

    // A pod relaylet runs in the joined leaf: its copy there is what unjoin must clean up.
    root_pod_runs_in(w, &leaf, "default", "joined-app", &node);

    let out = joined_with(
        w,
        &leaf,
        &["unjoin", "--name", "joined", "--timeout", "180s"],
    );
    eprintln!("{}", shown(&out));
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(!exists(&w.root, &["node", &node]));
    assert!(!exists(
        &w.root,
        &["secret", "-n", RELAYLET_NAMESPACE, "relaylet-leaf-joined"]
    ));
    assert!(!exists(
        &w.root,
        &[
            "leafcluster",
            "-n",
            RELAYLET_NAMESPACE,
            "relaylet-leaf-joined"
        ]
    ));
    let selector = format!("relaylet.io/node={node}");
    for kind in ["pods", "configmaps", "secrets"] {
        assert!(
            !exists(&leaf, &[kind, "-A", "-l", &selector]),
            "relaylet's {kind} are left in the leaf"
        );
    }
    assert!(!exists(&leaf, &["clusterrole", "relaylet-leaf"]));
    assert!(!exists(&leaf, &["clusterrolebinding", "relaylet-leaf"]));
    eventually("the leaf's relaylet namespace gone", || {
        !exists(&leaf, &["namespace", "relaylet"])
    });
    // leaf-1, joined by the world, never noticed.
    w.wait_for_node_ready(&virtual_node("leaf-1"));
}

#[test]
fn join_fails_naming_why_when_relaylet_cannot_reach_the_leaf_or_refuses_its_secret() {
    let w = world();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let leaf = unregistered_leaf(w, "unreachable");

    // Nothing listens on port 1: relaylet's Node for it is NotReady, LeafUnreachable.
    let out = joined_with(
        w,
        &leaf,
        &[
            "join",
            "--name",
            "unreachable",
            "--leaf-server",
            "https://127.0.0.1:1",
            "--timeout",
            "40s",
        ],
    );
    assert_ne!(out.status.code(), Some(0), "{}", shown(&out));
    let said = text(&out.stderr);
    assert!(
        said.contains("the leaf's Node was not Ready within 40 s: LeafUnreachable:"),
        "{}",
        shown(&out)
    );

    // A node name leaf-1's Secret holds: refused at once, relaylet's reason on the last line.
    let out = joined_with(
        w,
        &leaf,
        &[
            "join",
            "--name",
            "unreachable",
            "--node-name",
            "relaylet-leaf-1",
            "--timeout",
            "120s",
        ],
    );
    assert_ne!(out.status.code(), Some(0), "{}", shown(&out));
    let last = text(&out.stderr)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(
        last.starts_with(
            "relaylet: relaylet refused the leaf Secret: SecretRefusedNodeNameTaken: node name \"relaylet-leaf-1\" is already used by"
        ),
        "{}",
        shown(&out)
    );
    let out = joined_with(
        w,
        &leaf,
        &[
            "unjoin",
            "--name",
            "unreachable",
            "--node-name",
            "relaylet-unreachable",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    w.wait_for_node_ready(&virtual_node("leaf-1"));
}

/// A root pod `namespace/name` bound to `node`, once relaylet made its copy in `leaf`.
fn root_pod_runs_in(w: &World, leaf: &ControlPlane, namespace: &str, name: &str, node: &str) {
    w.root.kubectl_stdin_ok(
        &["apply", "-f", "-"],
        Some(&demo_pod(namespace, name, node, None)),
    );
    eventually(
        &format!("the copy of {namespace}/{name} in the leaf"),
        || exists(leaf, &["pod", "-n", namespace, name]),
    );
}

/// Whether relaylet's leaf ServiceAccount may `verb` `resource` in `namespace` of `leaf`.
fn leaf_may(leaf: &ControlPlane, verb: &str, resource: &str, namespace: &str) -> bool {
    // `can-i` exits 1 for "no".
    let out = Command::new(support::realk8s::harness::kubectl_path())
        .args(["auth", "can-i", verb, resource, "-n", namespace])
        .args(["--as", "system:serviceaccount:relaylet:relaylet-leaf"])
        .env("KUBECONFIG", &leaf.admin_kubeconfig)
        .output()
        .expect("kubectl runs");
    text(&out.stdout).trim() == "yes"
}

#[test]
fn join_with_namespaced_access_grants_streams_only_there_and_narrows_an_earlier_full_join() {
    let w = world();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let leaf = unregistered_leaf(w, "scoped");
    let node = virtual_node("scoped");
    leaf.kubectl_ok(&["create", "namespace", "team-a"]);

    // A namespace the leaf lacks: refused before anything is written.
    let out = joined_with(
        w,
        &leaf,
        &[
            "join",
            "--name",
            "scoped",
            "--access",
            "namespaced",
            "--access-namespaces",
            "team-a,team-b",
        ],
    );
    assert_ne!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(
        text(&out.stderr).contains("namespace team-b does not exist in the leaf: create it first"),
        "{}",
        shown(&out)
    );
    assert!(!exists(&leaf, &["namespace", "relaylet"]));

    // Full access first, as the default join gives.
    let out = joined_with(w, &leaf, &["join", "--name", "scoped", "--timeout", "120s"]);
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(leaf_may(&leaf, "create", "pods/exec", "default"));

    // Joined again with namespaced access: the cluster-wide grant goes, team-a keeps it.
    let out = joined_with(
        w,
        &leaf,
        &[
            "join",
            "--name",
            "scoped",
            "--access",
            "namespaced",
            "--access-namespaces",
            "team-a",
            "--timeout",
            "120s",
        ],
    );
    eprintln!("{}", shown(&out));
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let said = text(&out.stderr);
    assert!(
        said.contains("RoleBinding/relaylet-leaf-streams")
            && said.contains("removed what the access asked for does not grant: ")
            && said.contains("ClusterRoleBinding/relaylet-leaf"),
        "{said}"
    );
    assert!(!exists(&leaf, &["clusterrolebinding", "relaylet-leaf"]));
    assert!(leaf_may(&leaf, "create", "pods/exec", "team-a"));
    assert!(!leaf_may(&leaf, "create", "pods/exec", "default"));
    assert!(!leaf_may(&leaf, "create", "pods", "default"));
    assert!(
        leaf_may(&leaf, "list", "pods", "default"),
        "the reads stay cluster-wide"
    );
    assert_eq!(node_ready(w, &node), "True");

    // relaylet runs a root pod of team-a there.
    w.root.kubectl_ok(&["create", "namespace", "team-a"]);
    root_pod_runs_in(w, &leaf, "team-a", "scoped-app", &node);

    let out = joined_with(
        w,
        &leaf,
        &["unjoin", "--name", "scoped", "--timeout", "180s"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    assert!(!exists(
        &leaf,
        &["rolebinding", "-n", "team-a", "relaylet-leaf-streams"]
    ));
    for role in ["relaylet-leaf-read", "relaylet-leaf-streams"] {
        assert!(!exists(&leaf, &["clusterrole", role]), "{role}");
    }
    assert!(!exists(
        &leaf,
        &["clusterrolebinding", "relaylet-leaf-read"]
    ));
    assert!(!exists(&leaf, &["pod", "-n", "team-a", "scoped-app"]));
    w.root
        .kubectl_ok(&["delete", "namespace", "team-a", "--wait=false"]);
    w.wait_for_node_ready(&virtual_node("leaf-1"));
}

/// The row of `secret`'s `status.<field>`, read with kubectl.
fn row_field(w: &World, secret: &str, field: &str) -> String {
    w.root.kubectl_ok(&[
        "get",
        "leafcluster",
        "-n",
        RELAYLET_NAMESPACE,
        secret,
        "-o",
        &format!("jsonpath={{.status.{field}}}"),
    ])
}

#[test]
fn relaylet_renews_a_short_lived_leaf_token_before_it_expires_and_sessions_carry_on() {
    let w = world();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let leaf = unregistered_leaf(w, "renewed");
    let node = virtual_node("renewed");
    let secret = "relaylet-leaf-renewed";
    let out = joined_with(
        w,
        &leaf,
        &[
            "join",
            "--name",
            "renewed",
            "--token-duration",
            "10m",
            "--timeout",
            "120s",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
    let first_expiry = row_field(w, secret, "credentialExpires");
    assert!(
        !first_expiry.is_empty(),
        "the row shows when the token expires"
    );
    let secret_token = || {
        w.root.kubectl_ok(&[
            "get",
            "secret",
            "-n",
            RELAYLET_NAMESPACE,
            secret,
            "-o",
            "jsonpath={.data.kubeconfig}",
        ])
    };
    let first_secret = secret_token();

    // A session through the leaf before the renewal: it must carry on after it.
    w.root.kubectl_stdin_ok(
        &["apply", "-f", "-"],
        Some(&demo_pod("default", "renewed-app", &node, None)),
    );
    eventually("the pod Running in the root", || {
        w.root.kubectl_ok(&[
            "get",
            "pod",
            "-n",
            "default",
            "renewed-app",
            "-o",
            "jsonpath={.status.phase}",
        ]) == "Running"
    });
    let mut logs = Command::new(support::realk8s::harness::kubectl_path())
        .args(["logs", "-f", "-n", "default", "renewed-app"])
        .env("KUBECONFIG", &w.root.admin_kubeconfig)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl logs -f");
    let lines = std::sync::Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        let stdout = logs.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                lines.lock().unwrap().push(line);
            }
        })
    };
    eventually("the log stream's first line", || {
        !lines.lock().unwrap().is_empty()
    });

    // Renewed 30 s after the token was issued: a new token in the Secret, a later expiry on
    // the row, the Node Ready throughout.
    let renewed_expiry = support::eventually_some("the renewed token's expiry on the row", || {
        let now = row_field(w, secret, "credentialExpires");
        (!now.is_empty() && now != first_expiry).then_some(now)
    });
    assert!(
        renewed_expiry > first_expiry,
        "{renewed_expiry} after {first_expiry}"
    );
    assert_ne!(
        secret_token(),
        first_secret,
        "the Secret holds the new token"
    );
    assert_ne!(row_field(w, secret, "reason"), "CredentialRenewalFailed");
    let seen = lines.lock().unwrap().len();
    eventually("log lines after the renewal on the same stream", || {
        lines.lock().unwrap().len() > seen + 2
    });
    assert!(
        logs.try_wait().expect("kubectl").is_none(),
        "the stream is still open"
    );
    assert_eq!(node_ready(w, &node), "True");
    let _ = logs.kill();
    let _ = reader.join();

    let out = joined_with(
        w,
        &leaf,
        &["unjoin", "--name", "renewed", "--timeout", "180s"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", shown(&out));
}

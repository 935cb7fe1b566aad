//! The chart as a restricted platform runs it, on a real root node (the image built from the
//! Dockerfile, `helm install` from `charts/relaylet`, the real kubelet and containerd, as
//! `node_chart.rs`): OpenShift's restricted-v2 SCC refuses the chart's fixed UID, so the
//! release removes it with the values `ci/openshift-values.yaml` gives (null removes a key),
//! one extra container runs beside relaylet (`extraContainers`), and then the UID, GID and
//! fsGroup are assigned to the pod from outside the chart, as the SCC's admission assigns them
//! (an arbitrary high UID no image knows). relaylet must run as that UID and still relay; and
//! `helm test` (the chart's hook, `relaylet check` in the image) must pass, and fail naming the
//! leaf whose Node is not Ready.

use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use relaylet_dev::testkit as support;
use support::realk8s::harness::K8s;
use support::realk8s::world::{RELAYLET_NAMESPACE, ROOT_NODE, Setup, World, virtual_node};
use support::{shown, text};

/// The UID (and GID, fsGroup) the test assigns, as restricted-v2 assigns the first of a
/// namespace's `openshift.io/sa.scc.uid-range` (e.g. 1000650000/10000).
const ASSIGNED: u32 = 1_000_650_000;
/// What `ci/openshift-values.yaml` removes, as `--set` pairs (checked against the file below).
const OPENSHIFT: [&str; 5] = [
    "podSecurityContext.runAsUser=null",
    "podSecurityContext.runAsGroup=null",
    "podSecurityContext.fsGroup=null",
    "securityContext.runAsUser=null",
    "securityContext.runAsGroup=null",
];
/// relaylet's pods (not the test hook, which carries no instance label).
const RELAYLET_PODS: &str = "app.kubernetes.io/name=relaylet,app.kubernetes.io/instance=relaylet";

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        const VALUES: &[&str] = &[
            OPENSHIFT[0],
            OPENSHIFT[1],
            OPENSHIFT[2],
            OPENSHIFT[3],
            OPENSHIFT[4],
            // The sidecar: the node's pause image (its user is the numeric 65535, so it runs
            // under runAsNonRoot before a UID is assigned), hardened as the SCC asks.
            "extraContainers[0].name=sidecar",
            "extraContainers[0].image=localhost/pause:relaylet",
            "extraContainers[0].imagePullPolicy=Never",
            "extraContainers[0].securityContext.allowPrivilegeEscalation=false",
            "extraContainers[0].securityContext.readOnlyRootFilesystem=true",
            "extraContainers[0].securityContext.capabilities.drop={ALL}",
            // The failing run waits this long for the unready leaf before it fails.
            "helmTest.timeout=20s",
            // OpenShift's order (InternalIP only, docs/install.md): the root apiserver reaches
            // the real root node's kubelet (`helm test --logs`) at its address, not its name.
            "nodeServer.preferredAddressType=InternalIP",
        ];
        let w = World::start(Setup {
            leaves: &["leaf-1"],
            replicas: 0,
            helm_replicas: 1,
            chart_values: VALUES,
            root_address_order: "InternalIP,ExternalIP,Hostname",
            root_version: K8s::V1_35,
            leaf_version: K8s::V1_35,
            ..Setup::default()
        });
        w.sync_pod("leaf-1", "default", "demo");
        w
    })
}

/// The tests change the release (a rollout, a leaf Secret): one at a time.
static TURN: Mutex<()> = Mutex::new(());

/// `kubectl get <args> -o jsonpath=<path>` in the root, trimmed.
fn root_get(w: &World, args: &[&str], path: &str) -> String {
    let jsonpath = format!("jsonpath={path}");
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", &jsonpath]);
    w.root.kubectl_ok(&all).trim().to_string()
}

/// relaylet's one Running pod that is not being deleted: (name, IP).
fn relaylet_pod(w: &World) -> (String, String) {
    let mut last = String::new();
    for _ in 0..300 {
        last = root_get(
            w,
            &["pods", "-n", RELAYLET_NAMESPACE, "-l", RELAYLET_PODS],
            "{range .items[*]}{.metadata.name} {.status.podIP} {.status.phase} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        );
        let live: Vec<Vec<&str>> = last
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .collect();
        if let [pod] = live.as_slice()
            && let [name, ip, "Running"] = pod.as_slice()
        {
            return (name.to_string(), ip.to_string());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("not one live relaylet pod: {last}");
}

/// Waits until `node` is Ready with `ip` (relaylet's pod) as its first address.
fn wait_node_on(w: &World, node: &str, ip: &str) {
    let mut last = String::new();
    for _ in 0..300 {
        last = root_get(
            w,
            &["node", node],
            "{.status.addresses[0].address} {.status.conditions[?(@.type==\"Ready\")].status}",
        );
        if last == format!("{ip} True") {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{node} is not Ready at {ip}: {last}");
}

/// The host's view of a container's main process, found by its container ID in the cgroup
/// paths (the node's pods are this machine's processes): its `/proc/<pid>/status`.
fn process_status(container_id: &str, binary: &str) -> String {
    let id = container_id
        .rsplit("://")
        .next()
        .expect("a containerd:// ID");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc") {
        let dir = entry.expect("a /proc entry").path();
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        if !read("cgroup").contains(id) {
            continue;
        }
        let cmdline = read("cmdline").replace('\0', " ");
        seen.push(cmdline.clone());
        if cmdline.starts_with(binary) {
            return read("status");
        }
    }
    panic!("no process {binary} in container {id}; its processes: {seen:?}");
}

/// A `/proc/<pid>/status` field's values (`Uid:` real, effective, saved, filesystem).
fn status_ids(status: &str, field: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"))
        .split_whitespace()
        .map(|n| n.parse().expect("a number"))
        .collect()
}

/// The release as OpenShift runs it. Installed with the UID removed: the Deployment has none
/// (pod or container), and relaylet runs as the image's own user. Then the UID, GID and fsGroup
/// are assigned to the pod as restricted-v2's admission assigns them: relaylet's process runs as
/// that UID (read from the kernel, `/proc/<pid>/status` on this machine), the pod is Ready with
/// both containers running, its IP is the virtual Node's address, and `kubectl exec` through it
/// reaches the leaf pod.
#[test]
fn an_assigned_uid_and_a_sidecar_run_and_relay() {
    let w = world();
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    // The values this world was installed with are exactly what the ci file removes.
    let file = std::fs::read_to_string(
        support::realk8s::world::repo().join("charts/relaylet/ci/openshift-values.yaml"),
    )
    .expect("ci/openshift-values.yaml");
    let file: serde_json::Value = serde_saphyr::from_str(&file).expect("it parses");
    let mut removed: Vec<String> = Vec::new();
    for (section, keys) in file.as_object().expect("a map") {
        for (key, value) in keys.as_object().expect("a map") {
            assert!(value.is_null(), "{section}.{key} removes");
            removed.push(format!("{section}.{key}=null"));
        }
    }
    removed.sort();
    let mut ours: Vec<String> = OPENSHIFT.iter().map(|s| s.to_string()).collect();
    ours.sort();
    assert_eq!(
        removed, ours,
        "the world removes what ci/openshift-values.yaml removes"
    );

    let template = root_get(
        w,
        &["deployment", "relaylet", "-n", RELAYLET_NAMESPACE],
        "{.spec.template.spec.securityContext} {.spec.template.spec.containers[*].securityContext}",
    );
    for field in ["runAsUser", "runAsGroup", "fsGroup"] {
        assert!(!template.contains(field), "{field} installed: {template}");
    }
    assert!(template.contains("\"runAsNonRoot\":true"), "{template}");
    w.wait_for_rollout();
    let (pod, _) = relaylet_pod(w);
    let id = root_get(
        w,
        &["pod", &pod, "-n", RELAYLET_NAMESPACE],
        "{.status.containerStatuses[?(@.name==\"relaylet\")].containerID}",
    );
    let status = process_status(&id, "/usr/local/bin/relaylet serve");
    assert_eq!(
        status_ids(&status, "Uid:"),
        [65532; 4],
        "no UID given: the image's user"
    );

    // What restricted-v2's admission writes into the pod: its UID, GID and fsGroup.
    let assigned = format!(
        r#"{{"spec":{{"template":{{"spec":{{"securityContext":{{"runAsUser":{ASSIGNED},"runAsGroup":{ASSIGNED},"fsGroup":{ASSIGNED}}}}}}}}}}}"#
    );
    w.root.kubectl_ok(&[
        "patch",
        "deployment",
        "relaylet",
        "-n",
        RELAYLET_NAMESPACE,
        "--type=strategic",
        "-p",
        &assigned,
    ]);
    w.wait_for_rollout();
    let (pod, ip) = relaylet_pod(w);
    let containers = root_get(
        w,
        &["pod", &pod, "-n", RELAYLET_NAMESPACE],
        "{.spec.nodeName} {.status.conditions[?(@.type==\"Ready\")].status}{range .status.containerStatuses[*]} {.name}:{.ready}:{.restartCount}:{.state.running.startedAt}{end}",
    );
    let fields: Vec<&str> = containers.split_whitespace().collect();
    assert_eq!(
        fields.get(..2),
        Some(&[ROOT_NODE, "True"][..]),
        "{containers}"
    );
    let mut names: Vec<&str> = Vec::new();
    for status in &fields[2..] {
        let parts: Vec<&str> = status.splitn(4, ':').collect();
        assert!(
            matches!(parts.as_slice(), [_, "true", "0", started] if !started.is_empty()),
            "running, ready, never restarted: {containers}"
        );
        names.push(parts[0]);
    }
    names.sort();
    assert_eq!(names, ["relaylet", "sidecar"], "{containers}");

    let id = root_get(
        w,
        &["pod", &pod, "-n", RELAYLET_NAMESPACE],
        "{.status.containerStatuses[?(@.name==\"relaylet\")].containerID}",
    );
    let status = process_status(&id, "/usr/local/bin/relaylet serve");
    assert_eq!(status_ids(&status, "Uid:"), [ASSIGNED; 4], "{status}");
    assert_eq!(status_ids(&status, "Gid:"), [ASSIGNED; 4], "{status}");
    assert!(
        status_ids(&status, "Groups:").contains(&ASSIGNED),
        "fsGroup is a supplementary group: {status}"
    );
    let sidecar = root_get(
        w,
        &["pod", &pod, "-n", RELAYLET_NAMESPACE],
        "{.status.containerStatuses[?(@.name==\"sidecar\")].containerID}",
    );
    let status = process_status(&sidecar, "/pause");
    assert_eq!(status_ids(&status, "Uid:"), [ASSIGNED; 4], "{status}");
    eprintln!("relaylet pod {pod} at {ip}: uid {ASSIGNED}, containers {names:?}");

    // The Node is served from this pod, and a session through it reaches the leaf pod.
    wait_node_on(w, &virtual_node("leaf-1"), &ip);
    let k = support::kubectl("1.35");
    support::realk8s::websocket_calls::exec_with_stdin_stderr_and_exit_code(w, &k, "demo");
}

/// A leaf Secret relaylet refuses: its kubeconfig's user names an exec plugin.
const REFUSED_SECRET: &str = r#"apiVersion: v1
kind: Secret
metadata:
  name: relaylet-leaf-refused
  namespace: relaylet
  labels:
    relaylet.io/leaf-cluster: refused
stringData:
  kubeconfig: |
    apiVersion: v1
    kind: Config
    clusters:
    - name: c
      cluster:
        server: https://127.0.0.1:1
    users:
    - name: u
      user:
        exec:
          apiVersion: client.authentication.k8s.io/v1
          command: /bin/true
    contexts:
    - name: c
      context:
        cluster: c
        user: u
    current-context: c
"#;

/// `helm test <release>`: its output and exit status.
fn helm_test(w: &World) -> Output {
    let helm = relaylet_sim::tools::helm().expect("helm: run tests/tools/install.sh");
    Command::new(helm)
        .args([
            "test",
            "relaylet",
            "--namespace",
            RELAYLET_NAMESPACE,
            "--logs",
            "--timeout",
            "3m",
        ])
        .env("KUBECONFIG", &w.root.admin_kubeconfig)
        .output()
        .expect("helm runs")
}

/// `helm test` runs the chart's hook (`relaylet check` in the image, with the release's
/// ServiceAccount and securityContexts): it passes with the check's lines in its log; with a
/// leaf Secret whose apiserver relaylet's pod cannot reach and one relaylet refuses, it fails,
/// its log (the failed pod is kept) naming the first leaf and its Node's condition, and the
/// second with the refusal its LeafCluster row holds, while the good leaf still passes; with both Secrets
/// gone it passes again.
#[test]
fn helm_test_passes_and_fails_naming_the_leaf_that_is_not_ready() {
    let w = world();
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    w.wait_for_rollout();
    let (_, ip) = relaylet_pod(w);
    wait_node_on(w, &virtual_node("leaf-1"), &ip);

    let started = std::time::Instant::now();
    let out = helm_test(w);
    eprintln!(
        "helm test (passing) in {:?}:\n{}",
        started.elapsed(),
        shown(&out)
    );
    assert!(out.status.success(), "{}", shown(&out));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("relaylet-test"), "the hook ran: {stdout}");
    assert!(stdout.contains("Succeeded"), "{stdout}");
    for line in [
        "ok   relaylet pods: 1 of 1 Ready (app.kubernetes.io/name=relaylet,app.kubernetes.io/instance=relaylet in namespace relaylet)",
        "ok   leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): Ready",
        "relaylet check: all 2 checks passed",
    ] {
        assert!(stdout.contains(line), "{line:?} in the log: {stdout}");
    }

    // A leaf whose apiserver relaylet's pod cannot reach (its own loopback, nothing listens):
    // relaylet makes its Node, NotReady.
    w.register_leaf(
        "leaf-1",
        "gone",
        &[
            "--leaf-server".to_string(),
            "https://127.0.0.1:1".to_string(),
        ],
    );
    let mut ready = String::new();
    for _ in 0..300 {
        ready = w.node_ready(&virtual_node("gone"));
        if ready == "False" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(ready, "False", "relaylet-gone is made, NotReady");
    // And a Secret relaylet refuses (its kubeconfig names an exec plugin): no Node, a Warning
    // Event on the Secret, which the hook reads (the chart lets its ServiceAccount list them).
    w.root
        .kubectl_stdin_ok(&["apply", "-f", "-"], Some(REFUSED_SECRET));
    let mut events = String::new();
    for _ in 0..300 {
        events = root_get(
            w,
            &[
                "events.v1.events.k8s.io",
                "-n",
                RELAYLET_NAMESPACE,
                "--field-selector",
                "reason=LeafSecretRefused",
            ],
            "{.items[?(@.regarding.name==\"relaylet-leaf-refused\")].note}",
        );
        if !events.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        events.contains("exec is not allowed"),
        "refused: {events:?}"
    );
    let started = std::time::Instant::now();
    let out = helm_test(w);
    eprintln!(
        "helm test (failing) in {:?}:\n{}",
        started.elapsed(),
        shown(&out)
    );
    assert!(!out.status.success(), "{}", shown(&out));
    assert!(
        text(&out.stderr).contains("relaylet-test"),
        "{}",
        shown(&out)
    );
    assert!(
        text(&out.stdout)
            .contains("FAIL leaf gone (Secret relaylet-leaf-gone, Node relaylet-gone)"),
        "helm prints the failed hook's log, naming the leaf: {}",
        shown(&out)
    );
    let log = w
        .root
        .kubectl_ok(&["logs", "relaylet-test", "-n", RELAYLET_NAMESPACE]);
    assert!(
        log.lines().any(|l| l.starts_with(
            "FAIL leaf gone (Secret relaylet-leaf-gone, Node relaylet-gone): not Ready (False): "
        ) && l
            .contains("LeafUnreachable: leaf cluster apiserver is not reachable")),
        "the failed hook's log names the leaf and why: {log}"
    );
    assert!(
        log.contains("ok   leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): Ready"),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.starts_with(
            "FAIL leaf refused (Secret relaylet-leaf-refused, Node relaylet-refused): no Node; relaylet refused the Secret: SecretRefused"
        ) && l.contains(": kubeconfig user \"u\": exec is not allowed")),
        "the refusal on the Secret's LeafCluster row, read by the hook: {log}"
    );
    assert!(log.contains("check: 2 of 4 checks failed"), "{log}");
    let phase = root_get(
        w,
        &["pod", "relaylet-test", "-n", RELAYLET_NAMESPACE],
        "{.status.phase}",
    );
    assert_eq!(phase, "Failed", "a failed hook's pod is kept");

    w.root.kubectl_ok(&[
        "delete",
        "secret",
        "relaylet-leaf-refused",
        "relaylet-leaf-gone",
        "-n",
        RELAYLET_NAMESPACE,
    ]);
    let out = helm_test(w);
    assert!(out.status.success(), "without the leaf: {}", shown(&out));
}

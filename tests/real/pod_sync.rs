//! Pods that run, as they ship: relaylet installed by the chart from the image (two replicas on
//! a real root node), a real leaf whose node is the real kubelet with containerd, a real
//! kube-scheduler and controller-manager on both sides. Workloads a user writes in the root run
//! in the leaf's containers: a Deployment with an init container, a ConfigMap volume and a
//! Secret env becomes Running and Ready, `kubectl exec` and `logs -f` reach its pods, scaling
//! down deletes their copies, a deleted pod gets SIGTERM within its grace before the root pod
//! goes, a container that crashes shows its restarts, a copy deleted in the leaf fails its root
//! pod and the ReplicaSet replaces it, a Job completes, host access is refused, a ConfigMap's
//! change reaches its mounted file and the leaf's Events show on the root pod, a pod asks the
//! root apiserver who it is with the token it was given and is told its own service account
//! (podSync.rootApiserver), `kubectl debug -i` attaches to the container relaylet added to the
//! copy, and killing the replica that serves the Node during a rollout leaves no duplicate and
//! no orphan in the leaf.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use relaylet_dev::testkit as support;
use support::realk8s::harness::K8s;
use support::realk8s::real_node::BUSYBOX_IMAGE;
use support::realk8s::world::{RELAYLET_NAMESPACE, Setup, World, virtual_node};
use support::{Run, describe, eventually, text};

const LEAF: &str = "leaf-1";

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        World::start(Setup {
            leaves: &[LEAF],
            real_node_leaves: &[LEAF],
            replicas: 0,
            helm_replicas: 2,
            pod_sync: true,
            pod_root_apiserver: true,
            root_version: K8s::V1_35,
            leaf_version: K8s::V1_35,
            ..Setup::default()
        })
    })
}

/// The tests that change relaylet's pods or count the leaf's take the world alone.
static ALONE: Mutex<()> = Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a workload's pods look like: placed on the virtual node (its label and taint), a
/// busybox container that logs a tick a second and says when it gets SIGTERM.
fn template(labels: &str, extra: &str) -> String {
    format!(
        r#"    metadata:
      labels: {{{labels}}}
    spec:
      nodeSelector: {{type: virtual-kubelet}}
      tolerations: [{{key: virtual-kubelet.io/provider, operator: Exists, effect: NoSchedule}}]
      terminationGracePeriodSeconds: 20
{extra}"#
    )
}

fn busybox(script: &str) -> String {
    format!(
        r#"        - name: main
          image: {BUSYBOX_IMAGE}
          imagePullPolicy: Never
          command: [sh, -c, "{script}"]
"#
    )
}

const TICKS: &str = "trap 'echo got TERM; exit 0' TERM; i=0; while true; do echo tick $i; i=$((i+1)); sleep 1 & wait $!; done";

/// The Deployment: an init container writes a file the main container reads and its readiness
/// probe checks.
fn deployment(name: &str, replicas: u32) -> String {
    configured_deployment(name, replicas, "", "")
}

/// [`deployment`], its main container also given `env` and `mounts` (YAML list items at the
/// container's indentation) and the pod `volumes`.
fn configured_deployment(name: &str, replicas: u32, env: &str, volumes: &str) -> String {
    let script = format!("cat /work/init; {TICKS}");
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
{}"#,
        template(
            &format!("app: {name}"),
            &format!(
                r#"      initContainers:
        - name: init
          image: {BUSYBOX_IMAGE}
          imagePullPolicy: Never
          command: [sh, -c, "echo initialized > /work/init"]
          volumeMounts: [{{name: work, mountPath: /work}}]
      containers:
{}          volumeMounts: [{{name: work, mountPath: /work}}{mounts}]
          readinessProbe: {{exec: {{command: [cat, /work/init]}}, periodSeconds: 1}}
{env}      volumes: [{{name: work, emptyDir: {{}}}}{volumes}]
"#,
                busybox(&script),
                mounts = if volumes.is_empty() {
                    ""
                } else {
                    ", {name: config, mountPath: /config}"
                },
            )
        )
    )
}

/// `kubectl get <what> -o jsonpath=<path>` in the root (or, with `leaf`, in the leaf).
fn get(w: &World, leaf: bool, args: &[&str], path: &str) -> String {
    let jsonpath = format!("jsonpath={path}");
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", &jsonpath]);
    let plane = if leaf { w.leaf(LEAF) } else { &w.root };
    plane.kubectl_ok(&all).trim().to_string()
}

/// The pods with label `selector` in the root: (name, uid, phase, ready) per pod not being
/// deleted.
fn root_pods(w: &World, selector: &str) -> Vec<(String, String, String, String)> {
    get(
        w,
        false,
        &["pods", "-l", selector],
        "{range .items[*]}{.metadata.name} {.metadata.uid} {.status.phase} {.status.conditions[?(@.type==\"Ready\")].status} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    )
    .lines()
    .filter_map(|l| {
        let p: Vec<&str> = l.split_whitespace().collect();
        (p.len() == 4).then(|| (p[0].into(), p[1].into(), p[2].into(), p[3].into()))
    })
    .collect()
}

/// relaylet's copies in the leaf: (name, the root pod UID it stands for, its node, its first
/// container's ID).
fn copies(w: &World, selector: &str) -> Vec<(String, String, String, String)> {
    let selector = format!("relaylet.io/node={},{selector}", virtual_node(LEAF));
    get(
        w,
        true,
        &["pods", "-l", &selector],
        "{range .items[*]}{.metadata.name} {.metadata.annotations.relaylet\\.io/root-pod-uid} {.spec.nodeName} {.status.containerStatuses[0].containerID}{\"\\n\"}{end}",
    )
    .lines()
    .map(|l| {
        let p: Vec<&str> = l.split_whitespace().collect();
        let at = |i: usize| p.get(i).copied().unwrap_or_default().to_string();
        (at(0), at(1), at(2), at(3))
    })
    .collect()
}

#[test]
fn a_deployment_runs_in_the_leafs_containers_and_kubectl_reaches_it() {
    let w = world();
    let _alone = alone();
    w.root.kubectl_ok(&[
        "create",
        "configmap",
        "web-config",
        "--from-literal=greeting=hello",
    ]);
    w.root.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "web-secret",
        "--from-literal=password=s3cret",
    ]);
    let env = "          env: [{name: PASSWORD, valueFrom: {secretKeyRef: {name: web-secret, key: password}}}]\n";
    let volumes = ", {name: config, configMap: {name: web-config}}";
    w.root.kubectl_stdin_ok(
        &["apply", "-f", "-"],
        Some(&configured_deployment("web", 3, env, volumes)),
    );
    eventually("three pods Running and Ready in the root", || {
        let pods = root_pods(w, "app=web");
        pods.len() == 3 && pods.iter().all(|p| p.2 == "Running" && p.3 == "True")
    });
    // Each runs in a real container on the real leaf node, as its root pod's copy.
    let roots: BTreeSet<(String, String)> = root_pods(w, "app=web")
        .into_iter()
        .map(|p| (p.0, p.1))
        .collect();
    let leaf: Vec<_> = copies(w, "app=web");
    assert_eq!(
        leaf.iter()
            .map(|c| (c.0.clone(), c.1.clone()))
            .collect::<BTreeSet<_>>(),
        roots,
        "one copy per root pod, marked with its UID"
    );
    for (name, _, node, container) in &leaf {
        assert_eq!(node, "leaf-1-node", "{name}");
        assert!(
            container.starts_with("containerd://"),
            "{name}: {container}"
        );
    }

    let k = support::kubectl("1.35");
    let kubeconfig = w.root_kubeconfig();
    let pod = roots.iter().next().unwrap().0.clone();
    let out = Run::new(&k, kubeconfig, &["exec", &pod, "--", "cat", "/work/init"]).output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(
        text(&out.stdout),
        "initialized\n",
        "the init container ran first"
    );
    // The ConfigMap volume and the Secret env, copied from the root.
    let out = Run::new(
        &k,
        kubeconfig,
        &[
            "exec",
            &pod,
            "--",
            "sh",
            "-c",
            "cat /config/greeting; echo \" $PASSWORD\"",
        ],
    )
    .output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(text(&out.stdout), "hello s3cret\n");

    // logs -f follows the container through the root, relaylet and the leaf.
    let mut follow = std::process::Command::new(&k.path)
        .args(["logs", "-f", &pod])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let first_tick = lines
        .find_map(|l| l.ok().filter(|l| l.starts_with("tick ")))
        .expect("a tick");
    let next = lines.next().unwrap().unwrap();
    assert!(next.starts_with("tick "), "{first_tick} then {next}");
    let _ = follow.kill();
    let _ = follow.wait();

    // Scaling down deletes the surplus copies in the leaf.
    w.root
        .kubectl_ok(&["scale", "deployment", "web", "--replicas=1"]);
    eventually("one pod left in the root and one copy in the leaf", || {
        root_pods(w, "app=web").len() == 1 && copies(w, "app=web").len() == 1
    });
    w.root
        .kubectl_ok(&["delete", "deployment", "web", "--wait=true"]);
    eventually("no copy left", || copies(w, "app=web").is_empty());
    w.root
        .kubectl_ok(&["delete", "configmap/web-config", "secret/web-secret"]);
}

/// A pod reading a ConfigMap (a mounted volume) and a Secret (an env var) from the root.
fn configured(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  tolerations: [{{key: virtual-kubelet.io/provider, operator: Exists, effect: NoSchedule}}]
  terminationGracePeriodSeconds: 1
  containers:
{container}          env:
            - name: PASSWORD
              valueFrom: {{secretKeyRef: {{name: {name}-secret, key: password}}}}
          volumeMounts: [{{name: config, mountPath: /config}}]
  volumes: [{{name: config, configMap: {{name: {name}-config}}}}]
"#,
        node = virtual_node(LEAF),
        container = busybox("sleep 3600"),
    )
}

#[test]
fn the_config_maps_and_secrets_a_pod_names_reach_its_container_and_follow_the_root() {
    let w = world();
    w.root.kubectl_ok(&[
        "create",
        "configmap",
        "files-config",
        "--from-literal=greeting=hello",
    ]);
    w.root.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "files-secret",
        "--from-literal=password=s3cret",
    ]);
    w.root
        .kubectl_stdin_ok(&["apply", "-f", "-"], Some(&configured("files")));
    eventually("the pod Running", || {
        get(w, false, &["pod", "files"], "{.status.phase}") == "Running"
    });
    let k = support::kubectl("1.35");
    let kubeconfig = w.root_kubeconfig();
    let exec = |script: &str| {
        let out = Run::new(&k, kubeconfig, &["exec", "files", "--", "sh", "-c", script]).output();
        assert!(out.status.success(), "{}", describe(&k, &out));
        text(&out.stdout)
    };
    assert_eq!(
        exec("cat /config/greeting; echo; echo $PASSWORD"),
        "hello\ns3cret\n"
    );
    // The leaf kubelet's Events about the copy are told on the root pod.
    eventually("the leaf's Started Event on the root pod", || {
        get(
            w,
            false,
            &[
                "events",
                "--field-selector",
                "involvedObject.name=files,reason=Started",
            ],
            "{.items[*].reportingComponent}",
        )
        .contains("relaylet")
    });
    // The leaf kubelet brings a mounted ConfigMap's change into the container (within its sync
    // period, about a minute); relaylet's part is the copy.
    w.root.kubectl_ok(&[
        "patch",
        "configmap",
        "files-config",
        "--type=merge",
        "-p",
        r#"{"data":{"greeting":"changed"}}"#,
    ]);
    support::wait_until(
        "the change in the mounted file",
        Duration::from_secs(240),
        || exec("cat /config/greeting") == "changed",
    );
    // The pod gone, its copies go; the root's objects stay.
    w.root
        .kubectl_ok(&["delete", "pod", "files", "--wait=true"]);
    eventually("the copies deleted in the leaf", || {
        get(
            w,
            true,
            &["configmaps,secrets", "-l", "relaylet.io/owner"],
            "{.items[*].metadata.name}",
        )
        .split_whitespace()
        .all(|name| !name.starts_with("files-"))
    });
    assert_eq!(
        get(w, false, &["configmap", "files-config"], "{.data.greeting}"),
        "changed"
    );
    w.root.kubectl_ok(&["delete", "configmap", "files-config"]);
    w.root.kubectl_ok(&["delete", "secret", "files-secret"]);
}

/// Creates pod `name` in the root's `default` namespace, bound to the virtual Node, with a
/// busybox container that sleeps; waits until it is Running.
fn running_pod(w: &World, name: &str) {
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
{container}"#,
        node = virtual_node(LEAF),
        container = busybox("sleep 3600"),
    );
    w.root
        .kubectl_stdin_ok(&["apply", "-f", "-"], Some(&manifest));
    eventually("the pod Running", || {
        get(w, false, &["pod", name], "{.status.phase}") == "Running"
    });
}

#[test]
fn a_pod_in_the_leaf_talks_to_the_root_apiserver_as_itself() {
    use base64::Engine;
    let w = world();
    running_pod(w, "whoami");
    let k = support::kubectl("1.35");
    let kubeconfig = w.root_kubeconfig();
    let exec = |script: &str| {
        let out = Run::new(
            &k,
            kubeconfig,
            &["exec", "whoami", "--", "sh", "-c", script],
        )
        .output();
        assert!(out.status.success(), "{}", describe(&k, &out));
        text(&out.stdout)
    };
    // What the container was given: the address, the token and the CA. The address is reached
    // from inside the container: busybox has no TLS client that kube-apiserver accepts (its wget
    // fails the handshake), so a plain HTTP request, which Go's TLS server answers itself.
    let host = exec("echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT");
    let host = host.trim();
    let reach = exec(
        "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 10 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT",
    );
    assert!(
        reach.contains("Client sent an HTTP request to an HTTPS server"),
        "{host} from the container: {reach}"
    );
    let token = exec("cat /var/run/secrets/kubernetes.io/serviceaccount/token");
    let ca = exec("cat /var/run/secrets/kubernetes.io/serviceaccount/ca.crt");
    // Asked with exactly those: the CA verifies the apiserver at that address, the token says
    // who the pod is.
    let as_the_pod =
        std::env::temp_dir().join(format!("relaylet-whoami-{}.kubeconfig", std::process::id()));
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "root", "cluster": {
            "server": format!("https://{host}"),
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca.as_bytes()),
        }}],
        "users": [{"name": "pod", "user": {"token": token.trim()}}],
        "contexts": [{"name": "pod", "context": {"cluster": "root", "user": "pod"}}],
    });
    std::fs::write(&as_the_pod, config.to_string()).unwrap();
    let out = Run::new(&k, &as_the_pod, &["auth", "whoami", "-o", "json"]).output();
    let _ = std::fs::remove_file(&as_the_pod);
    assert!(out.status.success(), "{}", describe(&k, &out));
    let review: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", describe(&k, &out)));
    let user = &review["status"]["userInfo"];
    assert_eq!(
        user["username"], "system:serviceaccount:default:default",
        "{review}"
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-name"][0], "whoami",
        "bound to its root pod: {review}"
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-uid"][0],
        get(w, false, &["pod", "whoami"], "{.metadata.uid}").as_str(),
        "{review}"
    );
    // The CA it was given is the root's.
    assert_eq!(
        ca.trim(),
        get(
            w,
            false,
            &["configmap", "kube-root-ca.crt"],
            "{.data.ca\\.crt}"
        )
        .trim()
    );
    let uid = get(w, false, &["pod", "whoami"], "{.metadata.uid}");
    let tokens = format!("relaylet.io/tokens-for={uid}");
    assert_eq!(
        get(
            w,
            true,
            &["secrets", "-l", &tokens],
            "{.items[*].metadata.name}"
        ),
        format!("relaylet-token-{uid}")
    );
    w.root
        .kubectl_ok(&["delete", "pod", "whoami", "--wait=true"]);
    eventually("the tokens Secret deleted in the leaf", || {
        get(
            w,
            true,
            &["secrets", "-l", &tokens],
            "{.items[*].metadata.name}",
        )
        .is_empty()
    });
}

/// `kubectl debug -i`: relaylet adds the root pod's ephemeral container to the copy, the leaf's
/// kubelet runs it, its status comes up, and kubectl attaches to it.
#[test]
fn kubectl_debug_adds_a_container_to_the_copy_and_attaches_to_it() {
    use std::io::Write;
    let w = world();
    running_pod(w, "debugged");
    let k = support::kubectl("1.35");
    let image = format!("--image={BUSYBOX_IMAGE}");
    let mut cmd = Run::new(
        &k,
        w.root_kubeconfig(),
        &[
            "debug",
            "debugged",
            "-i",
            &image,
            "--image-pull-policy=Never",
            "-c",
            "dbg",
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
    // The line goes in once kubectl attaches (it says so on stderr), as a user types it once
    // the prompt hint shows: written at once, it raced the ephemeral container's start.
    let (attached_tx, attached) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().expect("stderr");
    let stderr_reader = std::thread::spawn(move || {
        let mut said = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("If you don't see a command prompt") {
                let _ = attached_tx.send(());
            }
            said.push_str(&line);
            said.push('\n');
        }
        said
    });
    let _ = attached.recv_timeout(Duration::from_secs(120));
    stdin.write_all(b"ping\n").expect("stdin");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("kubectl's output");
    drop(stdin);
    if line != "got ping\n" {
        // kubectl says why on stderr (a timeout waiting for the container, an attach refused).
        let _ = child.kill();
        let why = stderr_reader.join().unwrap_or_default();
        panic!("kubectl debug printed {line:?}, not \"got ping\"; its stderr: {why}");
    }
    let status = support::wait_exit(child, Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| s.success()),
        "kubectl debug ended with {status:?}"
    );
    assert!(
        get(
            w,
            true,
            &["pod", "debugged"],
            "{.spec.ephemeralContainers[*].name}"
        )
        .contains("dbg"),
        "the copy has the container"
    );
    w.root
        .kubectl_ok(&["delete", "pod", "debugged", "--wait=false"]);
}

#[test]
fn kubectl_delete_gives_the_container_its_sigterm_before_the_root_pod_goes() {
    let w = world();
    let _alone = alone();
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: graceful, namespace: default, labels: {{app: graceful}}}}\nspec:\n  nodeName: {}\n  terminationGracePeriodSeconds: 20\n  tolerations: [{{operator: Exists}}]\n  containers:\n{}",
        virtual_node(LEAF),
        busybox(TICKS)
    );
    w.root
        .kubectl_stdin_ok(&["apply", "-f", "-"], Some(&manifest));
    eventually("the pod Running", || {
        root_pods(w, "app=graceful")
            .first()
            .is_some_and(|p| p.2 == "Running")
    });
    let k = support::kubectl("1.35");
    let kubeconfig = w.root_kubeconfig();
    // Its log, followed through relaylet, says when the container got SIGTERM.
    let mut follow = std::process::Command::new(&k.path)
        .args(["logs", "-f", "graceful"])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let reader = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_secs(2));
    // While the root pod is deleted, it never outlives its copy.
    let watcher = std::thread::spawn(move || {
        let w = world();
        for _ in 0..600 {
            let root = !root_pods_all(w, "app=graceful").is_empty();
            let leaf = !copies(w, "app=graceful").is_empty();
            assert!(root || !leaf, "the root pod went before its copy");
            if !root && !leaf {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the pod and its copy did not go");
    });
    let mut run = Run::new(
        &k,
        kubeconfig,
        &["delete", "pod", "graceful", "--wait=true"],
    );
    run.timeout = Duration::from_secs(60);
    let out = run.output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    watcher.join().unwrap();
    let _ = follow.wait();
    let logged = reader.join().unwrap();
    assert!(
        logged.iter().any(|l| l == "got TERM"),
        "the container handled SIGTERM within its grace: {logged:?}"
    );
}

/// Every pod with label `selector` in the root, being deleted or not.
fn root_pods_all(w: &World, selector: &str) -> Vec<String> {
    get(
        w,
        false,
        &["pods", "-l", selector],
        "{.items[*].metadata.name}",
    )
    .split_whitespace()
    .map(String::from)
    .collect()
}

#[test]
fn crashes_lost_copies_jobs_and_host_access_say_so_in_the_root() {
    let w = world();
    let _alone = alone();
    let node = virtual_node(LEAF);
    let bare = |name: &str, script: &str, spec: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, labels: {{app: {name}}}}}\nspec:\n  nodeName: {node}\n  tolerations: [{{operator: Exists}}]\n{spec}  containers:\n{}",
            busybox(script)
        )
    };
    w.root.kubectl_stdin_ok(
        &["apply", "-f", "-"],
        Some(&bare("crashes", "sleep 1; exit 3", "")),
    );
    w.root.kubectl_stdin_ok(
        &["apply", "-f", "-"],
        Some(&bare("hostnet", "sleep 600", "  hostNetwork: true\n")),
    );
    w.root.kubectl_stdin_ok(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: once, namespace: default}}\nspec:\n  backoffLimit: 0\n  template:\n{}",
            template("app: once", &format!("      restartPolicy: Never\n      containers:\n{}", busybox("echo done")))
        )),
    );
    w.root
        .kubectl_stdin_ok(&["apply", "-f", "-"], Some(&deployment("replaced", 1)));

    eventually(
        "the crashing container's restarts counted in the root",
        || {
            get(
                w,
                false,
                &["pod", "crashes"],
                "{.status.containerStatuses[0].restartCount}",
            )
            .parse::<i32>()
            .is_ok_and(|n| n >= 1)
        },
    );
    eventually("the host-network pod refused", || {
        get(
            w,
            false,
            &["pod", "hostnet"],
            "{.status.phase} {.status.reason}",
        ) == "Failed HostAccessNotAllowed"
    });
    assert!(copies(w, "app=hostnet").is_empty());
    eventually("the Job complete in the root", || {
        get(
            w,
            false,
            &["job", "once"],
            "{.status.conditions[?(@.type==\"Complete\")].status}",
        ) == "True"
    });

    // A copy deleted in the leaf fails its root pod; the ReplicaSet replaces it.
    eventually("the Deployment's pod Running", || {
        root_pods(w, "app=replaced")
            .first()
            .is_some_and(|p| p.2 == "Running")
    });
    let (first, _, _, _) = root_pods(w, "app=replaced").remove(0);
    w.leaf(LEAF)
        .kubectl_ok(&["delete", "pod", &first, "--grace-period=0", "--force"]);
    eventually("the lost pod Failed, a new one Running", || {
        let reason = get(
            w,
            false,
            &["pod", &first],
            "{.status.phase} {.status.reason}",
        );
        let others: Vec<_> = root_pods(w, "app=replaced")
            .into_iter()
            .filter(|p| p.0 != first && p.2 == "Running")
            .collect();
        reason == "Failed LeafPodGone" && others.len() == 1
    });
    for what in [
        "pod/crashes",
        "pod/hostnet",
        "job/once",
        "deployment/replaced",
    ] {
        w.root.kubectl_ok(&["delete", what, "--wait=false"]);
    }
}

#[test]
fn killing_the_replica_that_serves_the_node_during_a_rollout_leaves_no_duplicate_or_orphan() {
    let w = world();
    let _alone = alone();
    w.root
        .kubectl_stdin_ok(&["apply", "-f", "-"], Some(&deployment("rolling", 3)));
    eventually("three pods Ready", || {
        let pods = root_pods(w, "app=rolling");
        pods.len() == 3 && pods.iter().all(|p| p.3 == "True")
    });
    w.root
        .kubectl_ok(&["rollout", "restart", "deployment/rolling"]);
    let writer = get(
        w,
        false,
        &["node", &virtual_node(LEAF)],
        "{.metadata.annotations.relaylet\\.io/served-by}",
    );
    w.root.kubectl_ok(&[
        "delete",
        "pod",
        &writer,
        "-n",
        RELAYLET_NAMESPACE,
        "--grace-period=0",
        "--force",
    ]);
    w.root
        .kubectl_ok(&["rollout", "status", "deployment/rolling", "--timeout=180s"]);
    // Settled: exactly one copy per root pod, none of a pod that is gone.
    eventually("one copy per root pod and no other", || {
        let roots: BTreeSet<(String, String)> = root_pods(w, "app=rolling")
            .into_iter()
            .map(|p| (p.0, p.1))
            .collect();
        let leaf: Vec<(String, String)> = copies(w, "app=rolling")
            .into_iter()
            .map(|c| (c.0, c.1))
            .collect();
        roots.len() == 3
            && leaf.len() == 3
            && leaf.iter().cloned().collect::<BTreeSet<_>>() == roots
    });
    w.root
        .kubectl_ok(&["delete", "deployment", "rolling", "--wait=true"]);
    w.wait_for_rollout();
}

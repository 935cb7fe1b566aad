//! Issue #27 item 6 on real Kubernetes: leaf tenants cannot forge relaylet's counterpart marker.
//! `deploy/leaf-marker-policy.yaml` (a ValidatingAdmissionPolicy) is applied to a real leaf
//! kube-apiserver with the syncer identity set to the test's syncer stand-in, and a tenant user
//! who may create, patch and delete pods in the mapped namespace tries every way to put the
//! marker on a pod: first without the policy (each way works, and a root user's `kubectl exec`
//! lands in the tenant's pod), then with it (each is refused with the policy's message, while
//! the tenant's other pod writes still pass, and a recreated pod without the marker makes
//! relaylet refuse the exec through the real root apiserver).
//!
//! The leaf also runs `deploy/leaf-rbac-namespaced.yaml` instead of the cluster-wide grant:
//! relaylet streams into the namespace bound for it, and gets the leaf's 403 elsewhere.

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::realk8s::harness::{self, K8s};
use relaylet_dev::testkit::realk8s::{pods, world};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{LazyLock, Mutex, MutexGuard};

use relaylet_sim::tools::Kubectl;
use support::{Run, describe, text};
use world::{Setup, World};

const LEAF: &str = "leaf-1";
/// The mapped namespace (the same name in root and leaf): the tenant writes pods here, and
/// relaylet's streams are bound here.
const NS: &str = "tenant-a";
/// A namespace where relaylet's streams are not bound.
const OTHER: &str = "elsewhere";
/// Who the test's syncer stand-in is: `World::sync_pod` writes the leaf copy with the leaf's
/// admin kubeconfig, whose client certificate says user `admin` (group `system:masters`;
/// admission policies apply to that group too).
const SYNCER: &str = "admin";
const TENANT: &str = "tenant";
const MARKER: &str = relaylet::model::counterpart::ROOT_UID_MARKER;
/// What the tenant's pods carry in env POD, to tell them from synced copies.
const PLANTED: &str = "planted by the tenant";
/// The start of the policy's refusal, as kubectl prints it.
const DENIED: &str = "ValidatingAdmissionPolicy 'relaylet-leaf-marker' with binding 'relaylet-leaf-marker' denied request: only the pod syncer may set, change or remove relaylet's counterpart marker relaylet.io/root-pod-uid (annotation or label) on pods: tenant is not listed in ConfigMap relaylet/relaylet-leaf-marker-syncers";

struct Fixture {
    w: World,
    tenant: PathBuf,
}

fn fixture() -> MutexGuard<'static, Fixture> {
    static FIXTURE: LazyLock<Mutex<Fixture>> = LazyLock::new(|| {
        let w = World::start(Setup {
            root_version: K8s::V1_35,
            leaf_version: K8s::V1_37,
            ..Setup::default()
        });
        for ns in [NS, OTHER] {
            w.root.kubectl_ok(&["create", "namespace", ns]);
            w.leaf(LEAF).kubectl_ok(&["create", "namespace", ns]);
            // The root admits pods only once the controllers made the default ServiceAccount.
            support::eventually(
                &format!("the root's default ServiceAccount in {ns}"),
                || {
                    Command::new(harness::kubectl_path())
                        .args(["get", "serviceaccount", "default", "-n", ns])
                        .env("KUBECONFIG", w.root_kubeconfig())
                        .output()
                        .is_ok_and(|o| o.status.success())
                },
            );
        }
        namespaced_leaf_rbac(&w);
        let leaf = w.leaf(LEAF);
        // The tenant: every pod write in the mapped namespace, the subresources that can
        // change a pod's metadata included, as a namespace admin might have.
        leaf.kubectl_stdin_ok(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: tenant-pods\n  namespace: {NS}\nrules:\n- apiGroups: [\"\"]\n  resources: [pods, pods/status, pods/binding, bindings]\n  verbs: [get, list, watch, create, update, patch, delete]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: tenant-pods\n  namespace: {NS}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: tenant-pods\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: {TENANT}\n"
            )),
        );
        let tenant = leaf.user_kubeconfig(TENANT, &[]);
        Mutex::new(Fixture { w, tenant })
    });
    FIXTURE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The leaf's RBAC as `deploy/leaf-rbac-namespaced.yaml` says to move to it: apply the file,
/// bind the streams role in the mapped namespace, drop `deploy/leaf-rbac.yaml`'s
/// cluster-wide grant (which `World::start` applied).
fn namespaced_leaf_rbac(w: &World) {
    let leaf = w.leaf(LEAF);
    let file = world::repo().join("deploy/leaf-rbac-namespaced.yaml");
    leaf.kubectl_ok(&["apply", "-f", &file.display().to_string()]);
    leaf.kubectl_ok(&[
        "-n",
        NS,
        "create",
        "rolebinding",
        "relaylet-leaf-streams",
        "--clusterrole=relaylet-leaf-streams",
        "--serviceaccount=relaylet:relaylet-leaf",
    ]);
    leaf.kubectl_ok(&["delete", "clusterrolebinding", "relaylet-leaf"]);
}

fn kubectl() -> Kubectl {
    support::kubectl("1.35")
}

/// kubectl 1.35 with `kubeconfig`, feeding `stdin`.
fn kubectl_as(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = Command::new(harness::kubectl_path())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .expect("kubectl stdin");
    drop(input);
    child.wait_with_output().expect("kubectl output")
}

fn show(args: &[&str], out: &Output) -> String {
    format!(
        "kubectl {args:?}: exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// Runs `args` as the tenant in the leaf; asserts it passes.
fn tenant_ok(f: &Fixture, args: &[&str], stdin: Option<&str>) {
    let out = kubectl_as(&f.tenant, args, stdin);
    assert!(out.status.success(), "{}", show(args, &out));
}

/// Runs `args` as the tenant in the leaf; asserts the marker policy refuses it.
fn tenant_denied(f: &Fixture, args: &[&str], stdin: Option<&str>) {
    let out = kubectl_as(&f.tenant, args, stdin);
    assert!(
        !out.status.success() && text(&out.stderr).contains(DENIED),
        "the policy must refuse this: {}",
        show(args, &out)
    );
}

#[derive(Clone, Copy, Debug)]
enum Form {
    Annotation,
    Label,
}

/// A pod of the tenant's in the mapped leaf namespace, running the demo container with env POD
/// = [`PLANTED`]; on the leaf node unless `unbound`, and with the marker in `form` if given.
fn tenant_pod(name: &str, marker: Option<(Form, &str)>, unbound: bool) -> String {
    let manifest = pods::demo_pod(NS, name, &world::leaf_node(LEAF), None);
    let mut pod: serde_json::Value = serde_json::from_str(&manifest).expect("pod json");
    pod["spec"]["containers"][0]["env"][0]["value"] = PLANTED.into();
    if unbound && let Some(spec) = pod["spec"].as_object_mut() {
        spec.remove("nodeName");
    }
    if let Some((form, uid)) = marker {
        let field = match form {
            Form::Annotation => "annotations",
            Form::Label => "labels",
        };
        pod["metadata"][field] = serde_json::json!({ MARKER: uid });
    }
    pod.to_string()
}

/// A Binding of pod `name` to the leaf node that carries the marker as an annotation (the
/// apiserver copies a Binding's annotations onto the pod).
fn binding_with_marker(name: &str, uid: &str) -> String {
    binding(name, Form::Annotation, MARKER, uid)
}

/// A Binding of pod `name` to the leaf node with one annotation or label (the apiserver copies
/// both onto the pod; labels since PodTopologyLabelsAdmission, on by default in 1.35).
fn binding(name: &str, form: Form, key: &str, value: &str) -> String {
    let field = match form {
        Form::Annotation => "annotations",
        Form::Label => "labels",
    };
    serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": NS, field: {key: value}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": world::leaf_node(LEAF)},
    })
    .to_string()
}

fn root_uid(w: &World, name: &str) -> String {
    w.root
        .kubectl_ok(&[
            "get",
            "pod",
            name,
            "-n",
            NS,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .trim()
        .to_string()
}

/// The leaf pod's marker annotation and label (empty when absent).
fn leaf_marker(w: &World, name: &str) -> (String, String) {
    let escaped = MARKER.replace('.', "\\.");
    let get = |field: &str| {
        w.leaf(LEAF)
            .kubectl_ok(&[
                "get",
                "pod",
                name,
                "-n",
                NS,
                "-o",
                &format!("jsonpath={{.metadata.{field}.{escaped}}}"),
            ])
            .trim()
            .to_string()
    };
    (get("annotations"), get("labels"))
}

/// `kubectl exec -n NS <pod> -- <command>` as the root's admin, through the real root
/// apiserver and relaylet.
fn root_exec(w: &World, pod: &str, command: &[&str]) -> (Kubectl, Output) {
    let k = kubectl();
    let mut args = vec!["exec", "-n", NS, pod, "--"];
    args.extend_from_slice(command);
    let out = Run::new(&k, w.root_kubeconfig(), &args).output();
    (k, out)
}

/// The tenant deletes pod `name` at once (it may: the policy does not cover deletes).
fn tenant_delete(f: &Fixture, name: &str) {
    tenant_ok(
        f,
        &[
            "delete",
            "pod",
            name,
            "-n",
            NS,
            "--grace-period=0",
            "--force",
        ],
        None,
    );
}

/// Applies `deploy/leaf-marker-policy.yaml` as its header says for another syncer (its identity
/// written into the ConfigMap in place of relaylet's own), and waits until the apiserver
/// enforces it: a server-side dry run of the tenant's forged pod is refused.
fn apply_marker_policy(f: &Fixture) {
    let file = world::repo().join("deploy/leaf-marker-policy.yaml");
    let shipped = std::fs::read_to_string(&file).expect("deploy/leaf-marker-policy.yaml");
    let configured = shipped.replacen(
        "  usernames: \"system:serviceaccount:relaylet:relaylet-leaf\"\n",
        &format!("  usernames: \"{SYNCER}\"\n"),
        1,
    );
    assert_ne!(configured, shipped, "the ConfigMap has a usernames entry");
    f.w.leaf(LEAF)
        .kubectl_stdin_ok(&["apply", "-f", "-"], Some(&configured));
    let probe = tenant_pod("probe", Some((Form::Annotation, "probe")), false);
    support::eventually("the leaf apiserver enforces the marker policy", || {
        let out = kubectl_as(
            &f.tenant,
            &["create", "--dry-run=server", "-f", "-"],
            Some(&probe),
        );
        !out.status.success() && text(&out.stderr).contains(DENIED)
    });
}

/// Every way a tenant can put the marker on a pod, first without the policy (each works, and a
/// root user's exec lands in the tenant's pod), then with it (each is refused; the tenant's
/// other pod writes pass; the syncer still marks its copies; a same-named pod recreated
/// without the marker makes relaylet refuse the exec).
#[test]
fn leaf_tenants_cannot_forge_the_counterpart_marker() {
    let f = fixture();
    let w = &f.w;
    let create = ["create", "-f", "-"];

    // Without the policy: the attack this item is about. The tenant replaces the synced copy
    // with its own pod carrying the root pod's UID, and the root user's exec runs there.
    w.sync_pod(LEAF, NS, "victim");
    let uid = root_uid(w, "victim");
    tenant_delete(&f, "victim");
    tenant_ok(
        &f,
        &create,
        Some(&tenant_pod("victim", Some((Form::Annotation, &uid)), false)),
    );
    w.wait_for_log_lines(LEAF, NS, "victim", 1);
    let (k, out) = root_exec(w, "victim", &["sh", "-c", "echo $POD"]);
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(
        text(&out.stdout),
        format!("{PLANTED}\n"),
        "{}",
        describe(&k, &out)
    );
    tenant_delete(&f, "victim");
    // The other ways in, each open without the policy: the label form, pods/status (which may
    // change labels and annotations) and a Binding (whose annotations are copied to the pod).
    tenant_ok(
        &f,
        &create,
        Some(&tenant_pod("open-label", Some((Form::Label, &uid)), false)),
    );
    tenant_ok(&f, &create, Some(&tenant_pod("open-status", None, false)));
    tenant_ok(
        &f,
        &[
            "patch",
            "pod",
            "open-status",
            "-n",
            NS,
            "--subresource=status",
            "--type=merge",
            "-p",
            &serde_json::json!({"metadata": {"annotations": {MARKER: uid}}}).to_string(),
        ],
        None,
    );
    assert_eq!(leaf_marker(w, "open-status").0, uid, "pods/status set it");
    tenant_ok(&f, &create, Some(&tenant_pod("open-binding", None, true)));
    let pod_binding = |name: &str| format!("/api/v1/namespaces/{NS}/pods/{name}/binding");
    tenant_ok(
        &f,
        &["create", "--raw", &pod_binding("open-binding"), "-f", "-"],
        Some(&binding_with_marker("open-binding", &uid)),
    );
    assert_eq!(leaf_marker(w, "open-binding").0, uid, "the Binding set it");
    for name in ["open-label", "open-status", "open-binding"] {
        tenant_delete(&f, name);
    }

    apply_marker_policy(&f);

    // (d) The syncer marks its copy (annotation form, as World::sync_pod writes it; and the
    // label form).
    w.sync_pod(LEAF, NS, "synced");
    let uid = root_uid(w, "synced");
    assert_eq!(leaf_marker(w, "synced"), (uid.clone(), String::new()));
    let labelled = tenant_pod("synced-label", Some((Form::Label, "some-uid")), false);
    w.leaf(LEAF).kubectl_stdin_ok(&create, Some(&labelled));
    w.leaf(LEAF).kubectl_ok(&[
        "delete",
        "pod",
        "synced-label",
        "-n",
        NS,
        "--grace-period=0",
        "--force",
    ]);

    // (a) The tenant's pods with the marker, in either form, on create.
    for form in [Form::Annotation, Form::Label] {
        tenant_denied(
            &f,
            &create,
            Some(&tenant_pod("forged", Some((form, &uid)), false)),
        );
    }

    // (b) The tenant adding, changing or removing the marker on the synced pod: with patches
    // of the pod, of pods/status, and with a Binding of an unbound pod.
    let other = "00000000-0000-0000-0000-000000000000";
    let set = format!("{MARKER}={other}");
    tenant_denied(
        &f,
        &["annotate", "pod", "synced", "-n", NS, "--overwrite", &set],
        None,
    );
    tenant_denied(&f, &["label", "pod", "synced", "-n", NS, &set], None);
    let remove = format!("{MARKER}-");
    tenant_denied(&f, &["annotate", "pod", "synced", "-n", NS, &remove], None);
    let mut status_patch = vec![
        "patch",
        "pod",
        "synced",
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
    ];
    let change = serde_json::json!({"metadata": {"annotations": {MARKER: other}}}).to_string();
    status_patch.push(&change);
    tenant_denied(&f, &status_patch, None);
    let label = serde_json::json!({"metadata": {"labels": {MARKER: uid}}}).to_string();
    status_patch.pop();
    status_patch.push(&label);
    tenant_denied(&f, &status_patch, None);
    assert_eq!(leaf_marker(w, "synced"), (uid.clone(), String::new()));

    // (c) The tenant's other writes pass: a pod without the marker, other labels and
    // annotations on the synced pod, a Binding without the marker, deletes.
    tenant_ok(&f, &create, Some(&tenant_pod("unbound", None, true)));
    // The legacy `bindings` resource (POST .../namespaces/{ns}/bindings) does what pods/binding
    // does.
    let legacy_binding = format!("/api/v1/namespaces/{NS}/bindings");
    tenant_denied(
        &f,
        &["create", "--raw", &legacy_binding, "-f", "-"],
        Some(&binding_with_marker("unbound", &uid)),
    );
    for form in [Form::Annotation, Form::Label] {
        tenant_denied(
            &f,
            &["create", "--raw", &pod_binding("unbound"), "-f", "-"],
            Some(&binding("unbound", form, MARKER, &uid)),
        );
    }
    tenant_ok(
        &f,
        &["create", "--raw", &legacy_binding, "-f", "-"],
        Some(&binding("unbound", Form::Annotation, "team", "a")),
    );
    tenant_ok(&f, &["label", "pod", "synced", "-n", NS, "team=a"], None);
    tenant_ok(
        &f,
        &["annotate", "pod", "synced", "-n", NS, "note=fine"],
        None,
    );
    assert_eq!(leaf_marker(w, "unbound"), (String::new(), String::new()));
    tenant_delete(&f, "unbound");
    let (k, out) = root_exec(w, "synced", &["sh", "-c", "echo $POD"]);
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(text(&out.stdout), format!("{NS}/synced\n"));

    // (e) The attack again: the tenant may delete the synced copy and recreate the name, but
    // only without the marker, and relaylet then refuses the root user's exec.
    tenant_delete(&f, "synced");
    tenant_denied(
        &f,
        &create,
        Some(&tenant_pod("synced", Some((Form::Annotation, &uid)), false)),
    );
    tenant_ok(&f, &create, Some(&tenant_pod("synced", None, false)));
    w.wait_for_log_lines(LEAF, NS, "synced", 1);
    let (k, out) = root_exec(w, "synced", &["sh", "-c", "echo $POD"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        !text(&out.stdout).contains(PLANTED),
        "{}",
        describe(&k, &out)
    );
    assert!(
        err.contains(&format!(
            "pod {NS}/synced in leaf cluster {LEAF} is not the counterpart of root pod {NS}/synced: it carries no {MARKER} marker"
        )),
        "{}",
        describe(&k, &out)
    );
    tenant_delete(&f, "synced");
}

/// With `deploy/leaf-rbac-namespaced.yaml`, relaylet keeps its cluster-wide reads (the real
/// RBAC authorizer says so) and streams into the namespace bound for it; elsewhere the leaf
/// refuses, and kubectl shows the leaf's 403.
#[test]
fn namespaced_leaf_rbac_streams_only_in_bound_namespaces() {
    let f = fixture();
    let w = &f.w;
    let sa = "system:serviceaccount:relaylet:relaylet-leaf";
    // The real RBAC authorizer's answer for relaylet's leaf ServiceAccount ("" namespace:
    // cluster-wide).
    let can = |verb: &str, group: &str, resource: &str, subresource: &str, namespace: &str| {
        let review = serde_json::json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {
                "user": sa,
                "groups": ["system:serviceaccounts", "system:serviceaccounts:relaylet", "system:authenticated"],
                "resourceAttributes": {
                    "verb": verb, "group": group, "resource": resource,
                    "subresource": subresource, "namespace": namespace,
                },
            },
        });
        w.leaf(LEAF)
            .kubectl_stdin_ok(
                &["create", "-f", "-", "-o", "jsonpath={.status.allowed}"],
                Some(&review.to_string()),
            )
            .trim()
            == "true"
    };
    for verb in ["get", "list", "watch"] {
        for resource in ["pods", "nodes"] {
            assert!(can(verb, "", resource, "", ""), "{verb} {resource}");
        }
    }
    assert!(can("list", "metrics.k8s.io", "pods", "", ""));
    for (ns, allowed) in [(NS, true), (OTHER, false), ("default", false), ("", false)] {
        for (verb, subresource) in [
            ("create", "exec"),
            ("get", "exec"),
            ("create", "attach"),
            ("get", "attach"),
            ("create", "portforward"),
            ("get", "portforward"),
            ("get", "log"),
        ] {
            assert_eq!(
                can(verb, "", "pods", subresource, ns),
                allowed,
                "{verb} pods/{subresource} in {ns:?}"
            );
        }
    }

    // Through relaylet and the real root apiserver.
    let k = kubectl();
    w.sync_pod(LEAF, NS, "inside");
    let out = Run::new(
        &k,
        w.root_kubeconfig(),
        &["exec", "-n", NS, "inside", "--", "echo", "in"],
    )
    .output();
    assert!(out.status.success(), "{}", describe(&k, &out));
    assert_eq!(text(&out.stdout), "in\n");
    let out = Run::new(
        &k,
        w.root_kubeconfig(),
        &["logs", "-n", NS, "--tail=1", "inside"],
    )
    .output();
    assert!(
        out.status.success() && text(&out.stdout).contains("tick"),
        "{}",
        describe(&k, &out)
    );

    w.sync_pod(LEAF, OTHER, "outside");
    let out = Run::new(
        &k,
        w.root_kubeconfig(),
        &["exec", "-n", OTHER, "outside", "--", "echo", "out"],
    )
    .output();
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        err.contains(sa) && err.contains("pods/exec") && err.contains("forbidden"),
        "{}",
        describe(&k, &out)
    );
    let out = Run::new(&k, w.root_kubeconfig(), &["logs", "-n", OTHER, "outside"]).output();
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", describe(&k, &out));
    assert!(
        err.contains(sa) && err.contains("pods/log"),
        "{}",
        describe(&k, &out)
    );
}

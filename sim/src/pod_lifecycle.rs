//! What a cluster's scheduler and kubelets do for the pods created through its API, as far as
//! relaylet sees it: an unbound pod is bound to a node that has a kubelet (a one-node leaf's
//! scheduler); a bound pod's kubelet runs its init containers to completion, then its
//! containers as local processes, and reports them in the pod's status; a container that
//! exits is restarted or not by the pod's `restartPolicy`, with its restart count, and a pod
//! whose containers are done ends `Succeeded` or `Failed`; a pod being deleted gets SIGTERM,
//! its grace period, SIGKILL, and is then deleted by its kubelet (grace 0, its UID as
//! precondition), as upstream's kubelet does. Pods started by `Cluster::add_pod` are the
//! kubelet's already and left alone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

use crate::apiserver::{Store, kinds};
use crate::kubelet::{ContainerRun, Kubelet, PodRun};

/// The kubelets of a cluster by node name.
pub type Kubelets =
    std::sync::Arc<Mutex<std::collections::HashMap<String, std::sync::Arc<Kubelet>>>>;

/// How long a crashed container waits before it runs again (the kubelet's back-off starts at
/// 10 s; the stand-in keeps tests short).
const RESTART_DELAY: Duration = Duration::from_millis(500);

/// The pods (by UID) whose kubelet is stopping them.
static STOPPING: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stops pod `uid` (`namespace/name`) wherever a kubelet runs it: it left the store.
pub async fn forget(kubelets: &Kubelets, namespace: &str, name: &str, uid: &str) {
    let all: Vec<_> = kubelets
        .lock()
        .map(|k| k.values().cloned().collect())
        .unwrap_or_default();
    for kubelet in all {
        if kubelet.runs(namespace, name, uid) {
            kubelet.remove_pod(namespace, name).await;
        }
    }
}

/// Brings `pod` one step along its life (called for every change of it).
pub async fn settle(store: &Store, kubelets: &Kubelets, pod: &Pod) {
    let (Some(namespace), Some(name), Some(uid)) = (
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
        pod.metadata.uid.as_deref(),
    ) else {
        return;
    };
    let Some(spec) = &pod.spec else { return };
    let Some(node) = spec.node_name.as_deref() else {
        schedule(store, kubelets, namespace, name);
        return;
    };
    let Some(kubelet) = kubelets.lock().ok().and_then(|k| k.get(node).cloned()) else {
        return;
    };
    if let Some(grace) = pod.metadata.deletion_grace_period_seconds
        && pod.metadata.deletion_timestamp.is_some()
    {
        // Stopped once, whatever changes while it stops.
        if !lock(&STOPPING).insert(uid.to_string()) {
            return;
        }
        let (store, kubelet) = (store.clone(), kubelet.clone());
        let (namespace, name, uid) = (namespace.to_string(), name.to_string(), uid.to_string());
        tokio::spawn(async move {
            kubelet
                .stop_pod(&namespace, &name, Duration::from_secs(grace.max(0) as u64))
                .await;
            if let Some(kind) = kinds::lookup("", "v1", "pods") {
                // Gone already, or another pod of the name by now: nothing to delete.
                if store
                    .get(kind, &namespace, &name)
                    .is_ok_and(|p| p["metadata"]["uid"].as_str() == Some(uid.as_str()))
                {
                    let _ = store.delete(kind, &namespace, &name, None);
                }
            }
            lock(&STOPPING).remove(&uid);
        });
        return;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if kubelet.runs(namespace, name, uid) || matches!(phase, Some("Succeeded" | "Failed")) {
        return;
    }
    // Once only: a pod the kubelet has taken is `Running` or further, or has started.
    if phase != Some("Pending") || pod.status.as_ref().is_some_and(|s| s.start_time.is_some()) {
        return;
    }
    mark(store, namespace, name, |status| {
        status["startTime"] = json!(crate::apiserver::clock::now());
        status["hostIP"] = json!("127.0.0.1");
        status["hostIPs"] = json!([{"ip": "127.0.0.1"}]);
    });
    let (store, kubelet, pod) = (store.clone(), kubelet.clone(), pod.clone());
    tokio::spawn(async move { run(&store, &kubelet, &pod).await });
}

/// Binds an unbound pod to a node with a kubelet, as the cluster's scheduler would.
fn schedule(store: &Store, kubelets: &Kubelets, namespace: &str, name: &str) {
    let node = kubelets.lock().ok().and_then(|k| k.keys().min().cloned());
    let (Some(node), Some(kind)) = (node, kinds::lookup("", "v1", "pods")) else {
        return;
    };
    let _ = store.modify(kind, namespace, name, |live| {
        let mut next = live.clone();
        if next["spec"]["nodeName"].as_str().is_none_or(str::is_empty)
            && next["metadata"]["deletionTimestamp"].is_null()
        {
            next["spec"]["nodeName"] = json!(node);
            let conditions = &mut next["status"]["conditions"];
            *conditions = json!([{"type": "PodScheduled", "status": "True",
                "lastTransitionTime": crate::apiserver::clock::now()}]);
        }
        Ok(next)
    });
}

/// Runs `pod` on `kubelet`: its init containers one after the other, then its containers,
/// reporting each step in its status, until its containers are done for good.
async fn run(store: &Store, kubelet: &Kubelet, pod: &Pod) {
    let (Some(namespace), Some(name), Some(uid), Some(spec)) = (
        pod.metadata.namespace.clone(),
        pod.metadata.name.clone(),
        pod.metadata.uid.clone(),
        pod.spec.clone(),
    ) else {
        return;
    };
    let policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    let env_of = |c: &Container| env(store, &namespace, c);
    for init in spec.init_containers.iter().flatten() {
        loop {
            let code = run_once(&init.name, &argv(init), &env_of(init)).await;
            report(
                store,
                &namespace,
                &name,
                "initContainerStatuses",
                terminated(init, 0, code),
            );
            if code == 0 {
                break;
            }
            if policy == "Never" {
                mark(store, &namespace, &name, |s| s["phase"] = json!("Failed"));
                return;
            }
            tokio::time::sleep(RESTART_DELAY).await;
        }
    }
    let mut runs = Vec::new();
    for c in &spec.containers {
        let mut env = env_of(c);
        let mut ports = Vec::new();
        for p in c.ports.iter().flatten() {
            let Ok(addr) = crate::ports::free_loopback_port() else {
                continue;
            };
            env.push((
                format!("PORT_{}", p.container_port),
                addr.port().to_string(),
            ));
            ports.push((p.container_port as u16, addr));
        }
        runs.push(ContainerRun {
            name: c.name.clone(),
            command: argv(c),
            env,
            stdin: c.stdin.unwrap_or(false),
            tty: c.tty.unwrap_or(false),
            ports,
        });
    }
    let started = kubelet
        .run_pod(PodRun {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: uid.clone(),
            containers: runs,
        })
        .await;
    if let Err(e) = started {
        mark(store, &namespace, &name, |s| {
            s["phase"] = json!("Failed");
            s["reason"] = json!("RunContainerError");
            s["message"] = json!(e.to_string());
        });
        return;
    }
    mark(store, &namespace, &name, |s| {
        s["phase"] = json!("Running");
        s["podIP"] = json!("127.0.0.1");
        s["podIPs"] = json!([{"ip": "127.0.0.1"}]);
        s["qosClass"] = json!("BestEffort");
        s["conditions"] = conditions(true);
    });
    let watchers = spec
        .containers
        .iter()
        .map(|c| supervise(store, kubelet, &namespace, &name, &uid, c, &policy));
    let codes = futures::future::join_all(watchers).await;
    if !kubelet.runs(&namespace, &name, &uid) {
        return;
    }
    let phase = if codes.iter().all(|c| *c == Some(0)) {
        "Succeeded"
    } else {
        "Failed"
    };
    mark(store, &namespace, &name, |s| {
        s["phase"] = json!(phase);
        s["conditions"] = conditions(false);
    });
}

/// Watches one container: reports it running, restarts it as `policy` says, and returns its
/// last exit code once it is done for good (`None`: the pod went away meanwhile).
async fn supervise(
    store: &Store,
    kubelet: &Kubelet,
    namespace: &str,
    pod: &str,
    uid: &str,
    c: &Container,
    policy: &str,
) -> Option<i32> {
    let mut restarts = 0;
    let mut last: Option<Value> = None;
    loop {
        let mut status = json!({
            "name": c.name, "ready": true, "started": true, "restartCount": restarts,
            "image": c.image, "imageID": "relaylet-sim/local@sha256:0",
            "containerID": format!("sim://{uid}-{}-{restarts}", c.name),
            "state": {"running": {"startedAt": crate::apiserver::clock::now()}},
        });
        if let Some(previous) = &last {
            status["lastState"] = previous.clone();
        }
        report(store, namespace, pod, "containerStatuses", status);
        let code = kubelet.container_exit(namespace, pod, &c.name).await?;
        if !kubelet.runs(namespace, pod, uid) {
            return None;
        }
        let ended = terminated(c, restarts, code);
        let again = policy == "Always" || (policy == "OnFailure" && code != 0);
        if !again {
            report(store, namespace, pod, "containerStatuses", ended);
            return Some(code);
        }
        last = Some(ended["state"].clone());
        tokio::time::sleep(RESTART_DELAY).await;
        if kubelet
            .restart_container(namespace, pod, &c.name)
            .await
            .is_err()
        {
            return None;
        }
        restarts += 1;
    }
}

/// Runs an init container's command to its end; its exit code (127: it did not start).
async fn run_once(name: &str, argv: &[String], env: &[(String, String)]) -> i32 {
    let Some((program, args)) = argv.split_first() else {
        return 0;
    };
    let status = tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("HOSTNAME", name)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
    status.ok().and_then(|s| s.code()).unwrap_or(127)
}

/// A container's command and arguments (or busybox's default, `sh`).
fn argv(c: &Container) -> Vec<String> {
    let argv: Vec<String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect();
    if argv.is_empty() {
        vec!["sh".into()]
    } else {
        argv
    }
}

/// A container's environment: literal values, and the keys of ConfigMaps and Secrets the pod's
/// namespace holds (`valueFrom`, `envFrom`), as the kubelet resolves them.
fn env(store: &Store, namespace: &str, c: &Container) -> Vec<(String, String)> {
    let data = |kind: &str, name: &str| -> BTreeMap<String, String> {
        let Some(k) = kinds::lookup("", "v1", kind) else {
            return BTreeMap::new();
        };
        let Ok(object) = store.get(k, namespace, name) else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for (key, value) in object["data"].as_object().into_iter().flatten() {
            let text = value.as_str().unwrap_or_default();
            let text = if kind == "secrets" {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .unwrap_or_default()
            } else {
                text.to_string()
            };
            out.insert(key.clone(), text);
        }
        out
    };
    let mut out = Vec::new();
    for from in c.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            out.extend(data("configmaps", &r.name));
        }
        if let Some(r) = &from.secret_ref {
            out.extend(data("secrets", &r.name));
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => Some(v.clone()),
            (None, Some(from)) => {
                if let Some(r) = &from.config_map_key_ref {
                    data("configmaps", &r.name).remove(&r.key)
                } else if let Some(r) = &from.secret_key_ref {
                    data("secrets", &r.name).remove(&r.key)
                } else {
                    None
                }
            }
            _ => None,
        };
        if let Some(value) = value {
            out.push((e.name.clone(), value));
        }
    }
    out
}

/// A container's status, ended with `code`.
fn terminated(c: &Container, restarts: i32, code: i32) -> Value {
    json!({
        "name": c.name, "ready": false, "started": false, "restartCount": restarts,
        "image": c.image, "imageID": "relaylet-sim/local@sha256:0",
        "state": {"terminated": {
            "exitCode": code,
            "reason": if code == 0 { "Completed" } else { "Error" },
            "finishedAt": crate::apiserver::clock::now(),
        }},
    })
}

/// The kubelet's conditions, all `ready` or not (`PodScheduled` as the scheduler left it).
fn conditions(ready: bool) -> Value {
    let now = crate::apiserver::clock::now();
    let status = if ready { "True" } else { "False" };
    json!([
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now},
        {"type": "Ready", "status": status, "lastTransitionTime": now},
        {"type": "ContainersReady", "status": status, "lastTransitionTime": now},
    ])
}

/// Changes the pod's status with `change`.
fn mark(store: &Store, namespace: &str, name: &str, change: impl FnOnce(&mut Value)) {
    let Some(kind) = kinds::lookup("", "v1", "pods") else {
        return;
    };
    let _ = store.modify(kind, namespace, name, |live| {
        let mut next = live.clone();
        if !next["status"].is_object() {
            next["status"] = json!({});
        }
        change(&mut next["status"]);
        Ok(next)
    });
}

/// Adds (or replaces) one container's entry in the pod's status list `list`.
fn report(store: &Store, namespace: &str, name: &str, list: &str, status: Value) {
    mark(store, namespace, name, |s| {
        let items = &mut s[list];
        if !items.is_array() {
            *items = json!([]);
        }
        if let Some(items) = items.as_array_mut() {
            items.retain(|i| i["name"] != status["name"]);
            items.push(status);
        }
    });
}

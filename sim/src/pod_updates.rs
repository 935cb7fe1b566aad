//! What a cluster's kubelets do when their pods change after the start: bring each pod along
//! its life (`pod_lifecycle`), and run the ephemeral containers `kubectl debug` adds (through
//! `pods/ephemeralcontainers`) and report each in the pod's
//! `status.ephemeralContainerStatuses`, as the kubelet does. The image is not pulled: the
//! container runs its command (or `sh`, busybox's default) as a local process, like every
//! container of the sim.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EphemeralContainer, Pod};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::apiserver::store::Change;
use crate::apiserver::{Store, kinds};
use crate::kubelet::{ContainerRun, Kubelet};

pub use crate::pod_lifecycle::Kubelets;

/// Watches `store` until `stop` and starts ephemeral containers on the nodes in `kubelets`.
/// Looks only at the pods that changed, as a kubelet watches its own: reading every pod of the
/// store on every change (a Lease renewal included) took more than half of the fleet
/// benchmark's CPU at 10,000 root pods.
pub fn watch(store: Store, kubelets: Kubelets, stop: CancellationToken) {
    let Some(kind) = kinds::lookup("", "v1", "pods") else {
        return;
    };
    tokio::spawn(async move {
        // Subscribed before the first read: a change between the two wakes the loop.
        let mut changes = store.subscribe_kind(kind);
        let mut seen = None;
        loop {
            seen = Some(start_new_since(&store, &kubelets, seen).await);
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
        }
    });
}

/// Starts what pods changed after revision `since` (every pod when `None`, or when the store
/// no longer keeps those changes) ask for; the revision looked at.
async fn start_new_since(store: &Store, kubelets: &Kubelets, since: Option<u64>) -> u64 {
    let changed = since.and_then(|rv| store.events_since(rv).ok());
    let Some((events, rv)) = changed else {
        let rv = store.revision();
        for pod in store.list_typed::<Pod>(None).unwrap_or_default() {
            crate::pod_lifecycle::settle(store, kubelets, &pod).await;
            start_new_ones(store, kubelets, &pod).await;
        }
        return rv;
    };
    let pods = events
        .iter()
        .filter(|e| e.key.group.is_empty() && e.key.resource == "pods");
    let mut changed = BTreeSet::new();
    for event in pods {
        let key = (event.key.namespace.clone(), event.key.name.clone());
        if event.change == Change::Deleted {
            // Gone from the store (at once, or after its kubelet stopped it): nothing of it
            // may keep running.
            let uid = event.object["metadata"]["uid"].as_str().unwrap_or_default();
            crate::pod_lifecycle::forget(kubelets, &key.0, &key.1, uid).await;
        }
        changed.insert(key);
    }
    for (namespace, name) in changed {
        // The pod as it is now, not as the event saw it: a container started and reported
        // since is not started again.
        if let Ok(pod) = store.get_typed::<Pod>(&namespace, &name) {
            crate::pod_lifecycle::settle(store, kubelets, &pod).await;
            start_new_ones(store, kubelets, &pod).await;
        }
    }
    rv
}

async fn start_new_ones(store: &Store, kubelets: &Kubelets, pod: &Pod) {
    let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
        return;
    };
    let Some(spec) = &pod.spec else { return };
    let kubelet = spec
        .node_name
        .as_ref()
        .and_then(|node| kubelets.lock().ok()?.get(node).cloned());
    let Some(kubelet) = kubelet else { return };
    let reported: Vec<&str> = pod
        .status
        .as_ref()
        .and_then(|s| s.ephemeral_container_statuses.as_ref())
        .map(|l| l.iter().map(|s| s.name.as_str()).collect())
        .unwrap_or_default();
    for container in spec.ephemeral_containers.iter().flatten() {
        if reported.contains(&container.name.as_str()) {
            continue;
        }
        let started = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = |state: Value| {
            json!({
                "name": container.name,
                "image": container.image,
                "imageID": "relaylet-sim/local@sha256:0",
                "containerID": format!("sim://{}-{}", pod.metadata.uid.clone().unwrap_or_default(), container.name),
                "ready": false,
                "restartCount": 0,
                "state": state,
            })
        };
        match kubelet
            .add_container(namespace, name, run_of(container))
            .await
        {
            Ok(()) => {
                report(
                    store,
                    namespace,
                    name,
                    status(json!({"running": {"startedAt": started}})),
                );
                // Ephemeral containers are never restarted: report the exit once it comes.
                let ended = status(Value::Null);
                let (store, kubelet) = (store.clone(), kubelet.clone());
                let (namespace, name) = (namespace.clone(), name.clone());
                tokio::spawn(async move {
                    report_exit(&store, &kubelet, &namespace, &name, ended, started).await;
                });
            }
            Err(e) => report(
                store,
                namespace,
                name,
                status(
                    json!({"waiting": {"reason": "RunContainerError", "message": e.to_string()}}),
                ),
            ),
        }
    }
}

/// Waits for an ephemeral container's process to end and reports it terminated.
async fn report_exit(
    store: &Store,
    kubelet: &Kubelet,
    namespace: &str,
    pod: &str,
    mut status: Value,
    started: String,
) {
    let container = status["name"].as_str().unwrap_or_default().to_string();
    // None: the pod is gone, nothing to report on.
    let Some(code) = kubelet.container_exit(namespace, pod, &container).await else {
        return;
    };
    status["state"] = json!({"terminated": {
        "exitCode": code,
        "reason": if code == 0 { "Completed" } else { "Error" },
        "startedAt": started,
        "finishedAt": k8s_openapi::jiff::Timestamp::now().to_string(),
        "containerID": status["containerID"].clone(),
    }});
    report(store, namespace, pod, status);
}

/// The local process an ephemeral container runs.
fn run_of(c: &EphemeralContainer) -> ContainerRun {
    let mut command: Vec<String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect();
    if command.is_empty() {
        command.push("sh".into());
    }
    ContainerRun {
        name: c.name.clone(),
        command,
        env: c
            .env
            .iter()
            .flatten()
            .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
            .collect(),
        stdin: c.stdin.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        ports: Vec::new(),
    }
}

/// Adds (or replaces) one container's entry in the pod's `ephemeralContainerStatuses`.
fn report(store: &Store, namespace: &str, name: &str, status: Value) {
    let Some(kind) = kinds::lookup("", "v1", "pods") else {
        return;
    };
    let result = store.modify(kind, namespace, name, |live| {
        let mut next = live.clone();
        let list = &mut next["status"]["ephemeralContainerStatuses"];
        if !list.is_array() {
            *list = json!([]);
        }
        if let Some(items) = list.as_array_mut() {
            items.retain(|s| s["name"] != status["name"]);
            items.push(status.clone());
        }
        Ok(next)
    });
    if let Err(e) = result {
        tracing::warn!(pod = %name, error = %e.message, "reporting an ephemeral container failed");
    }
}

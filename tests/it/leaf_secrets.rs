//! The threat: someone who may write Secrets in relaylet's leaf-Secret namespace (not a cluster
//! administrator) registers a "leaf" whose kubeconfig makes relaylet run a command, send its own
//! root ServiceAccount token (any file of its) to a server of their choosing, or whose
//! `relaylet.io/node-name` takes over a real Node or another leaf's node. Each attempt is made
//! here as a real Secret in the sandbox root; relaylet must refuse it (a `LeafSecretRefused`
//! Warning Event on the Secret and `relaylet_leaf_secret_refusals_total{reason}`), and the harm
//! must not happen: the command never runs, the token never leaves, the Node and its pods stay
//! unrouted, and the first leaf keeps serving.
//!
//! Each test waits for the Event or the harm, whichever comes first, then asserts no harm: on
//! code without the checks the harm comes, and the test says which.

use relaylet_dev::testkit as support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use relaylet_dev::sandbox::{RELAYLET_LEAF_USER, RELAYLET_NAMESPACE, Settings};
use relaylet_sim::cluster::{SimContainer, SimPod};
use support::{Env, RT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);
const LABEL: &str = "relaylet.io/leaf-cluster";

fn env() -> &'static Env {
    support::env(Settings::default)
}

/// Creates leaf Secret `name` for leaf `leaf` with `kubeconfig` and `annotations`.
async fn create_secret(
    e: &Env,
    name: &str,
    leaf: &str,
    kubeconfig: &str,
    annotations: &[(&str, &str)],
) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(RELAYLET_NAMESPACE.into()),
            labels: Some(BTreeMap::from([(LABEL.to_string(), leaf.to_string())])),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced(e.root_client().await, RELAYLET_NAMESPACE);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|err| panic!("creating Secret {name}: {err}"));
}

/// The note of the `LeafSecretRefused` Event on Secret `secret`, once there is one.
async fn refusal_event(e: &Env, secret: &str) -> Option<String> {
    let events: Api<Event> = Api::namespaced(e.root_client().await, RELAYLET_NAMESPACE);
    let list = events.list(&ListParams::default()).await.ok()?;
    list.items.into_iter().find_map(|ev| {
        let regarding = ev.regarding.as_ref()?;
        (regarding.name.as_deref() == Some(secret)
            && regarding.kind.as_deref() == Some("Secret")
            && ev.reason.as_deref() == Some("LeafSecretRefused")
            && ev.type_.as_deref() == Some("Warning"))
        .then(|| ev.note.unwrap_or_default())
    })
}

/// Waits until relaylet refuses Secret `secret` (its Event) or `harm` reports what went wrong;
/// returns the Event's note or panics with the harm.
async fn refused_or_harm(
    e: &Env,
    secret: &str,
    mut harm: impl AsyncFnMut() -> Option<String>,
) -> String {
    let waited = tokio::time::timeout(HANG, async {
        loop {
            if let Some(what) = harm().await {
                return Err(what);
            }
            if let Some(note) = refusal_event(e, secret).await {
                return Ok(note);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    match waited {
        Ok(Ok(note)) => note,
        Ok(Err(harm)) => panic!("Secret {secret} was not refused: {harm}"),
        Err(_) => panic!("no LeafSecretRefused Event on Secret {secret} within {HANG:?}"),
    }
}

/// relaylet's refusal counter for `reason`.
async fn refusals(e: &Env, reason: &str) -> f64 {
    let got = support::metrics::http_get(e.sandbox.relaylet.metrics_addr, "/metrics").await;
    let scrape = support::metrics::parse(&got.body);
    support::metrics::count(
        &scrape,
        "relaylet_leaf_secret_refusals_total",
        &[("reason", reason)],
    )
}

async fn node_exists(e: &Env, name: &str) -> bool {
    let nodes: Api<Node> = Api::all(e.root_client().await);
    nodes.get_opt(name).await.unwrap().is_some()
}

/// A kubeconfig for server `server` whose user entry has `user` (YAML lines, 4 spaces in).
fn kubeconfig(server: &str, user: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: leaf
  cluster:
    server: {server}
    insecure-skip-tls-verify: true
users:
- name: relaylet
  user:
{user}
contexts:
- name: leaf
  context: {{cluster: leaf, user: relaylet}}
current-context: leaf
"
    )
}

/// The status and body of a `containerLogs` call for `default/pod` on relaylet's kubelet API,
/// as the root apiserver makes it.
async fn kubelet_logs(e: &Env, pod: &str) -> (u16, String) {
    let client = e.kubelet_api_client().await;
    let request = http::Request::get(format!("/containerLogs/default/{pod}/main"))
        .body(Vec::new())
        .unwrap();
    match client.request_text(request).await {
        Ok(text) => (200, text),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(err) => (0, err.to_string()),
    }
}

#[test]
fn an_exec_plugin_never_runs() {
    let e = env();
    RT.block_on(async {
        let marker = e.sandbox.files().join("exec-plugin-ran");
        let user = format!(
            "    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: sh
      args: [-c, 'touch {}']
      interactiveMode: Never",
            marker.display()
        );
        let leaf_server = e.sandbox.leaves["leaf-1"].api.url();
        create_secret(e, "exec-plugin", "exec-plugin", &kubeconfig(&leaf_server, &user), &[]).await;
        let note = refused_or_harm(e, "exec-plugin", async || {
            marker
                .exists()
                .then(|| format!("the exec plugin ran: {} exists", marker.display()))
        })
        .await;
        assert_eq!(
            note,
            "kubeconfig user \"relaylet\": exec is not allowed in a leaf Secret (relaylet never runs commands named by a Secret); leaf Secrets carry inline credentials only"
        );
        assert!(refusals(e, "exec_plugin").await >= 1.0);
        assert!(!marker.exists(), "the exec plugin ran");
        assert!(e.sandbox.relaylet.registry.by_node("relaylet-exec-plugin").is_none());
        assert!(!node_exists(e, "relaylet-exec-plugin").await);
    });
}

#[test]
fn a_token_file_never_leaves() {
    let e = env();
    RT.block_on(async {
        // The canary stands for relaylet's own root ServiceAccount token.
        let canary = "canary-token-7c1d9b";
        let token_file = e.sandbox.files().join("canary-token");
        std::fs::write(&token_file, canary).unwrap();
        // A plain listener that records whether any request carries the canary.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = format!("http://{}", listener.local_addr().unwrap());
        let leaked = Arc::new(AtomicBool::new(false));
        tokio::spawn({
            let leaked = leaked.clone();
            async move {
                while let Ok((mut conn, _)) = listener.accept().await {
                    let leaked = leaked.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0; 16 * 1024];
                        let mut seen = Vec::new();
                        while let Ok(n) = conn.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            seen.extend_from_slice(&buf[..n]);
                            if String::from_utf8_lossy(&seen).contains(canary) {
                                leaked.store(true, Ordering::SeqCst);
                            }
                            if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                let _ = conn
                                    .write_all(
                                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
                                    )
                                    .await;
                                seen.clear();
                            }
                        }
                    });
                }
            }
        });
        let user = format!("    tokenFile: {}", token_file.display());
        create_secret(
            e,
            "token-file",
            "token-file",
            &kubeconfig(&server, &user),
            &[],
        )
        .await;
        let note = refused_or_harm(e, "token-file", async || {
            leaked
                .load(Ordering::SeqCst)
                .then(|| format!("a request carrying the token file's contents reached {server}"))
        })
        .await;
        assert!(note.contains("tokenFile is not allowed"), "{note}");
        assert!(!note.contains(canary), "{note}");
        assert!(refusals(e, "token_file").await >= 1.0);
        assert!(!leaked.load(Ordering::SeqCst));
        assert!(
            e.sandbox
                .relaylet
                .registry
                .by_node("relaylet-token-file")
                .is_none()
        );
    });
}

#[test]
fn a_node_relaylet_does_not_own_is_not_taken_over() {
    let e = env();
    RT.block_on(async {
        // A real worker node, not relaylet's.
        let nodes: Api<Node> = Api::all(e.root_client().await);
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "relaylet-real-worker", "labels": {"kubernetes.io/hostname": "relaylet-real-worker"}}
        }))
        .unwrap();
        let before = nodes.create(&PostParams::default(), &node).await.unwrap();
        // A pod on it, with a copy in leaf-1 marked as its counterpart: were the node routed
        // to leaf-1, relaylet would serve this pod's logs from there.
        let pod = SimPod {
            namespace: "default".into(),
            name: "on-real-worker".into(),
            containers: vec![SimContainer {
                name: "main".into(),
                command: vec!["sh".into(), "-c".into(), "echo routed; sleep 600".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        relaylet_dev::sandbox::sync_pod(
            &e.sandbox.root,
            "relaylet-real-worker",
            &e.sandbox.leaves["leaf-1"],
            "leaf-1-node",
            &pod,
        )
        .await
        .unwrap();
        // A working kubeconfig (leaf-1's), naming the real node.
        let working = e.sandbox.leaves["leaf-1"]
            .kubeconfig(RELAYLET_LEAF_USER, &[])
            .unwrap();
        create_secret(
            e,
            "takes-real-worker",
            "takeover",
            &working,
            &[("relaylet.io/node-name", "relaylet-real-worker")],
        )
        .await;
        let note = refused_or_harm(e, "takes-real-worker", async || {
            let (status, body) = kubelet_logs(e, "on-real-worker").await;
            (status == 200).then(|| format!("relaylet-real-worker's pod was routed to leaf-1: {body:?}"))
        })
        .await;
        assert_eq!(
            note,
            "node name \"relaylet-real-worker\" is an existing Node that belongs to something other than relaylet; relaylet does not take it over"
        );
        assert!(refusals(e, "node_not_owned").await >= 1.0);
        // Not routed: a Node in relaylet's name prefix without a registered leaf.
        let (status, body) = kubelet_logs(e, "on-real-worker").await;
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("has no registered leaf cluster"), "{body}");
        assert!(e.sandbox.relaylet.registry.by_node("relaylet-real-worker").is_none());
        let after = nodes.get("relaylet-real-worker").await.unwrap();
        assert_eq!(after.metadata.resource_version, before.metadata.resource_version);
        assert_eq!(after.metadata.labels, before.metadata.labels);
    });
}

#[test]
fn a_second_secret_naming_a_taken_node_is_refused_and_the_first_keeps_serving() {
    let e = env();
    RT.block_on(async {
        let (status, body) = kubelet_logs(e, "demo-2").await;
        assert_eq!(status, 200, "{body}");
        // Created long after the sandbox's leaf-leaf-2 Secret, and its name sorts after it
        // too, so the rule (older Secret, then name) favours leaf-leaf-2 either way.
        let other = e.sandbox.leaves["leaf-1"]
            .kubeconfig(RELAYLET_LEAF_USER, &[])
            .unwrap();
        create_secret(
            e,
            "x-second-claim",
            "intruder",
            &other,
            &[("relaylet.io/node-name", "relaylet-leaf-2")],
        )
        .await;
        let note = refused_or_harm(e, "x-second-claim", async || {
            let (status, body) = kubelet_logs(e, "demo-2").await;
            (status != 200).then(|| format!("relaylet-leaf-2 stopped serving demo-2: {status} {body:?}"))
        })
        .await;
        assert_eq!(
            note,
            "node name \"relaylet-leaf-2\" is already used by leaf Secret \"leaf-leaf-2\"; the older Secret keeps it (give this leaf another relaylet.io/node-name)"
        );
        assert!(refusals(e, "node_name_taken").await >= 1.0);
        let leaf = e.sandbox.relaylet.registry.by_node("relaylet-leaf-2").unwrap();
        assert_eq!(leaf.name, "leaf-2");
        let (status, body) = kubelet_logs(e, "demo-2").await;
        assert_eq!(status, 200, "{body}");
        assert!(!body.is_empty());
    });
}

#[test]
fn serving_certificate_names_come_from_registered_leaves_only() {
    // The serving-certificate CSR names every registered virtual node (lib.rs reads
    // `registry.snapshot()`): a refused Secret never registers, so a name it asks for, here a
    // wildcard, never reaches the certificate.
    let e = env();
    RT.block_on(async {
        let wildcard = "*.example.com";
        let working = e.sandbox.leaves["leaf-1"]
            .kubeconfig(RELAYLET_LEAF_USER, &[])
            .unwrap();
        create_secret(
            e,
            "csr-name",
            "csr-name",
            &working,
            &[("relaylet.io/node-name", wildcard)],
        )
        .await;
        let names = || -> Vec<String> {
            e.sandbox
                .relaylet
                .registry
                .snapshot()
                .values()
                .map(|l| l.node_name.clone())
                .collect()
        };
        let note = refused_or_harm(e, "csr-name", async || {
            let names = names();
            names.contains(&wildcard.to_string()).then(|| {
                format!("{wildcard} is a registered node name, so the CSR asks for it: {names:?}")
            })
        })
        .await;
        assert!(
            note.starts_with(
                "annotation relaylet.io/node-name: \"*.example.com\" must be a DNS subdomain"
            ),
            "{note}"
        );
        assert!(refusals(e, "node_name_invalid").await >= 1.0);
        assert!(!names().contains(&wildcard.to_string()));
    });
}

#[test]
fn a_working_leaf_survives_its_secret_turning_into_code() {
    let e = env();
    RT.block_on(async {
        let working = e.sandbox.leaves["leaf-1"]
            .kubeconfig(RELAYLET_LEAF_USER, &[])
            .unwrap();
        create_secret(e, "turns-bad", "turns-bad", &working, &[]).await;
        tokio::time::timeout(HANG, async {
            while e
                .sandbox
                .relaylet
                .registry
                .by_node("relaylet-turns-bad")
                .is_none()
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the working leaf registered");
        // Its writer swaps the kubeconfig for an exec plugin.
        let marker = e.sandbox.files().join("turned-bad-plugin-ran");
        let user = format!(
            "    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: sh
      args: [-c, 'touch {}']
      interactiveMode: Never",
            marker.display()
        );
        let bad = kubeconfig(&e.sandbox.leaves["leaf-1"].api.url(), &user);
        let patch = serde_json::json!({"data": {"kubeconfig": ByteString(bad.into_bytes())}});
        let secrets: Api<Secret> = Api::namespaced(e.root_client().await, RELAYLET_NAMESPACE);
        secrets
            .patch("turns-bad", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let note = refused_or_harm(e, "turns-bad", async || {
            marker
                .exists()
                .then(|| format!("the exec plugin ran: {} exists", marker.display()))
        })
        .await;
        assert!(note.contains("exec is not allowed"), "{note}");
        assert!(!marker.exists(), "the exec plugin ran");
        // The leaf built from the Secret's last good version still serves.
        let leaf = e.sandbox.relaylet.registry.by_node("relaylet-turns-bad");
        assert_eq!(leaf.map(|l| l.name.clone()).as_deref(), Some("turns-bad"));
    });
}

/// Waits until virtual node `node` is served by leaf `leaf`.
async fn wait_leaf_of(e: &Env, node: &str, leaf: &str) {
    tokio::time::timeout(HANG, async {
        while e
            .sandbox
            .relaylet
            .registry
            .by_node(node)
            .map(|l| l.name.clone())
            .as_deref()
            != Some(leaf)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("node {node} not served by leaf {leaf} within {HANG:?}"));
}

#[test]
fn a_refused_claim_stays_refused_while_the_holder_exists_and_takes_over_after() {
    let e = env();
    RT.block_on(async {
        let working = e.sandbox.leaves["leaf-1"]
            .kubeconfig(RELAYLET_LEAF_USER, &[])
            .unwrap();
        let shared = [("relaylet.io/node-name", "relaylet-shared-node")];
        create_secret(e, "holder", "holder", &working, &shared).await;
        wait_leaf_of(e, "relaylet-shared-node", "holder").await;
        // Created after "holder" (and its name sorts after it, should both share a second).
        create_secret(e, "waiting", "waiting", &working, &shared).await;
        let note = refused_or_harm(e, "waiting", async || {
            let leaf = e.sandbox.relaylet.registry.by_node("relaylet-shared-node");
            leaf.filter(|l| l.name != "holder")
                .map(|l| format!("shared-node was taken over by leaf {}", l.name))
        })
        .await;
        assert!(
            note.contains("already used by leaf Secret \"holder\""),
            "{note}"
        );
        // The holder goes: the waiting Secret is decided again and gets the node.
        let secrets: Api<Secret> = Api::namespaced(e.root_client().await, RELAYLET_NAMESPACE);
        secrets
            .delete("holder", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        wait_leaf_of(e, "relaylet-shared-node", "waiting").await;
    });
}

#[test]
fn a_secret_that_loses_its_node_name_and_wins_it_back_is_registered_again() {
    // A registered leaf's Secret is kept without its data (every replica keeps every leaf
    // Secret); winning its names back after losing them must read the data again.
    let e = env();
    RT.block_on(async {
        let working = e.sandbox.leaves["leaf-1"]
            .kubeconfig(RELAYLET_LEAF_USER, &[])
            .unwrap();
        let own = [("relaylet.io/node-name", "relaylet-elder-own")];
        create_secret(e, "elder", "elder", &working, &own).await;
        wait_leaf_of(e, "relaylet-elder-own", "elder").await;
        // Created after "elder" (and its name sorts after it, should both share a second).
        let contested = [("relaylet.io/node-name", "relaylet-contested")];
        create_secret(e, "younger", "younger", &working, &contested).await;
        wait_leaf_of(e, "relaylet-contested", "younger").await;
        let secrets: Api<Secret> = Api::namespaced(e.root_client().await, RELAYLET_NAMESPACE);
        let point_elder_at = async |node: &str| {
            let patch = serde_json::json!({
                "metadata": {"annotations": {"relaylet.io/node-name": node}}
            });
            secrets
                .patch("elder", &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
        };
        // The older Secret asks for the same node name: it takes it.
        point_elder_at("relaylet-contested").await;
        wait_leaf_of(e, "relaylet-contested", "elder").await;
        // ... and gives it up: the younger Secret, unchanged since, gets it back.
        point_elder_at("relaylet-elder-own").await;
        wait_leaf_of(e, "relaylet-contested", "younger").await;
        wait_leaf_of(e, "relaylet-elder-own", "elder").await;
        let leaf = e
            .sandbox
            .relaylet
            .registry
            .by_node("relaylet-contested")
            .unwrap();
        assert!(leaf.client().version().await.is_ok());
    });
}

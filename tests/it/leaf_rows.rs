//! The row per leaf (issue 58): a `LeafCluster` beside every leaf Secret, refused ones
//! included, that `kubectl get leafclusters` shows with READY, REASON, VERSION, NODE,
//! SERVED-BY, PODS and CREDENTIAL-EXPIRES, kept current by relaylet and gone with its Secret.
//! Read through the sandbox root's API as an operator would, and with kubectl.

use relaylet_dev::testkit as support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use relaylet::model::leaf_row::{self, LeafStatus};
use relaylet_dev::sandbox::{RELAYLET_NAMESPACE, Settings, leaf_secret};
use support::{Env, RT, Run, describe, text};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

fn env() -> &'static Env {
    support::env(Settings::default)
}

fn rows(client: kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(client, RELAYLET_NAMESPACE, &leaf_row::api_resource())
}

/// Row `name`'s status once `done` holds for it.
async fn row_when(e: &Env, name: &str, done: impl Fn(&LeafStatus) -> bool) -> LeafStatus {
    let api = rows(e.root_client().await);
    let mut last = None;
    let waited = tokio::time::timeout(HANG, async {
        loop {
            if let Ok(Some(row)) = api.get_opt(name).await
                && let Ok(status) = serde_json::from_value::<LeafStatus>(row.data["status"].clone())
            {
                if done(&status) {
                    return status;
                }
                last = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    waited.unwrap_or_else(|_| panic!("row {name} never got there; last: {last:?}"))
}

#[test]
fn every_registered_leaf_has_a_row_that_kubectl_get_shows() {
    let e = env();
    let me = e.sandbox.config.replica_name();
    let status = RT.block_on(row_when(e, "leaf-leaf-1", |s| s.ready == "True"));
    assert_eq!(status.reason, "LeafReady");
    assert_eq!(status.leaf.as_deref(), Some("leaf-1"));
    assert_eq!(status.node.as_deref(), Some("relaylet-leaf-1"));
    assert_eq!(status.served_by.as_deref(), Some(me.as_str()));
    assert!(
        status
            .version
            .as_deref()
            .is_some_and(|v| v.starts_with('v')),
        "{status:?}"
    );
    assert!(status.pods.is_some(), "{status:?}");
    // The Secret's version the row speaks of is the Secret's own.
    let secret_rv = RT.block_on(async {
        let secrets: Api<Secret> = Api::namespaced(e.root_client().await, RELAYLET_NAMESPACE);
        secrets
            .get("leaf-leaf-1")
            .await
            .unwrap()
            .metadata
            .resource_version
    });
    assert_eq!(status.secret_resource_version, secret_rv);

    let kubeconfig = e.sandbox.files().join("rows-admin.kubeconfig");
    std::fs::write(&kubeconfig, e.sandbox.root.admin_kubeconfig().unwrap()).unwrap();
    let k = support::kubectl("1.35");
    let out = Run::new(
        &k,
        &kubeconfig,
        &["get", "leaves", "-n", RELAYLET_NAMESPACE],
    )
    .output();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&k, &out));
    let shown = text(&out.stdout);
    let header: Vec<&str> = shown.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "READY",
            "REASON",
            "VERSION",
            "NODE",
            "SERVED-BY",
            "PODS",
            "CREDENTIAL-EXPIRES",
            "AGE"
        ],
        "{shown}"
    );
    let row = shown
        .lines()
        .find(|l| l.starts_with("leaf-leaf-1 "))
        .unwrap_or_else(|| panic!("no row for leaf-leaf-1:\n{shown}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[1..5],
        [
            "True",
            "LeafReady",
            status.version.as_deref().unwrap(),
            "relaylet-leaf-1"
        ],
        "{row}"
    );
    assert_eq!(cells[5], me, "{row}");
}

#[test]
fn a_refused_secret_has_a_row_saying_why_and_the_row_goes_with_its_secret() {
    let e = env();
    RT.block_on(async {
        let secrets: Api<Secret> = Api::namespaced(e.root_client().await, RELAYLET_NAMESPACE);
        // Names the node leaf-1's Secret holds: refused, leaf-1 keeps it.
        let mut secret = leaf_secret(
            RELAYLET_NAMESPACE,
            "rows-taken",
            "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
        );
        secret.metadata.annotations.get_or_insert_default().insert(
            relaylet::leaf::NODE_NAME_ANNOTATION.into(),
            "relaylet-leaf-1".into(),
        );
        let created = secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let name = created.metadata.name.clone().unwrap();
        let status = row_when(e, &name, |s| s.ready == "False").await;
        assert_eq!(status.reason, "SecretRefusedNodeNameTaken", "{status:?}");
        assert!(status.message.contains("relaylet-leaf-1"), "{status:?}");
        assert_eq!(
            status.secret_resource_version,
            created.metadata.resource_version
        );
        assert_eq!(status.served_by, None);

        // The sandbox has no garbage collector: relaylet deletes the row itself.
        secrets
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        let api = rows(e.root_client().await);
        tokio::time::timeout(HANG, async {
            while api.get_opt(&name).await.unwrap().is_some() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("row {name} outlived its Secret"));
        // leaf-1 never lost its row.
        let kept = row_when(e, "leaf-leaf-1", |_| true).await;
        assert_eq!(kept.node.as_deref(), Some("relaylet-leaf-1"));
    });
}

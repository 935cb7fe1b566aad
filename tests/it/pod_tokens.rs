//! The root's service-account tokens for the pods relaylet runs (`LEAF_POD_ROOT_APISERVER`),
//! through the sandbox: a root pod's token sources become a Secret in the leaf holding a token
//! the root apiserver issued for the pod's service account and bound to the pod, which
//! authenticates at the root as that service account; the copy reads it (its token source
//! rewritten, its root CA copied under another name, the root apiserver's address in its
//! environment, no leaf token mounted); the Secret goes with the pod, and the token stops
//! working with it.

use relaylet_dev::testkit as support;

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use relaylet_dev::sandbox::{RELAYLET_ROOT_USER, Settings};
use relaylet_sim::apiserver::auth::Rule;
use serde_json::json;
use support::{Env, RT, env};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);
const NODE: &str = "relaylet-leaf-1";

fn settings() -> Settings {
    let mut s = Settings::default();
    s.env.insert(
        "LEAF_POD_ROOT_APISERVER".into(),
        "https://root.example:6443".into(),
    );
    // What the chart grants with podSync.rootApiserver set.
    s.root_rules.push(
        Rule::user(RELAYLET_ROOT_USER)
            .verbs(&["create"])
            .api_groups(&[""])
            .resources(&["serviceaccounts/token"]),
    );
    s
}

async fn leaf(e: &Env) -> Client {
    let kubeconfig = e.sandbox.leaves["leaf-1"].admin_kubeconfig().unwrap();
    relaylet_dev::sandbox::kube_client(&kubeconfig)
        .await
        .unwrap()
}

/// Polls `get` until it gives something; `what` names the wait.
async fn until_some<T>(what: &str, mut get: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        if let Some(v) = get().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {HANG:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Who the root apiserver says `token` is (`None`: it does not authenticate).
async fn whoami(e: &Env, token: &str) -> Option<String> {
    let kubeconfig = e.sandbox.root.api.kubeconfig_with_token("pod", token);
    let client = relaylet_dev::sandbox::kube_client(&kubeconfig)
        .await
        .unwrap();
    let reviews: Api<SelfSubjectReview> = Api::all(client);
    let review: SelfSubjectReview = serde_json::from_value(json!({})).unwrap();
    match reviews.create(&PostParams::default(), &review).await {
        Ok(r) => r.status?.user_info?.username,
        Err(kube::Error::Api(e)) if e.code == 401 => None,
        Err(err) => panic!("{err}"),
    }
}

#[test]
fn a_pods_tokens_are_the_roots_bound_to_it_and_go_with_it() {
    let e = env(settings);
    RT.block_on(async {
        let root = e.root_client().await;
        let leaf = leaf(e).await;
        let pp = PostParams::default();
        Api::<ServiceAccount>::namespaced(root.clone(), "default")
            .create(&pp, &serde_json::from_value(json!({"metadata": {"name": "builder"}})).unwrap())
            .await
            .unwrap();
        // The root's CA bundle, as its root-ca-cert-publisher writes it in every namespace.
        let root_cas: Api<ConfigMap> = Api::namespaced(root.clone(), "default");
        if root_cas.get_opt("kube-root-ca.crt").await.unwrap().is_none() {
            root_cas
                .create(
                    &pp,
                    &serde_json::from_value(json!({"metadata": {"name": "kube-root-ca.crt"},
                        "data": {"ca.crt": "the root's CA"}}))
                    .unwrap(),
                )
                .await
                .unwrap();
        }
        // The pod as the root's admission leaves it: its kube-api-access volume mounted.
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "tokened", "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "serviceAccountName": "builder",
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "600"],
                    "volumeMounts": [{"name": "kube-api-access-x", "readOnly": true,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                "volumes": [{"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                ]}}]
            }
        }))
        .unwrap();
        let roots: Api<Pod> = Api::namespaced(root.clone(), "default");
        let uid = roots.create(&pp, &pod).await.unwrap().metadata.uid.unwrap();
        let leaf_pods: Api<Pod> = Api::namespaced(leaf.clone(), "default");
        let copy = until_some("the copy", async || leaf_pods.get_opt("tokened").await.unwrap()).await;
        let spec = serde_json::to_value(copy.spec.unwrap()).unwrap();
        let secret = format!("relaylet-token-{uid}");
        assert_eq!(spec["automountServiceAccountToken"], false, "no leaf token");
        let sources = &spec["volumes"][0]["projected"]["sources"];
        assert_eq!(sources[0]["secret"]["name"], secret.as_str());
        assert_eq!(sources[0]["secret"]["items"][0]["path"], "token");
        assert_eq!(sources[1]["configMap"]["name"], "relaylet-root-ca.crt");
        let env = &spec["containers"][0]["env"];
        assert!(
            env.as_array().unwrap().iter().any(|v| v["name"] == "KUBERNETES_SERVICE_HOST"
                && v["value"] == "root.example"),
            "{env}"
        );
        // The root CA is copied beside the leaf's own, under its other name.
        let leaf_cas: Api<ConfigMap> = Api::namespaced(leaf.clone(), "default");
        let ca = leaf_cas.get("relaylet-root-ca.crt").await.unwrap();
        assert_eq!(
            ca.data.unwrap()["ca.crt"],
            root_cas.get("kube-root-ca.crt").await.unwrap().data.unwrap()["ca.crt"]
        );
        // The token, made before the copy, is the root's, for the pod's service account.
        let secrets: Api<Secret> = Api::namespaced(leaf.clone(), "default");
        let token = secrets.get(&secret).await.unwrap().data.unwrap()["token-0"].0.clone();
        let token = String::from_utf8(token).unwrap();
        assert_eq!(
            whoami(e, &token).await.as_deref(),
            Some("system:serviceaccount:default:builder")
        );

        // The pod gone, its tokens Secret goes, and the token no longer works (bound to it).
        roots
            .delete("tokened", &DeleteParams::default())
            .await
            .unwrap();
        until_some("the tokens Secret deleted", async || {
            secrets.get_opt(&secret).await.unwrap().is_none().then_some(())
        })
        .await;
        until_some("the root pod gone", async || {
            roots.get_opt("tokened").await.unwrap().is_none().then_some(())
        })
        .await;
        assert_eq!(whoami(e, &token).await, None, "bound to the deleted pod");
    });
}

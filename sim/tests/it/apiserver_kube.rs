//! kube-rs 5 against the API server stand-in: the runtime watcher (ordered add/modify/delete,
//! pagination, streaming lists, relisting after 410 Gone across a server restart), server-side
//! apply with conflicting field managers, optimistic concurrency, merge and strategic patches
//! on Node status, and Lease CRUD as relaylet's node controller does it.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use relaylet_sim::apiserver::{ApiServer, ApiServerConfig, Store};
use relaylet_sim::tls::Ca;
use serde_json::json;

const STEP: Duration = Duration::from_secs(10);

async fn start(
    ca: Arc<Ca>,
    store: Option<Store>,
    listen: Option<std::net::SocketAddr>,
) -> ApiServer {
    let mut cfg = ApiServerConfig::new("sim", ca);
    if let Some(addr) = listen {
        cfg.listen = addr;
    }
    match store {
        Some(store) => ApiServer::start_with_store(cfg, store).await.unwrap(),
        None => ApiServer::start(cfg).await.unwrap(),
    }
}

async fn client(api: &ApiServer, user: &str) -> Client {
    let yaml = api.kubeconfig(user, &["system:masters"]).unwrap();
    let kubeconfig = Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "data": {"v": value}
    }))
    .unwrap()
}

/// Next event that is not an error, within STEP.
async fn next_event<S>(stream: &mut S) -> Event<ConfigMap>
where
    S: futures::Stream<Item = Result<Event<ConfigMap>, watcher::Error>> + Unpin,
{
    loop {
        match tokio::time::timeout(STEP, stream.next()).await {
            Ok(Some(Ok(event))) => return event,
            Ok(Some(Err(_))) => continue,
            Ok(None) => panic!("watch stream ended"),
            Err(_) => panic!("no watch event within {STEP:?}"),
        }
    }
}

fn describe(event: &Event<ConfigMap>) -> String {
    let name = |c: &ConfigMap| {
        let v = c
            .data
            .as_ref()
            .and_then(|d| d.get("v"))
            .cloned()
            .unwrap_or_default();
        format!("{}={v}", c.metadata.name.clone().unwrap_or_default())
    };
    match event {
        Event::Init => "Init".into(),
        Event::InitApply(c) => format!("InitApply {}", name(c)),
        Event::InitDone => "InitDone".into(),
        Event::Apply(c) => format!("Apply {}", name(c)),
        Event::Delete(c) => format!("Delete {}", name(c)),
    }
}

async fn events<S>(stream: &mut S, n: usize) -> Vec<String>
where
    S: futures::Stream<Item = Result<Event<ConfigMap>, watcher::Error>> + Unpin,
{
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(describe(&next_event(stream).await));
    }
    out
}

#[tokio::test]
async fn watcher_sees_changes_in_order_and_relists_after_gone() {
    let ca = Arc::new(Ca::new("sim").unwrap());
    let api = start(ca.clone(), None, None).await;
    let client = client(&api, "admin").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &cm(name, "0"))
            .await
            .unwrap();
    }
    // Page size 1 makes the initial list use limit/continue.
    let config = watcher::Config::default().page_size(1);
    let mut stream = watcher::watcher(cms.clone(), config)
        .default_backoff()
        .boxed();
    assert_eq!(
        events(&mut stream, 5).await,
        [
            "Init",
            "InitApply a=0",
            "InitApply b=0",
            "InitApply c=0",
            "InitDone"
        ]
    );

    cms.create(&PostParams::default(), &cm("d", "1"))
        .await
        .unwrap();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await
    .unwrap();
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        events(&mut stream, 3).await,
        ["Apply d=1", "Apply a=2", "Delete b=0"]
    );

    // Restart: while the server is down, objects change and history is compacted, so the
    // watcher's resume point is gone (410) and it must relist to see the new state.
    let addr = api.addr;
    let store = api.store().clone();
    api.stop();
    drop(api);
    let cm_kind = relaylet_sim::apiserver::kinds::by_resource("", "configmaps").unwrap();
    store.delete(cm_kind, "default", "c", None).unwrap();
    store.create_typed(&cm("e", "3")).unwrap();
    store.compact();
    let mut restarted = None;
    for _ in 0..50 {
        let mut cfg = ApiServerConfig::new("sim", ca.clone());
        cfg.listen = addr;
        match ApiServer::start_with_store(cfg, store.clone()).await {
            Ok(api) => {
                restarted = Some(api);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let _api = restarted.expect("server restarts on its port");
    let mut relisted = Vec::new();
    loop {
        let event = describe(&next_event(&mut stream).await);
        if event == "Init" {
            relisted.push(event);
            break;
        }
    }
    relisted.extend(events(&mut stream, 4).await);
    assert_eq!(
        relisted,
        [
            "Init",
            "InitApply a=2",
            "InitApply d=1",
            "InitApply e=3",
            "InitDone"
        ]
    );
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_then_changes() {
    let ca = Arc::new(Ca::new("sim").unwrap());
    let api = start(ca, None, None).await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&api, "admin").await, "default");
    cms.create(&PostParams::default(), &cm("x", "1"))
        .await
        .unwrap();
    let config = watcher::Config::default().streaming_lists();
    let mut stream = watcher::watcher(cms.clone(), config).boxed();
    assert_eq!(
        events(&mut stream, 3).await,
        ["Init", "InitApply x=1", "InitDone"]
    );
    cms.create(&PostParams::default(), &cm("y", "2"))
        .await
        .unwrap();
    assert_eq!(events(&mut stream, 1).await, ["Apply y=2"]);
}

#[tokio::test]
async fn server_side_apply_tracks_managers_and_conflicts() {
    let ca = Arc::new(Ca::new("sim").unwrap());
    let api = start(ca, None, None).await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&api, "admin").await, "default");
    let config = |v: serde_json::Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}, "data": v});
    let a = PatchParams::apply("manager-a");
    let created = cms
        .patch(
            "shared",
            &a,
            &Patch::Apply(config(json!({"owner": "a", "both": "1"}))),
        )
        .await
        .unwrap();
    let managed = created.metadata.managed_fields.clone().unwrap();
    assert_eq!(managed.len(), 1);
    assert_eq!(managed[0].manager.as_deref(), Some("manager-a"));
    assert_eq!(managed[0].operation.as_deref(), Some("Apply"));

    // Same value: shared ownership, no conflict.
    let b = PatchParams::apply("manager-b");
    cms.patch("shared", &b, &Patch::Apply(config(json!({"both": "1"}))))
        .await
        .unwrap();
    // Different value for a field manager-a owns: 409 Conflict naming the field.
    let err = cms
        .patch("shared", &b, &Patch::Apply(config(json!({"both": "2"}))))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 409);
            assert_eq!(status.reason, "Conflict");
            assert_eq!(
                status.message,
                "Apply failed with 1 conflict: conflict with \"manager-a\": .data.both"
            );
        }
        other => panic!("expected a 409, got {other:?}"),
    }
    // Forced, the value changes and manager-a no longer owns it.
    let forced = cms
        .patch(
            "shared",
            &b.clone().force(),
            &Patch::Apply(config(json!({"both": "2"}))),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["both"], "2");
    let a_fields = forced
        .metadata
        .managed_fields
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.manager.as_deref() == Some("manager-a"))
        .and_then(|m| m.fields_v1.clone())
        .unwrap();
    assert!(
        a_fields.0["f:data"].get("f:both").is_none(),
        "{:?}",
        a_fields.0
    );
    assert!(a_fields.0["f:data"].get("f:owner").is_some());
    // manager-a drops "owner" from its config: the field is removed (no one else owns it).
    let pruned = cms
        .patch("shared", &a, &Patch::Apply(config(json!({}))))
        .await
        .unwrap();
    assert!(!pruned.data.unwrap_or_default().contains_key("owner"));

    // The apply body may be YAML, as its content type says.
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\ndata:\n  k: yes-as-string\n  n: \"1\"\n";
    let request = http::Request::patch(
        "/api/v1/namespaces/default/configmaps/from-yaml?fieldManager=yaml-applier",
    )
    .header("content-type", "application/apply-patch+yaml")
    .body(yaml.as_bytes().to_vec())
    .unwrap();
    let created: ConfigMap = cms.clone().into_client().request(request).await.unwrap();
    let data = created.data.unwrap();
    assert_eq!(
        (data["k"].as_str(), data["n"].as_str()),
        ("yes-as-string", "1")
    );
    assert_eq!(
        created.metadata.managed_fields.unwrap()[0]
            .manager
            .as_deref(),
        Some("yaml-applier")
    );
}

#[tokio::test]
async fn stale_update_is_a_conflict() {
    let ca = Arc::new(Ca::new("sim").unwrap());
    let api = start(ca, None, None).await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&api, "admin").await, "default");
    let original = cms
        .create(&PostParams::default(), &cm("rv", "0"))
        .await
        .unwrap();
    let mut first = original.clone();
    first.data = Some([("v".to_string(), "1".to_string())].into());
    let updated = cms
        .replace("rv", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        original.metadata.resource_version
    );
    let mut stale = original.clone();
    stale.data = Some([("v".to_string(), "2".to_string())].into());
    match cms
        .replace("rv", &PostParams::default(), &stale)
        .await
        .unwrap_err()
    {
        kube::Error::Api(status) => {
            assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
            assert!(
                status
                    .message
                    .starts_with("Operation cannot be fulfilled on configmaps \"rv\"")
            );
        }
        other => panic!("expected a 409, got {other:?}"),
    }
    let current = cms.get("rv").await.unwrap();
    assert_eq!(current.data.unwrap()["v"], "1");
    match cms.get("missing").await.unwrap_err() {
        kube::Error::Api(status) => {
            assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"))
        }
        other => panic!("expected a 404, got {other:?}"),
    }
}

#[tokio::test]
async fn node_status_patches_merge_like_upstream() {
    let ca = Arc::new(Ca::new("sim").unwrap());
    let api = start(ca, None, None).await;
    let nodes: Api<Node> = Api::all(client(&api, "admin").await);
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "virtual-leaf"},
        "spec": {},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "leaf"}]}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();

    // Strategic merge on addresses: merged by type, patch order first.
    let smp = json!({"status": {
        "addresses": [{"type": "InternalDNS", "address": "relaylet.ns.svc"}, {"type": "InternalIP", "address": "10.0.0.9"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "LeafHealthy"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}
    }});
    let patched = nodes
        .patch_status(
            "virtual-leaf",
            &PatchParams::default(),
            &Patch::Strategic(smp),
        )
        .await
        .unwrap();
    let addresses: Vec<(String, String)> = patched
        .status
        .as_ref()
        .unwrap()
        .addresses
        .clone()
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addresses,
        [
            ("InternalDNS".to_string(), "relaylet.ns.svc".to_string()),
            ("InternalIP".to_string(), "10.0.0.9".to_string()),
            ("Hostname".to_string(), "leaf".to_string()),
        ]
    );
    // A second SMP updates one condition by type and leaves the rest.
    let smp = json!({"status": {"conditions": [{"type": "MemoryPressure", "status": "False"}]}});
    let patched = nodes
        .patch_status(
            "virtual-leaf",
            &PatchParams::default(),
            &Patch::Strategic(smp),
        )
        .await
        .unwrap();
    let conditions = patched.status.unwrap().conditions.unwrap();
    assert_eq!(conditions.len(), 2);

    // JSON merge patch replaces the whole list (atomic replacement of addresses).
    let merge =
        json!({"status": {"addresses": [{"type": "InternalDNS", "address": "relaylet.ns.svc"}]}});
    let patched = nodes
        .patch_status(
            "virtual-leaf",
            &PatchParams::default(),
            &Patch::Merge(merge),
        )
        .await
        .unwrap();
    assert_eq!(
        patched
            .status
            .as_ref()
            .unwrap()
            .addresses
            .as_ref()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        patched
            .status
            .unwrap()
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        10250
    );

    // The status subresource does not write spec, and the main resource does not write status.
    let spec_via_status = json!({"spec": {"unschedulable": true}, "status": {"phase": "Running"}});
    let patched = nodes
        .patch_status(
            "virtual-leaf",
            &PatchParams::default(),
            &Patch::Merge(spec_via_status),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().unschedulable, None);
    let status_via_main = json!({"status": {"phase": "Terminated"}, "metadata": {"labels": {"type": "virtual-kubelet"}}});
    let patched = nodes
        .patch(
            "virtual-leaf",
            &PatchParams::default(),
            &Patch::Merge(status_via_main),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(patched.metadata.labels.unwrap()["type"], "virtual-kubelet");

    // Server-side apply on status: addresses are a list-map keyed by type.
    let apply = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "virtual-leaf"},
        "status": {"addresses": [{"type": "ExternalIP", "address": "203.0.113.1"}]}});
    let applied = nodes
        .patch_status(
            "virtual-leaf",
            &PatchParams::apply("relaylet").force(),
            &Patch::Apply(apply),
        )
        .await
        .unwrap();
    let types: Vec<String> = applied
        .status
        .unwrap()
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| a.type_)
        .collect();
    assert_eq!(types, ["InternalDNS", "ExternalIP"]);
}

#[tokio::test]
async fn leases_crud_and_label_selection() {
    let ca = Arc::new(Ca::new("sim").unwrap());
    let api = start(ca, None, None).await;
    let leases: Api<Lease> = Api::namespaced(client(&api, "admin").await, "kube-node-lease");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "virtual-leaf", "labels": {"relaylet.io/leaf": "a"}},
        "spec": {"holderIdentity": "virtual-leaf", "leaseDurationSeconds": 40, "renewTime": "2026-01-01T00:00:00.000000Z"}
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    assert!(created.metadata.uid.is_some());
    let mut renewed = created.clone();
    renewed.spec.as_mut().unwrap().renew_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            "2026-01-01T00:00:10.000000Z".parse().unwrap(),
        ));
    let renewed = leases
        .replace("virtual-leaf", &PostParams::default(), &renewed)
        .await
        .unwrap();
    assert_ne!(
        renewed.metadata.resource_version,
        created.metadata.resource_version
    );
    let listed = leases
        .list(&ListParams::default().labels("relaylet.io/leaf=a"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let none = leases
        .list(&ListParams::default().labels("relaylet.io/leaf notin (a)"))
        .await
        .unwrap();
    assert!(none.items.is_empty());
    let merged = leases
        .patch(
            "virtual-leaf",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "replica-2"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.spec.unwrap().holder_identity.as_deref(),
        Some("replica-2")
    );
    leases
        .delete("virtual-leaf", &DeleteParams::default())
        .await
        .unwrap();
    assert!(leases.get_opt("virtual-leaf").await.unwrap().is_none());
    let all: Vec<Lease> = leases.list(&ListParams::default()).await.unwrap().items;
    assert!(all.is_empty());
}

#[tokio::test]
async fn raw_watches_report_gone_bookmarks_and_selector_transitions() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{WatchEvent, WatchParams};

    let ca = Arc::new(Ca::new("sim").unwrap());
    // Bookmarks within a step, not the minute upstream waits.
    let mut cfg = ApiServerConfig::new("sim", ca);
    cfg.bookmark_every = Duration::from_secs(1);
    let api = ApiServer::start(cfg).await.unwrap();
    let client = client(&api, "admin").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("old", "0"))
        .await
        .unwrap();
    api.store().compact();

    // A resume point older than the kept history: one ERROR event with 410 Expired.
    let mut stream = cms
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(STEP, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(
                e.message.starts_with("too old resource version: 1 ("),
                "{}",
                e.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }

    // Bookmarks (on by default in kube-rs) carry the current revision.
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(STEP, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, rv),
        other => panic!("expected a BOOKMARK, got {other:?}"),
    }

    // Objects leaving a label selection are DELETED for that watch, entering are ADDED.
    let labelled = |name: &str, team: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"team": team}}}))
            .unwrap()
    };
    cms.create(&PostParams::default(), &labelled("sel", "blue"))
        .await
        .unwrap();
    let rv = cms
        .get("sel")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().labels("team=blue"), &rv)
        .await
        .unwrap()
        .boxed();
    cms.patch(
        "sel",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "red"}}})),
    )
    .await
    .unwrap();
    cms.patch(
        "sel",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "blue"}}})),
    )
    .await
    .unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        match tokio::time::timeout(STEP, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Deleted(_) => kinds.push("DELETED"),
            WatchEvent::Added(_) => kinds.push("ADDED"),
            WatchEvent::Modified(_) => kinds.push("MODIFIED"),
            _ => {}
        }
    }
    assert_eq!(kinds, ["DELETED", "ADDED"]);

    // The root pod index watches pods by node with a field selector.
    let pods: Api<Pod> = Api::all(client.clone());
    let pod = |name: &str, node: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}))
        .unwrap()
    };
    let mut stream = pods
        .watch(&WatchParams::default().fields("spec.nodeName=leaf-a"), "0")
        .await
        .unwrap()
        .boxed();
    let ns_pods: Api<Pod> = Api::namespaced(client, "default");
    ns_pods
        .create(&PostParams::default(), &pod("on-b", "leaf-b"))
        .await
        .unwrap();
    ns_pods
        .create(&PostParams::default(), &pod("on-a", "leaf-a"))
        .await
        .unwrap();
    match tokio::time::timeout(STEP, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Added(p) => {
            assert_eq!(p.metadata.name.as_deref(), Some("on-a"));
            assert_eq!(
                p.status.unwrap().phase.as_deref(),
                Some("Pending"),
                "status is reset on create"
            );
        }
        other => panic!("expected ADDED on-a, got {other:?}"),
    }
}

#[tokio::test]
async fn reviews_and_client_ca_serve_a_kubelet_like_authenticator() {
    use k8s_openapi::api::authentication::v1::TokenReview;
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    use relaylet_sim::apiserver::{Policy, Rule, UserInfo};

    let ca = Arc::new(Ca::new("sim").unwrap());
    let mut cfg = ApiServerConfig::new("sim", ca.clone());
    cfg.tokens = vec![("user-token".into(), UserInfo::new("alice", &["devs"]))];
    cfg.policy = Policy::new(vec![
        // What `system:auth-delegator` grants relaylet.
        Rule::user("relaylet")
            .verbs(&["create"])
            .api_groups(&["authentication.k8s.io", "authorization.k8s.io"])
            .resources(&["tokenreviews", "subjectaccessreviews"]),
        Rule::user("relaylet")
            .verbs(&["get"])
            .api_groups(&[""])
            .resources(&["configmaps"])
            .namespaces(&["kube-system"])
            .names(&["extension-apiserver-authentication"]),
        Rule::group("devs")
            .verbs(&["create"])
            .api_groups(&[""])
            .resources(&["nodes/proxy"]),
    ]);
    let api = ApiServer::start(cfg).await.unwrap();
    let yaml = api.kubeconfig("relaylet", &[]).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::from_yaml(&yaml).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = Client::try_from(config).unwrap();

    let auth_cm: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let cm = auth_cm
        .get("extension-apiserver-authentication")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["client-ca-file"], ca.cert_pem());
    // Only that one object: the rule names it.
    assert!(auth_cm.get("other").await.is_err());

    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review: TokenReview =
        serde_json::from_value(json!({"spec": {"token": "user-token"}})).unwrap();
    let answered = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let status = answered.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    let user = status.user.unwrap();
    assert_eq!(user.username.as_deref(), Some("alice"));
    assert_eq!(user.groups.unwrap(), ["devs", "system:authenticated"]);
    let bad: TokenReview = serde_json::from_value(json!({"spec": {"token": "nope"}})).unwrap();
    assert_ne!(
        reviews
            .create(&PostParams::default(), &bad)
            .await
            .unwrap()
            .status
            .unwrap()
            .authenticated,
        Some(true)
    );

    let sars: Api<SubjectAccessReview> = Api::all(client.clone());
    let sar = |verb: &str, sub: &str| -> SubjectAccessReview {
        serde_json::from_value(json!({"spec": {"user": "alice", "groups": ["devs"],
            "resourceAttributes": {"verb": verb, "resource": "nodes", "subresource": sub, "name": "leaf"}}}))
        .unwrap()
    };
    let allowed = sars
        .create(&PostParams::default(), &sar("create", "proxy"))
        .await
        .unwrap();
    assert!(allowed.status.unwrap().allowed);
    let denied = sars
        .create(&PostParams::default(), &sar("get", "proxy"))
        .await
        .unwrap();
    assert!(!denied.status.unwrap().allowed);

    // Without the delegator rule, creating reviews is forbidden.
    let other = kube::Config::from_custom_kubeconfig(
        Kubeconfig::from_yaml(&api.kubeconfig("mallory", &[]).unwrap()).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let forbidden = Api::<TokenReview>::all(Client::try_from(other).unwrap())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_err();
    match forbidden {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden")),
        other => panic!("expected 403, got {other:?}"),
    }
}

#[tokio::test]
async fn json_patch_and_watch_timeout() {
    use kube::api::{WatchEvent, WatchParams};

    let ca = Arc::new(Ca::new("sim").unwrap());
    let api = start(ca, None, None).await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&api, "admin").await, "default");
    cms.create(&PostParams::default(), &cm("jp", "0"))
        .await
        .unwrap();
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/v", "value": "0"},
        {"op": "add", "path": "/data/w", "value": "1"},
        {"op": "replace", "path": "/data/v", "value": "2"}
    ]))
    .unwrap();
    let patched = cms
        .patch("jp", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    let data = patched.data.unwrap();
    assert_eq!((data["v"].as_str(), data["w"].as_str()), ("2", "1"));
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/v", "value": "0"}])).unwrap();
    match cms
        .patch("jp", &PatchParams::default(), &Patch::<()>::Json(failing))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!(s.code, 422),
        other => panic!("expected 422, got {other:?}"),
    }

    // timeoutSeconds ends the stream cleanly: the watch is open (it delivers a change made
    // after it started), then ends by itself, with no error event, while the client still
    // reads (nothing else ends a watch the client keeps).
    let rv = cms
        .get("jp")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(2).disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    cms.patch(
        "jp",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "3"}})),
    )
    .await
    .unwrap();
    match tokio::time::timeout(STEP, stream.next()).await.unwrap() {
        Some(Ok(WatchEvent::Modified(cm))) => {
            assert_eq!(cm.data.unwrap()["v"], "3");
        }
        other => panic!("expected the change, got {other:?}"),
    }
    let rest: Vec<_> = tokio::time::timeout(STEP, stream.collect::<Vec<_>>())
        .await
        .expect("the server ends the watch at its timeoutSeconds");
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test]
async fn metadata_lists_and_watchers_get_partial_objects() {
    let ca = Arc::new(Ca::new("sim").unwrap());
    let api = start(ca, None, None).await;
    let client = client(&api, "admin").await;
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, managed) in [("virtual-a", true), ("real-b", false)] {
        let mut labels = json!({});
        if managed {
            labels["app.kubernetes.io/managed-by"] = json!("relaylet");
        }
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
            "status": {"capacity": {"cpu": "4"}}}))
            .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let listed = nodes
        .list_metadata(&ListParams::default().labels("app.kubernetes.io/managed-by=relaylet"))
        .await
        .unwrap();
    let names: Vec<_> = listed
        .items
        .iter()
        .map(|n| n.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["virtual-a"]);
    assert_eq!(
        listed.items[0].types.as_ref().unwrap().kind,
        "PartialObjectMetadata"
    );

    let partial: Api<kube::core::PartialObjectMeta<Node>> = Api::all(client.clone());
    let mut stream = watcher::watcher(partial, watcher::Config::default()).boxed();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let event = tokio::time::timeout(STEP, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(match event {
            Event::Init => "Init".to_string(),
            Event::InitApply(n) => format!("InitApply {}", n.metadata.name.unwrap()),
            Event::InitDone => "InitDone".to_string(),
            Event::Apply(n) => format!("Apply {}", n.metadata.name.unwrap()),
            Event::Delete(n) => format!("Delete {}", n.metadata.name.unwrap()),
        });
    }
    assert_eq!(
        seen,
        [
            "Init",
            "InitApply real-b",
            "InitApply virtual-a",
            "InitDone"
        ]
    );
    nodes
        .delete("real-b", &DeleteParams::default())
        .await
        .unwrap();
    match tokio::time::timeout(STEP, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        Event::Delete(n) => assert_eq!(n.metadata.name.as_deref(), Some("real-b")),
        other => panic!("expected a delete, got {other:?}"),
    }
}

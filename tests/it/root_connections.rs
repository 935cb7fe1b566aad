//! Connections that do not grow with the leaves (issue 39): relaylet's root client carries its
//! watches and calls as HTTP/2 streams over a few connections, counted from the sim root
//! apiserver's side (which, like kube-apiserver, offers h2 by ALPN with 100 streams per
//! connection); its pool spreads watches over more connections when a server allows few streams
//! per connection; the leaf API client speaks h2 too, and the leaf stream client (exec, the
//! spare connection) offers HTTP/1.1 only; a server without h2 gets HTTP/1.1.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{AttachParams, ListParams, PostParams, WatchEvent, WatchParams};
use relaylet::config::Config;
use relaylet::kube_client::Budget;
use relaylet::ops::Shutdown;
use relaylet_dev::sandbox::kube_client;
use relaylet_sim::apiserver::{ApiServer, ApiServerConfig};
use relaylet_sim::cluster::{Cluster, ClusterOptions, SimContainer, SimPod};
use serde_json::json;
use tokio::io::AsyncReadExt;

const NAMESPACE: &str = "relaylet-system";
const POD_NAME: &str = "relaylet-0";

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(120);

/// The root user relaylet's client certificate names (what the sim counts connections by).
fn relaylet_user() -> String {
    format!("system:serviceaccount:{NAMESPACE}:{POD_NAME}")
}

/// Checks `check` every 50 ms until it yields a value; `HANG` only turns a hang into a failure.
async fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let poll = async {
        loop {
            if let Some(value) = check() {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(HANG, poll)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {HANG:?}"))
}

async fn kube_config(kubeconfig: &str) -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(kubeconfig).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config")
}

async fn root_cluster() -> Cluster {
    let root = Cluster::start(ClusterOptions::new("root"))
        .await
        .expect("root cluster starts");
    root.api
        .store()
        .create_typed(&Namespace {
            metadata: ObjectMeta {
                name: Some(NAMESPACE.to_string()),
                ..Default::default()
            },
            ..Default::default()
        })
        .expect("namespace created");
    root
}

/// relaylet on 127.0.0.1 against `root`, with the root client relaylet's own `serve` builds.
async fn start_relaylet(root: &Cluster) -> (relaylet::Running, Shutdown) {
    let env: BTreeMap<String, String> = BTreeMap::from([
        ("LEAF_NODE_IP".into(), "127.0.0.1".into()),
        // The test makes the leaf copies itself, as another syncer would.
        ("LEAF_POD_SYNC".into(), "false".into()),
        ("NODE_SERVER_PORT".into(), "0".into()),
        ("METRICS_ADDR".into(), "127.0.0.1:0".into()),
        ("AUTH_MODE".into(), "webhook".into()),
        ("POD_NAME".into(), POD_NAME.into()),
        ("POD_NAMESPACE".into(), NAMESPACE.into()),
    ]);
    let config = Config::from_lookup(|name| env.get(name).cloned()).expect("config");
    if config.leader_elect {
        let admin = kube_client(&root.admin_kubeconfig().expect("admin kubeconfig"))
            .await
            .expect("admin client");
        relaylet_dev::sandbox::replica_pod::running(&admin, NAMESPACE, POD_NAME, "127.0.0.1")
            .await
            .expect("the replica's pod");
    }
    let kubeconfig = root
        .kubeconfig(&relaylet_user(), &["system:masters"])
        .expect("root kubeconfig");
    let client = relaylet::kube_client::root_from(&kube_config(&kubeconfig).await)
        .expect("relaylet's root client");
    let shutdown = Shutdown::default();
    let running = relaylet::start(config, client, shutdown.clone())
        .await
        .expect("relaylet starts");
    (running, shutdown)
}

/// A Ready leaf node as a kubelet would have registered it.
fn leaf_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "6.1",
                "osImage": "sim", "containerRuntimeVersion": "sim://1", "kubeletVersion": "v1.35.0",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}
        }
    }))
    .expect("leaf node JSON")
}

/// Leaf `name` with a kubelet-less Ready node `a`, registered with relaylet through `root`.
async fn add_leaf(root: &Cluster, name: &str) -> Cluster {
    let leaf = Cluster::start(ClusterOptions::new(name))
        .await
        .expect("leaf starts");
    leaf.api
        .store()
        .create_typed(&leaf_node("a"))
        .expect("leaf node");
    root.api
        .store()
        .create_typed(&relaylet_dev::sandbox::leaf_secret(
            NAMESPACE,
            name,
            &leaf.admin_kubeconfig().expect("kubeconfig"),
        ))
        .expect("leaf secret");
    leaf
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn ready_nodes(root: &Cluster) -> usize {
    let nodes = root.api.store().list_typed::<Node>(None).expect("nodes");
    nodes.iter().filter(|n| is_ready(n)).count()
}

/// Pod `default/<pod>` running `sleep` on leaf node `b` (with a kubelet), shown in the root on
/// virtual node `node`.
async fn run_pod(root: &Cluster, leaf: &Cluster, node: &str, pod: &str) {
    let pod = SimPod {
        namespace: "default".to_string(),
        name: pod.to_string(),
        containers: vec![SimContainer {
            name: "main".to_string(),
            command: vec!["sleep".into(), "600".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    relaylet_dev::sandbox::sync_pod(root, node, leaf, "b", &pod)
        .await
        .expect("root pod and its leaf copy");
}

/// `echo via-<word>` in `default/<pod>` with kube-rs through the root apiserver, retried until
/// it succeeds (relaylet's pod index may need a moment); stdout.
async fn exec_through_the_root(root: &Cluster, pod: &str, word: &str) -> String {
    let client = kube_client(&root.admin_kubeconfig().expect("kubeconfig"))
        .await
        .expect("client");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let once = || async {
        let mut process = pods
            .exec(
                pod,
                vec!["sh", "-c", "echo via-$0", word],
                &AttachParams::default().stdout(true).stderr(false),
            )
            .await?;
        let mut stdout = process
            .stdout()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut out = String::new();
        stdout.read_to_string(&mut out).await?;
        process.join().await?;
        anyhow::Ok(out)
    };
    let mut last = None;
    let tries = async {
        loop {
            match once().await {
                Ok(out) if !out.is_empty() => return out,
                Ok(_) => last = Some("empty output".to_string()),
                Err(err) => last = Some(format!("{err:#}")),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    match tokio::time::timeout(HANG, tries).await {
        Ok(out) => out,
        Err(_) => panic!("exec through the root: {last:?}"),
    }
}

/// With 10 and then 60 leaves, relaylet's connections to the root apiserver stay at a few (over
/// HTTP/1.1 each virtual node's pod watch and Node watch held one of its own: 20 and 120), it
/// watches the Nodes once, not once per Node (at 1,000 leaves those watches alone were more
/// streams than its connections carry), and its watches are not starved: every Node is Ready,
/// a deleted Node is put back, a leaf pod changes its Node's allocatable, and a root pod
/// created last is reached by exec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_connections_stay_few_as_leaves_are_added() {
    const BOUND: usize = 4;
    let root = root_cluster().await;
    let (_running, shutdown) = start_relaylet(&root).await;
    let user = relaylet_user();
    let mut leaves = Vec::new();
    for (count, stage) in [(10, "10 leaves"), (60, "60 leaves")] {
        while leaves.len() < count {
            let name = format!("leaf-{}", leaves.len());
            leaves.push(add_leaf(&root, &name).await);
        }
        wait_for(&format!("{stage}: every Node Ready"), || {
            (ready_nodes(&root) == count).then_some(())
        })
        .await;
        let open = root.api.connections().open(&user);
        eprintln!(
            "{stage}: relaylet holds {open} root connections (accepted by protocol: {:?})",
            root.api.connections().accepted_by(&user)
        );
        assert!(
            open <= BOUND,
            "{stage}: {open} root connections open, more than {BOUND}"
        );
        assert!(
            root.api.connections().open_with(&user, "h2") >= 1,
            "{stage}: relaylet speaks h2 to the root"
        );
        let node_watches = root.api.open_watches("/api/v1/nodes");
        assert_eq!(node_watches, 1, "{stage}: relaylet's open Node watches");
    }

    // The Node watch: a deleted Node comes back.
    let store = root.api.store().clone();
    let node = "relaylet-leaf-7";
    let old = store.get_typed::<Node>("", node).expect("node");
    store.delete_typed::<Node>("", node).expect("node deleted");
    wait_for("the deleted Node put back", || {
        store
            .get_typed::<Node>("", node)
            .ok()
            .filter(|n| n.metadata.uid != old.metadata.uid && is_ready(n))
    })
    .await;

    // A leaf's watches: a leaf-local pod is taken off its Node's allocatable.
    let local: Pod = serde_json::from_value(json!({
        "metadata": {"namespace": "kube-system", "name": "local"},
        "spec": {"nodeName": "a", "containers": [
            {"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m"}}}
        ]},
        "status": {"phase": "Running"}
    }))
    .expect("pod JSON");
    leaves[42]
        .api
        .store()
        .create_typed(&local)
        .expect("leaf pod");
    wait_for("the leaf pod counted on its Node", || {
        store
            .get_typed::<Node>("", "relaylet-leaf-42")
            .ok()
            .and_then(|n| n.status?.allocatable?.get("cpu").cloned())
            .filter(|cpu| cpu.0 == "3500m")
    })
    .await;

    // The root pod watch of a virtual node: a pod made now is found for exec.
    leaves[59].add_node("b").await.expect("leaf kubelet");
    run_pod(&root, &leaves[59], "relaylet-leaf-59", "late").await;
    assert_eq!(
        exec_through_the_root(&root, "late", "relaylet").await,
        "via-relaylet\n"
    );
    let open = root.api.connections().open(&user);
    assert!(open <= BOUND, "after exec: {open} root connections open");
    shutdown.begin.cancel();
    shutdown.sessions.cancel();
}

/// relaylet's leaf API client speaks h2 to a leaf that offers it, and its stream client offers
/// HTTP/1.1 only by ALPN (exec is an HTTP/1.1 upgrade, and so is the spare connection's next
/// session): the leaf apiserver sees no connection from relaylet without ALPN, at least one
/// `http/1.1` one (the exec's), and h2 for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaf_stream_client_offers_http1_only_and_the_api_client_h2() {
    let root = root_cluster().await;
    let (_running, shutdown) = start_relaylet(&root).await;
    let leaf = add_leaf(&root, "leaf-a").await;
    leaf.add_node("b").await.expect("leaf kubelet");
    wait_for("the Node Ready", || (ready_nodes(&root) == 1).then_some(())).await;
    run_pod(&root, &leaf, "relaylet-leaf-a", "work").await;
    assert_eq!(
        exec_through_the_root(&root, "work", "leaf").await,
        "via-leaf\n"
    );
    let seen = leaf.api.connections().accepted_by("admin");
    eprintln!("the leaf apiserver accepted from relaylet, by ALPN: {seen:?}");
    assert_eq!(seen.get(""), None, "a connection without ALPN: {seen:?}");
    assert!(
        seen.get("http/1.1").is_some_and(|n| *n >= 1),
        "the exec's connection: {seen:?}"
    );
    assert!(
        seen.get("h2").is_some_and(|n| *n >= 1),
        "the API client's: {seen:?}"
    );
    shutdown.begin.cancel();
    shutdown.sessions.cancel();
}

/// Against a server that allows 5 streams per HTTP/2 connection, a pool with a budget of 4
/// streams per connection runs 12 watches at once: each gets its event (none waits for a free
/// stream behind the others), ordinary calls complete while they run, and the server sees 4
/// connections: 3 carrying 4 watches each, and the one the calls opened when those were full.
/// (hyper's own HTTP/2 client would put all 12 on one connection, where 7 wait.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_spreads_watches_over_connections_within_the_servers_stream_limit() {
    const WATCHES: usize = 12;
    let ca = std::sync::Arc::new(relaylet_sim::tls::Ca::new("small-ca").expect("ca"));
    let mut config = ApiServerConfig::new("small", ca);
    config.http2_max_streams_per_connection = 5;
    let api = ApiServer::start(config).await.expect("apiserver starts");
    let kubeconfig = api
        .kubeconfig("watcher", &["system:masters"])
        .expect("kubeconfig");
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    tcp.enforce_http(false);
    let budget = Budget {
        streams_per_connection: 4,
        connections: 8,
    };
    let client =
        relaylet::kube_client::api_calls(&kube_config(&kubeconfig).await, tcp, None, budget)
            .expect("client")
            .into_client("default".to_string());
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut streams = open_watches(&maps, WATCHES).await;
    // Ordinary calls while every watch is open.
    let list = tokio::time::timeout(HANG, maps.list(&ListParams::default()))
        .await
        .expect("list did not complete")
        .expect("list");
    assert!(list.items.is_empty());
    every_watch_sees_a_new_map(&maps, &mut streams).await;
    let open = api.connections().open_with("watcher", "h2");
    assert_eq!(open, WATCHES / 4 + 1, "connections the server sees");
}

/// Against an apiserver with HTTP/2 turned off (kube-apiserver's `DisableHTTP2` serving
/// option), the same client falls back to HTTP/1.1: watches and calls work, each watch on a
/// connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_falls_back_to_http1_where_the_server_offers_no_h2() {
    const WATCHES: usize = 6;
    let ca = std::sync::Arc::new(relaylet_sim::tls::Ca::new("h1-ca").expect("ca"));
    let mut config = ApiServerConfig::new("h1", ca);
    config.disable_http2 = true;
    let api = ApiServer::start(config).await.expect("apiserver starts");
    let kubeconfig = api
        .kubeconfig("watcher", &["system:masters"])
        .expect("kubeconfig");
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    tcp.enforce_http(false);
    let budget = relaylet::kube_client::budget(16);
    let client =
        relaylet::kube_client::api_calls(&kube_config(&kubeconfig).await, tcp, None, budget)
            .expect("client")
            .into_client("default".to_string());
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut streams = open_watches(&maps, WATCHES).await;
    every_watch_sees_a_new_map(&maps, &mut streams).await;
    let seen = api.connections().accepted_by("watcher");
    assert_eq!(seen.get("h2"), None, "{seen:?}");
    assert!(
        api.connections().open_with("watcher", "http/1.1") >= WATCHES,
        "{seen:?}"
    );
}

type Watch = futures::stream::BoxStream<'static, kube::Result<WatchEvent<ConfigMap>>>;

/// `n` watches of ConfigMaps, each open before the next starts.
async fn open_watches(maps: &Api<ConfigMap>, n: usize) -> Vec<Watch> {
    let mut streams = Vec::new();
    for i in 0..n {
        let stream =
            tokio::time::timeout(HANG, maps.watch(&WatchParams::default().timeout(290), "0"))
                .await
                .unwrap_or_else(|_| panic!("watch {i} did not start"))
                .expect("watch");
        streams.push(stream.boxed());
    }
    streams
}

/// Creates ConfigMap `seen`; every one of `streams` must report it ADDED.
async fn every_watch_sees_a_new_map(maps: &Api<ConfigMap>, streams: &mut [Watch]) {
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some("seen".to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    tokio::time::timeout(HANG, maps.create(&PostParams::default(), &map))
        .await
        .expect("create did not complete")
        .expect("create");
    for (i, stream) in streams.iter_mut().enumerate() {
        let event = tokio::time::timeout(HANG, stream.try_next())
            .await
            .unwrap_or_else(|_| panic!("watch {i} got no event"))
            .expect("watch event")
            .expect("watch open");
        match event {
            WatchEvent::Added(m) => assert_eq!(m.metadata.name.as_deref(), Some("seen")),
            other => panic!("watch {i}: {other:?}"),
        }
    }
}

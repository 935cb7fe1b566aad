//! Node-level reads do not amplify: `/stats/summary`, `/metrics/resource` and `/pods` each cost
//! LISTs in the root and in the leaf, so a caller allowed `nodes/stats` that asks many times at
//! once (or a scraper gone wrong) must not turn each call into LISTs. Concurrent calls share one
//! read, and an answer is served again while it is young (`NODE_STATS_CACHE_TTL`, default 5 s).
//! A sandbox of its own, at the default settings.

use relaylet_dev::testkit as support;
use relaylet_dev::testkit::metrics::https_get;

use relaylet_dev::sandbox::Settings;
use support::{RT, env};

/// Calls made at once.
const CALLS: u64 = 30;

#[test]
fn concurrent_node_reads_cost_the_root_and_the_leaf_a_few_lists() {
    let e = env(Settings::default);
    let node = "relaylet-leaf-1";
    let addr = e
        .sandbox
        .relaylet
        .node_ports
        .addr_of(node)
        .expect("the node's own kubelet port");
    let ca = &e.sandbox.root.ca;
    let scraper = ca
        .issue_client("stats-reader", &["system:masters"])
        .expect("client certificate");
    let tls = ca.client_config(Some(&scraper)).expect("TLS settings");
    let (root, leaf) = (&e.sandbox.root.api, &e.sandbox.leaves["leaf-1"].api);
    let counts = || {
        (
            root.requests("GET", "/api/v1/pods"),
            leaf.requests("GET", "/api/v1/pods"),
            leaf.requests("GET", "/apis/metrics.k8s.io/v1beta1/pods"),
        )
    };
    for path in ["/stats/summary", "/metrics/resource", "/pods"] {
        let before = counts();
        let answers = RT.block_on(async {
            let calls: Vec<_> = (0..CALLS)
                .map(|_| tokio::spawn(https_get(addr, tls.clone(), path, &[])))
                .collect();
            let mut answers = Vec::new();
            for call in calls {
                answers.push(call.await.expect("a call"));
            }
            answers
        });
        for got in &answers {
            assert_eq!(got.status, 200, "{path}: {}", got.body);
        }
        let after = counts();
        let lists = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
        // One read serves them all; a few more only if the calls straddle the answer's age
        // (or a watch reconnects meanwhile). Each call reading alone would make 30 of each.
        assert!(
            lists.0 <= 3 && lists.1 <= 3 && lists.2 <= 3,
            "{path}: {CALLS} concurrent calls made (root pod lists, leaf pod lists, leaf metrics reads) = {lists:?}"
        );
    }
}

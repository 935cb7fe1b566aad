//! What a leaf holds on a replica before anything is asked of it. Every replica registers every
//! leaf of the fleet (to take its Node over at once), so at 1,000 leaves a registered leaf is
//! paid 1,000 times per replica, served or not; its two API clients (reads and watches;
//! sessions, with their spare connection's connector) are built only where they are used, the
//! leaves the replica serves. Counted by the test binary's allocator (`allocations`), which tallies
//! the bytes each thread holds (asked for minus given back), with the leaves built on this thread.

use k8s_openapi::ByteString;
use relaylet::leaf::Leaf;
use relaylet::ops::Metrics;
use relaylet_sim::tls::Ca;

fn held() -> isize {
    crate::allocations::held()
}

/// What relaylet may hold for one registered leaf, in bytes, its clients not used. Measured on
/// Nov 27 2026: 3,941 B; 31,644 B while both clients were built with the leaf.
const BUDGET_REGISTERED: isize = 8 * 1024;
/// ... and once both its clients are used. Measured on Nov 28 2026: 12,490 B; 23,845 B while
/// the stream client was a `kube::Client`, 34,875 B while both were (each a tower `Buffer` and
/// its worker: `kube_client::calls`); 59,668 B while each client's TLS settings had rustls' default
/// session cache (room for 32 servers, allocated up front, for a client that talks to one).
const BUDGET_USED: isize = 16 * 1024;

/// A leaf Secret's kubeconfig as the fleet's are: the leaf's CA and a client certificate, inline.
fn kubeconfig(ca: &Ca) -> String {
    let client = ca
        .issue_client("relaylet", &[])
        .expect("a client certificate");
    let b64 = |pem: &str| {
        serde_json::to_value(ByteString(pem.as_bytes().to_vec()))
            .expect("base64")
            .as_str()
            .expect("a string")
            .to_string()
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: leaf
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: {}
users:
- name: relaylet
  user:
    client-certificate-data: {}
    client-key-data: {}
contexts:
- name: leaf
  context: {{cluster: leaf, user: relaylet}}
current-context: leaf
",
        b64(&ca.cert_pem()),
        b64(&client.cert_pem),
        b64(&client.key_pem),
    )
}

/// Gives the tasks on this thread's runtime a hundred turns: a dropped client's worker ends at its first.
async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

/// ... and a leaf handed away to another replica (`Leaf::release_clients`) is back to what a
/// registered leaf holds.
#[test]
fn a_leaf_holds_little_and_its_clients_only_once_used() {
    // One thread: everything the leaves allocate, their clients' spawned workers included, is
    // allocated here, and nothing else runs meanwhile.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ca = Ca::new("leaf-ca").unwrap();
    let yaml = kubeconfig(&ca);
    let metrics = Metrics::new();
    const LEAVES: isize = 50;
    let per_leaf = rt.block_on(async {
        let build = |i: isize| {
            let (name, node) = (format!("leaf-{i}"), format!("relaylet-leaf-{i}"));
            let (yaml, metrics) = (&yaml, &metrics);
            async move {
                Leaf::from_kubeconfig(&name, &node, yaml, metrics, true)
                    .await
                    .expect("the leaf's clients")
            }
        };
        // The first leaf sets up what all share (the crypto provider, the metric families).
        let mut leaves = vec![build(0).await];
        let before = held();
        for i in 1..=LEAVES {
            leaves.push(build(i).await);
        }
        // Let the tasks of clients built and dropped (the registration's check) see their
        // clients gone and end, as a runtime that is not blocked here does at once.
        settle().await;
        let registered = (held() - before) / LEAVES;
        for leaf in &leaves[1..] {
            let _ = (leaf.client(), leaf.stream_client());
        }
        settle().await;
        let used = (held() - before) / LEAVES;
        // Handed away: the replica no longer serves the leaf's Node.
        for leaf in &leaves[1..] {
            leaf.release_clients();
        }
        settle().await;
        let released = (held() - before) / LEAVES;
        drop(leaves);
        (registered, used, released)
    });
    let (registered, used, released) = per_leaf;
    eprintln!(
        "a registered leaf holds {registered} B; with its clients used, {used} B; released, {released} B"
    );
    assert!(
        registered <= BUDGET_REGISTERED,
        "a registered leaf holds {registered} B, over its budget of {BUDGET_REGISTERED} B"
    );
    assert!(
        used <= BUDGET_USED,
        "a leaf with its clients used holds {used} B, over its budget of {BUDGET_USED} B"
    );
    assert!(
        released <= BUDGET_REGISTERED,
        "a leaf whose clients were released holds {released} B, over a registered leaf's {BUDGET_REGISTERED} B"
    );
}

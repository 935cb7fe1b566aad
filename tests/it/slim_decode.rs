//! A leaf pod's bulk never reaches relaylet's heap: a watch event of a pod with a 64 KiB
//! annotation and 64 KiB of env, decoded as relaylet's watches decode it (`SlimPod`), allocates
//! what the same event of a small pod allocates. Decoded as a whole `Pod` (what the watches did
//! before) it allocates the bulk and more. Counted by the test binary's allocator, which tallies
//! the bytes each thread asks for (`allocations`).

use k8s_openapi::api::core::v1::Pod;
use kube::core::WatchEvent;
use relaylet::model::slim_pod::SlimPod;
use relaylet::virtual_node::PodFacts;
use serde_json::json;

/// The bytes this thread asked the allocator for while `f` ran.
fn asked_during<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let before = crate::allocations::asked();
    let out = f();
    (crate::allocations::asked() - before, out)
}

/// A watch event line for a pod carrying `bulk` bytes of annotation and as many of env, its
/// `type` first as the apiserver writes it.
fn event(bulk: usize) -> Vec<u8> {
    let object = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "namespace": "tenant-a",
                "name": "web-7",
                "uid": "3f1c0000-0000-0000-0000-000000000007",
                "resourceVersion": "123456",
                "labels": {"app": "web"},
                "annotations": {"example.com/payload": "x".repeat(bulk)},
            },
            "spec": {
                "nodeName": "leaf-node-3",
                "containers": [{
                    "name": "main",
                    "image": "registry.example.com/web:1",
                    "env": [{"name": "PAYLOAD", "value": "y".repeat(bulk)}],
                    "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}},
                }],
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
            "status": {"phase": "Running", "podIP": "10.0.0.7"},
    });
    format!(r#"{{"type":"ADDED","object":{object}}}"#).into_bytes()
}

fn decode_slim(line: &[u8]) -> PodFacts {
    match serde_json::from_slice::<WatchEvent<SlimPod>>(line).unwrap() {
        WatchEvent::Added(pod) => PodFacts::of(&pod),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_64_kib_pod_allocates_what_a_small_pod_allocates_while_it_is_decoded() {
    let (small, big) = (event(0), event(64 * 1024));
    // Once each first, so one-time allocations (lazy statics) count for neither.
    let _ = (decode_slim(&small), decode_slim(&big));

    let (small_bytes, small_facts) = asked_during(|| decode_slim(&small));
    let (big_bytes, big_facts) = asked_during(|| decode_slim(&big));
    assert_eq!(big_facts, small_facts, "the same facts are kept");
    assert_eq!(big_facts.node.as_deref(), Some("leaf-node-3"));
    assert_eq!(
        big_bytes, small_bytes,
        "a 64 KiB annotation and 64 KiB of env cost nothing while decoded"
    );
    // Its few strings and two small maps, all let go once the facts are built (~1.5 KiB).
    assert!(
        small_bytes < 2048,
        "{small_bytes} bytes asked to decode one pod"
    );

    // The control: the whole object, as the watches decoded it before.
    let (whole_bytes, _) = asked_during(|| {
        serde_json::from_slice::<WatchEvent<Pod>>(&big).unwrap();
    });
    assert!(
        whole_bytes > 128 * 1024,
        "a whole Pod holds its bulk: {whole_bytes} bytes"
    );
}

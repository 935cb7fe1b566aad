//! Who writes a virtual Node: the `relaylet.io/served-by` annotation, and the one rule for
//! taking it over.
//!
//! A replica takes a Node (writes its own name into the annotation) only when the annotation is
//! empty, already its own, or names a replica that cannot be writing any more (its presence
//! Lease expired, was released or deleted: `replicas`). The write carries the resourceVersion
//! it read, so of two replicas racing for one Node exactly one wins; so does every later write
//! of the holder (`virtual_node`'s leaf loop, which also makes the write), so a replica that lost the Node while it was starved cannot land
//! a write after the new holder's claim. A replica that is no longer
//! assigned a Node hands it back by writing the annotation empty, the same way.

use k8s_openapi::api::core::v1::Node;

use crate::replicas::Peers;

/// The annotation naming the replica that writes a Node.
pub const SERVED_BY: &str = "relaylet.io/served-by";

/// The replica `node` names as its writer ("" when none).
pub fn served_by(node: &Node) -> &str {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SERVED_BY))
        .map(String::as_str)
        .unwrap_or("")
}

/// Whether `me` may take a Node whose writer is `holder`.
pub fn may_take(holder: &str, me: &str, peers: &Peers) -> bool {
    holder.is_empty() || holder == me || !peers.may_be_alive(holder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_taken_only_from_no_one_itself_or_the_gone() {
        // Alone (no election): nobody else can be writing.
        let alone = Peers::default();
        assert!(may_take("", "a", &alone));
        assert!(may_take("a", "a", &alone));
        assert!(may_take("old-pod", "a", &alone));
        // Elected: never from a replica that may still be writing.
        let peers = Peers::seen(&["b"], &["c"]);
        assert!(may_take("", "a", &peers));
        assert!(may_take("a", "a", &peers));
        assert!(!may_take("b", "a", &peers), "renewing");
        assert!(!may_take("c", "a", &peers), "seen once, not expired");
        assert!(may_take("d", "a", &peers), "expired, released or deleted");
    }
}

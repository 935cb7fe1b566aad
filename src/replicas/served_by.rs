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
//!
//! [`choose`] is every round's choice for one Node on one replica, from what it knows then: the
//! leaf loop acts on it, and the protocol simulation (`protocol_sim`) runs the same function.

use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

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

/// Whether `me` may take, at `now`, a Node whose writer is `holder`: none, itself, or a replica
/// that cannot be writing any more by a current view of the presence Leases
/// ([`Peers::current`]). (Where the holder's Lease is written but its pod is not among the live
/// ones cached, [`Peers::unconfirmed`], the leaf loop also asks the apiserver whether its pod
/// runs: a lagging cache must not make a live peer look forged.) A name no listing showed counts as gone (a Lease deleted long after
/// its replica died): a replica that just started cannot be serving the Node, as its term
/// counts only once a current view shows it (`leader::FRESH_TERM_WAIT`).
pub fn may_take(holder: &str, me: &str, peers: &Peers, now: Instant) -> bool {
    holder.is_empty() || holder == me || (peers.current(now) && !peers.may_be_alive(holder))
}

/// What one replica knows of one Node at a round.
#[derive(Debug, Clone, Copy)]
pub struct Facts {
    /// This replica's term holds now (its presence renewed within its deadline).
    pub present: bool,
    /// The assignment gives this replica the Node (and it is present).
    pub assigned: bool,
    /// This replica serves the Node now (its claim landed and nothing took it since).
    pub held: bool,
    /// The Node names this replica as its writer (as last read, or as its events said).
    pub names_me: bool,
    /// The Node's writer, when another, may be taken from ([`may_take`]: none, or gone).
    pub holder_gone: bool,
}

/// What a round does about one Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Stop serving at once and write nothing: past its deadline, or another took the Node.
    LetGo,
    /// Write the Node's writer empty (guarded), then stop serving: assigned elsewhere.
    HandBack,
    /// Claim the Node (guarded): assigned here, and no one else may be writing it.
    Take,
    /// Write the Node and renew its Lease (guarded): assigned here and its writer.
    Serve,
    /// Nothing to do this round: its writer is alive (it hands the Node back), or this replica
    /// must be present again to hand it back.
    Wait,
    /// Nothing of the Node is this replica's: its loop goes quiet.
    Idle,
}

/// The round's choice for one Node.
pub fn choose(f: Facts) -> Choice {
    if f.held && !f.present {
        return Choice::LetGo;
    }
    if !f.assigned {
        return match (f.names_me, f.present, f.held) {
            (true, true, _) => Choice::HandBack,
            (true, false, _) => Choice::Wait,
            (false, _, true) => Choice::LetGo,
            (false, _, false) => Choice::Idle,
        };
    }
    match (f.names_me, f.held, f.holder_gone) {
        (true, _, _) => Choice::Serve,
        (false, true, _) => Choice::LetGo,
        (false, false, true) => Choice::Take,
        (false, false, false) => Choice::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_taken_only_from_no_one_itself_or_the_gone() {
        // Alone (no election): nobody else can be writing.
        let alone = Peers::default();
        let now = Instant::now();
        assert!(may_take("", "a", &alone, now));
        assert!(may_take("a", "a", &alone, now));
        assert!(may_take("old-pod", "a", &alone, now));
        // Elected: never from a replica that may still be writing.
        let peers = Peers::seen(&["b"], &["c"]);
        assert!(may_take("", "a", &peers, now));
        assert!(may_take("a", "a", &peers, now));
        assert!(!may_take("b", "a", &peers, now), "renewing");
        assert!(!may_take("c", "a", &peers, now), "seen once, not expired");
        assert!(
            may_take("d", "a", &peers, now),
            "expired, released or deleted"
        );
        // A view asked for too long ago (listings failing, a pause) judges no one gone.
        let stale =
            now + crate::replicas::leader::FRESH_TERM_WAIT + std::time::Duration::from_secs(1);
        assert!(!may_take("d", "a", &peers, stale), "by a stale view");
        assert!(may_take("", "a", &peers, stale), "no one's");
    }

    #[test]
    fn every_rounds_choice() {
        use Choice::*;
        let f = |present, assigned, held, names_me, holder_gone| Facts {
            present,
            assigned: assigned && present,
            held,
            names_me,
            holder_gone,
        };
        // (present, assigned, held, names me, holder gone) -> choice
        let table = [
            // Past its deadline: stop at once, whatever else holds.
            (f(false, false, true, true, false), LetGo),
            (f(false, true, true, true, true), LetGo),
            // Not present and not serving: a Node naming it waits until it can hand it back.
            (f(false, false, false, true, false), Wait),
            (f(false, false, false, false, true), Idle),
            // Assigned elsewhere.
            (f(true, false, true, true, false), HandBack),
            (f(true, false, false, true, false), HandBack),
            (f(true, false, true, false, false), LetGo),
            (f(true, false, false, false, true), Idle),
            // Assigned here.
            (f(true, true, true, true, false), Serve),
            (f(true, true, false, true, false), Serve),
            (f(true, true, true, false, false), LetGo),
            (f(true, true, false, false, true), Take),
            (f(true, true, false, false, false), Wait),
        ];
        for (facts, want) in table {
            assert_eq!(choose(facts), want, "{facts:?}");
        }
    }
}

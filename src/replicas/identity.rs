//! Which replica Leases count: the rule that makes a replica something only relaylet can claim.
//!
//! Whoever may write Leases in relaylet's namespace can write a presence Lease
//! (`relaylet-replica-<name>`) or the leader Lease. Such a Lease counts only when
//! - its holder is its own name's replica (a presence Lease of `b` is held by `b`, nobody else),
//! - and that replica is a live relaylet pod: a Running pod of this install in relaylet's
//!   namespace, found by relaylet's own selector (`live_pods`).
//!
//! Durations are not part of a Lease's claim: relaylet judges every Lease by its own
//! `leader::LEASE_DURATION`, never by `leaseDurationSeconds` (a Lease claiming a day would
//! otherwise keep a ghost "alive" for a day). A Lease that breaks the rule is ignored (as if
//! absent) and reported (`ignored`).

use super::live_pods::LivePods;

/// Why a Lease does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ignored {
    /// A presence Lease held by someone other than the replica it is named after.
    HolderMismatch,
    /// The holder is not a Running pod of this install in relaylet's namespace.
    NotALivePod,
}

impl Ignored {
    /// The metric label and the word in logs and Events.
    pub fn reason(self) -> &'static str {
        match self {
            Ignored::HolderMismatch => "holder_mismatch",
            Ignored::NotALivePod => "not_a_live_pod",
        }
    }

    /// What is wrong, in a few words, for a log line or an Event.
    pub fn explain(self) -> &'static str {
        match self {
            Ignored::HolderMismatch => "its holder is not the replica the Lease is named after",
            Ignored::NotALivePod => {
                "its replica is not a Running relaylet pod of this install (by relaylet's selector)"
            }
        }
    }
}

/// What a presence Lease says, judged by the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence<'a> {
    /// Held by nobody: its replica left (released it).
    Released,
    /// A claim of replica `.0`, which counts.
    Counts(&'a str),
    /// A claim that does not count.
    Ignored(Ignored),
}

/// Judges presence Lease `name` (prefix stripped: `replica`) held by `holder`.
pub fn presence<'a>(replica: &'a str, holder: Option<&str>, live: &LivePods) -> Presence<'a> {
    match holder.filter(|h| !h.is_empty()) {
        None => Presence::Released,
        Some(holder) if holder != replica => Presence::Ignored(Ignored::HolderMismatch),
        Some(_) if !live.is_live(replica) => Presence::Ignored(Ignored::NotALivePod),
        Some(_) => Presence::Counts(replica),
    }
}

/// Whether `holder` may hold the leader Lease: a live relaylet pod (`Ok`), or why not.
pub fn leader_holder(holder: &str, live: &LivePods) -> Result<(), Ignored> {
    if live.is_live(holder) {
        Ok(())
    } else {
        Err(Ignored::NotALivePod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_presence_lease_counts_only_for_its_own_live_replica() {
        let live = LivePods::fixed(["b"]);
        assert_eq!(presence("b", Some("b"), &live), Presence::Counts("b"));
        assert_eq!(presence("b", None, &live), Presence::Released);
        assert_eq!(presence("b", Some(""), &live), Presence::Released);
        assert_eq!(
            presence("b", Some("c"), &live),
            Presence::Ignored(Ignored::HolderMismatch)
        );
        assert_eq!(
            presence("ghost-1", Some("ghost-1"), &live),
            Presence::Ignored(Ignored::NotALivePod)
        );
    }

    #[test]
    fn the_leader_is_a_live_pod() {
        let live = LivePods::fixed(["a"]);
        assert_eq!(leader_holder("a", &live), Ok(()));
        assert_eq!(leader_holder("ghost", &live), Err(Ignored::NotALivePod));
    }
}

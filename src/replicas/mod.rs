//! Several replicas: which relaylet replicas are alive, and which of them serves which virtual
//! node, so the nodes are spread over all of them.
//!
//! It offers the virtual node controller [`start`] (joining: [`Joined`]), [`Replicas`] (this
//! replica and the others it sees, `presence`), [`Leadership`] (the elected leader, `leader`; a term with a deadline, `leadership`),
//! [`Assignment`] (`assignment`: which live replica serves which Node, from one replica's view),
//! [`Publication`] (`published`: the leader's assignment, which every replica follows) and
//! `served_by` (the one-writer rule on a Node). Inside, `live_pods` (this install's Running
//! relaylet pods), `identity` (which replica Leases count) and `ignored` (reporting those that
//! do not) keep being a replica something only relaylet can claim. `protocol_sim` (tests only)
//! runs the protocol's real pieces for many replicas on virtual time under generated faults.

mod assignment;
mod identity;
mod ignored;
mod leader;
mod leadership;
mod live_pods;
mod presence;
#[cfg(test)]
mod protocol_sim;
mod published;
pub mod served_by;
mod start;

pub use assignment::Assignment;
pub use leadership::Leadership;
pub use live_pods::LivePods;
pub use presence::{Judges, PRESENCE_PREFIX, Peers, Replicas};
pub use published::{ASSIGNMENT_CONFIGMAP, Publication, Published, effective};
pub use start::{Joined, LEADER_LEASE, start};

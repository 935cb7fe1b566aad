//! The virtual node controller: one live Node per leaf cluster in the root cluster.
//!
//! For every registered leaf it keeps a Node whose first address is relaylet's own (so the root
//! apiserver sends kubelet calls here), whose kubelet port is `NODE_SERVER_PORT`, whose capacity
//! the scheduler can trust, and whose Ready condition follows the leaf's health; plus a Lease in
//! `kube-node-lease` renewed every 10 s so the root never marks the node NotReady (and evicts its
//! pods) while relaylet is alive.
//!
//! Every replica serves: each Node is assigned to one live replica (`replicas::assignment`, over
//! the replicas `replicas` sees), and only that replica writes it, with its own pod IP first, so the
//! root apiserver sends that node's sessions there. The Node's `relaylet.io/served-by`
//! annotation says who writes it; a replica takes a Node only when the annotation is empty, its
//! own, or names a replica that is gone (`replicas::served_by`), so two replicas never write one Node.
//! The elected leader only deletes Nodes whose leaf went away.
//!
//! Every Node carries the install that owns it (label `relaylet.io/owner`, the install's
//! namespace): an install writes and deletes only its own Nodes, and one that finds a Node of
//! the same name owned by another install (or a real node) says so loudly and leaves it alone.
//! Each leaf's loop hears its Node's events from one watch of the Nodes per replica
//! (`node_watch`), so a deleted or altered Node is put back at once, not at the next heartbeat.
//!
//! Each leaf is watched by one replica only: every replica runs every leaf's loop, but a loop
//! only waits unless its replica serves the leaf's Node, is assigned it or still hands it over,
//! and watches its leaf (nodes, pods, probes) and listens on the node's own port only then
//! (`leaf_loop`). The leader's duties need no leaf: Nodes of
//! removed leaves are found from the registry of leaf Secrets, which every replica keeps (its
//! leaf clients dial nothing until used).
//!
//! Inside: `controller` ([`Controller`]: the set of loops, one per registered leaf, orphans
//! removed, and the Node writes), `leaf_loop` (one leaf's loop), `node_lease` (its Lease),
//! `node_watch` (the Nodes' watch the loops share), `desired` (what the Node should say),
//! `leaf_watch` (what the leaf says; `leaf_pods` the little kept of its pods, `leaf_objects` the
//! bounded watch both its nodes and pods are kept by), `rounds` (the grid the loops' rounds fall
//! on), `leaf_rows` (the `LeafCluster` row beside each leaf Secret: written by the replica
//! serving its Node, or by the leader for a refused Secret).

mod controller;
mod desired;
mod leaf_loop;
mod leaf_objects;
mod leaf_pods;
mod leaf_rows;
mod leaf_watch;
mod node_lease;
mod node_watch;
mod rounds;

pub use controller::{Controller, Parts, start};
pub use leaf_pods::PodFacts;

use crate::model::node_ownership::Ownership;
use crate::replicas::served_by;
use controller::{SyncError, patch_params};

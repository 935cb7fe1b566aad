//! Pods that run: the replica that serves a leaf's virtual Node runs the pods the root binds to
//! it, as a kubelet runs its node's. Each root pod gets a copy in the leaf, its status mirrors
//! the copy's, and it ends as a kubelet ends a pod.
//!
//! - `syncer`: [`LeafPodSync`], one leaf's pods (two watches, a queue, workers) for as long as
//!   this replica serves the leaf's Node;
//! - `decide`: what to do about one pod, from its root pod and its leaf pod;
//! - `leaf_copy`: a root pod's leaf copy (kept, cleared, dropped, refused) and its later
//!   updates;
//! - `root_status`: the root pod's status from its copy's;
//! - `references`: the ConfigMaps and Secrets a pod names, and their leaf copies; `copied`:
//!   those copies made, kept in step, deleted when no pod names them;
//! - `tokens`: the root's service-account tokens for the pods, in a Secret per pod in the leaf;
//! - `leaf_events`: the leaf's Events about the copies, told on their root pods;
//! - `marks`: what makes a leaf pod relaylet's, and which root pods relaylet runs;
//! - `queue`: the work queue (one worker per pod at a time); `sync_error`: a failed call, by
//!   side.
//!
//! It uses `model`, `ops`, `kube_client` and `leaf`.

mod copied;
mod decide;
mod leaf_copy;
mod leaf_events;
mod marks;
mod queue;
mod references;
mod root_status;
mod sync_error;
mod syncer;
mod tokens;

pub use marks::{NODE_LABEL, OWNER_LABEL, RUN_DAEMONSET_ANNOTATION};
pub use syncer::{Context, LeafPodSync};

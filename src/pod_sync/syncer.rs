//! One leaf's pods, run by the replica that serves the leaf's Node, as a kubelet runs its
//! node's: two watches find the pods that changed (the root pods bound to the Node, from the
//! pod index's watch of the Node, and this install's copies in the leaf), a queue hands each
//! pod to one worker at a time, and the worker reads both pods, asks `decide` what to do and
//! does it.
//!
//! Only the pods' names are kept: a worker reads the two pods it works on when it works on
//! them, so what relaylet holds per synced pod is one entry with its name, its two UIDs and a
//! few bytes of memory (restarts, the last status write, the leaf's last word), whatever the
//! pods carry.
//! Nothing is decided before both watches have listed once (after a start or a takeover, a
//! half view would delete or create what it does not see), and a leaf that cannot be read
//! decides nothing: its pods keep their status until it answers again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Pod, ServiceAccount, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::copied::{Copied, Io};
use super::decide::{Facts, LeafAction, Plan, RootAction, decide, leaf_reason};
use super::leaf_copy::CopyRules;
use super::leaf_events::{LeafEvents, RootPod};
use super::marks::Marks;
use super::queue::Queue;
use super::references::references;
use super::root_status::{self, Restarts};
use super::sync_error::SyncError;
use super::tokens;
use crate::config::PodApiserver;
use crate::kube_client::{Calls, LeanWatch};
use crate::leaf::Leaf;
use crate::model::slim_pod::SlimPod;
use crate::model::uid::{self, Uid};
use crate::ops::{Backoff, Metrics};
use crate::routing::NodePodChanges;

/// Pods worked on at once per leaf: each waits on the root's and the leaf's apiservers, so a
/// Deployment's pods start together rather than in waves.
const WORKERS: usize = 32;
/// At most one status write per pod this often within a phase; the changes meanwhile go in the
/// next one.
const STATUS_EVERY: Duration = Duration::from_secs(1);
/// Every pod is looked at again this often, whatever its watches said; then the copies of
/// ConfigMaps and Secrets no pod names are swept.
const RESYNC: Duration = Duration::from_secs(300);
/// The copies of the ConfigMaps and Secrets pods name are compared with their root objects this
/// often (the kubelet looks at a mounted ConfigMap about once a minute).
const REFRESH: Duration = Duration::from_secs(10);
/// At most this many root objects are looked at a second for that (a leaf's pods naming many
/// objects get a longer round rather than a busier root apiserver).
const REFRESH_PER_SECOND: u32 = 50;
/// Pods per LIST page of the watches.
const PAGE: u32 = 500;
/// A failed reconcile of a pod is tried again after this, doubling up to the most.
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(60);
/// relaylet's field manager in the leaf.
const MANAGER: &str = "relaylet";

/// A root pod's namespace and name.
type Key = (String, String);

/// What one leaf's pod sync is started with.
pub struct Context {
    pub root: Client,
    pub leaf: Arc<Leaf>,
    /// The virtual Node's taints (their tolerations are dropped from the copies).
    pub node_taints: Vec<Taint>,
    /// This install's namespace: its mark on the copies, and the pods it does not run.
    pub owner: String,
    /// The counterpart marker's key (`LEAF_POD_MARKER`).
    pub marker: String,
    /// The virtual Node's address (the pods' `hostIP`): this replica's.
    pub host_ip: String,
    /// Where the pods reach the root apiserver with the root's tokens
    /// (`LEAF_POD_ROOT_APISERVER`); `None`: the leaf's own service accounts.
    pub root_apiserver: Option<PodApiserver>,
    pub metrics: Metrics,
}

/// The pod sync of one leaf; it stops when dropped.
pub struct LeafPodSync {
    task: JoinHandle<()>,
}

impl Drop for LeafPodSync {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LeafPodSync {
    /// Starts running the pods of `context.leaf`'s virtual Node, the root pods bound to it
    /// being `root_pods` (as the pod index's watch of the Node sees them change).
    pub fn start(context: Context, root_pods: NodePodChanges) -> LeafPodSync {
        let marks = Marks {
            owner: context.owner.clone(),
            node: context.leaf.node_name.clone(),
            marker: context.marker.clone(),
        };
        let context_leaf_name = context.leaf.name.clone();
        let shared = Arc::new(Shared {
            context,
            marks,
            queue: Queue::default(),
            pods: Mutex::default(),
            ensured: Mutex::default(),
            copied: Copied::new(),
            events: LeafEvents::new(&context_leaf_name),
        });
        LeafPodSync {
            task: tokio::spawn(shared.run(root_pods)),
        }
    }
}

/// What the watches and the workers of one leaf share.
struct Shared {
    context: Context,
    marks: Marks,
    queue: Queue<Key>,
    /// Every pod either watch has shown and not yet found gone on both sides, with what is kept
    /// of it: one entry per pod, its name once. Boxed: a table has up to twice the slots it
    /// fills, and an empty slot then costs a pointer, not a whole `Kept` (1,000 pods in 2,048
    /// slots: about 290 bytes a pod instead of 440).
    pods: Mutex<HashMap<Key, Box<Kept>>>,
    /// Leaf namespaces and service accounts known to exist.
    ensured: Mutex<HashSet<(String, String)>>,
    /// The ConfigMaps and Secrets the pods name, copied into the leaf.
    copied: Copied,
    /// The leaf's Events about the copies, told on the root pods.
    events: LeafEvents,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let known = lock(&self.pods).len() as i64;
        self.context.metrics.pods_synced.dec_by(known);
    }
}

/// What is kept of one pod between watch events and reconciles.
#[derive(Default)]
struct Kept {
    /// The worker's part: taken while a worker works on the pod.
    memory: Memory,
    /// The root pod's UID, as last read (its tokens Secret is named by it); kept after the pod
    /// went, until its tokens are forgotten.
    root_uid: Option<Uid>,
    /// Whether the root pod existed when last read.
    root_live: bool,
    /// Its copy's UID, as the leaf watch last showed it.
    copy_uid: Option<Uid>,
    /// Why its copy ended, as the leaf watch saw it go (taken by the next reconcile). Boxed,
    /// as the other rare parts: every pod's entry has room for it.
    leaf_said: Option<Box<(String, String)>>,
}

/// What a worker remembers of one pod between its reconciles.
#[derive(Default)]
struct Memory {
    restarts: Restarts,
    /// When its root status was last written.
    written: Option<Instant>,
    /// Why its copy ended, as the leaf last said.
    leaf_reason: Option<Box<(String, String)>>,
    /// The waits after failed reconciles.
    retry: Option<Box<Backoff>>,
    /// When its root tokens are next due (`tokens`).
    tokens_due: Option<Timestamp>,
}

impl Shared {
    async fn run(self: Arc<Self>, root_pods: NodePodChanges) {
        let (leaf_listed, mut leaf_ready) = watch::channel(false);
        let mut leaf_ready_too = leaf_ready.clone();
        let root_listed = root_pods.listing();
        let workers = async {
            // No decision from half a view: both sides listed first.
            root_listed.wait().await;
            let _ = leaf_ready.wait_for(|listed| *listed).await;
            self.enqueue_known();
            futures::future::join_all((0..WORKERS).map(|_| self.clone().work())).await;
        };
        let resync = async {
            root_listed.wait().await;
            let _ = leaf_ready_too.wait_for(|listed| *listed).await;
            loop {
                // Once every pod was looked at, what no pod names is an orphan.
                while !self.queue.idle() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                if let Err(err) = self.copied.sweep(&self.io()).await {
                    tracing::warn!(leaf = %self.context.leaf.name, %err, "sweeping the leaf's copies no pod names");
                }
                if self.context.root_apiserver.is_some() {
                    let live: HashSet<String> = lock(&self.pods)
                        .values()
                        .filter(|kept| kept.root_live)
                        .filter_map(|kept| kept.root_uid.as_ref().map(Uid::to_string))
                        .collect();
                    if let Err(err) = self.tokens().sweep(&live).await {
                        tracing::warn!(leaf = %self.context.leaf.name, %err, "sweeping the leaf's token Secrets of pods gone");
                    }
                }
                tokio::time::sleep(RESYNC).await;
                self.enqueue_known();
            }
        };
        let events = self.events.follow(
            self.context.leaf.client(),
            &self.context.root,
            |copy| self.copy_of(copy),
            &self.context.metrics,
        );
        let refresh = async {
            loop {
                self.copied
                    .refresh(&self.io(), REFRESH, REFRESH_PER_SECOND)
                    .await;
            }
        };
        tokio::join!(
            self.clone().follow_root(root_pods),
            self.clone().watch_leaf(leaf_listed),
            workers,
            resync,
            refresh,
            events
        );
    }

    /// The root pod leaf pod `copy` stands for, if it is a copy the leaf watch has shown and
    /// its root pod is there.
    fn copy_of(&self, copy: &ObjectReference) -> Option<RootPod> {
        let namespace = copy.namespace.as_deref()?;
        let root = self.context.leaf.namespaces.root_namespace(namespace)?;
        let key = (root.to_string(), copy.name.clone()?);
        let pods = lock(&self.pods);
        let kept = pods.get(&key)?;
        if kept.copy_uid.is_none()
            || !uid::same(kept.copy_uid.as_ref(), copy.uid.as_deref())
            || !kept.root_live
        {
            return None;
        }
        let uid = kept.root_uid.as_ref()?.to_string();
        Some(RootPod {
            namespace: key.0,
            name: key.1,
            uid,
        })
    }

    /// Where the pods' root tokens are requested and kept.
    fn tokens(&self) -> tokens::Io<'_> {
        tokens::Io {
            root: &self.context.root,
            leaf: self.context.leaf.client(),
            marks: &self.marks,
            metrics: &self.context.metrics,
        }
    }

    /// Where the copies of ConfigMaps and Secrets are read and written.
    fn io(&self) -> Io<'_> {
        Io {
            leaf_name: &self.context.leaf.name,
            root: &self.context.root,
            leaf: self.context.leaf.client(),
            marks: &self.marks,
            metrics: &self.context.metrics,
        }
    }

    fn enqueue_known(&self) {
        let keys: Vec<Key> = lock(&self.pods).keys().cloned().collect();
        for key in keys {
            self.queue.add(key);
        }
    }

    fn saw(&self, key: Key) {
        self.keep(&key, |_| {});
        self.queue.add(key);
    }

    /// Changes what is kept of pod `key` (known from now on, if it was not); what `change`
    /// returns.
    fn keep<T>(&self, key: &Key, change: impl FnOnce(&mut Kept) -> T) -> T {
        let mut pods = lock(&self.pods);
        let kept = match pods.get_mut(key) {
            Some(kept) => kept,
            None => {
                self.context.metrics.pods_synced.inc();
                pods.entry(key.clone()).or_default()
            }
        };
        change(kept.as_mut())
    }

    /// The root pods bound to the Node, as the pod index's watch sees them change.
    async fn follow_root(self: Arc<Self>, mut root_pods: NodePodChanges) {
        while let Some(key) = root_pods.next().await {
            self.saw(key);
        }
    }

    /// This install's copies for the Node in the leaf.
    async fn watch_leaf(self: Arc<Self>, listed: watch::Sender<bool>) {
        let calls = self.context.leaf.client();
        let mut events = LeanWatch::<SlimPod>::new(calls, None, PAGE).labels(self.marks.selector());
        loop {
            match events.next().await {
                Ok(watcher::Event::InitDone) => {
                    listed.send_replace(true);
                }
                Ok(watcher::Event::InitApply(pod) | watcher::Event::Apply(pod)) => {
                    if let Some(key) = self.root_key_of_copy(&pod) {
                        let uid = pod.metadata.uid.as_deref().map(Uid::new);
                        self.keep(&key, |kept| kept.copy_uid = uid);
                        self.queue.add(key);
                    }
                }
                Ok(watcher::Event::Delete(pod)) => {
                    if let Some(key) = self.root_key_of_copy(&pod) {
                        // The copy's last word on why it went (an eviction's reason).
                        let said = pod.status.as_ref().and_then(|status| {
                            let reason = status.reason.as_deref()?;
                            Some(Box::new((
                                crate::model::quote::quote(reason),
                                crate::model::quote::quote(status.message.as_deref().unwrap_or("")),
                            )))
                        });
                        self.keep(&key, |kept| {
                            if uid::same(kept.copy_uid.as_ref(), pod.metadata.uid.as_deref()) {
                                kept.copy_uid = None;
                            }
                            if said.is_some() {
                                kept.leaf_said = said;
                            }
                        });
                        self.queue.add(key);
                    }
                }
                Ok(watcher::Event::Init) => {}
                Err(err) => {
                    tracing::warn!(%err, leaf = %self.context.leaf.name, "watching the pods relaylet runs in the leaf")
                }
            }
        }
    }

    /// The root pod a copy in the leaf stands for (by name: its namespace mapped back).
    fn root_key_of_copy(&self, pod: &SlimPod) -> Option<Key> {
        let namespace = pod.metadata.namespace.as_deref()?;
        let root = self.context.leaf.namespaces.root_namespace(namespace)?;
        Some((root.to_string(), pod.metadata.name.clone()?))
    }

    async fn work(self: Arc<Self>) {
        loop {
            let key = self.queue.next().await;
            let mut memory = self.keep(&key, |kept| std::mem::take(&mut kept.memory));
            let span = tracing::debug_span!("pod_sync", namespace = %key.0, pod = %key.1, leaf = %self.context.leaf.name);
            let outcome =
                tracing::Instrument::instrument(Box::pin(self.reconcile(&key, &mut memory)), span)
                    .await;
            let again = match outcome {
                Ok(Done::Forget) => {
                    let mut pods = lock(&self.pods);
                    if pods.remove(&key).is_some() {
                        self.context.metrics.pods_synced.dec();
                    }
                    // A burst gone gives its room back (rarely: a quarter full at most).
                    if pods.capacity() > 64 && pods.len() < pods.capacity() / 4 {
                        let keep = pods.len() * 2;
                        pods.shrink_to(keep);
                    }
                    None
                }
                Ok(Done::Keep) => {
                    memory.retry = None;
                    let due = memory.tokens_due.map(until);
                    self.keep(&key, |kept| kept.memory = memory);
                    due
                }
                Ok(Done::After(wait)) => {
                    let due = memory.tokens_due.map(until);
                    self.keep(&key, |kept| kept.memory = memory);
                    Some(due.map_or(wait, |due| due.min(wait)))
                }
                Err(err) => {
                    self.context.metrics.pod_sync_error(err.side());
                    let wait = memory
                        .retry
                        .get_or_insert_with(|| {
                            Box::new(Backoff::new(FIRST_RETRY, MAX_RETRY).jittered())
                        })
                        .next_wait();
                    tracing::warn!(namespace = %key.0, pod = %key.1, leaf = %self.context.leaf.name, %err, retry_in = ?wait, "running a pod in its leaf");
                    self.keep(&key, |kept| kept.memory = memory);
                    Some(wait)
                }
            };
            self.queue.done(&key);
            if let Some(wait) = again {
                self.queue.add_after(key, wait);
            }
        }
    }

    /// Reads root pod `key` and its copy, decides and acts.
    async fn reconcile(&self, key: &Key, memory: &mut Memory) -> Result<Done, SyncError> {
        let (namespace, name) = key;
        let node = &self.context.leaf.node_name;
        let roots: Api<Pod> = Api::namespaced(self.context.root.clone(), namespace);
        let root = roots
            .get_opt(name)
            .await
            .map_err(SyncError::Root)?
            // A pod of that name on another node is another pod.
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node));
        // The UID as read (the last one, once the pod is gone), and the copy's last word.
        let (root_uid, said) = self.keep(key, |kept| {
            let uid = root
                .as_ref()
                .and_then(|r| r.metadata.uid.as_deref().map(Uid::new));
            kept.root_live = uid.is_some();
            if uid.is_some() {
                kept.root_uid = uid;
            }
            (kept.root_uid.clone(), kept.leaf_said.take())
        });
        if said.is_some() {
            memory.leaf_reason = said;
        }
        let Some(leaf_namespace) = self.context.leaf.namespaces.leaf_namespace(namespace) else {
            return self.unmapped(&roots, root.as_ref(), memory).await;
        };
        let leaf = self
            .context
            .leaf
            .client()
            .get_opt::<Pod>(Some(leaf_namespace), name)
            .await
            .map_err(SyncError::Leaf)?;
        // Two whole pods read and dropped: a burst of them is memory worth giving back.
        crate::ops::memory::decoded();
        crate::ops::memory::decoded();
        if root.is_none() && leaf.is_none() {
            self.copied.forget(&self.io(), key).await?;
            if self.context.root_apiserver.is_some()
                && let Some(uid) = &root_uid
            {
                self.tokens()
                    .forget(leaf_namespace, &uid.to_string())
                    .await?;
            }
            return Ok(Done::Forget);
        }
        if let Some(said) = leaf.as_ref().and_then(leaf_reason) {
            memory.leaf_reason = Some(Box::new(said));
        }
        let rules = CopyRules {
            marks: self.marks.clone(),
            leaf_namespace: leaf_namespace.to_string(),
            node_taints: self.context.node_taints.clone(),
            node_label_keys: CopyRules::node_label_keys(&self.context.leaf.node_labels),
            host_access: self.context.leaf.host_access,
            root_apiserver: self.context.root_apiserver.clone(),
        };
        let facts = Facts {
            rules: &rules,
            host_ip: &self.context.host_ip,
            own_namespace: &self.context.owner,
            leaf_reason: memory.leaf_reason.as_deref(),
            now: Timestamp::now(),
        };
        let Plan {
            leaf: leaf_action,
            root: root_action,
        } = decide(root.as_ref(), leaf.as_ref(), &facts, &mut memory.restarts);
        // What the pod names goes first, and follows the pod while it runs.
        let runs = matches!(leaf_action, Some(LeafAction::Create(_)))
            || leaf.as_ref().is_some_and(|l| {
                self.marks.ours(&l.metadata)
                    && self.marks.root_uid(&l.metadata)
                        == root.as_ref().and_then(|r| r.metadata.uid.as_deref())
            });
        let forwarding = self.context.root_apiserver.is_some();
        if let Some(root) = root.as_ref().filter(|_| runs)
            && let Some(spec) = &root.spec
        {
            self.copied
                .follow(
                    &self.io(),
                    key,
                    leaf_namespace,
                    &references(spec, forwarding),
                )
                .await?;
            let ended =
                root_status::terminal(root.status.as_ref().and_then(|s| s.phase.as_deref()));
            if forwarding && root.metadata.deletion_timestamp.is_none() && !ended {
                memory.tokens_due = self
                    .tokens()
                    .ensure(root, leaf_namespace, memory.tokens_due)
                    .await?;
            }
        }
        let refused = match leaf_action {
            Some(action) => self.act_in_leaf(leaf_namespace, name, action).await?,
            None => None,
        };
        // The leaf refused the copy for good: the root pod fails, saying why.
        if let (Some(why), Some(root)) = (refused, &root) {
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now());
            if let Some(status) = root_status::failed(root, "LeafRejected", &why, &now) {
                return self
                    .write_status(&roots, root, status, memory, "root_fail")
                    .await;
            }
        }
        match (root_action, &root) {
            (Some(RootAction::Status(status)), Some(root)) => {
                let action = if status.phase.as_deref() == Some("Failed")
                    && !root_status::terminal(root.status.as_ref().and_then(|s| s.phase.as_deref()))
                {
                    "root_fail"
                } else {
                    "root_status"
                };
                self.write_status(&roots, root, *status, memory, action)
                    .await
            }
            (Some(RootAction::Delete { uid }), _) => {
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match roots.delete(name, &params).await {
                    Ok(_) => self.context.metrics.pod_sync_action("root_delete"),
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(err) => return Err(SyncError::Root(err)),
                }
                Ok(Done::Keep)
            }
            _ => Ok(Done::Keep),
        }
    }

    /// A root pod in a namespace the leaf's map does not name: it says so (or, deleted,
    /// finishes at once: it never had a copy).
    async fn unmapped(
        &self,
        roots: &Api<Pod>,
        root: Option<&Pod>,
        memory: &mut Memory,
    ) -> Result<Done, SyncError> {
        let Some(root) = root else {
            return Ok(Done::Forget);
        };
        if root.metadata.deletion_timestamp.is_some() {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: root.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let name = root.metadata.name.as_deref().unwrap_or_default();
            return match roots.delete(name, &params).await {
                Ok(_) | Err(kube::Error::Api(_)) => Ok(Done::Keep),
                Err(err) => Err(SyncError::Root(err)),
            };
        }
        let message = format!(
            "namespace {} is not mapped to a namespace of leaf cluster {} (its Secret's relaylet.io/namespace-map)",
            root.metadata.namespace.as_deref().unwrap_or_default(),
            self.context.leaf.name
        );
        let status = root_status::not_run(root, "NamespaceNotMapped", &message);
        if !root_status::differs(root.status.as_ref(), &status) {
            return Ok(Done::Keep);
        }
        self.write_status(roots, root, status, memory, "root_status")
            .await
    }

    /// Does `action` in leaf namespace `namespace`; the leaf's refusal of a copy for good, if
    /// it refused one (the root pod then fails with it).
    async fn act_in_leaf(
        &self,
        namespace: &str,
        name: &str,
        action: LeafAction,
    ) -> Result<Option<String>, SyncError> {
        let calls = self.context.leaf.client();
        match action {
            LeafAction::Create(copy) => {
                self.ensure_namespace(&calls, namespace).await?;
                let account = copy
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.clone())
                    .unwrap_or_else(|| "default".to_string());
                self.ensure_service_account(&calls, namespace, &account)
                    .await?;
                let params = PostParams {
                    field_manager: Some(MANAGER.to_string()),
                    ..PostParams::default()
                };
                match calls.create(Some(namespace), &*copy, &params).await {
                    Ok(_) => {
                        self.context.metrics.pod_sync_action("leaf_create");
                        tracing::info!(namespace, pod = name, leaf = %self.context.leaf.name, "pod created in its leaf cluster");
                        Ok(None)
                    }
                    // Made already (a create whose answer was lost): the next look sees it.
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
                    Err(kube::Error::Api(e)) if refused_for_good(&e) => Ok(Some(format!(
                        "leaf cluster {} refused the pod: {}",
                        self.context.leaf.name,
                        crate::model::quote::quote(&e.message)
                    ))),
                    Err(err) => Err(SyncError::Leaf(err)),
                }
            }
            LeafAction::Patch(patch) => {
                let params = PatchParams {
                    field_manager: Some(MANAGER.to_string()),
                    ..PatchParams::default()
                };
                calls
                    .patch::<Pod, _>(Some(namespace), name, &params, &Patch::Strategic(patch))
                    .await
                    .map_err(SyncError::Leaf)?;
                self.context.metrics.pod_sync_action("leaf_patch");
                Ok(None)
            }
            LeafAction::EphemeralContainers(patch) => {
                let request =
                    kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
                        .patch_subresource(
                            "ephemeralcontainers",
                            name,
                            &PatchParams {
                                field_manager: Some(MANAGER.to_string()),
                                ..PatchParams::default()
                            },
                            &Patch::Strategic(patch),
                        )
                        .map_err(|e| SyncError::Leaf(kube::Error::BuildRequest(e)))?;
                calls
                    .request::<Pod>(request)
                    .await
                    .map_err(SyncError::Leaf)?;
                self.context.metrics.pod_sync_action("leaf_debug");
                Ok(None)
            }
            LeafAction::Delete { uid, grace } => {
                let params = DeleteParams {
                    grace_period_seconds: grace.map(|g| g as u32),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match calls.delete::<Pod>(Some(namespace), name, &params).await {
                    Ok(_) => self.context.metrics.pod_sync_action("leaf_delete"),
                    // Another pod by now (the precondition): the next look decides again.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(err) => return Err(SyncError::Leaf(err)),
                }
                Ok(None)
            }
        }
    }

    /// Writes `status` on root pod `root` (with its resourceVersion), at most once a second
    /// within a phase: a write sooner waits for the rest of the second and carries what changed
    /// meanwhile. A new phase goes at once (a pod has few: Pending, Running, then one terminal
    /// phase that never goes back), so a pod is Running in the root as soon as in the leaf.
    async fn write_status(
        &self,
        roots: &Api<Pod>,
        root: &Pod,
        status: k8s_openapi::api::core::v1::PodStatus,
        memory: &mut Memory,
        action: &'static str,
    ) -> Result<Done, SyncError> {
        let new_phase =
            root.status.as_ref().and_then(|s| s.phase.as_ref()) != status.phase.as_ref();
        if let Some(at) = memory.written
            && !new_phase
        {
            let since = at.elapsed();
            if since < STATUS_EVERY {
                return Ok(Done::After(STATUS_EVERY - since));
            }
        }
        let mut pod = root.clone();
        pod.status = Some(status);
        let name = root.metadata.name.as_deref().unwrap_or_default();
        match roots
            .replace_status(name, &PostParams::default(), &pod)
            .await
        {
            Ok(_) => {
                memory.written = Some(Instant::now());
                self.context.metrics.pod_sync_action(action);
                Ok(Done::Keep)
            }
            // Changed since it was read: read it again now.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Done::After(Duration::ZERO)),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Done::Keep),
            Err(err) => Err(SyncError::Root(err)),
        }
    }

    /// Creates leaf namespace `namespace` if it is missing (never deleted: others may use it).
    async fn ensure_namespace(&self, calls: &Calls, namespace: &str) -> Result<(), SyncError> {
        let key = (namespace.to_string(), String::new());
        if lock(&self.ensured).contains(&key) {
            return Ok(());
        }
        let found = match calls.get_opt::<Namespace>(None, namespace).await {
            Ok(found) => found.is_some(),
            // The namespaced leaf RBAC reads no namespaces: they are the administrator's to
            // make, and a missing one fails the create that follows, saying so.
            Err(kube::Error::Api(e)) if e.code == 403 => true,
            Err(err) => return Err(SyncError::Leaf(err)),
        };
        if !found {
            let object = Namespace {
                metadata: ObjectMeta {
                    name: Some(namespace.to_string()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            match calls.create(None, &object, &PostParams::default()).await {
                Ok(_) => {
                    tracing::info!(namespace, leaf = %self.context.leaf.name, "namespace created in the leaf cluster")
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(err) => return Err(SyncError::Leaf(err)),
            }
        }
        lock(&self.ensured).insert(key);
        Ok(())
    }

    /// Creates service account `account` in leaf namespace `namespace` if it is missing, with
    /// no rights (the leaf's admission refuses a pod whose account does not exist).
    async fn ensure_service_account(
        &self,
        calls: &Calls,
        namespace: &str,
        account: &str,
    ) -> Result<(), SyncError> {
        let key = (namespace.to_string(), account.to_string());
        if lock(&self.ensured).contains(&key) {
            return Ok(());
        }
        if calls
            .get_opt::<ServiceAccount>(Some(namespace), account)
            .await
            .map_err(SyncError::Leaf)?
            .is_none()
        {
            let object = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(account.to_string()),
                    namespace: Some(namespace.to_string()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            };
            match calls
                .create(Some(namespace), &object, &PostParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(err) => return Err(SyncError::Leaf(err)),
            }
        }
        lock(&self.ensured).insert(key);
        Ok(())
    }
}

/// How a reconcile ended.
enum Done {
    /// Nothing of the pod is left on either side: forget it.
    Forget,
    /// Done until the pod changes.
    Keep,
    /// Look again after this (a status write held back, a write that met a newer pod).
    After(Duration),
}

/// The wait from now until `at` (none if it is past).
fn until(at: Timestamp) -> Duration {
    at.duration_since(Timestamp::now())
        .try_into()
        .unwrap_or(Duration::ZERO)
}

/// Whether the leaf refused a pod for what it is (its admission: Pod Security, a policy, an
/// invalid field), not for relaylet's rights or a passing fault: the root pod then fails.
fn refused_for_good(status: &kube::core::Status) -> bool {
    match status.code {
        400 | 422 => true,
        // RBAC says "cannot create resource"; an admission denial says why the pod is refused.
        403 => !status.message.contains("cannot create resource"),
        _ => false,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

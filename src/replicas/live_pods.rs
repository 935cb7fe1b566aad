//! Which relaylet pods are live: the names of this install's Running pods in relaylet's
//! namespace, from one watch kept in memory, so judging a replica Lease (`identity`) costs no
//! API call.
//!
//! The pods are found by relaylet's own selector: `REPLICA_SELECTOR` (the chart sets it to the
//! Deployment's selector, which cannot change while the Deployment lives), else this replica's
//! own pod labels, read once at start, minus the labels a controller puts on each revision or
//! pod (`pod-template-hash` and the like). The chart's way is the better one: pods of an older
//! revision whose labels differ (a changed `podLabels`) still match the Deployment's selector,
//! while they may not match a newer pod's own labels.
//!
//! A pod counts while its phase is `Running` (a terminating pod still runs, and hands its nodes
//! over). Readiness does not matter: relaylet is unready while no leaf answers, and a fleet of
//! unready replicas must still keep its Nodes. Until the first listing is done nothing is live,
//! so a replica takes part in elections only after it (`LivePods::includes`).
//!
//! Memory is bounded: only names are kept, and at most [`MAX_PODS`] of them.
//!
//! A watch can lag: a replica about to take a Node from a peer whose presence Lease is renewed
//! but whose pod the cache does not show asks the apiserver first ([`LivePods::runs_now`]), so
//! a lagging cache never makes a live peer look forged.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::ReplicaSelector;
use crate::model::slim_pod::SlimPod;

/// More relaylet pods than this in one install are not tracked (the rest never count).
pub const MAX_PODS: usize = 256;
/// Labels a controller sets per revision or per pod: never part of the install's selector.
const PER_POD_LABELS: [&str; 4] = [
    "pod-template-hash",
    "controller-revision-hash",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
];
/// How long this replica's own pod may be missing from the live ones before that is said.
const SAY_AFTER: Duration = Duration::from_secs(30);
/// How long to wait before trying again to read this replica's own pod labels.
const RETRY_OWN_POD: Duration = Duration::from_secs(5);

/// The names of the live pods, `None` until the first listing is done.
type Names = Option<Arc<BTreeSet<String>>>;

/// Where to ask the apiserver about one pod, and the selector once it is known.
type Ask = (Api<SlimPod>, watch::Receiver<Option<ReplicaSelector>>);

/// The live relaylet pods of this install. Cheap to clone.
#[derive(Clone)]
pub struct LivePods {
    names: watch::Receiver<Names>,
    /// Where to ask about one pod now, once the selector is known (none for a fixed set).
    ask: Option<Arc<Ask>>,
    /// Held so a fixed set stays readable.
    _fixed: Option<Arc<watch::Sender<Names>>>,
}

impl LivePods {
    /// Watches the pods of namespace `namespace` selected by `selector` (or, when `None`, by
    /// the labels of pod `me` there) until `stop` fires.
    pub fn watch(
        root: Client,
        namespace: &str,
        selector: Option<ReplicaSelector>,
        me: String,
        stop: CancellationToken,
    ) -> LivePods {
        let (tx, rx) = watch::channel(None);
        let (selector_tx, selector_rx) = watch::channel(None);
        let ask = Some(Arc::new((
            Api::namespaced(root.clone(), namespace),
            selector_rx,
        )));
        let namespace = namespace.to_string();
        tokio::spawn(async move {
            tokio::select! {
                _ = follow(root, namespace, selector, me, tx, selector_tx) => {}
                _ = stop.cancelled() => {}
            }
        });
        LivePods {
            names: rx,
            ask,
            _fixed: None,
        }
    }

    /// A fixed set of live pods (tests; an embedding that knows its replicas).
    pub fn fixed<'a>(names: impl IntoIterator<Item = &'a str>) -> LivePods {
        let names = names.into_iter().map(str::to_string).collect();
        let (tx, rx) = watch::channel(Some(Arc::new(names)));
        LivePods {
            names: rx,
            ask: None,
            _fixed: Some(Arc::new(tx)),
        }
    }

    /// Whether `name` is a Running relaylet pod of this install as the apiserver says now,
    /// not as the cache says (a fixed set: whether it is in it). `true` when that cannot be
    /// told (the selector not known yet, the read failed): the caller then waits rather than
    /// take a Node from a replica that may be serving it.
    pub async fn runs_now(&self, name: &str) -> bool {
        let Some((api, selector)) = self.ask.as_deref() else {
            return self.is_live(name);
        };
        let Some(selector) = selector.borrow().clone() else {
            return true;
        };
        let params = kube::api::ListParams::default()
            .labels(&selector.query())
            .fields(&format!("metadata.name={name}"));
        match api.list(&params).await {
            Ok(pods) => pods.items.iter().any(|pod| pod.phase() == Some("Running")),
            Err(err) => {
                tracing::debug!(%err, pod = name, "reading a relaylet pod");
                true
            }
        }
    }

    /// Whether `name` is a live relaylet pod (never before the first listing).
    pub fn is_live(&self, name: &str) -> bool {
        self.names
            .borrow()
            .as_ref()
            .is_some_and(|names| names.contains(name))
    }

    /// Resolves once the pods have been listed (before, nothing is live).
    pub async fn synced(&self) {
        let mut names = self.names.clone();
        if names.wait_for(Option::is_some).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once `name` is seen live. Says once, loudly, when it has not been for
    /// [`SAY_AFTER`]: a replica whose own pod relaylet's selector does not find (a wrong
    /// `REPLICA_SELECTOR`, a wrong `POD_NAME`) would be ignored by its peers, so it does not
    /// stand at all. (Not at once: the kubelet may report the pod Running a moment after its
    /// container started.)
    pub async fn includes(&self, name: &str) {
        let mut names = self.names.clone();
        let live = |names: &Names| names.as_ref().is_some_and(|set| set.contains(name));
        let found = matches!(
            tokio::time::timeout(SAY_AFTER, names.wait_for(live)).await,
            Ok(Ok(_))
        );
        if found {
            return;
        }
        tracing::warn!(
            pod = name,
            "this replica's own pod is not among the Running relaylet pods its selector finds (REPLICA_SELECTOR, else its own labels): it takes no part in leader election or serving Nodes until it is"
        );
        if names.wait_for(live).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves the selector, then keeps `tx` up to date with the live pods' names.
async fn follow(
    root: Client,
    namespace: String,
    selector: Option<ReplicaSelector>,
    me: String,
    tx: watch::Sender<Names>,
    selector_tx: watch::Sender<Option<ReplicaSelector>>,
) {
    let selector = match selector {
        Some(selector) => selector,
        None => own_pod_selector(&root, &namespace, &me).await,
    };
    selector_tx.send_replace(Some(selector.clone()));
    tracing::info!(selector = %selector.query(), "relaylet pods are found by this selector");
    let api: Api<SlimPod> = Api::namespaced(root, &namespace);
    let config = watcher::Config::default().labels(&selector.query());
    let mut events = watcher(api, config).default_backoff().boxed();
    // The listing under way (`Init` .. `InitDone`), swapped in whole when done, so a re-list
    // never shows a moment with no pods.
    let mut listing: Option<BTreeSet<String>> = None;
    let mut over_cap_said = false;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                tracing::debug!(%err, "watching relaylet's pods (retrying)");
                continue;
            }
        };
        match event {
            watcher::Event::Init => listing = Some(BTreeSet::new()),
            watcher::Event::InitApply(pod) => {
                if let Some(listing) = listing.as_mut() {
                    apply(listing, &pod, &mut over_cap_said);
                }
            }
            watcher::Event::InitDone => {
                if let Some(listing) = listing.take() {
                    tx.send_replace(Some(Arc::new(listing)));
                }
            }
            watcher::Event::Apply(pod) => {
                tx.send_if_modified(|names| {
                    let Some(names) = names.as_mut() else {
                        return false;
                    };
                    let mut next = (**names).clone();
                    apply(&mut next, &pod, &mut over_cap_said);
                    let changed = next != **names;
                    if changed {
                        *names = Arc::new(next);
                    }
                    changed
                });
            }
            watcher::Event::Delete(pod) => {
                tx.send_if_modified(|names| {
                    let (Some(names), Some(name)) = (names.as_mut(), pod.metadata.name.as_deref())
                    else {
                        return false;
                    };
                    if !names.contains(name) {
                        return false;
                    }
                    let mut next = (**names).clone();
                    next.remove(name);
                    *names = Arc::new(next);
                    true
                });
            }
        }
    }
}

/// Puts `pod` in `names` when it runs, takes it out when it does not.
fn apply(names: &mut BTreeSet<String>, pod: &SlimPod, over_cap_said: &mut bool) {
    let Some(name) = pod.metadata.name.as_deref() else {
        return;
    };
    if pod.phase() != Some("Running") {
        names.remove(name);
    } else if names.len() < MAX_PODS || names.contains(name) {
        names.insert(name.to_string());
    } else if !std::mem::replace(over_cap_said, true) {
        tracing::warn!(
            max = MAX_PODS,
            "more Running pods match relaylet's selector than relaylet tracks: the others never count as replicas"
        );
    }
}

/// This replica's own pod labels minus the per-revision ones, retried until read: nothing is
/// live (so this replica does not stand) until then.
async fn own_pod_selector(root: &Client, namespace: &str, me: &str) -> ReplicaSelector {
    let api: Api<Pod> = Api::namespaced(root.clone(), namespace);
    loop {
        let problem = match api.get_opt(me).await {
            Ok(Some(pod)) => {
                let mut labels = pod.metadata.labels.unwrap_or_default();
                for label in PER_POD_LABELS {
                    labels.remove(label);
                }
                if !labels.is_empty() {
                    return ReplicaSelector(labels);
                }
                "it has no labels but per-pod ones".to_string()
            }
            Ok(None) => "it does not exist (is POD_NAME the pod's name?)".to_string(),
            Err(err) => err.to_string(),
        };
        tracing::warn!(
            pod = me,
            namespace,
            problem = %problem,
            "cannot read this replica's own pod labels to find its peers; set REPLICA_SELECTOR (retrying)"
        );
        tokio::time::sleep(RETRY_OWN_POD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str) -> SlimPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn only_running_pods_count_and_at_most_max_pods() {
        let mut names = BTreeSet::new();
        let mut said = false;
        apply(&mut names, &pod("a", "Pending"), &mut said);
        assert!(names.is_empty());
        apply(&mut names, &pod("a", "Running"), &mut said);
        assert!(names.contains("a"));
        apply(&mut names, &pod("a", "Failed"), &mut said);
        assert!(names.is_empty());
        for i in 0..MAX_PODS + 10 {
            apply(&mut names, &pod(&format!("p{i}"), "Running"), &mut said);
        }
        assert_eq!(names.len(), MAX_PODS);
        assert!(said);
    }

    #[tokio::test]
    async fn nothing_is_live_before_the_first_listing() {
        let (tx, rx) = watch::channel(None);
        let live = LivePods {
            names: rx,
            ask: None,
            _fixed: None,
        };
        assert!(!live.is_live("a"));
        tx.send_replace(Some(Arc::new(BTreeSet::from(["a".to_string()]))));
        assert!(live.is_live("a"));
        live.includes("a").await;
    }

    /// A replica waits for its own pod however long it takes (it is said once, after a while).
    #[tokio::test(start_paused = true)]
    async fn a_replica_waits_for_its_own_pod() {
        let (tx, rx) = watch::channel(Some(Arc::new(BTreeSet::from(["a".to_string()]))));
        let live = LivePods {
            names: rx,
            ask: None,
            _fixed: None,
        };
        let waiting = tokio::spawn(async move { live.includes("b").await });
        tokio::time::sleep(SAY_AFTER * 3).await;
        assert!(!waiting.is_finished());
        tx.send_replace(Some(Arc::new(BTreeSet::from(["a".into(), "b".into()]))));
        waiting.await.unwrap();
    }
}

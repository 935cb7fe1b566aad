//! The leaf's Events about relaylet's copies, told again on their root pods, so `kubectl
//! describe pod` in the root shows what the leaf's scheduler and kubelet said of the pod
//! (`Scheduled`, `Pulled`, `Started`, `BackOff`, `FailedMount`...).
//!
//! One watch per leaf, of its Events about pods (`involvedObject.kind=Pod`). Told are only
//! Events about a copy relaylet made for a pod it runs, only those that arrive while it
//! watches (not the history a LIST gives), each at most once a minute however often the leaf
//! counts it again, at most one every 5 seconds per pod after a burst of [`POD_BURST`], and at
//! most [`RATE`] a second per leaf after a burst of [`BURST`]: a leaf, or a tenant in it writing
//! Events, cannot make relaylet write the root full, nor one pod's Events drown the others'.
//! What was not told is counted. The leaf's text is quoted short.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as LeafEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::caps::TokenBucket;
use crate::kube_client::{Calls, LeanWatch};
use crate::model::event::{Said, event};
use crate::model::quote::quote;
use crate::ops::Metrics;

/// Events told a second per leaf, after a burst of [`BURST`].
const RATE: f64 = 10.0;
const BURST: f64 = 100.0;
/// Events told a second per pod, after a burst of [`POD_BURST`].
const POD_RATE: f64 = 0.2;
const POD_BURST: f64 = 20.0;
/// Pods whose budget is remembered before the full ones are forgotten (a full budget is as
/// good as a new one); only pods relaylet runs get one, so there are at most as many as those.
const POD_BUDGETS: usize = 1024;
/// A leaf Event counted again is told again at most this often.
const REPEAT: Duration = Duration::from_secs(60);
/// The leaf Events remembered as told (their UIDs), at most.
const RECENT: usize = 4096;
/// Events per LIST page.
const PAGE: u32 = 500;

/// The root pod a copy stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One leaf's Events told on root pods.
pub struct LeafEvents {
    /// The leaf's name: the Events' `reportingInstance`.
    leaf: String,
    recent: Mutex<Recent>,
    budget: Mutex<Budget>,
}

/// The leaf's budget and each pod's (by root pod UID).
struct Budget {
    leaf: TokenBucket,
    pods: HashMap<String, TokenBucket>,
}

impl Budget {
    /// Takes one Event about root pod `uid` from its budget and the leaf's, if both have one.
    fn take(&mut self, uid: &str) -> bool {
        if self.pods.len() >= POD_BUDGETS && !self.pods.contains_key(uid) {
            self.pods
                .retain(|_, bucket| !bucket.is_full(POD_RATE, POD_BURST));
        }
        let pod = self
            .pods
            .entry(uid.to_string())
            .or_insert_with(|| TokenBucket::full(POD_BURST));
        // The pod's first: a pod over its budget does not spend the leaf's.
        pod.take(POD_RATE, POD_BURST) && self.leaf.take(RATE, BURST)
    }
}

/// Which leaf Events were told lately, and when.
#[derive(Default)]
struct Recent {
    at: HashMap<String, Instant>,
    order: VecDeque<String>,
}

impl LeafEvents {
    pub fn new(leaf: &str) -> LeafEvents {
        LeafEvents {
            leaf: leaf.to_string(),
            recent: Mutex::default(),
            budget: Mutex::new(Budget {
                leaf: TokenBucket::full(BURST),
                pods: HashMap::new(),
            }),
        }
    }

    /// Watches the leaf's pod Events through `calls` for ever, telling those about a copy
    /// (`copy_of` gives the root pod of the leaf pod an Event is about, if it is a copy) on its
    /// root pod through `root`.
    pub async fn follow(
        &self,
        calls: Calls,
        root: &Client,
        copy_of: impl Fn(&ObjectReference) -> Option<RootPod>,
        metrics: &Metrics,
    ) {
        let mut watch =
            LeanWatch::<LeafEvent>::new(calls, Some("involvedObject.kind=Pod".into()), PAGE);
        loop {
            match watch.next().await {
                // What the LIST gives is history: told once already, or before relaylet ran.
                Ok(watcher::Event::Apply(leaf_event)) => {
                    let Some(pod) = copy_of(&leaf_event.involved_object) else {
                        continue;
                    };
                    let Some(uid) = leaf_event.metadata.uid.as_deref() else {
                        continue;
                    };
                    if !self.fresh(uid, Instant::now()) {
                        continue;
                    }
                    if !lock(&self.budget).take(&pod.uid) {
                        metrics.pod_sync_action("root_event_dropped");
                        continue;
                    }
                    let told = root_event(&leaf_event, &pod, &self.leaf, Timestamp::now());
                    let events: Api<Event> = Api::namespaced(root.clone(), &pod.namespace);
                    match events.create(&PostParams::default(), &told).await {
                        Ok(_) => metrics.pod_sync_action("root_event"),
                        Err(err) => {
                            tracing::debug!(namespace = %pod.namespace, pod = %pod.name, leaf = %self.leaf, %err, "telling a leaf Event on its root pod")
                        }
                    }
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(leaf = %self.leaf, %err, "watching the leaf's Events about pods")
                }
            }
        }
    }

    /// Whether leaf Event `uid` was not told within [`REPEAT`] of `now` (and notes it told).
    fn fresh(&self, uid: &str, now: Instant) -> bool {
        let mut recent = lock(&self.recent);
        if let Some(at) = recent.at.get(uid)
            && now.duration_since(*at) < REPEAT
        {
            return false;
        }
        if recent.at.insert(uid.to_string(), now).is_none() {
            recent.order.push_back(uid.to_string());
        }
        while recent.order.len() > RECENT {
            if let Some(oldest) = recent.order.pop_front() {
                recent.at.remove(&oldest);
            }
        }
        true
    }
}

/// The root Event telling `leaf_event` on root pod `pod`: the leaf's type, reason and message
/// (quoted), reported by relaylet for leaf `leaf`.
pub fn root_event(leaf_event: &LeafEvent, pod: &RootPod, leaf: &str, now: Timestamp) -> Event {
    let reason = quote(leaf_event.reason.as_deref().unwrap_or_default());
    let action = quote(leaf_event.action.as_deref().unwrap_or_default());
    let note = quote(leaf_event.message.as_deref().unwrap_or_default());
    let regarding = ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Pod".to_string()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: Some(pod.uid.clone()),
        // The container an Event is about (`spec.containers{main}`) is the same in the root.
        field_path: leaf_event.involved_object.field_path.as_deref().map(quote),
        ..ObjectReference::default()
    };
    let said = Said {
        type_: leaf_event.type_.as_deref().unwrap_or("Normal"),
        reason: if reason.is_empty() {
            "LeafEvent"
        } else {
            &reason
        },
        action: if action.is_empty() { "Run" } else { &action },
        note: &note,
    };
    event(regarding, &said, leaf, now)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> RootPod {
        RootPod {
            namespace: "team".into(),
            name: "web-0".into(),
            uid: "root-uid".into(),
        }
    }

    #[test]
    fn a_leaf_event_is_told_on_the_root_pod_quoted() {
        let leaf: LeafEvent = serde_json::from_value(json!({
            "metadata": {"name": "web-0.1", "namespace": "leaf-team", "uid": "e1"},
            "involvedObject": {"kind": "Pod", "name": "web-0", "namespace": "leaf-team",
                "uid": "leaf-uid", "fieldPath": "spec.containers{main}"},
            "type": "Warning", "reason": "BackOff",
            "message": format!("Back-off restarting failed container\n{}", "x".repeat(2000)),
            "source": {"component": "kubelet", "host": "leaf-node-7"}
        }))
        .unwrap();
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let told = root_event(&leaf, &pod(), "leaf-1", now);
        let regarding = told.regarding.unwrap();
        assert_eq!(
            (
                regarding.namespace.as_deref(),
                regarding.name.as_deref(),
                regarding.uid.as_deref(),
                regarding.field_path.as_deref()
            ),
            (
                Some("team"),
                Some("web-0"),
                Some("root-uid"),
                Some("spec.containers{main}")
            ),
            "about the root pod, never the leaf's"
        );
        assert_eq!(told.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(told.type_.as_deref(), Some("Warning"));
        assert_eq!(told.reason.as_deref(), Some("BackOff"));
        assert_eq!(told.action.as_deref(), Some("Run"));
        let note = told.note.unwrap();
        assert!(
            note.starts_with("Back-off restarting failed container x"),
            "{note}"
        );
        assert!(
            note.len() < 400 && !note.contains('\n'),
            "quoted short: {note}"
        );
        assert_eq!(told.reporting_instance.as_deref(), Some("leaf-1"));
    }

    #[test]
    fn one_pod_cannot_spend_the_leafs_budget() {
        let mut budget = Budget {
            leaf: TokenBucket::full(BURST),
            pods: HashMap::new(),
        };
        let told = (0..100).filter(|_| budget.take("noisy")).count();
        assert_eq!(told, POD_BURST as usize, "one pod gets its burst");
        assert!(budget.take("quiet"), "another pod still gets told");
    }

    #[test]
    fn an_event_counted_again_is_told_again_only_after_a_minute_and_memory_is_bounded() {
        let events = LeafEvents::new("leaf-1");
        let t0 = Instant::now();
        assert!(events.fresh("e1", t0));
        assert!(!events.fresh("e1", t0 + Duration::from_secs(30)));
        assert!(events.fresh("e1", t0 + REPEAT));
        for i in 0..RECENT + 10 {
            events.fresh(&format!("x{i}"), t0);
        }
        let recent = lock(&events.recent);
        assert_eq!(recent.at.len(), RECENT);
        assert_eq!(recent.order.len(), RECENT);
    }
}

//! How a replica Lease that breaks the rules (`identity`) is made known: every write of one is
//! counted (`relaylet_ignored_leases_total{reason}`), and a few are told in full: a warn log
//! line and a Warning Event on the Lease (reason `LeaseIgnored`, so `kubectl describe lease`
//! shows it to whoever wrote it).
//!
//! Telling is budgeted (a burst of [`BURST`], then one every [`EVERY`] per replica): whoever
//! writes Leases could otherwise make relaylet write an Event per write of theirs. What was not
//! told is still counted, and the next line says how many were left untold. Text taken from a
//! Lease (its holder) is quoted short.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

use super::identity::Ignored;
use crate::caps::TokenBucket;
use crate::model::event::{Said, event};
use crate::ops::Metrics;

/// The Event reason.
pub const EVENT_REASON: &str = "LeaseIgnored";
/// Ignored Leases told at once before the budget slows down.
const BURST: f64 = 5.0;
/// Then one told this often.
const EVERY: Duration = Duration::from_secs(30);
/// A holder is quoted up to this many characters.
const QUOTE: usize = 64;

/// Makes ignored Leases known. Cheap to clone.
#[derive(Clone)]
pub struct IgnoredLeases(Arc<Inner>);

struct Inner {
    metrics: Metrics,
    /// Where Events go (relaylet's namespace); `None`: counted and logged only.
    events: Option<Api<Event>>,
    /// The Events' `reportingInstance`: this replica.
    instance: String,
    /// The telling budget, and how many were not told since the last line.
    budget: Mutex<(TokenBucket, u64)>,
}

impl IgnoredLeases {
    /// Reports to `metrics`, the log, and Events in `namespace` as replica `instance`.
    pub fn new(root: Client, namespace: &str, metrics: Metrics, instance: &str) -> IgnoredLeases {
        IgnoredLeases::build(
            metrics,
            Some(Api::namespaced(root, namespace)),
            instance.to_string(),
        )
    }

    /// Counts and logs only (no Events).
    pub fn counting(metrics: Metrics) -> IgnoredLeases {
        IgnoredLeases::build(metrics, None, String::new())
    }

    fn build(metrics: Metrics, events: Option<Api<Event>>, instance: String) -> IgnoredLeases {
        IgnoredLeases(Arc::new(Inner {
            metrics,
            events,
            instance,
            budget: Mutex::new((TokenBucket::full(BURST), 0)),
        }))
    }

    /// One write of `lease`, held by `holder`, seen and not counted because of `why`.
    pub fn report(&self, lease: &Lease, holder: &str, why: Ignored) {
        self.0.metrics.ignored_lease(why.reason());
        let untold = {
            let Ok(mut budget) = self.0.budget.lock() else {
                return;
            };
            let (bucket, untold) = &mut *budget;
            if !bucket.take(1.0 / EVERY.as_secs_f64(), BURST) {
                *untold += 1;
                return;
            }
            std::mem::take(untold)
        };
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        let holder = quote(holder);
        tracing::warn!(
            lease = name,
            holder = %holder,
            reason = why.reason(),
            untold_since_last = untold,
            "replica Lease ignored: {}",
            why.explain()
        );
        if let Some(events) = self.0.events.clone() {
            let event = self.event(lease, &holder, why);
            tokio::spawn(async move {
                if let Err(err) = events.create(&PostParams::default(), &event).await {
                    tracing::debug!(%err, "recording an ignored Lease as an Event");
                }
            });
        }
    }

    /// A Warning Event about `lease`.
    fn event(&self, lease: &Lease, holder: &str, why: Ignored) -> Event {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let note = format!(
            "relaylet does not count Lease {name} (holder {holder}): {}",
            why.explain()
        );
        let regarding = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".to_string()),
            kind: Some("Lease".to_string()),
            name: Some(name),
            namespace: lease.metadata.namespace.clone(),
            uid: lease.metadata.uid.clone(),
            resource_version: lease.metadata.resource_version.clone(),
            ..ObjectReference::default()
        };
        let said = Said {
            type_: "Warning",
            reason: EVENT_REASON,
            action: "Ignore",
            note: &note,
        };
        event(regarding, &said, &self.0.instance, Timestamp::now())
    }
}

/// `holder` in quotes, cut to [`QUOTE`] characters.
fn quote(holder: &str) -> String {
    let cut: String = holder.chars().take(QUOTE).collect();
    if cut.len() < holder.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_is_counted_and_a_holder_is_quoted_short() {
        let metrics = Metrics::new();
        let ignored = IgnoredLeases::counting(metrics.clone());
        let lease = Lease::default();
        for _ in 0..20 {
            ignored.report(&lease, "ghost", Ignored::NotALivePod);
        }
        ignored.report(&lease, "b", Ignored::HolderMismatch);
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("relaylet_ignored_leases_total{reason=\"not_a_live_pod\"} 20"),
            "{text}"
        );
        assert!(text.contains("relaylet_ignored_leases_total{reason=\"holder_mismatch\"} 1"));
        assert_eq!(quote("g"), "\"g\"");
        let long = "x".repeat(1000);
        assert_eq!(quote(&long).len(), QUOTE + 2 + 3);
    }
}

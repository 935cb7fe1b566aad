//! Several replicas: which relaylet replicas are alive, so virtual nodes can be spread over all
//! of them. It offers [`Replicas`] (who is alive), `leader` (the elected leader), `assignment`
//! (which replica serves which virtual node) and `served_by` (the one-writer rule on a Node) to
//! the virtual node controller. This file keeps the presence Leases.
//!
//! Each replica keeps a presence Lease, `relaylet-replica-<POD_NAME>` in relaylet's namespace,
//! with the same election code as the leader Lease (`leader::elect`; it is the Lease's only
//! candidate): renewed every 2 s, and a replica that cannot renew for 7 s counts itself gone
//! before anyone else may. Every replica lists those Leases every 2 s and judges each the way
//! the leader election judges its Lease: by when *it* saw the Lease change, never by the
//! timestamps in it, so clock skew cannot make a live replica look dead.
//!
//! Two questions are answered, deliberately differently:
//! - [`Peers::candidates`]: whom to spread nodes over. A replica counts once this one has seen
//!   its Lease renewed (not merely present: a crashed replica's Lease lingers).
//! - [`Peers::may_be_alive`]: whether a replica that holds a node might still be writing it.
//!   Yes until its Lease has gone unrenewed for the Lease's duration (the first sighting
//!   counts as a renewal), or it released or deleted its Lease. A node is taken from a replica
//!   only when the answer is no.

pub mod assignment;
pub mod leader;
pub mod served_by;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use leader::{LEASE_DURATION, Leadership, RETRY_PERIOD};

/// The prefix of presence Lease names; the rest is the replica's name.
pub const PRESENCE_PREFIX: &str = "relaylet-replica-";
/// A presence Lease unrenewed this long is deleted by the leader (a replica that crashed).
const FORGET_AFTER: Duration = Duration::from_secs(120);

/// This replica and what it knows of the others. Cheap to clone.
#[derive(Clone)]
pub struct Replicas {
    /// This replica's name (`POD_NAME`).
    pub me: Arc<str>,
    /// Whether this replica's own presence is current: it may serve nodes only while it is.
    pub present: Leadership,
    peers: watch::Receiver<Peers>,
    /// Held so a fixed [`Replicas::alone`] keeps its value readable.
    _fixed: Option<Arc<watch::Sender<Peers>>>,
}

/// The replicas seen, as of the last listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peers {
    /// Others whose Lease this replica saw renewed within its duration.
    renewing: BTreeSet<Arc<str>>,
    /// Others whose Lease might still be renewed (not yet expired, released or gone).
    maybe_alive: BTreeSet<Arc<str>>,
    /// `false` with leader election off: there are no others, and every node is this one's to
    /// take whatever its Node says.
    elected: bool,
}

impl Peers {
    /// Whom to spread nodes over: this replica (while present) and the others seen renewing.
    pub fn candidates<'a>(&'a self, me: &'a str, present: bool) -> impl Iterator<Item = &'a str> {
        present
            .then_some(me)
            .into_iter()
            .chain(self.renewing.iter().map(|r| &**r).filter(move |r| *r != me))
    }

    /// Whether `replica` (another one) might still be writing the nodes it holds.
    pub fn may_be_alive(&self, replica: &str) -> bool {
        self.elected && self.maybe_alive.contains(replica)
    }

    /// Peers as seen with election on: `renewing` (also maybe alive) and `maybe_alive`.
    #[cfg(test)]
    pub fn seen(renewing: &[&str], maybe_alive: &[&str]) -> Peers {
        Peers {
            renewing: renewing.iter().map(|r| Arc::from(*r)).collect(),
            maybe_alive: renewing
                .iter()
                .chain(maybe_alive)
                .map(|r| Arc::from(*r))
                .collect(),
            elected: true,
        }
    }

    /// Whether any other replica is seen renewing (someone to hand nodes to).
    pub fn others_renewing(&self, me: &str) -> bool {
        self.renewing.iter().any(|r| &**r != me)
    }
}

impl Replicas {
    /// The only replica (`LEADER_ELECT=false`), present once `eligible` resolves.
    pub fn alone(
        me: String,
        eligible: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Replicas {
        let (tx, rx) = watch::channel(Peers::default());
        Replicas {
            me: me.into(),
            present: Leadership::once(eligible),
            peers: rx,
            _fixed: Some(Arc::new(tx)),
        }
    }

    /// Joins the replicas of namespace `namespace` as `me` once `eligible` resolves; leaves
    /// (releasing the presence Lease, so peers take its nodes at once) when `stop` fires.
    /// `leader` deletes the Leases of replicas long gone.
    pub fn join(
        root: Client,
        namespace: &str,
        me: String,
        eligible: impl std::future::Future<Output = ()> + Send + 'static,
        leader: Leadership,
        stop: CancellationToken,
    ) -> Replicas {
        let present = leader::elect(
            root.clone(),
            namespace,
            &format!("{PRESENCE_PREFIX}{me}"),
            me.clone(),
            eligible,
            stop.clone(),
        );
        let (tx, rx) = watch::channel(Peers {
            elected: true,
            ..Peers::default()
        });
        let api: Api<Lease> = Api::namespaced(root, namespace);
        tokio::spawn(async move {
            let mut seen = Seen::default();
            // Said once when listing starts failing, and once when it works again: while it
            // fails this replica sees no peers, so it spreads nodes over itself alone.
            let mut failing = false;
            loop {
                match api.list(&ListParams::default()).await {
                    Ok(list) => {
                        if std::mem::take(&mut failing) {
                            tracing::info!("listing replica presence leases works again");
                        }
                        let peers = seen.observe(&list.items, Instant::now());
                        tx.send_if_modified(|old| {
                            let changed = *old != peers;
                            *old = peers;
                            changed
                        });
                        if leader.is_leader() {
                            forget_gone(&api, &seen.long_gone(Instant::now())).await;
                        }
                    }
                    Err(err) if !failing => {
                        failing = true;
                        tracing::warn!(%err, "listing replica presence leases failed: the other replicas are not seen (retrying)");
                    }
                    Err(err) => tracing::debug!(%err, "listing replica presence leases"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(RETRY_PERIOD) => {}
                    _ = stop.cancelled() => break,
                }
            }
        });
        Replicas {
            me: me.into(),
            present,
            peers: rx,
            _fixed: None,
        }
    }

    /// The peers as last seen.
    pub fn peers(&self) -> Peers {
        self.peers.borrow().clone()
    }

    /// Resolves when the peers seen change.
    pub async fn changed(&mut self) {
        if self.peers.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Deletes the presence Leases of replicas unrenewed for [`FORGET_AFTER`].
async fn forget_gone(api: &Api<Lease>, gone: &[String]) {
    for name in gone {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(lease = %name, "removed the presence lease of a replica long gone")
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(err) => tracing::debug!(%err, lease = %name, "removing a stale presence lease"),
        }
    }
}

/// What this replica has seen of each presence Lease: (holder, renew time) and when it last
/// saw that change, plus whether it has seen it change at all.
#[derive(Default)]
struct Seen(BTreeMap<String, Sighting>);

struct Sighting {
    claim: (Option<String>, Option<String>),
    changed_at: Instant,
    renewed: bool,
    duration: Duration,
}

impl Seen {
    /// Takes in one listing of the namespace's Leases at `now`.
    fn observe(&mut self, leases: &[Lease], now: Instant) -> Peers {
        let mut present = BTreeMap::new();
        for lease in leases {
            let Some(name) = lease.metadata.name.as_deref() else {
                continue;
            };
            if !name.starts_with(PRESENCE_PREFIX) {
                continue;
            }
            let spec = lease.spec.clone().unwrap_or_default();
            let claim = (
                spec.holder_identity,
                spec.renew_time.map(|t| t.0.to_string()),
            );
            let duration = spec
                .lease_duration_seconds
                .map(|s| Duration::from_secs(s.max(1) as u64))
                .unwrap_or(LEASE_DURATION);
            let sighting = match self.0.remove(name) {
                Some(old) if old.claim == claim => Sighting { duration, ..old },
                Some(_) => Sighting {
                    claim,
                    changed_at: now,
                    renewed: true,
                    duration,
                },
                None => Sighting {
                    claim,
                    changed_at: now,
                    renewed: false,
                    duration,
                },
            };
            present.insert(name.to_string(), sighting);
        }
        // A Lease no longer listed was deleted: its replica is gone.
        self.0 = present;
        let mut peers = Peers {
            elected: true,
            ..Peers::default()
        };
        for sighting in self.0.values() {
            let Some(holder) = sighting.claim.0.as_deref().filter(|h| !h.is_empty()) else {
                continue;
            };
            let fresh = now.duration_since(sighting.changed_at) <= sighting.duration;
            if fresh {
                peers.maybe_alive.insert(holder.into());
                if sighting.renewed {
                    peers.renewing.insert(holder.into());
                }
            }
        }
        peers
    }

    /// Presence Leases unrenewed (or released) for [`FORGET_AFTER`].
    fn long_gone(&self, now: Instant) -> Vec<String> {
        self.0
            .iter()
            .filter(|(_, s)| now.duration_since(s.changed_at) > FORGET_AFTER)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn lease(replica: &str, holder: Option<&str>, renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(format!("{PRESENCE_PREFIX}{replica}")),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(10),
                renew_time: Some(MicroTime(
                    Timestamp::from_second(1_800_000_000 + renewed).unwrap(),
                )),
                ..Default::default()
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_counts_once_seen_renewing_and_is_gone_after_its_duration() {
        let mut seen = Seen::default();
        let start = Instant::now();
        let peers = seen.observe(&[lease("b", Some("b"), 0)], start);
        // First sighting: might be alive (do not take its nodes), not yet a candidate.
        assert!(peers.may_be_alive("b"));
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a"]);

        let peers = seen.observe(&[lease("b", Some("b"), 2)], start + RETRY_PERIOD);
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a", "b"]);
        assert!(peers.others_renewing("a"));

        // Unchanged for longer than its duration (whatever its own clock says): gone.
        let later = start + RETRY_PERIOD + Duration::from_secs(11);
        let peers = seen.observe(&[lease("b", Some("b"), 2)], later);
        assert!(!peers.may_be_alive("b"));
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_or_deleted_lease_is_gone_at_once() {
        let mut seen = Seen::default();
        let now = Instant::now();
        seen.observe(&[lease("b", Some("b"), 0), lease("c", Some("c"), 0)], now);
        let peers = seen.observe(&[lease("b", None, 1)], now + RETRY_PERIOD);
        assert!(!peers.may_be_alive("b"), "released");
        assert!(!peers.may_be_alive("c"), "deleted");
        assert!(!peers.others_renewing("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn other_leases_in_the_namespace_are_not_replicas() {
        let mut seen = Seen::default();
        let mut leader = lease("x", Some("b"), 0);
        leader.metadata.name = Some("relaylet-leader".into());
        let peers = seen.observe(&[leader], Instant::now());
        assert!(!peers.may_be_alive("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn long_gone_leases_are_named_for_deletion() {
        let mut seen = Seen::default();
        let now = Instant::now();
        seen.observe(&[lease("b", Some("b"), 0)], now);
        assert!(seen.long_gone(now + FORGET_AFTER).is_empty());
        assert_eq!(
            seen.long_gone(now + FORGET_AFTER + Duration::from_secs(1)),
            [format!("{PRESENCE_PREFIX}b")]
        );
    }

    #[test]
    fn alone_no_one_else_might_be_writing() {
        let peers = Peers::default();
        assert!(!peers.may_be_alive("old-pod"));
        assert_eq!(peers.candidates("a", false).count(), 0);
    }
}

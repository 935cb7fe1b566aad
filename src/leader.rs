//! Leader election between relaylet replicas on a Lease, like client-go's leaderelection.
//!
//! Every replica relays streams, but only the leader writes virtual Nodes and their Leases (and
//! puts its own pod IP first in the Node addresses, so the root apiserver dials it). Expiry is
//! judged by when this replica last *saw* the Lease change, not by the holder's clock, so clock
//! skew between nodes cannot cause two leaders. A leader that cannot renew within
//! [`RENEW_DEADLINE`] steps down at once, before its Lease can expire for anyone else.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a leader's claim lasts without renewal. A successor takes over at most this plus
/// one [`RETRY_PERIOD`] after the leader dies: well inside a node lease's 40 s.
pub const LEASE_DURATION: Duration = Duration::from_secs(10);
/// A leader that has not renewed for this long stops acting as leader.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(7);
/// How often candidates try and leaders renew.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Whether this replica leads now. Cheap to clone.
#[derive(Clone)]
pub struct Leadership {
    is_leader: watch::Receiver<bool>,
    /// Holds the sender of a fixed leadership, so the value stays readable.
    _fixed: Option<std::sync::Arc<watch::Sender<bool>>>,
}

impl Leadership {
    /// Always the leader (single replica, `LEADER_ELECT=false`, tests).
    pub fn always() -> Leadership {
        let (tx, rx) = watch::channel(true);
        Leadership {
            is_leader: rx,
            _fixed: Some(std::sync::Arc::new(tx)),
        }
    }

    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// Resolves when leadership changes, with the new value. Never resolves once the election
    /// has ended (its value is final then), so callers can select on it in a loop without
    /// spinning.
    pub async fn changed(&mut self) -> bool {
        if self.is_leader.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        self.is_leader()
    }
}

/// Runs an election on Lease `namespace/name` as `identity` until `stop` fires; then, if
/// leading, releases the Lease at once so a successor need not wait for it to expire.
pub fn elect(
    root: Client,
    namespace: &str,
    name: &str,
    identity: String,
    stop: CancellationToken,
) -> Leadership {
    let (tx, rx) = watch::channel(false);
    let api: Api<Lease> = Api::namespaced(root, namespace);
    let name = name.to_string();
    tokio::spawn(async move {
        let mut election = Election {
            api,
            name,
            identity,
            observed: None,
            last_renew: None,
        };
        loop {
            let leading = election.try_acquire_or_renew().await;
            let was = *tx.borrow();
            if leading != was {
                tracing::info!(identity = %election.identity, leading, "leadership changed");
                tx.send_replace(leading);
            }
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PERIOD) => {}
                _ = stop.cancelled() => break,
            }
        }
        if *tx.borrow() {
            tx.send_replace(false);
            election.release().await;
        }
    });
    Leadership {
        is_leader: rx,
        _fixed: None,
    }
}

/// Who holds a Lease and when they last renewed it.
type Claim = (Option<String>, Option<MicroTime>);

struct Election {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// The Lease's (holder, renew time) last seen, and when we saw it change.
    observed: Option<(Claim, Instant)>,
    /// When we last renewed successfully as leader.
    last_renew: Option<Instant>,
}

impl Election {
    /// One round; returns whether we lead after it.
    async fn try_acquire_or_renew(&mut self) -> bool {
        match self.round().await {
            Ok(leading) => {
                if leading {
                    self.last_renew = Some(Instant::now());
                }
                leading
            }
            Err(err) => {
                tracing::debug!(%err, "leader election round failed");
                // Keep leading only while still inside the renew deadline.
                self.last_renew
                    .is_some_and(|t| t.elapsed() < RENEW_DEADLINE)
            }
        }
    }

    async fn round(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.claim(now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let seen = (spec.holder_identity.clone(), spec.renew_time.clone());
        let changed = self.observed.as_ref().is_none_or(|(s, _)| *s != seen);
        if changed {
            self.observed = Some((seen, Instant::now()));
        }
        let holder = spec.holder_identity.as_deref().unwrap_or("");
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(1) as u64))
            .unwrap_or(LEASE_DURATION);
        let expired = self
            .observed
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() > duration);
        let mine = holder == self.identity;
        if !mine && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + if mine { 0 } else { 1 };
        let acquire_time = if mine {
            spec.acquire_time.clone()
        } else {
            None
        };
        let mut claim = self.claim(now, transitions);
        if acquire_time.is_some() {
            claim.acquire_time = acquire_time;
        }
        lease.spec = Some(claim);
        // Replace carries the resourceVersion we read: a racing candidate gets 409 and loses.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn claim(&self, now: MicroTime, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Gives the Lease up (empty holder), so another replica can lead on its next round.
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(identity = %self.identity, "leadership released"),
            Err(err) => tracing::warn!(%err, "releasing leadership"),
        }
    }
}

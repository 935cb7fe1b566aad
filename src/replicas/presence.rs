//! The presence Leases: which relaylet replicas are alive, so virtual nodes can be spread over
//! all of them.
//!
//! Each replica keeps a presence Lease, `relaylet-replica-<POD_NAME>` in relaylet's namespace,
//! with the same election code as the leader Lease (`leader::elect`; it is the Lease's only
//! candidate): renewed every 2 s, and a replica that cannot renew for 7 s counts itself gone
//! before anyone else may. Every replica lists those Leases every second and judges each the
//! way the leader election judges its Lease: by when *it* saw the Lease change, never by the
//! timestamps in it, so clock skew cannot make a live replica look dead, and after relaylet's
//! own `leader::LEASE_DURATION`, never the Lease's.
//!
//! A presence Lease counts only as `identity` says: held by the replica it is named after, a
//! live relaylet pod. Anyone who may write Leases in the namespace can write one; a ghost
//! (`relaylet-replica-ghost`, no such pod) or a real replica's Lease written over by someone
//! else is ignored (as if its last counted claim were still there) and reported (`ignored`).
//!
//! Two questions are answered, deliberately differently:
//! - [`Peers::candidates`]: whom to spread nodes over. A replica counts once this one has seen
//!   its Lease renewed (not merely present: a crashed replica's Lease lingers).
//! - [`Peers::may_be_alive`]: whether a replica that holds a node might still be writing it.
//!   Yes until its Lease has gone unrenewed for `LEASE_DURATION` (the first sighting counts as
//!   a renewal), or it released or deleted its Lease, or its pod stopped running. A node is
//!   taken from a replica only when the answer is no.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::identity::{self, Presence};
use super::ignored::IgnoredLeases;
use super::leader::{self, FRESH_TERM_WAIT, Holders, LEASE_DURATION};
use super::leadership::Leadership;
use super::live_pods::LivePods;

/// The prefix of presence Lease names; the rest is the replica's name.
pub const PRESENCE_PREFIX: &str = "relaylet-replica-";
/// A presence Lease unrenewed this long is deleted by the leader (a replica that crashed).
const FORGET_AFTER: Duration = Duration::from_secs(120);
/// Leases read per page when listing: a Lease may be as large as any object (about 1.5 MiB of
/// annotations), so a listing holds at most this many at once.
const PAGE: u32 = 32;
/// How long after a peer's Lease would expire (as seen here) it is listed to judge it: past the
/// duration, so the listing counts it gone unless it shows a new claim.
const EXPIRY_MARGIN: Duration = Duration::from_millis(100);
/// How often the presence Leases are listed. A peer is timed from this replica's first
/// sighting of its last renewal, so the listing's lag (up to this) adds to a takeover, and
/// two replicas may count one killed peer gone up to this far apart. A listing is a read of a
/// few small Leases per replica.
pub(super) const LIST_EVERY: Duration = Duration::from_secs(1);
/// Listings further apart than this leave a gap in what this replica saw of its peers (its
/// regular listings are at most `LIST_EVERY` apart plus a listing's time).
const OBSERVATION_GAP: Duration = Duration::from_secs(3);
/// How long one listing may take before it is given up: with the listing period, the most a
/// peer's renewal can go unseen here, which a fresh term waits out (`FRESH_TERM_WAIT`).
const LIST_TIMEOUT: Duration = FRESH_TERM_WAIT.saturating_sub(LIST_EVERY);
/// Presence Leases remembered (to tell their writes apart) besides those that count; a Lease
/// beyond it that breaks the rules is still ignored, and counted at every listing.
const MAX_TRACKED: usize = 1024;

/// This replica and what it knows of the others. Cheap to clone.
#[derive(Clone)]
pub struct Replicas {
    /// This replica's name (`POD_NAME`).
    pub me: Arc<str>,
    /// Whether this replica's own presence is current: it may serve nodes only while it is.
    pub present: Leadership,
    peers: watch::Receiver<Peers>,
    /// This install's live pods (none when alone).
    live: Option<LivePods>,
    /// Held so a fixed [`Replicas::alone`] keeps its value readable.
    _fixed: Option<Arc<watch::Sender<Peers>>>,
}

/// The replicas seen, as of the last listing.
#[derive(Debug, Clone, Default)]
pub struct Peers {
    /// Others whose Lease this replica saw renewed within its duration.
    renewing: BTreeSet<Arc<str>>,
    /// Others whose Lease might still be renewed (not yet expired, released or gone).
    maybe_alive: BTreeSet<Arc<str>>,
    /// Others whose Lease is written (by its own name) within its duration but whose pod the
    /// cache of live pods does not show: a ghost, or a live peer the cache has not caught up
    /// with. Not counted; asked about before any of its Nodes is taken.
    unconfirmed: BTreeSet<Arc<str>>,
    /// `false` with leader election off: there are no others, and every node is this one's to
    /// take whatever its Node says.
    elected: bool,
    /// When the listing these come from was asked for (not part of what is seen: a new listing
    /// that shows the same wakes no one).
    asked: Option<Instant>,
}

impl PartialEq for Peers {
    fn eq(&self, other: &Peers) -> bool {
        self.renewing == other.renewing
            && self.maybe_alive == other.maybe_alive
            && self.unconfirmed == other.unconfirmed
            && self.elected == other.elected
    }
}

impl Eq for Peers {}

impl Peers {
    /// Whom to spread nodes over: this replica (while present) and the others seen renewing.
    pub fn candidates<'a>(&'a self, me: &'a str, present: bool) -> impl Iterator<Item = &'a str> {
        present
            .then_some(me)
            .into_iter()
            .chain(self.renewing.iter().map(|r| &**r).filter(move |r| *r != me))
    }

    /// Whether `replica` (another one) was seen renewing its presence.
    pub fn is_renewing(&self, replica: &str) -> bool {
        self.renewing.contains(replica)
    }

    /// Whether `replica`'s Lease is written within its duration though its pod is not among
    /// the live ones as cached (ask the apiserver before taking its Nodes).
    pub fn unconfirmed(&self, replica: &str) -> bool {
        self.elected && self.unconfirmed.contains(replica)
    }

    /// Whether `replica` (another one) might still be writing the nodes it holds.
    pub fn may_be_alive(&self, replica: &str) -> bool {
        self.elected && self.maybe_alive.contains(replica)
    }

    /// Whether this view may judge a replica gone at `now`: it was asked for less than
    /// `FRESH_TERM_WAIT` ago, so it shows every renewal that began a term counting now (a view
    /// kept while listings fail, or from before a pause, judges no one gone).
    pub fn current(&self, now: Instant) -> bool {
        !self.elected
            || self
                .asked
                .is_some_and(|asked| now.saturating_duration_since(asked) < FRESH_TERM_WAIT)
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
            unconfirmed: BTreeSet::new(),
            elected: true,
            asked: Some(Instant::now()),
        }
    }

    /// Whether any other replica is seen renewing (someone to hand nodes to).
    pub fn others_renewing(&self, me: &str) -> bool {
        self.renewing.iter().any(|r| &**r != me)
    }
}

/// What joining the replicas needs besides the root client: who counts, and where what does
/// not is reported.
#[derive(Clone)]
pub struct Judges {
    /// This install's live relaylet pods.
    pub live: LivePods,
    /// Where replica Leases that break the rules are reported.
    pub ignored: IgnoredLeases,
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
            live: None,
            _fixed: Some(Arc::new(tx)),
        }
    }

    /// Joins the replicas of namespace `namespace` as `me` once `eligible` resolves; leaves
    /// (releasing the presence Lease, so peers take its nodes at once) when `stop` fires.
    /// Only Leases `judges` count are replicas. `leader` deletes the Leases of replicas long
    /// gone.
    pub fn join(
        root: Client,
        namespace: &str,
        me: String,
        eligible: impl std::future::Future<Output = ()> + Send + 'static,
        leader: Leadership,
        judges: Judges,
        stop: CancellationToken,
    ) -> Replicas {
        // Present (so serving, and taking Nodes from replicas it does not see) only once the
        // others have been seen: before its first listing a replica would take every Node.
        let (listed, mut first_listing) = watch::channel(false);
        let present = leader::elect(
            root.clone(),
            namespace,
            &format!("{PRESENCE_PREFIX}{me}"),
            me.clone(),
            Holders::OnlyMe,
            judges.ignored.clone(),
            async move {
                eligible.await;
                if first_listing.wait_for(|done| *done).await.is_err() {
                    std::future::pending::<()>().await;
                }
            },
            stop.clone(),
        );
        let (tx, rx) = watch::channel(Peers {
            elected: true,
            ..Peers::default()
        });
        let api: Api<Lease> = Api::namespaced(root, namespace);
        let live = judges.live.clone();
        tokio::spawn(async move {
            // Leases are judged only once the live pods are known (before, every one would
            // look like a ghost).
            tokio::select! {
                _ = judges.live.synced() => {}
                _ = stop.cancelled() => return,
            }
            let mut seen = Seen::default();
            // Said once when listing starts failing, and once when it works again: while it
            // fails the peers stay as last seen.
            let mut failing = false;
            loop {
                // A listing that hangs keeps the peers as last seen (no one is judged gone
                // from a listing that never came) and is given up, so the next one can start.
                let listed_now =
                    tokio::time::timeout(LIST_TIMEOUT, list(&api, &mut seen, &judges)).await;
                match listed_now.unwrap_or_else(|_| {
                    Err(kube::Error::Service(
                        "listing presence leases timed out".into(),
                    ))
                }) {
                    Ok(peers) => {
                        if std::mem::take(&mut failing) {
                            tracing::info!("listing replica presence leases works again");
                        }
                        tx.send_if_modified(|old| {
                            let changed = *old != peers;
                            if changed {
                                // Rare (a replica starting, stopping or dying), and what a
                                // takeover's timeline starts from.
                                tracing::info!(renewing = ?peers.renewing, maybe_alive = ?peers.maybe_alive, "replicas seen");
                            }
                            *old = peers;
                            changed
                        });
                        listed.send_replace(true);
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
                // Listed again after `LIST_EVERY`, or sooner when a peer's Lease would expire
                // first: a crashed replica's Nodes are taken as soon as its Lease is judged
                // expired, not up to a period later.
                let now = Instant::now();
                let next = seen
                    .next_expiry(now)
                    .map(|at| at + EXPIRY_MARGIN)
                    .filter(|at| *at < now + LIST_EVERY)
                    .unwrap_or(now + LIST_EVERY);
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {}
                    _ = stop.cancelled() => break,
                }
            }
        });
        Replicas {
            me: me.into(),
            present,
            peers: rx,
            live: Some(live),
            _fixed: None,
        }
    }

    /// Whether replica `name`'s pod runs now, as the apiserver says (not the cache): asked
    /// before taking a Node from a peer whose Lease is written but whose pod the cache misses
    /// ([`Peers::unconfirmed`]). Alone: there is no other replica.
    pub async fn runs_now(&self, name: &str) -> bool {
        match &self.live {
            Some(live) => live.runs_now(name).await,
            None => false,
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

/// Lists the namespace's Leases a page at a time into `seen`; the peers they show.
/// Each Lease is timed from when its page arrived, never from when the listing was asked for:
/// the holder times its term from its renewal's start, so a slow listing only makes a peer
/// look alive longer here, never gone before its own deadline.
async fn list(api: &Api<Lease>, seen: &mut Seen, judges: &Judges) -> Result<Peers, kube::Error> {
    let asked = Instant::now();
    seen.begin();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let page = api.list(&params).await?;
        let now = Instant::now();
        for lease in &page.items {
            seen.observe(lease, now, judges);
        }
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(seen.finish(asked, now));
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

/// (holder, renew time) of a Lease as written.
type Claim = (Option<String>, Option<String>);

/// What this replica has seen of each presence Lease, listing after listing.
#[derive(Default)]
pub(super) struct Seen {
    leases: BTreeMap<String, Sighting>,
    /// The listing under way; a Lease not seen in it was deleted.
    listing: u64,
    /// When the last listing ended.
    last_listed: Option<Instant>,
}

struct Sighting {
    /// The claim last seen, whoever wrote it: a change is a write.
    last: Claim,
    /// When anything in the claim last changed.
    changed_at: Instant,
    /// The replica's own claim, while it counts.
    counted: Option<Counted>,
    /// The listing that last saw the Lease.
    listing: u64,
    /// Ignored at its last sighting only because its pod is not among the live ones cached.
    unconfirmed: bool,
}

/// A claim that counts: the replica's own, its pod live.
struct Counted {
    claim: Claim,
    /// When this replica saw it change.
    changed_at: Instant,
    /// Whether it has changed since first seen (a lingering Lease never has).
    renewed: bool,
}

impl Seen {
    /// Starts a listing.
    pub(super) fn begin(&mut self) {
        self.listing += 1;
    }

    /// Takes in one Lease of the listing under way, seen at `now`.
    pub(super) fn observe(&mut self, lease: &Lease, now: Instant, judges: &Judges) {
        let Some(name) = lease.metadata.name.as_deref() else {
            return;
        };
        let Some(replica) = name.strip_prefix(PRESENCE_PREFIX) else {
            return;
        };
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.clone());
        let claim: Claim = (
            holder.clone(),
            spec.and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string()),
        );
        let verdict = identity::presence(replica, holder.as_deref(), &judges.live);
        let holder = holder.as_deref().unwrap_or_default();
        let tracked = self.leases.contains_key(name);
        if !tracked && self.leases.len() >= MAX_TRACKED {
            // Not remembered: what counts is tracked anyway (live pods are few); a Lease that
            // breaks the rules is counted at every listing instead of at each write.
            match verdict {
                Presence::Ignored(why) => {
                    judges.ignored.report(lease, holder, why);
                    return;
                }
                Presence::Released => return,
                Presence::Counts(_) => {}
            }
        }
        let sighting = self
            .leases
            .entry(name.to_string())
            .or_insert_with(|| Sighting {
                last: claim.clone(),
                changed_at: now,
                counted: None,
                listing: 0,
                unconfirmed: false,
            });
        let first = !tracked;
        let written = first || sighting.last != claim;
        if written {
            sighting.last = claim.clone();
            sighting.changed_at = now;
        }
        sighting.listing = self.listing;
        sighting.unconfirmed = verdict == Presence::Ignored(identity::Ignored::NotALivePod);
        match verdict {
            Presence::Released => sighting.counted = None,
            Presence::Counts(_) => {
                sighting.counted = Some(match sighting.counted.take() {
                    Some(counted) if counted.claim == claim => counted,
                    // A claim that changed, or came back after a release or a write over
                    // it, is a renewal; the first sighting of a Lease is not.
                    _ => Counted {
                        claim,
                        changed_at: now,
                        renewed: !first,
                    },
                });
            }
            Presence::Ignored(why) => {
                // A Lease written over keeps its replica's last counted claim (it expires on
                // its own); a replica whose pod is gone is gone.
                if why == identity::Ignored::NotALivePod {
                    sighting.counted = None;
                }
                if written {
                    judges.ignored.report(lease, holder, why);
                }
            }
        }
    }

    /// Ends the listing at `now`: Leases it did not see were deleted. The peers it shows.
    ///
    /// A listing after a gap (this replica could not list, or was paused) restarts every
    /// peer's clock: a peer is judged only by time this replica could watch it, so after an
    /// apiserver outage no peer looks expired merely because no one could renew, and no Node
    /// changes hands before its holder had a fair chance to renew.
    pub(super) fn finish(&mut self, asked: Instant, now: Instant) -> Peers {
        let listing = self.listing;
        self.leases.retain(|_, s| s.listing == listing);
        let gap = self
            .last_listed
            .is_some_and(|at| now.duration_since(at) > OBSERVATION_GAP);
        self.last_listed = Some(now);
        if gap {
            for counted in self.leases.values_mut().filter_map(|s| s.counted.as_mut()) {
                counted.changed_at = counted.changed_at.max(now);
            }
        }
        let mut peers = Peers {
            elected: true,
            asked: Some(asked),
            ..Peers::default()
        };
        for (name, sighting) in &self.leases {
            if let Some(replica) = name.strip_prefix(PRESENCE_PREFIX)
                && sighting.unconfirmed
                && now.duration_since(sighting.changed_at) <= LEASE_DURATION
            {
                peers.unconfirmed.insert(replica.into());
            }
            let (Some(replica), Some(counted)) =
                (name.strip_prefix(PRESENCE_PREFIX), &sighting.counted)
            else {
                continue;
            };
            if now.duration_since(counted.changed_at) <= LEASE_DURATION {
                peers.maybe_alive.insert(replica.into());
                if counted.renewed {
                    peers.renewing.insert(replica.into());
                }
            }
        }
        peers
    }

    /// When the first Lease that counts as maybe alive now stops counting unless renewed
    /// (`LEASE_DURATION` after this replica saw its claim change); `None` when none does.
    fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.leases
            .values()
            .filter_map(|s| s.counted.as_ref())
            .map(|counted| counted.changed_at + LEASE_DURATION)
            .filter(|at| *at >= now)
            .min()
    }

    /// Presence Leases unchanged (or released) for [`FORGET_AFTER`].
    fn long_gone(&self, now: Instant) -> Vec<String> {
        self.leases
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

    use crate::replicas::leader::RETRY_PERIOD;

    use super::*;
    use crate::ops::Metrics;

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

    /// Judges for which `b` and `c` are live relaylet pods, counting into `metrics`.
    fn judges(metrics: &Metrics) -> Judges {
        Judges {
            live: LivePods::fixed(["a", "b", "c"]),
            ignored: IgnoredLeases::counting(metrics.clone()),
        }
    }

    /// One listing of `leases` at `now`.
    fn listing(seen: &mut Seen, leases: &[Lease], now: Instant, judges: &Judges) -> Peers {
        seen.begin();
        for lease in leases {
            seen.observe(lease, now, judges);
        }
        seen.finish(now, now)
    }

    /// Listings of `leases` every second after `from` up to `until` (the last one at
    /// `until`), as the listing loop makes them; the peers the last one shows.
    fn listed_until(
        seen: &mut Seen,
        leases: &[Lease],
        from: Instant,
        until: Instant,
        judges: &Judges,
    ) -> Peers {
        let mut at = from;
        loop {
            at = (at + Duration::from_secs(1)).min(until);
            let peers = listing(seen, leases, at, judges);
            if at == until {
                return peers;
            }
        }
    }

    fn ignored(metrics: &Metrics, reason: &str) -> u64 {
        let text = metrics.encode().unwrap();
        let prefix = format!("relaylet_ignored_leases_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map_or(0, |v| v.trim().parse().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_counts_once_seen_renewing_and_is_gone_after_its_duration() {
        let j = judges(&Metrics::new());
        let mut seen = Seen::default();
        let start = Instant::now();
        let peers = listing(&mut seen, &[lease("b", Some("b"), 0)], start, &j);
        // First sighting: might be alive (do not take its nodes), not yet a candidate.
        assert!(peers.may_be_alive("b"));
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a"]);

        let peers = listing(
            &mut seen,
            &[lease("b", Some("b"), 2)],
            start + RETRY_PERIOD,
            &j,
        );
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a", "b"]);
        assert!(peers.others_renewing("a"));

        // Unchanged for longer than its duration (whatever its own clock says): gone.
        let later = start + RETRY_PERIOD + Duration::from_secs(11);
        let b = [lease("b", Some("b"), 2)];
        let peers = listed_until(&mut seen, &b, start + RETRY_PERIOD, later, &j);
        assert!(!peers.may_be_alive("b"));
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a"]);
    }

    /// The next listing is due when the first Lease that counts would expire: then, not up to
    /// a retry period later, its replica is judged gone.
    #[tokio::test(start_paused = true)]
    async fn the_next_expiry_is_that_of_the_lease_seen_changed_longest_ago() {
        let j = judges(&Metrics::new());
        let mut seen = Seen::default();
        let start = Instant::now();
        assert_eq!(seen.next_expiry(start), None);
        listing(&mut seen, &[lease("b", Some("b"), 0)], start, &j);
        let later = start + RETRY_PERIOD;
        let both = [lease("b", Some("b"), 0), lease("c", Some("c"), 0)];
        listing(&mut seen, &both, later, &j);
        // b's claim unchanged since `start`: it expires first.
        assert_eq!(seen.next_expiry(later), Some(start + LEASE_DURATION));
        // b renewed: c's claim, first seen at `later`, is now the oldest.
        let renewed = [lease("b", Some("b"), 4), lease("c", Some("c"), 0)];
        let then = later + RETRY_PERIOD;
        listing(&mut seen, &renewed, then, &j);
        assert_eq!(seen.next_expiry(then), Some(later + LEASE_DURATION));
        // Once past, an expired Lease no longer asks for a listing; a released one never does.
        let released = [lease("b", None, 5), lease("c", Some("c"), 0)];
        let past = later + LEASE_DURATION + EXPIRY_MARGIN;
        let peers = listed_until(&mut seen, &released, then, past, &j);
        assert!(!peers.may_be_alive("c"));
        assert_eq!(seen.next_expiry(past), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_or_deleted_lease_is_gone_at_once() {
        let j = judges(&Metrics::new());
        let mut seen = Seen::default();
        let now = Instant::now();
        let both = [lease("b", Some("b"), 0), lease("c", Some("c"), 0)];
        listing(&mut seen, &both, now, &j);
        let peers = listing(&mut seen, &[lease("b", None, 1)], now + RETRY_PERIOD, &j);
        assert!(!peers.may_be_alive("b"), "released");
        assert!(!peers.may_be_alive("c"), "deleted");
        assert!(!peers.others_renewing("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn other_leases_in_the_namespace_are_not_replicas() {
        let j = judges(&Metrics::new());
        let mut seen = Seen::default();
        let mut leader = lease("x", Some("b"), 0);
        leader.metadata.name = Some("relaylet-leader".into());
        let peers = listing(&mut seen, &[leader], Instant::now(), &j);
        assert!(!peers.may_be_alive("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn long_gone_leases_are_named_for_deletion() {
        let j = judges(&Metrics::new());
        let mut seen = Seen::default();
        let now = Instant::now();
        listing(&mut seen, &[lease("b", Some("b"), 0)], now, &j);
        assert!(seen.long_gone(now + FORGET_AFTER).is_empty());
        assert_eq!(
            seen.long_gone(now + FORGET_AFTER + Duration::from_secs(1)),
            [format!("{PRESENCE_PREFIX}b")]
        );
    }

    /// Ghosts (no such pod), renewed with a huge duration, are never replicas; each write of
    /// one is counted once.
    #[tokio::test(start_paused = true)]
    async fn ghosts_are_ignored_and_each_of_their_writes_counted() {
        let metrics = Metrics::new();
        let j = judges(&metrics);
        let mut seen = Seen::default();
        let start = Instant::now();
        let ghosts = |renewed: i64| -> Vec<Lease> {
            (0..20)
                .map(|i| {
                    let name = format!("ghost-{i}");
                    let mut l = lease(&name, Some(&name), renewed);
                    l.spec.as_mut().unwrap().lease_duration_seconds = Some(i32::MAX);
                    l
                })
                .chain([lease("b", Some("b"), renewed)])
                .collect()
        };
        listing(&mut seen, &ghosts(0), start, &j);
        let peers = listing(&mut seen, &ghosts(2), start + RETRY_PERIOD, &j);
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a", "b"]);
        assert!(!peers.may_be_alive("ghost-0"));
        assert_eq!(ignored(&metrics, "not_a_live_pod"), 40);
        // Unchanged: no new write to count.
        listing(&mut seen, &ghosts(2), start + RETRY_PERIOD * 2, &j);
        assert_eq!(ignored(&metrics, "not_a_live_pod"), 40);
    }

    /// A real replica's Lease written over by someone else keeps the replica's last claim, which
    /// lasts relaylet's duration; taken back, it is a renewal again.
    #[tokio::test(start_paused = true)]
    async fn a_presence_lease_written_over_keeps_its_replicas_last_claim() {
        let metrics = Metrics::new();
        let j = judges(&metrics);
        let mut seen = Seen::default();
        let start = Instant::now();
        listing(&mut seen, &[lease("b", Some("b"), 0)], start, &j);
        listing(
            &mut seen,
            &[lease("b", Some("b"), 2)],
            start + RETRY_PERIOD,
            &j,
        );
        let mut hijacked = lease("b", Some("ghost"), 3);
        hijacked.spec.as_mut().unwrap().lease_duration_seconds = Some(i32::MAX);
        let peers = listing(&mut seen, &[hijacked.clone()], start + RETRY_PERIOD * 2, &j);
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(ignored(&metrics, "holder_mismatch"), 1);
        // Left written over: b's own claim runs out after relaylet's duration, not the day.
        let later = start + RETRY_PERIOD + LEASE_DURATION + Duration::from_secs(1);
        let peers = listed_until(&mut seen, &[hijacked], start + RETRY_PERIOD * 2, later, &j);
        assert!(!peers.may_be_alive("b"));
        // b takes it back: a renewal.
        let peers = listing(
            &mut seen,
            &[lease("b", Some("b"), 4)],
            later + RETRY_PERIOD,
            &j,
        );
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a", "b"]);
    }

    /// A replica whose pod stopped running is gone at once, even while its Lease is renewed.
    #[tokio::test(start_paused = true)]
    async fn a_replica_without_a_running_pod_is_gone() {
        let metrics = Metrics::new();
        let mut j = judges(&metrics);
        let mut seen = Seen::default();
        let start = Instant::now();
        listing(&mut seen, &[lease("c", Some("c"), 0)], start, &j);
        let peers = listing(
            &mut seen,
            &[lease("c", Some("c"), 2)],
            start + RETRY_PERIOD,
            &j,
        );
        assert!(peers.may_be_alive("c"));
        j.live = LivePods::fixed(["a", "b"]);
        let peers = listing(
            &mut seen,
            &[lease("c", Some("c"), 4)],
            start + RETRY_PERIOD * 2,
            &j,
        );
        assert!(!peers.may_be_alive("c"));
        assert_eq!(ignored(&metrics, "not_a_live_pod"), 1);
    }

    /// Beyond what is remembered, ghosts are still ignored (and counted at each listing).
    #[tokio::test(start_paused = true)]
    async fn what_is_remembered_is_bounded() {
        let metrics = Metrics::new();
        let j = judges(&metrics);
        let mut seen = Seen::default();
        let many: Vec<Lease> = (0..MAX_TRACKED + 50)
            .map(|i| lease(&format!("g{i:05}"), Some(&format!("g{i:05}")), 0))
            .chain([lease("zz-b", Some("zz-b"), 0), lease("b", Some("b"), 0)])
            .collect();
        let now = Instant::now();
        listing(&mut seen, &many, now, &j);
        let peers = listing(&mut seen, &many, now + RETRY_PERIOD, &j);
        assert!(
            seen.leases.len() <= MAX_TRACKED + 1,
            "{}",
            seen.leases.len()
        );
        assert!(
            peers.may_be_alive("b"),
            "a live replica is tracked past the bound"
        );
        assert!(!peers.may_be_alive("g00000"));
        assert_eq!(
            ignored(&metrics, "not_a_live_pod") as usize,
            MAX_TRACKED + (50 + 1) * 2
        );
    }

    #[test]
    fn alone_no_one_else_might_be_writing() {
        let peers = Peers::default();
        assert!(!peers.may_be_alive("old-pod"));
        assert_eq!(peers.candidates("a", false).count(), 0);
    }

    /// A listing whose answer is slow times the Leases it shows from when the answer came:
    /// the holder's term runs from its renewal's start, so a peer's expiry here must not come
    /// from when the listing was asked for (a LIST slower than 3 s ate the margin).
    #[tokio::test(start_paused = true)]
    async fn a_slow_listing_times_leases_from_its_answer() {
        use http::{Request, Response};
        let slow = Duration::from_secs(5);
        let renewed = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let service = tower::service_fn({
            let renewed = renewed.clone();
            move |_req: Request<kube::client::Body>| {
                let renewed = renewed.load(std::sync::atomic::Ordering::SeqCst);
                async move {
                    tokio::time::sleep(slow).await;
                    let list = serde_json::json!({
                        "apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                        "metadata": {}, "items": [lease("b", Some("b"), renewed)],
                    });
                    Response::builder()
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(serde_json::to_vec(&list).unwrap()))
                        .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
                }
            }
        });
        let api: Api<Lease> = Api::namespaced(Client::new(service, "relaylet"), "relaylet");
        let j = judges(&Metrics::new());
        let mut seen = Seen::default();
        list(&api, &mut seen, &j).await.unwrap();
        renewed.store(2, std::sync::atomic::Ordering::SeqCst);
        let asked = Instant::now();
        let peers = list(&api, &mut seen, &j).await.unwrap();
        assert!(peers.may_be_alive("b"));
        assert_eq!(
            seen.next_expiry(Instant::now()),
            Some(asked + slow + LEASE_DURATION)
        );
    }

    /// After an apiserver outage (or a pause of this replica) longer than a Lease's duration,
    /// the first listing does not judge every peer gone: their clocks restart, and they are
    /// gone only if they do not renew within a duration from then.
    #[tokio::test(start_paused = true)]
    async fn after_a_gap_in_listing_every_peer_gets_a_fair_chance_to_renew() {
        let j = judges(&Metrics::new());
        let mut seen = Seen::default();
        let start = Instant::now();
        listing(&mut seen, &[lease("b", Some("b"), 0)], start, &j);
        listing(
            &mut seen,
            &[lease("b", Some("b"), 2)],
            start + RETRY_PERIOD,
            &j,
        );
        // 30 s without a listing: b could not renew either.
        let back = start + Duration::from_secs(30);
        let peers = listing(&mut seen, &[lease("b", Some("b"), 2)], back, &j);
        assert!(
            peers.may_be_alive("b"),
            "judged gone for a time no one could watch"
        );
        assert_eq!(peers.candidates("a", true).collect::<Vec<_>>(), ["a", "b"]);
        // Not renewed within a duration of the first listing after the gap: gone.
        let b = [lease("b", Some("b"), 2)];
        let later = back + LEASE_DURATION + Duration::from_millis(500);
        let peers = listed_until(&mut seen, &b, back, later - Duration::from_secs(1), &j);
        assert!(peers.may_be_alive("b"));
        let peers = listed_until(&mut seen, &b, later - Duration::from_secs(1), later, &j);
        assert!(!peers.may_be_alive("b"));
    }
}

//! Leader election between relaylet replicas on a Lease, like client-go's leaderelection.
//!
//! Every replica relays streams and writes its share of virtual Nodes; the leader also deletes
//! the Nodes of removed leaves and the presence Leases of replicas long gone. The same code
//! keeps each replica's presence Lease (`replicas`), where the replica is the only candidate.
//! Expiry is judged by when this replica last *saw* the Lease change, not by the holder's
//! clock, so clock skew between nodes cannot cause two leaders, and always after relaylet's own
//! [`LEASE_DURATION`], never the Lease's `leaseDurationSeconds`. A holder that breaks the
//! replica rules ([`Holders`], `identity`) does not count: the Lease is taken at once, and the
//! write reported (`ignored`). A leader that cannot renew within [`RENEW_DEADLINE`] steps
//! down at once, before its Lease can expire for anyone else.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::identity::{self, Ignored};
use super::ignored::IgnoredLeases;
use super::leadership::{Leadership, Term};
use super::live_pods::LivePods;

/// How long a leader's claim lasts without renewal. A successor takes over at most this plus
/// one [`RETRY_PERIOD`] after the leader dies: well inside a node lease's 40 s.
pub const LEASE_DURATION: Duration = Duration::from_secs(10);
/// A leader that has not renewed for this long stops acting as leader.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(7);
/// How often candidates try and leaders renew.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// How long a fresh presence term (the first renewal after none held: a start, a restart under
/// the same name, a lapse) waits before it counts. A peer judges a replica gone only by a view
/// of the presence Leases asked for less than this long ago (`Peers::current`), so once a fresh
/// term counts, any peer that would take its Nodes sees its renewal. Without it a replica
/// restarted under its name served its Nodes while a peer that had not yet listed its renewal
/// took them, and a replica whose listings had failed took Nodes by a view from before its
/// peers started (both found by the protocol simulation).
pub const FRESH_TERM_WAIT: Duration = Duration::from_secs(6);

/// Whose claim on an elected Lease counts, besides the candidate's own.
#[derive(Clone)]
pub enum Holders {
    /// A presence Lease: it is its replica's alone, so any other holder is ignored.
    OnlyMe,
    /// The leader Lease: any live relaylet pod of this install.
    LivePods(LivePods),
}

impl Holders {
    /// Why `holder` (not the candidate, not empty) does not count, if it does not.
    fn ignores(&self, holder: &str) -> Option<Ignored> {
        match self {
            Holders::OnlyMe => Some(Ignored::HolderMismatch),
            Holders::LivePods(live) => identity::leader_holder(holder, live).err(),
        }
    }
}

/// Runs an election on Lease `namespace/name` as `identity` until `stop` fires; then, if
/// leading, releases the Lease at once so a successor need not wait for it to expire. Another
/// holder counts only as `holders` says; a write of one that does not is reported to
/// `ignored`. The replica stands only once `eligible` resolves (with a CSR-issued serving
/// certificate: once it has one, so no leader ever advertises an address it cannot serve TLS
/// on; with leader election: once the live pods are known and include it).
#[allow(clippy::too_many_arguments)]
pub fn elect(
    root: Client,
    namespace: &str,
    name: &str,
    identity: String,
    holders: Holders,
    ignored: IgnoredLeases,
    eligible: impl std::future::Future<Output = ()> + Send + 'static,
    stop: CancellationToken,
) -> Leadership {
    let (tx, leadership) = Leadership::elected();
    let api: Api<Lease> = Api::namespaced(root, namespace);
    let name = name.to_string();
    tokio::spawn(async move {
        tokio::select! {
            _ = eligible => {}
            _ = stop.cancelled() => return,
        }
        let mut election = Election {
            api,
            name,
            identity,
            holders,
            ignored,
            observed: None,
            last_renew: None,
            fresh_since: None,
        };
        loop {
            let term = election.try_acquire_or_renew().await;
            let was = tx.borrow().leading;
            if term.leading != was {
                tracing::info!(identity = %election.identity, leading = term.leading, "leadership changed");
            }
            tx.send_if_modified(|old| std::mem::replace(old, term) != term);
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PERIOD) => {}
                _ = stop.cancelled() => break,
            }
        }
        if tx.borrow().leading {
            tx.send_replace(Term::default());
            election.release().await;
        }
    });
    leadership
}

/// Who holds a Lease and when they last renewed it.
type Claim = (Option<String>, Option<MicroTime>);

struct Election {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// Whose claim counts besides ours.
    holders: Holders,
    /// Where writes of holders that do not count are reported.
    ignored: IgnoredLeases,
    /// The Lease's (holder, renew time) last seen, and when we saw it change.
    observed: Option<(Claim, Instant)>,
    /// When we last renewed successfully as leader.
    last_renew: Option<Instant>,
    /// When the renewal that began the current term was answered.
    fresh_since: Option<Instant>,
}

impl Election {
    /// One round, bounded by the current term's deadline (or, when not leading, by
    /// `RENEW_DEADLINE`): a hung root call cannot keep a term alive. The term after it.
    async fn try_acquire_or_renew(&mut self) -> Term {
        let started = Instant::now();
        let deadline = self
            .term_end()
            .filter(|end| *end > started)
            .unwrap_or(started + RENEW_DEADLINE);
        let round = tokio::time::timeout_at(deadline, self.round()).await;
        match round {
            Ok(Ok(true)) => {
                if self.term_end().is_none_or(|end| Instant::now() >= end) {
                    self.fresh_since = Some(Instant::now());
                }
                // Timed from the round's start: what peers see of it is later still.
                self.last_renew = Some(started);
            }
            Ok(Ok(false)) => self.last_renew = None,
            Ok(Err(err)) => tracing::debug!(%err, "leader election round failed"),
            Err(_) => tracing::debug!("leader election round timed out"),
        }
        match self.term_end() {
            Some(until) if Instant::now() < until => Term {
                leading: true,
                until: Some(until),
                // Only a presence term waits: the leader's duties are not a peer's to race.
                from: match self.holders {
                    Holders::OnlyMe => self.fresh_since.map(|at| at + FRESH_TERM_WAIT),
                    Holders::LivePods(_) => None,
                },
            },
            _ => {
                self.last_renew = None;
                self.fresh_since = None;
                Term::default()
            }
        }
    }

    /// When the current term ends unless renewed: the last renewal's start plus the deadline.
    fn term_end(&self) -> Option<Instant> {
        self.last_renew.map(|at| at + RENEW_DEADLINE)
    }

    async fn round(&mut self) -> Result<bool, kube::Error> {
        // To the microsecond, as the Lease stores it: `landed` compares it with what is read.
        let now = MicroTime(crate::model::micro_time::to_microsecond(Timestamp::now()));
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.claim(now.clone(), 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => self.landed(&now).await,
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
        let mine = holder == self.identity;
        // A holder that breaks the replica rules is as good as none.
        let ignored = (!mine && !holder.is_empty())
            .then(|| self.holders.ignores(holder))
            .flatten();
        if let Some(why) = ignored
            && changed
        {
            self.ignored.report(&lease, holder, why);
        }
        // Relaylet's own duration, whatever the Lease says.
        let expired = self
            .observed
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() > LEASE_DURATION);
        if !mine && !holder.is_empty() && ignored.is_none() && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + if mine { 0 } else { 1 };
        let acquire_time = if mine {
            spec.acquire_time.clone()
        } else {
            None
        };
        let mut claim = self.claim(now.clone(), transitions);
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
            Err(kube::Error::Api(e)) if e.code == 409 => self.landed(&now).await,
            Err(e) => Err(e),
        }
    }

    /// After a 409: whether the Lease holds this very claim anyway. A write retried after a
    /// 429 or 503 whose first attempt landed meets its own new resourceVersion; that is a
    /// renewal, not a lost race (else a replica would count itself gone for a round).
    async fn landed(&self, claimed: &MicroTime) -> Result<bool, kube::Error> {
        let lease = self.api.get_opt(&self.name).await?;
        let spec = lease.and_then(|l| l.spec);
        Ok(spec.is_some_and(|s| {
            s.holder_identity.as_deref() == Some(self.identity.as_str())
                && s.renew_time.as_ref() == Some(claimed)
        }))
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

#[cfg(test)]
mod tests {
    //! The election against an in-memory Lease endpoint that behaves like the apiserver's
    //! (404 for a missing Lease, 409 for a create that loses or a stale resourceVersion), with
    //! time paused: every wait below is virtual, and each step is an observed change of
    //! leadership, not a guess about timing.

    use std::sync::Arc;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use http::{Request, Response, StatusCode};
    use http_body_util::BodyExt;
    use k8s_openapi::jiff::ToSpan;
    use kube::client::Body;

    use super::*;
    use crate::ops::Metrics;

    const NS: &str = "relaylet";
    const NAME: &str = "relaylet-leader";

    #[derive(Default)]
    struct FakeLeases {
        lease: Mutex<Option<Lease>>,
        version: Mutex<u64>,
        /// Every request fails with 500 while set.
        down: AtomicBool,
        /// Every request goes unanswered while set (a black-holed connection).
        hang: AtomicBool,
        /// The next PUT lands but is answered 409 (as a write retried after a 503 whose first
        /// attempt landed is).
        lose_next_answer: AtomicBool,
    }

    impl FakeLeases {
        fn holder(&self) -> Option<String> {
            self.lease
                .lock()
                .unwrap()
                .as_ref()
                .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
        }

        /// Writes the Lease as another party would (a replica elsewhere, with its own clock).
        fn write(&self, spec: LeaseSpec) {
            let mut version = self.version.lock().unwrap();
            *version += 1;
            *self.lease.lock().unwrap() = Some(Lease {
                metadata: ObjectMeta {
                    name: Some(NAME.into()),
                    namespace: Some(NS.into()),
                    resource_version: Some(version.to_string()),
                    ..Default::default()
                },
                spec: Some(spec),
            });
        }

        fn answer(&self, method: &http::Method, body: &[u8]) -> (StatusCode, Vec<u8>) {
            if self.down.load(Ordering::SeqCst) {
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    status(500, "InternalError"),
                );
            }
            let mut stored = self.lease.lock().unwrap();
            let mut version = self.version.lock().unwrap();
            match *method {
                http::Method::GET => match stored.as_ref() {
                    Some(l) => (StatusCode::OK, serde_json::to_vec(l).unwrap()),
                    None => (StatusCode::NOT_FOUND, status(404, "NotFound")),
                },
                http::Method::POST | http::Method::PUT => {
                    let mut lease: Lease = serde_json::from_slice(body).unwrap();
                    let exists = stored.is_some();
                    if *method == http::Method::POST && exists {
                        return (StatusCode::CONFLICT, status(409, "AlreadyExists"));
                    }
                    if *method == http::Method::PUT
                        && lease.metadata.resource_version.as_deref()
                            != Some(version.to_string().as_str())
                    {
                        return (StatusCode::CONFLICT, status(409, "Conflict"));
                    }
                    *version += 1;
                    lease.metadata.resource_version = Some(version.to_string());
                    *stored = Some(lease.clone());
                    if self.lose_next_answer.swap(false, Ordering::SeqCst) {
                        return (StatusCode::CONFLICT, status(409, "Conflict"));
                    }
                    (StatusCode::OK, serde_json::to_vec(&lease).unwrap())
                }
                _ => (
                    StatusCode::METHOD_NOT_ALLOWED,
                    status(405, "MethodNotAllowed"),
                ),
            }
        }
    }

    /// A Status as the apiserver words it (kube's `get_opt` reads the reason).
    fn status(code: u16, reason: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": reason, "reason": reason, "code": code, "metadata": {},
        }))
        .unwrap()
    }

    fn client(leases: Arc<FakeLeases>) -> Client {
        let service = tower::service_fn(move |req: Request<Body>| {
            let leases = leases.clone();
            async move {
                let method = req.method().clone();
                let body = req.into_body().collect().await?.to_bytes();
                if leases.hang.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                let (code, body) = leases.answer(&method, &body);
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
            }
        });
        Client::new(service, NS)
    }

    fn candidate(leases: &Arc<FakeLeases>, identity: &str) -> (Leadership, CancellationToken) {
        candidate_once(leases, identity, std::future::ready(()))
    }

    /// A candidate that stands only once `eligible` resolves.
    fn candidate_once(
        leases: &Arc<FakeLeases>,
        identity: &str,
        eligible: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> (Leadership, CancellationToken) {
        candidate_judged(leases, identity, live_pods(), Metrics::new(), eligible)
    }

    /// The pods these tests treat as live relaylet replicas.
    fn live_pods() -> Holders {
        Holders::LivePods(LivePods::fixed(["a", "b", "dead", "skewed"]))
    }

    /// A candidate whose peers' claims count as `holders` says, reporting to `metrics`.
    fn candidate_judged(
        leases: &Arc<FakeLeases>,
        identity: &str,
        holders: Holders,
        metrics: Metrics,
        eligible: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> (Leadership, CancellationToken) {
        let stop = CancellationToken::new();
        let leadership = elect(
            client(leases.clone()),
            NS,
            NAME,
            identity.into(),
            holders,
            IgnoredLeases::counting(metrics),
            eligible,
            stop.clone(),
        );
        (leadership, stop)
    }

    /// The `relaylet_ignored_leases_total` count of `reason` in `metrics`.
    fn ignored(metrics: &Metrics, reason: &str) -> u64 {
        let text = metrics.encode().unwrap();
        let prefix = format!("relaylet_ignored_leases_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map_or(0, |v| v.trim().parse().unwrap())
    }

    /// A claim written by someone else: `holder`, claiming a day.
    fn claimed_for_a_day(holder: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(86_400),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }
    }

    /// A leader Lease held by a name that is no live relaylet pod, claiming a day and renewed
    /// by its writer, is taken at the first round, and every write of it is counted.
    #[tokio::test(start_paused = true)]
    async fn a_ghost_leader_does_not_count_whatever_its_duration() {
        let leases = Arc::new(FakeLeases::default());
        leases.write(claimed_for_a_day("ghost"));
        let metrics = Metrics::new();
        let (mut a, _stop) = candidate_judged(
            &leases,
            "a",
            live_pods(),
            metrics.clone(),
            std::future::ready(()),
        );
        let started = Instant::now();
        until(&mut a, true).await;
        assert!(started.elapsed() < RETRY_PERIOD, "{:?}", started.elapsed());
        assert_eq!(ignored(&metrics, "not_a_live_pod"), 1);
        // Hijacked again and again: taken back each round, each write counted.
        for round in 2..=4 {
            leases.write(claimed_for_a_day("ghost"));
            // Past a's next round (its rounds and this sleep would end at the same instant).
            tokio::time::sleep(RETRY_PERIOD + Duration::from_millis(100)).await;
            assert_eq!(leases.holder().as_deref(), Some("a"));
            assert_eq!(ignored(&metrics, "not_a_live_pod"), round);
        }
        assert!(a.is_leader());
    }

    /// A live replica's claim of a day lasts relaylet's own duration once it stops renewing.
    #[tokio::test(start_paused = true)]
    async fn a_live_leaders_claim_lasts_relaylets_duration_not_its_own() {
        let leases = Arc::new(FakeLeases::default());
        leases.write(claimed_for_a_day("dead"));
        let metrics = Metrics::new();
        let (mut b, _stop) = candidate_judged(
            &leases,
            "b",
            live_pods(),
            metrics.clone(),
            std::future::ready(()),
        );
        let started = Instant::now();
        until(&mut b, true).await;
        let waited = started.elapsed();
        assert!(
            waited > LEASE_DURATION && waited <= LEASE_DURATION + RETRY_PERIOD * 2,
            "{waited:?}"
        );
        assert_eq!(ignored(&metrics, "not_a_live_pod"), 0);
    }

    /// A presence Lease is its replica's alone: written over by anyone (even a live replica),
    /// it is taken back at the next round and the write counted.
    #[tokio::test(start_paused = true)]
    async fn a_presence_lease_written_over_is_taken_back_at_once() {
        let leases = Arc::new(FakeLeases::default());
        let metrics = Metrics::new();
        let (mut a, _stop) = candidate_judged(
            &leases,
            "a",
            Holders::OnlyMe,
            metrics.clone(),
            std::future::ready(()),
        );
        until(&mut a, true).await;
        for holder in ["ghost", "b"] {
            leases.write(claimed_for_a_day(holder));
            // Past a's next round (its rounds and this sleep would end at the same instant).
            tokio::time::sleep(RETRY_PERIOD + Duration::from_millis(100)).await;
            assert_eq!(leases.holder().as_deref(), Some("a"));
            assert!(a.is_leader(), "present throughout");
        }
        assert_eq!(ignored(&metrics, "holder_mismatch"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_candidate_stands_only_once_eligible() {
        let leases = Arc::new(FakeLeases::default());
        let (eligible, became_eligible) = tokio::sync::oneshot::channel::<()>();
        let (mut a, _stop_a) = candidate_once(&leases, "a", async move {
            let _ = became_eligible.await;
        });
        // A free Lease, many rounds: a candidate without its certificate does not take it.
        tokio::time::sleep(RETRY_PERIOD * 20).await;
        assert!(!a.is_leader());
        assert_eq!(leases.holder(), None);
        let _ = eligible.send(());
        until(&mut a, true).await;
        assert_eq!(leases.holder().as_deref(), Some("a"));
    }

    /// Waits (in virtual time) until `leadership` has the value `leading`.
    /// Fails after a minute of virtual time rather than hanging.
    async fn until(leadership: &mut Leadership, leading: bool) {
        let wait = async {
            while leadership.is_leader() != leading {
                leadership.changed().await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .is_err()
        {
            panic!("leadership never became {leading}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn of_two_candidates_exactly_one_leads() {
        let leases = Arc::new(FakeLeases::default());
        let (mut a, _stop_a) = candidate(&leases, "a");
        let (b, _stop_b) = candidate(&leases, "b");
        until(&mut a, true).await;
        // Many rounds later, still one leader, and it is the Lease's holder.
        tokio::time::sleep(RETRY_PERIOD * 20).await;
        assert!(a.is_leader() && !b.is_leader());
        assert_eq!(leases.holder().as_deref(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_is_taken_at_the_next_round() {
        let leases = Arc::new(FakeLeases::default());
        let (mut a, stop_a) = candidate(&leases, "a");
        until(&mut a, true).await;
        let (mut b, _stop_b) = candidate(&leases, "b");
        tokio::time::sleep(RETRY_PERIOD * 2).await;
        assert!(!b.is_leader());
        let asked = Instant::now();
        stop_a.cancel();
        until(&mut b, true).await;
        // Well before the Lease could have expired.
        assert!(asked.elapsed() <= RETRY_PERIOD * 2, "{:?}", asked.elapsed());
        assert!(!a.is_leader());
        assert_eq!(leases.holder().as_deref(), Some("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_leaders_lease_is_taken_only_after_it_expires() {
        let leases = Arc::new(FakeLeases::default());
        let mut spec = LeaseSpec {
            holder_identity: Some("dead".into()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        };
        leases.write(spec.clone());
        let (mut b, _stop_b) = candidate(&leases, "b");
        let started = Instant::now();
        until(&mut b, true).await;
        let waited = started.elapsed();
        assert!(
            waited > LEASE_DURATION && waited <= LEASE_DURATION + RETRY_PERIOD * 2,
            "{waited:?}"
        );
        assert_eq!(leases.holder().as_deref(), Some("b"));
        // The Lease records the change of holder.
        spec = leases.lease.lock().unwrap().clone().unwrap().spec.unwrap();
        assert_eq!(spec.lease_transitions, Some(1));
    }

    /// A live leader whose clock is an hour behind keeps its Lease: expiry is judged by when
    /// this replica saw the Lease change, never by the timestamps written in it.
    #[tokio::test(start_paused = true)]
    async fn a_skewed_clock_does_not_make_a_live_leader_look_dead() {
        let leases = Arc::new(FakeLeases::default());
        let skewed = || LeaseSpec {
            holder_identity: Some("skewed".into()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            renew_time: Some(MicroTime(Timestamp::now() - 1.hour())),
            ..Default::default()
        };
        leases.write(skewed());
        let (b, _stop_b) = candidate(&leases, "b");
        for _ in 0..30 {
            tokio::time::sleep(RETRY_PERIOD).await;
            leases.write(skewed());
            assert!(!b.is_leader(), "took the Lease of a live leader");
        }
        assert_eq!(leases.holder().as_deref(), Some("skewed"));
    }

    /// A leader that cannot reach the apiserver steps down once the renew deadline has passed
    /// since its last renewal, before its Lease can expire for anyone else.
    #[tokio::test(start_paused = true)]
    async fn a_leader_that_cannot_renew_steps_down_before_its_lease_expires() {
        let leases = Arc::new(FakeLeases::default());
        let (mut a, _stop_a) = candidate(&leases, "a");
        until(&mut a, true).await;
        tokio::time::sleep(RETRY_PERIOD / 2).await;
        let cut = Instant::now();
        leases.down.store(true, Ordering::SeqCst);
        until(&mut a, false).await;
        let stepped_down = cut.elapsed();
        assert!(stepped_down <= RENEW_DEADLINE, "{stepped_down:?}");
        assert!(stepped_down < LEASE_DURATION);
        // Still leading through short outages: not before the last renewal is RENEW_DEADLINE
        // minus a round old.
        assert!(
            stepped_down + RETRY_PERIOD * 2 > RENEW_DEADLINE,
            "{stepped_down:?}"
        );
    }

    /// A leader whose root calls hang (a black-holed connection, no answer and no error) steps
    /// down at its deadline: the start of its last renewal plus `RENEW_DEADLINE`, before any
    /// peer (who saw that renewal later) can count its Lease expired.
    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_calls_hang_steps_down_at_its_deadline() {
        let leases = Arc::new(FakeLeases::default());
        let (mut a, _stop_a) = candidate(&leases, "a");
        until(&mut a, true).await;
        // Just after a renewal started (rounds are RETRY_PERIOD apart, the first at once).
        let renewed = Instant::now();
        tokio::time::sleep(RETRY_PERIOD / 2).await;
        leases.hang.store(true, Ordering::SeqCst);
        until(&mut a, false).await;
        assert!(
            renewed.elapsed() <= RENEW_DEADLINE + RETRY_PERIOD,
            "{:?}",
            renewed.elapsed()
        );
        assert!(renewed.elapsed() < LEASE_DURATION);
        // The hang ends: it leads again.
        leases.hang.store(false, Ordering::SeqCst);
        until(&mut a, true).await;
    }

    /// A renewal answered 409 although it landed (its first attempt went through, the retry
    /// met its own new resourceVersion) is a renewal: the leader never steps down for it.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_that_landed_but_was_answered_409_keeps_the_lead() {
        let leases = Arc::new(FakeLeases::default());
        let (mut a, _stop_a) = candidate(&leases, "a");
        until(&mut a, true).await;
        let mut watcher = a.clone();
        let stepped_down = tokio::spawn(async move { while watcher.changed().await {} });
        for _ in 0..3 {
            leases.lose_next_answer.store(true, Ordering::SeqCst);
            tokio::time::sleep(RETRY_PERIOD).await;
        }
        tokio::time::sleep(RETRY_PERIOD * 3).await;
        assert!(
            !stepped_down.is_finished(),
            "stepped down for its own write"
        );
        assert!(a.is_leader());
        assert_eq!(leases.holder().as_deref(), Some("a"));
    }
}

//! Joining the replicas: who counts as one (this install's live pods), the leader election and
//! this replica's presence, each started once the replica may serve (with a CSR-issued serving
//! certificate, only once it is issued: no replica advertises an address it cannot serve TLS
//! on). With `LEADER_ELECT=false` the replica is alone and leads.

use std::sync::Arc;

use kube::Client;

use super::ignored::IgnoredLeases;
use super::leader::{self, Holders};
use super::leadership::Leadership;
use super::live_pods::LivePods;
use super::published::Publication;
use super::{Judges, Replicas};
use crate::certs::CsrCert;
use crate::config::{Config, ServingCert};
use crate::ops::{Metrics, Shutdown};

/// The Lease replicas elect their leader on, in relaylet's own namespace.
pub const LEADER_LEASE: &str = "relaylet-leader";

/// What joining gives the rest of relaylet.
pub struct Joined {
    /// This replica and the others it sees.
    pub replicas: Replicas,
    /// Whether this replica leads (the leader deletes the Nodes of removed leaves and
    /// publishes the assignment).
    pub leadership: Leadership,
    /// The assignment the leader publishes.
    pub publication: Publication,
}

/// Joins the replicas of `namespace` (relaylet's own) on the root cluster, once `csr`'s
/// certificate is issued if there is one; keeps the leader gauge current.
pub fn start(
    config: &Config,
    root: &Client,
    namespace: &str,
    metrics: &Metrics,
    shutdown: &Shutdown,
    csr: Option<Arc<CsrCert>>,
) -> Joined {
    let me = config.replica_name();
    let joined = if config.leader_elect {
        let judges = Judges {
            live: LivePods::watch(
                root.clone(),
                namespace,
                config.replica_selector.clone(),
                me.clone(),
                shutdown.begin.clone(),
            ),
            ignored: IgnoredLeases::new(root.clone(), namespace, metrics.clone(), &me),
        };
        let leadership = leader::elect(
            root.clone(),
            namespace,
            LEADER_LEASE,
            me.clone(),
            Holders::LivePods(judges.live.clone()),
            judges.ignored.clone(),
            eligible_replica(csr.clone(), judges.live.clone(), me.clone()),
            shutdown.hand_over.clone(),
        );
        let publication = Publication::start(
            root.clone(),
            namespace,
            me.as_str().into(),
            leadership.clone(),
            shutdown.begin.clone(),
        );
        let replicas = Replicas::join(
            root.clone(),
            namespace,
            me.clone(),
            eligible_replica(csr, judges.live.clone(), me),
            leadership.clone(),
            judges,
            shutdown.hand_over.clone(),
        );
        Joined {
            replicas,
            leadership,
            publication,
        }
    } else {
        let leadership = match config.serving_cert {
            ServingCert::Csr(_) => Leadership::once(eligible(csr.clone())),
            _ => Leadership::always(),
        };
        Joined {
            replicas: Replicas::alone(me, eligible(csr)),
            leadership,
            publication: Publication::none(),
        }
    };
    keep_leader_gauge(&joined.leadership, metrics, shutdown);
    joined
}

/// Waits until the replica may serve: with a CSR-issued serving certificate, until it is issued.
async fn eligible(csr: Option<Arc<CsrCert>>) {
    if let Some(cert) = csr {
        cert.ready().await;
    }
}

/// With leader election, also until this replica's own pod is seen among the live relaylet
/// pods (its peers would ignore it before).
async fn eligible_replica(csr: Option<Arc<CsrCert>>, live: LivePods, me: String) {
    eligible(csr).await;
    live.includes(&me).await;
}

/// `relaylet_leader` follows the leadership until shutdown begins (which releases it).
fn keep_leader_gauge(leadership: &Leadership, metrics: &Metrics, shutdown: &Shutdown) {
    let mut leadership = leadership.clone();
    let gauge = metrics.leader.clone();
    let begin = shutdown.begin.clone();
    tokio::spawn(async move {
        loop {
            gauge.set(i64::from(leadership.is_leader()));
            tokio::select! {
                _ = leadership.changed() => {}
                _ = begin.cancelled() => break,
            }
        }
        gauge.set(0);
    });
}

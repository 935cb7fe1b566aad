//! The virtual node's Lease in `kube-node-lease`, renewed like a kubelet's, so the root's node
//! lifecycle controller never marks the Node NotReady (and evicts its pods) while relaylet is
//! alive.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PostParams};
use serde_json::json;

use super::{Controller, patch_params};

/// Node lease renewal period and duration (the kubelet's defaults).
pub(super) const LEASE_RENEW: Duration = Duration::from_secs(10);
const NODE_LEASE_SECONDS: i32 = 40;
/// The namespace of node leases.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// What this replica last wrote to a node Lease while holding its Node: the version its next
/// renewal is guarded by, and the renew time that renewal must pass.
#[derive(Debug, Clone)]
pub(super) struct LeaseMark {
    version: String,
    renewed: Timestamp,
}

impl LeaseMark {
    fn of(lease: &Lease) -> Option<LeaseMark> {
        Some(LeaseMark {
            version: lease.metadata.resource_version.clone()?,
            renewed: lease
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        })
    }
}

/// The renew time to write: now, or just past the last one written when that is later (its
/// writer's clock was ahead of this one's). The node lifecycle controller counts a renewal only
/// when `renewTime` moves forward, so it never goes back, even by a microsecond.
pub(super) fn next_renew_time(now: Timestamp, last: Option<Timestamp>) -> Timestamp {
    let now = crate::model::micro_time::to_microsecond(now);
    match last.and_then(|t| {
        t.checked_add(k8s_openapi::jiff::SignedDuration::from_micros(1))
            .ok()
    }) {
        Some(after) if after > now => after,
        _ => now,
    }
}

impl Controller {
    /// The node Leases of the root cluster.
    pub(super) fn node_leases(&self) -> Api<Lease> {
        Api::namespaced(self.root.clone(), NODE_LEASE_NAMESPACE)
    }

    /// Renews (or creates) the node's Lease, owned by the Node so it goes with it. Every
    /// renewal is guarded by the version this replica last wrote or read (`mark`, read first
    /// when there is none: a takeover), and its `renewTime` passes the one before.
    pub(super) async fn renew_lease(
        &self,
        node: &str,
        node_uid: Option<&str>,
        mark: &mut Option<LeaseMark>,
    ) -> Result<(), kube::Error> {
        let leases = self.node_leases();
        // Someone else wrote it since (a replica that held the Node before): read it once more.
        for _ in 0..2 {
            let last = match mark.take() {
                Some(last) => last,
                None => match leases.get_opt(node).await? {
                    Some(lease) => LeaseMark::of(&lease).ok_or_else(|| {
                        kube::Error::Service("node lease without a resourceVersion".into())
                    })?,
                    None => {
                        *mark = self.create_lease(node, node_uid).await?;
                        return Ok(());
                    }
                },
            };
            let spec = claim(node, next_renew_time(Timestamp::now(), Some(last.renewed)));
            let patch = json!({
                "metadata": { "resourceVersion": last.version },
                "spec": spec,
            });
            match leases
                .patch(node, &patch_params(), &Patch::Merge(patch))
                .await
            {
                Ok(lease) => {
                    *mark = LeaseMark::of(&lease);
                    return Ok(());
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    *mark = self.create_lease(node, node_uid).await?;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        Err(kube::Error::Service(
            format!("node lease {node} kept changing under its renewal").into(),
        ))
    }

    /// Creates the node's Lease (someone else's create of it counts: the next renewal reads
    /// it); what this replica now knows of it.
    async fn create_lease(
        &self,
        node: &str,
        node_uid: Option<&str>,
    ) -> Result<Option<LeaseMark>, kube::Error> {
        let owner = node_uid.map(|uid| OwnerReference {
            api_version: "v1".to_string(),
            kind: "Node".to_string(),
            name: node.to_string(),
            uid: uid.to_string(),
            ..Default::default()
        });
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(node.to_string()),
                namespace: Some(NODE_LEASE_NAMESPACE.to_string()),
                owner_references: owner.map(|o| vec![o]),
                ..Default::default()
            },
            spec: Some(claim(node, next_renew_time(Timestamp::now(), None))),
        };
        match self
            .node_leases()
            .create(&PostParams::default(), &lease)
            .await
        {
            Ok(created) => Ok(LeaseMark::of(&created)),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A node Lease's spec as renewed at `renewed`.
fn claim(node: &str, renewed: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(node.to_string()),
        lease_duration_seconds: Some(NODE_LEASE_SECONDS),
        renew_time: Some(MicroTime(renewed)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::SignedDuration;

    use super::*;

    #[test]
    fn renew_time_never_goes_back() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        assert_eq!(next_renew_time(now, None), now);
        let earlier = now - SignedDuration::from_secs(3);
        assert_eq!(next_renew_time(now, Some(earlier)), now);
        // The last writer's clock was 40 s ahead: just past its renewal, not back to ours.
        let ahead = now + SignedDuration::from_secs(40);
        assert_eq!(
            next_renew_time(now, Some(ahead)),
            ahead + SignedDuration::from_micros(1)
        );
        assert_eq!(
            next_renew_time(now, Some(now)),
            now + SignedDuration::from_micros(1)
        );
        // Stored to the microsecond: what is written is what will be read back.
        let odd = now + SignedDuration::from_nanos(1_500);
        assert_eq!(next_renew_time(odd, None).as_nanosecond() % 1_000, 0);
    }
}

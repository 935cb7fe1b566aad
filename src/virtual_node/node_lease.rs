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

impl Controller {
    /// The node Leases of the root cluster.
    pub(super) fn node_leases(&self) -> Api<Lease> {
        Api::namespaced(self.root.clone(), NODE_LEASE_NAMESPACE)
    }

    /// Renews (or creates) the node's Lease, owned by the Node so it goes with it.
    pub(super) async fn renew_lease(
        &self,
        node: &str,
        node_uid: Option<&str>,
    ) -> Result<(), kube::Error> {
        let leases = self.node_leases();
        let now = MicroTime(Timestamp::now());
        let spec = LeaseSpec {
            holder_identity: Some(node.to_string()),
            lease_duration_seconds: Some(NODE_LEASE_SECONDS),
            renew_time: Some(now),
            ..Default::default()
        };
        match leases
            .patch(
                node,
                &patch_params(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => {
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
                    spec: Some(spec),
                };
                match leases.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
}

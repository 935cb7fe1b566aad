//! The row per leaf Secret (`model::leaf_row`), kept current: the replica serving a leaf's Node
//! writes its row from what it just wrote into the Node (Ready and why, the leaf's version, the
//! pods, the credential's expiry); the leader writes the rows of refused Secrets, which no
//! replica serves, and deletes the rows of Secrets that are gone (the root's garbage collector
//! does too, from the owner reference; relaylet does not rely on one running). A row is applied
//! only when it differs from the last one this replica applied, and again after a while, so a
//! row deleted by hand comes back; a failed write waits 30 s before the next try.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::NodeStatus;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::Controller;
use crate::leaf::{Leaf, Refused};
use crate::model::leaf_row::{self, LeafStatus, SecretRef};
use crate::model::quote::quote;

/// Field manager of the rows.
const MANAGER: &str = "relaylet";
/// A row is applied again after this long even if unchanged.
pub(super) const ROW_REFRESH: Duration = Duration::from_secs(300);
/// How often the leader looks over the rows.
const ROWS_CHECK_EVERY: Duration = Duration::from_secs(30);

/// A failed write is tried again after this long at the earliest (the CRD may be missing: a
/// warning per leaf every round would flood the log).
const ROW_RETRY: Duration = Duration::from_secs(30);

/// The last row a loop applied (or tried to), when, and whether it was written.
pub(super) type Applied = Option<Box<(LeafStatus, Instant, bool)>>;

/// A served leaf's row, from the Node status just written.
pub(super) fn served_status(
    leaf: &Leaf,
    node: &NodeStatus,
    me: &str,
    pods: usize,
    refused: Option<&Refused>,
) -> LeafStatus {
    let ready = node
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready");
    let mut status = LeafStatus {
        ready: ready.map_or("Unknown", |c| c.status.as_str()).to_string(),
        reason: ready
            .and_then(|c| c.reason.clone())
            .unwrap_or_else(|| "Registered".to_string()),
        message: ready.and_then(|c| c.message.clone()).unwrap_or_default(),
        leaf: Some(leaf.name.clone()),
        version: node
            .node_info
            .as_ref()
            .map(|i| i.kubelet_version.clone())
            .filter(|v| !v.is_empty()),
        node: Some(leaf.node_name.clone()),
        served_by: Some(me.to_string()),
        pods: Some(pods as u64),
        credential_expires: leaf.credential.as_ref().map(|c| c.expires.to_string()),
        secret_resource_version: leaf.secret.as_ref().map(|s| s.resource_version.clone()),
    };
    // A newer version of the Secret was refused; the Node goes on from the older one.
    if let Some(refused) = refused {
        status.reason = refused_reason(refused);
        status.message = format!(
            "the Secret's latest version was refused (the Node goes on from the earlier one): {}",
            refused.refusal
        );
        status.secret_resource_version = Some(refused.secret.resource_version.clone());
    }
    status
}

/// A refused Secret's row.
pub(super) fn refused_status(refused: &Refused) -> LeafStatus {
    LeafStatus {
        ready: "False".to_string(),
        reason: refused_reason(refused),
        message: quote(&refused.refusal.to_string()),
        leaf: refused.leaf.clone(),
        node: refused.node.clone(),
        secret_resource_version: Some(refused.secret.resource_version.clone()),
        ..LeafStatus::default()
    }
}

fn refused_reason(refused: &Refused) -> String {
    format!(
        "{}{}",
        leaf_row::REFUSED_REASON_PREFIX,
        leaf_row::camel_case(refused.refusal.reason())
    )
}

impl Controller {
    fn rows(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.root.clone(), namespace, &leaf_row::api_resource())
    }

    /// The namespace of the leaf Secrets, where their rows are.
    fn rows_namespace(&self) -> String {
        self.config
            .leaf_secret_namespace
            .clone()
            .unwrap_or_else(|| self.owner.clone())
    }

    /// Applies `status` as Secret `secret`'s row unless `last` says it was applied lately.
    /// Failures are logged (the CRD may not be installed); the next round tries again.
    pub(super) async fn keep_row(
        &self,
        secret: &SecretRef,
        status: LeafStatus,
        last: &mut Applied,
    ) {
        if last.as_deref().is_some_and(|(old, at, written)| {
            if *written {
                *old == status && at.elapsed() < ROW_REFRESH
            } else {
                at.elapsed() < ROW_RETRY
            }
        }) {
            return;
        }
        let row = leaf_row::row(secret, &self.owner, &status);
        let params = PatchParams::apply(MANAGER).force();
        match self
            .rows(&secret.namespace)
            .patch(&secret.name, &params, &Patch::Apply(row))
            .await
        {
            Ok(_) => *last = Some(Box::new((status, Instant::now(), true))),
            Err(err) => {
                self.metrics.node_write_error("leaf_row");
                tracing::warn!(secret = %secret.name, %err, "writing the leaf's LeafCluster row (is the LeafCluster CRD installed? chart value crds.install)");
                *last = Some(Box::new((status, Instant::now(), false)));
            }
        }
    }

    /// While this replica leads: the refused Secrets' rows written, the rows of Secrets that
    /// are gone deleted; at once on a change, and every 30 s.
    pub(super) async fn keep_rows(&self) {
        let mut refusals = self.registry.subscribe_refusals();
        let mut leaves = self.registry.subscribe();
        let mut leadership = self.leadership.clone();
        let mut every = tokio::time::interval(ROWS_CHECK_EVERY);
        let mut written: std::collections::BTreeMap<String, Applied> = Default::default();
        loop {
            if self.leadership.is_leader() && self.registry.synced() {
                self.look_over_rows(&mut written).await;
            } else {
                written.clear();
            }
            tokio::select! {
                changed = refusals.changed() => if changed.is_err() { return },
                changed = leaves.changed() => if changed.is_err() { return },
                _ = leadership.changed() => {}
                _ = every.tick() => {}
            }
        }
    }

    async fn look_over_rows(&self, written: &mut std::collections::BTreeMap<String, Applied>) {
        let refusals = self.registry.refusals();
        written.retain(|name, _| refusals.contains_key(name));
        for (name, refused) in refusals.iter().filter(|(_, r)| !r.kept) {
            let last = written.entry(name.clone()).or_default();
            self.keep_row(&refused.secret, refused_status(refused), last)
                .await;
        }
        let namespace = self.rows_namespace();
        let params =
            ListParams::default().labels(&format!("{}={}", leaf_row::OWNER_LABEL, self.owner));
        let rows = match self.rows(&namespace).list_metadata(&params).await {
            Ok(rows) => rows,
            Err(err) => {
                tracing::warn!(%err, "listing the LeafCluster rows");
                return;
            }
        };
        let secrets: BTreeSet<String> = self
            .registry
            .snapshot()
            .values()
            .filter_map(|leaf| Some(leaf.secret.as_ref()?.name.clone()))
            .chain(refusals.keys().cloned())
            .collect();
        for row in rows.items {
            let name = row.name_any();
            if secrets.contains(&name) {
                continue;
            }
            match self
                .rows(&namespace)
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %name, "its leaf Secret is gone: LeafCluster row deleted")
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(err) => tracing::warn!(secret = %name, %err, "deleting a LeafCluster row"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSystemInfo};

    use super::*;
    use crate::leaf::SecretRefusal;

    fn secret(rv: &str) -> SecretRef {
        SecretRef {
            name: "leaf-a".into(),
            namespace: "relaylet".into(),
            uid: "u".into(),
            resource_version: rv.into(),
        }
    }

    fn refused(kept: bool) -> Refused {
        Refused {
            secret: secret("9"),
            leaf: Some("a".into()),
            node: Some("relaylet-a".into()),
            refusal: SecretRefusal::NodeNameTaken {
                node: "relaylet-a".into(),
                holder: "leaf Secret old".into(),
            },
            kept,
        }
    }

    fn node(ready: &str, reason: &str) -> NodeStatus {
        NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                reason: Some(reason.into()),
                message: Some("why".into()),
                ..Default::default()
            }]),
            node_info: Some(NodeSystemInfo {
                kubelet_version: "v1.35.0".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_served_row_says_what_the_node_says() {
        let mut leaf = Leaf::from_kubeconfig(
            "a",
            "relaylet-a",
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: 'https://leaf:6443'}}]\nusers: [{name: u, user: {token: t}}]\n",
            &crate::ops::Metrics::new(),
            false,
        )
        .await
        .unwrap();
        leaf.secret = Some(secret("5"));
        let row = served_status(
            &leaf,
            &node("False", "LeafUnreachable"),
            "relaylet-0",
            3,
            None,
        );
        assert_eq!(
            (
                row.ready.as_str(),
                row.reason.as_str(),
                row.message.as_str()
            ),
            ("False", "LeafUnreachable", "why")
        );
        assert_eq!(row.version.as_deref(), Some("v1.35.0"));
        assert_eq!(row.served_by.as_deref(), Some("relaylet-0"));
        assert_eq!(row.pods, Some(3));
        assert_eq!(row.secret_resource_version.as_deref(), Some("5"));
        assert_eq!(row.credential_expires, None);

        // A later version refused for its own content: the Node goes on, the row says so
        // and speaks of the refused version.
        let row = served_status(
            &leaf,
            &node("True", "LeafReady"),
            "relaylet-0",
            0,
            Some(&refused(true)),
        );
        assert_eq!(row.ready, "True");
        assert_eq!(row.reason, "SecretRefusedNodeNameTaken");
        assert!(row.message.contains("latest version was refused"));
        assert_eq!(row.secret_resource_version.as_deref(), Some("9"));

        let row = served_status(&leaf, &NodeStatus::default(), "relaylet-0", 0, None);
        assert_eq!(
            (row.ready.as_str(), row.reason.as_str()),
            ("Unknown", "Registered")
        );
    }

    #[test]
    fn a_refused_row_is_not_ready_and_names_the_refusal() {
        let row = refused_status(&refused(false));
        assert_eq!(row.ready, "False");
        assert_eq!(row.reason, "SecretRefusedNodeNameTaken");
        assert!(
            row.message.contains("already used by leaf Secret old"),
            "{}",
            row.message
        );
        assert_eq!(row.node.as_deref(), Some("relaylet-a"));
        assert_eq!(row.served_by, None);
    }
}

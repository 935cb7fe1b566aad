//! The leaf token, renewed by the replica serving the leaf's Node before it expires: at
//! `LEAF_CREDENTIAL_RENEW_AT` percent of its life, a TokenRequest in the leaf for the token's
//! own ServiceAccount (the leaf RBAC lets that account request its own tokens, nothing else),
//! for as long a life as the token had, written back into the leaf Secret's kubeconfig
//! (guarded by the Secret's resourceVersion). The Secret watch then registers the leaf with the
//! new token; sessions in flight keep their connections. A failure is said on the leaf's row
//! (`CredentialRenewalFailed`) and tried again a minute later, until the token expires.

use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch};
use kube::config::Kubeconfig;
use serde_json::json;

use super::Controller;
use crate::leaf::credential::{request_token, with_token};
use crate::leaf::{KUBECONFIG_KEY, Leaf};

/// A failed renewal is tried again after this long.
const RETRY: Duration = Duration::from_secs(60);

/// One leaf's renewal, as its loop remembers it.
#[derive(Default)]
pub(super) struct Renewal {
    /// No try before this (after a failure, or once renewed: the new token arrives with the
    /// Secret's next version, as a new leaf).
    next_try: Option<Instant>,
    /// Why the last try failed, for the leaf's row.
    pub failed: Option<String>,
}

/// Why a renewal failed. Never carries a token.
#[derive(Debug, thiserror::Error)]
enum RenewError {
    #[error("requesting a token from the leaf: {0}")]
    Token(kube::Error),
    #[error("reading the leaf Secret: {0}")]
    Read(kube::Error),
    #[error("the leaf Secret is gone or holds no kubeconfig")]
    Gone,
    #[error("writing the leaf Secret: {0}")]
    Write(kube::Error),
}

impl Controller {
    /// Renews `leaf`'s token if it is due (and this is a token relaylet can renew).
    pub(super) async fn renew_if_due(&self, leaf: &Leaf, renewal: &mut Renewal) {
        let (Some(credential), Some(secret)) = (&leaf.credential, &leaf.secret) else {
            return;
        };
        let Some(due) =
            credential.renew_at(f64::from(self.config.leaf_credential_renew_at) / 100.0)
        else {
            return;
        };
        if Timestamp::now() < due || renewal.next_try.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let (Some(account), Some(issued)) = (&credential.account, credential.issued) else {
            return;
        };
        let life = credential.expires.as_second() - issued.as_second();
        match self
            .renew(leaf, account, life, &secret.namespace, &secret.name)
            .await
        {
            Ok(expires) => {
                tracing::info!(%expires, "leaf token renewed and written into its Secret");
                renewal.failed = None;
                // The Secret's new version registers the leaf anew; until then, no second try.
                renewal.next_try = Some(Instant::now() + RETRY);
            }
            Err(err) => {
                self.metrics.node_write_error("leaf_credential");
                tracing::warn!(%err, expires = %credential.expires, "renewing the leaf token");
                renewal.failed = Some(err.to_string());
                renewal.next_try = Some(Instant::now() + RETRY);
            }
        }
    }

    async fn renew(
        &self,
        leaf: &Leaf,
        account: &(String, String),
        life: i64,
        namespace: &str,
        name: &str,
    ) -> Result<Timestamp, RenewError> {
        let (token, expires) = request_token(&leaf.client(), account, life)
            .await
            .map_err(RenewError::Token)?;
        let secrets: Api<Secret> = Api::namespaced(self.root.clone(), namespace);
        // A list of the one Secret: relaylet may list and watch leaf Secrets, not get them.
        let params = ListParams::default().fields(&format!("metadata.name={name}"));
        let secret = secrets
            .list(&params)
            .await
            .map_err(RenewError::Read)?
            .items
            .into_iter()
            .next()
            .ok_or(RenewError::Gone)?;
        let kubeconfig = secret
            .data
            .as_ref()
            .and_then(|d| d.get(KUBECONFIG_KEY))
            .and_then(|b| std::str::from_utf8(&b.0).ok())
            .and_then(|text| Kubeconfig::from_yaml(text).ok())
            .and_then(|k| with_token(k, token))
            .ok_or(RenewError::Gone)?;
        let text = serde_json::to_string(&kubeconfig).map_err(|_| RenewError::Gone)?;
        let patch = json!({
            "metadata": { "resourceVersion": secret.metadata.resource_version },
            "data": { KUBECONFIG_KEY: base64::engine::general_purpose::STANDARD.encode(text) },
        });
        secrets
            .patch(name, &super::patch_params(), &Patch::Merge(patch))
            .await
            .map_err(RenewError::Write)?;
        Ok(expires)
    }
}

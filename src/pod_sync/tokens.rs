//! The root's service-account tokens for the pods relaylet runs, so a pod in a leaf talks to
//! the root apiserver as itself (`LEAF_POD_ROOT_APISERVER`).
//!
//! For each projected `serviceAccountToken` source of a root pod (the `kube-api-access-*`
//! volume the root's admission adds, and any of the author's), a TokenRequest on the root
//! apiserver for the pod's service account, bound to the root pod (so the token dies with it),
//! with the source's audience and expiry. The tokens go in one Secret per pod in the leaf
//! ([`secret_name`]), written before the copy and deleted when the pod is gone (or, gone while
//! relaylet was away, by the next sweep), and are requested again at 80 % of their life, as a
//! kubelet does. The copy reads them from that Secret: its token sources become Secret
//! sources ([`rewrite`]), its `kube-root-ca.crt` the root's CA (copied as
//! `relaylet-root-ca.crt`), its containers' `KUBERNETES_SERVICE_HOST` and `_PORT` the root
//! apiserver's address, and `automountServiceAccountToken: false` keeps the leaf's own token
//! out.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    EnvVar, KeyToPath, Pod, PodSpec, Secret, SecretProjection, ServiceAccount,
    ServiceAccountTokenProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};

use super::marks::{Marks, NODE_LABEL, OWNER_LABEL};
use super::references::{ROOT_CA, ROOT_CA_COPY};
use super::sync_error::SyncError;
use crate::config::PodApiserver;
use crate::kube_client::{Calls, continued, paged};
use crate::ops::Metrics;

/// The label on a tokens Secret naming the root pod's UID (and keeping it out of the copies
/// of the ConfigMaps and Secrets pods name).
pub const TOKENS_FOR_LABEL: &str = "relaylet.io/tokens-for";
/// The annotation on a tokens Secret saying when its tokens are to be requested again.
const REFRESH_AT: &str = "relaylet.io/refresh-at";
/// A source without `expirationSeconds` asks for an hour, as upstream's default.
const DEFAULT_EXPIRATION: i64 = 3600;
/// relaylet's field manager in the leaf.
const MANAGER: &str = "relaylet";
/// Secrets per LIST page when sweeping.
const PAGE: u32 = 500;

/// The leaf Secret holding the tokens of the root pod with UID `uid`.
pub fn secret_name(uid: &str) -> String {
    format!("relaylet-token-{uid}")
}

/// The Secret key of the `n`th token source.
fn key(n: usize) -> String {
    format!("token-{n}")
}

/// The pod's projected token sources, in order.
pub fn sources(spec: &PodSpec) -> Vec<&ServiceAccountTokenProjection> {
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .collect()
}

/// Makes copy `spec` read the root's tokens from Secret `secret` and talk to `apiserver`.
pub fn rewrite(spec: &mut PodSpec, secret: &str, apiserver: &PodApiserver) {
    spec.automount_service_account_token = Some(false);
    let mut n = 0;
    let projections = spec
        .volumes
        .iter_mut()
        .flatten()
        .filter_map(|v| v.projected.as_mut())
        .flat_map(|p| p.sources.iter_mut().flatten());
    for source in projections {
        if let Some(token) = source.service_account_token.take() {
            source.secret = Some(SecretProjection {
                name: secret.to_string(),
                items: Some(vec![KeyToPath {
                    key: key(n),
                    path: token.path,
                    mode: None,
                }]),
                optional: Some(false),
            });
            n += 1;
        }
        if let Some(ca) = source.config_map.as_mut()
            && ca.name == ROOT_CA
        {
            ca.name = ROOT_CA_COPY.to_string();
        }
    }
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        let env = c.env.get_or_insert_with(Vec::new);
        for (name, value) in [
            ("KUBERNETES_SERVICE_HOST", apiserver.host.clone()),
            ("KUBERNETES_SERVICE_PORT", apiserver.port.to_string()),
        ] {
            // The author's own setting stands.
            if !env.iter().any(|e| e.name == name) {
                env.push(EnvVar {
                    name: name.to_string(),
                    value: Some(value),
                    value_from: None,
                });
            }
        }
    }
}

/// When tokens issued at `now` that expire at `expirations` are to be requested again: at 80 %
/// of the shortest life.
pub fn refresh_at(now: Timestamp, expirations: &[Timestamp]) -> Timestamp {
    let shortest = expirations
        .iter()
        .map(|e| e.duration_since(now))
        .min()
        .unwrap_or(SignedDuration::ZERO)
        .max(SignedDuration::ZERO);
    let life = shortest.as_millis() as i64 * 4 / 5;
    now.checked_add(SignedDuration::from_millis(life))
        .unwrap_or(now)
}

/// The tokens Secret of root pod `uid` in `namespace`.
fn tokens_secret(
    namespace: &str,
    uid: &str,
    marks: &Marks,
    tokens: Vec<String>,
    refresh: Timestamp,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(uid)),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (OWNER_LABEL.to_string(), marks.owner.clone()),
                (NODE_LABEL.to_string(), marks.node.clone()),
                (TOKENS_FOR_LABEL.to_string(), uid.to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                REFRESH_AT.to_string(),
                refresh.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(
            tokens
                .into_iter()
                .enumerate()
                .map(|(n, t)| (key(n), ByteString(t.into_bytes())))
                .collect(),
        ),
        type_: Some("Opaque".to_string()),
        ..Secret::default()
    }
}

/// Where the tokens are requested and kept.
pub struct Io<'a> {
    pub root: &'a Client,
    pub leaf: Calls,
    pub marks: &'a Marks,
    pub metrics: &'a Metrics,
}

impl Io<'_> {
    /// Makes sure root pod `root`'s tokens are in the leaf (namespace `namespace`) and not due;
    /// when they are next due (`None`: the pod has no token sources). `known` is when they were
    /// due as last written (`None` after a start: the Secret says).
    pub async fn ensure(
        &self,
        root: &Pod,
        namespace: &str,
        known: Option<Timestamp>,
    ) -> Result<Option<Timestamp>, SyncError> {
        let (Some(spec), Some(uid), Some(name)) = (
            root.spec.as_ref(),
            root.metadata.uid.as_deref(),
            root.metadata.name.as_deref(),
        ) else {
            return Ok(None);
        };
        let wanted = sources(spec);
        if wanted.is_empty() {
            return Ok(None);
        }
        let now = Timestamp::now();
        let due = match known {
            Some(at) => Some(at),
            None => self.written(namespace, uid).await?,
        };
        if let Some(at) = due
            && now < at
        {
            return Ok(Some(at));
        }
        let account = spec.service_account_name.as_deref().unwrap_or("default");
        let accounts: Api<ServiceAccount> = Api::namespaced(
            self.root.clone(),
            root.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let mut tokens = Vec::new();
        let mut expirations = Vec::new();
        for source in wanted {
            let request = TokenRequest {
                spec: TokenRequestSpec {
                    audiences: source.audience.iter().cloned().collect(),
                    expiration_seconds: Some(
                        source.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION),
                    ),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".to_string()),
                        kind: Some("Pod".to_string()),
                        name: Some(name.to_string()),
                        uid: Some(uid.to_string()),
                    }),
                },
                ..TokenRequest::default()
            };
            let issued = accounts
                .create_token_request(account, &PostParams::default(), &request)
                .await
                .map_err(SyncError::Root)?;
            self.metrics.pod_sync_action("root_token");
            let status = issued.status.ok_or_else(|| {
                SyncError::Root(kube::Error::Service(
                    "the TokenRequest came back without a token".into(),
                ))
            })?;
            tokens.push(status.token);
            expirations.push(status.expiration_timestamp.0);
        }
        let next = refresh_at(now, &expirations);
        let secret = tokens_secret(namespace, uid, self.marks, tokens, next);
        self.leaf
            .patch::<Secret, _>(
                Some(namespace),
                &secret_name(uid),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await
            .map_err(SyncError::Leaf)?;
        self.metrics.pod_sync_action("leaf_tokens");
        Ok(Some(next))
    }

    /// When the tokens in root pod `uid`'s Secret are due, if relaylet wrote it.
    async fn written(&self, namespace: &str, uid: &str) -> Result<Option<Timestamp>, SyncError> {
        let meta = self
            .leaf
            .get_metadata_opt::<Secret>(namespace, &secret_name(uid))
            .await
            .map_err(SyncError::Leaf)?
            .map(|s| s.metadata);
        Ok(meta
            .filter(|m| self.marks.ours(m))
            .and_then(|m| m.annotations?.get(REFRESH_AT)?.parse().ok()))
    }

    /// Deletes root pod `uid`'s tokens Secret: the pod is gone.
    pub async fn forget(&self, namespace: &str, uid: &str) -> Result<(), SyncError> {
        self.leaf
            .delete::<Secret>(Some(namespace), &secret_name(uid), &DeleteParams::default())
            .await
            .map(drop)
            .map_err(SyncError::Leaf)
    }

    /// Deletes the tokens Secrets of root pods not in `live` (their copy never made, or made and
    /// gone while relaylet was away; a copy's own go with it).
    pub async fn sweep(&self, live: &HashSet<String>) -> Result<(), SyncError> {
        let selector = format!("{},{TOKENS_FOR_LABEL}", self.marks.selector());
        let params = ListParams::default().labels(&selector).limit(PAGE);
        let found = paged(|token| {
            let params = continued(&params, token);
            async move {
                let list = self.leaf.list_metadata::<Secret>(None, &params).await?;
                Ok((list.items, list.metadata.continue_))
            }
        })
        .await
        .map_err(SyncError::Leaf)?;
        for secret in found {
            let meta = secret.metadata;
            let for_uid = meta
                .labels
                .as_ref()
                .and_then(|l| l.get(TOKENS_FOR_LABEL))
                .cloned()
                .unwrap_or_default();
            if live.contains(&for_uid) {
                continue;
            }
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: meta.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let (Some(namespace), Some(name)) = (meta.namespace, meta.name) else {
                continue;
            };
            match self
                .leaf
                .delete::<Secret>(Some(&namespace), &name, &params)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(err) => return Err(SyncError::Leaf(err)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apiserver() -> PodApiserver {
        PodApiserver {
            host: "10.0.0.1".into(),
            port: 6443,
        }
    }

    /// A pod as the root's admission leaves it: the kube-api-access volume, plus one token of
    /// the author's with an audience.
    fn spec() -> PodSpec {
        serde_json::from_value(json!({
            "serviceAccountName": "builder",
            "containers": [{"name": "main", "env": [{"name": "KUBERNETES_SERVICE_PORT", "value": "8443"}]}],
            "initContainers": [{"name": "init"}],
            "volumes": [
                {"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                ]}},
                {"name": "vault", "projected": {"sources": [
                    {"serviceAccountToken": {"audience": "vault", "expirationSeconds": 600, "path": "vault-token"}}
                ]}},
                {"name": "data", "emptyDir": {}}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn token_sources_become_the_tokens_secret_and_the_root_ca_and_address_follow() {
        let mut copy = spec();
        assert_eq!(sources(&copy).len(), 2);
        rewrite(&mut copy, "relaylet-token-u", &apiserver());
        let got = serde_json::to_value(&copy).unwrap();
        assert_eq!(got["automountServiceAccountToken"], false, "no leaf token");
        let access = &got["volumes"][0]["projected"]["sources"];
        assert_eq!(
            access[0],
            json!({"secret": {"name": "relaylet-token-u", "optional": false,
                "items": [{"key": "token-0", "path": "token"}]}})
        );
        assert_eq!(access[1]["configMap"]["name"], "relaylet-root-ca.crt");
        assert_eq!(access[2]["downwardAPI"]["items"][0]["path"], "namespace");
        assert_eq!(
            got["volumes"][1]["projected"]["sources"][0]["secret"]["items"][0],
            json!({"key": "token-1", "path": "vault-token"})
        );
        assert!(sources(&copy).is_empty());
        let env = |c: &serde_json::Value| -> Vec<(String, String)> {
            c["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap().into(),
                        e["value"].as_str().unwrap().into(),
                    )
                })
                .collect()
        };
        assert_eq!(
            env(&got["containers"][0]),
            [
                ("KUBERNETES_SERVICE_PORT".to_string(), "8443".to_string()),
                (
                    "KUBERNETES_SERVICE_HOST".to_string(),
                    "10.0.0.1".to_string()
                ),
            ],
            "the author's own value stands"
        );
        assert_eq!(
            env(&got["initContainers"][0]),
            [
                (
                    "KUBERNETES_SERVICE_HOST".to_string(),
                    "10.0.0.1".to_string()
                ),
                ("KUBERNETES_SERVICE_PORT".to_string(), "6443".to_string()),
            ]
        );
    }

    #[test]
    fn tokens_are_requested_again_at_four_fifths_of_the_shortest_life() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let at = |s: i64| Timestamp::from_second(1_000_000 + s).unwrap();
        assert_eq!(refresh_at(now, &[at(3600), at(600)]), at(480));
        assert_eq!(refresh_at(now, &[at(-5)]), now, "already expired: now");
        let secret = tokens_secret(
            "team",
            "u",
            &Marks {
                owner: "relaylet".into(),
                node: "n".into(),
                marker: "m".into(),
            },
            vec!["a".into(), "b".into()],
            at(480),
        );
        let labels = secret.metadata.labels.unwrap();
        assert_eq!(labels[TOKENS_FOR_LABEL], "u");
        assert_eq!(labels["relaylet.io/owner"], "relaylet");
        let data = secret.data.unwrap();
        assert_eq!(data["token-0"].0, b"a");
        assert_eq!(data["token-1"].0, b"b");
        let due: Timestamp = secret.metadata.annotations.unwrap()[REFRESH_AT]
            .parse()
            .unwrap();
        assert_eq!(due, at(480));
    }
}

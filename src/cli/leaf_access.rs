//! What `join` makes in a leaf and `unjoin` removes: relaylet's ServiceAccount and RBAC there
//! (`deploy/leaf-rbac.yaml`, embedded, so no checkout of the repository is needed), a bounded
//! token for that ServiceAccount (a TokenRequest; never the manifest's long-lived token
//! Secret, which `join` leaves out), and the kubeconfig that carries it and the leaf's CA.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Scope, pinned_kind};
use kube::{Client, ResourceExt};

use crate::kube_client::Calls;
use crate::leaf::credential::request_token;

/// The leaf manifest `join` applies.
const LEAF_RBAC: &str = include_str!("../../deploy/leaf-rbac.yaml");
/// Where the manifest puts relaylet's ServiceAccount in a leaf.
pub const NAMESPACE: &str = "relaylet";
pub const SERVICE_ACCOUNT: &str = "relaylet-leaf";
/// Field manager of what `join` applies.
const MANAGER: &str = "relaylet-join";

/// The manifest's objects `join` applies, in order (the long-lived token Secret left out).
pub fn objects() -> anyhow::Result<Vec<DynamicObject>> {
    let mut out = Vec::new();
    for document in LEAF_RBAC.split("\n---\n") {
        let object: DynamicObject =
            serde_saphyr::from_str(document).context("the embedded deploy/leaf-rbac.yaml")?;
        let kind = object.types.as_ref().map(|t| t.kind.as_str());
        if kind != Some("Secret") {
            out.push(object);
        }
    }
    Ok(out)
}

/// The API of `object`'s kind in `client`'s cluster (found by discovery).
async fn api_for(client: &Client, object: &DynamicObject) -> anyhow::Result<Api<DynamicObject>> {
    let types = object
        .types
        .as_ref()
        .context("an object without apiVersion/kind")?;
    let (group, version) = match types.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", types.api_version.as_str()),
    };
    let gvk = GroupVersionKind::gvk(group, version, &types.kind);
    let (resource, caps) = pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("the leaf does not serve {}", types.kind))?;
    Ok(match (caps.scope, object.namespace()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), &ns, &resource),
        _ => Api::all_with(client.clone(), &resource),
    })
}

fn kind_of(object: &DynamicObject) -> String {
    object
        .types
        .as_ref()
        .map(|t| t.kind.clone())
        .unwrap_or_default()
}

/// Applies the objects (server-side apply); what was applied, for the user.
pub async fn apply(client: &Client) -> anyhow::Result<Vec<String>> {
    let mut done = Vec::new();
    for object in objects()? {
        let api = api_for(client, &object).await?;
        let name = object.name_any();
        let kind = kind_of(&object);
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .with_context(|| format!("applying {kind} {name} in the leaf"))?;
        done.push(format!("{kind}/{name}"));
    }
    Ok(done)
}

/// Deletes the objects, last first (the namespace, holding the ServiceAccount, last); what was
/// there to delete.
pub async fn delete(client: &Client) -> anyhow::Result<Vec<String>> {
    let mut done = Vec::new();
    for object in objects()?.into_iter().rev() {
        let api = api_for(client, &object).await?;
        let name = object.name_any();
        let kind = kind_of(&object);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => done.push(format!("{kind}/{name}")),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(err) => {
                return Err(err).with_context(|| format!("deleting {kind} {name} in the leaf"));
            }
        }
    }
    Ok(done)
}

/// A token for relaylet's ServiceAccount in the leaf, valid for `duration` (the apiserver may
/// shorten it), and when it expires.
pub async fn token(client: &Client, duration: Duration) -> anyhow::Result<(String, Timestamp)> {
    // The request relaylet makes when it renews this token: one TokenRequest in one place.
    let account = (NAMESPACE.to_string(), SERVICE_ACCOUNT.to_string());
    let life = i64::try_from(duration.as_secs()).unwrap_or(i64::MAX);
    request_token(&Calls::of_client(client.clone()), &account, life)
        .await
        .with_context(|| {
            format!("requesting a token for {NAMESPACE}/{SERVICE_ACCOUNT} in the leaf")
        })
}

/// What the leaf Secret's kubeconfig says: where the leaf is, how relaylet checks it is the
/// leaf, and relaylet's token; nothing of the user's own credentials.
pub struct LeafKubeconfig<'a> {
    pub name: &'a str,
    pub server: &'a str,
    pub ca_pem: Option<&'a str>,
    pub proxy_url: Option<&'a str>,
    pub token: &'a str,
}

impl LeafKubeconfig<'_> {
    /// As JSON (a kubeconfig is YAML, and JSON is YAML).
    pub fn render(&self) -> String {
        let mut cluster = serde_json::json!({ "server": self.server });
        if let Some(ca) = self.ca_pem {
            cluster["certificate-authority-data"] =
                base64::Engine::encode(&base64::engine::general_purpose::STANDARD, ca).into();
        }
        if let Some(proxy) = self.proxy_url {
            cluster["proxy-url"] = proxy.into();
        }
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": self.name, "cluster": cluster }],
            "users": [{ "name": SERVICE_ACCOUNT, "user": { "token": self.token } }],
            "contexts": [{ "name": self.name, "context": { "cluster": self.name, "user": SERVICE_ACCOUNT } }],
            "current-context": self.name,
        });
        serde_json::to_string_pretty(&kubeconfig).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_manifest_without_its_long_lived_token() {
        let kinds: Vec<String> = objects()
            .unwrap()
            .iter()
            .map(|o| format!("{}/{}", o.types.as_ref().unwrap().kind, o.name_any()))
            .collect();
        assert_eq!(
            kinds,
            [
                "Namespace/relaylet",
                "ServiceAccount/relaylet-leaf",
                "ClusterRole/relaylet-leaf",
                "ClusterRoleBinding/relaylet-leaf",
                "Role/relaylet-leaf-token",
                "RoleBinding/relaylet-leaf-token"
            ]
        );
    }

    #[test]
    fn the_kubeconfig_is_one_relaylet_accepts() {
        let text = LeafKubeconfig {
            name: "leaf-a",
            server: "https://10.0.0.5:6443",
            ca_pem: Some("-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"),
            proxy_url: Some("socks5://proxy:1080"),
            token: "tok",
        }
        .render();
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        crate::leaf::kubeconfig::check(&kubeconfig).unwrap();
        crate::leaf::kubeconfig::check_plaintext(&kubeconfig).unwrap();
        assert_eq!(
            crate::leaf::proxy_url(&kubeconfig),
            Some("socks5://proxy:1080")
        );
        assert_eq!(kubeconfig.current_context.as_deref(), Some("leaf-a"));
    }
}

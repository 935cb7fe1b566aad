//! What `join` makes in a leaf and `unjoin` removes: relaylet's ServiceAccount and RBAC there
//! (one of the three leaf manifests, `deploy/leaf-rbac*.yaml`, embedded, so no checkout of the
//! repository is needed; the namespaced one with its RoleBinding in each namespace named), a
//! bounded token for that ServiceAccount (a TokenRequest; never the manifests' long-lived token
//! Secret, which `join` leaves out), and the kubeconfig that carries it and the leaf's CA.
//! What the other manifests grant and the chosen one does not is removed, so a leaf holds the
//! access asked for, never the sum of every join.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::discovery::{Scope, pinned_kind};
use kube::{Client, ResourceExt};

use crate::kube_client::Calls;
use crate::leaf::credential::request_token;

/// Where the manifests put relaylet's ServiceAccount in a leaf.
pub const NAMESPACE: &str = "relaylet";
pub const SERVICE_ACCOUNT: &str = "relaylet-leaf";
/// Field manager of what `join` applies.
const MANAGER: &str = "relaylet-join";
/// The label on every object of the leaf manifests, and on the RoleBindings `join` makes.
const COMPONENT: (&str, &str) = ("app.kubernetes.io/component", "leaf-access");
/// The namespaced manifest's ClusterRole for the streams and the pods relaylet runs, bound per
/// namespace.
const STREAMS_ROLE: &str = "relaylet-leaf-streams";

/// Which leaf manifest `join` applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// `deploy/leaf-rbac.yaml`: streams to every pod, root pods run in any namespace.
    Full,
    /// `deploy/leaf-rbac-namespaced.yaml`, its streams role bound in each of these namespaces
    /// (which must exist: relaylet creates no namespace under this access).
    Namespaced(Vec<String>),
    /// `deploy/leaf-rbac-exec-only.yaml`: the relay alone, for installs where another syncer
    /// runs the pods (`LEAF_POD_SYNC=false`).
    ExecOnly,
}

/// The flag values, as the usage names them.
pub const ACCESS_VALUES: &str = "full, namespaced or exec-only";

impl Access {
    /// `--access` and `--access-namespaces`.
    pub fn parse(access: Option<&str>, namespaces: Option<&str>) -> anyhow::Result<Access> {
        let names: Vec<String> = namespaces
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        let access = match access.unwrap_or("full") {
            "full" => Access::Full,
            "exec-only" => Access::ExecOnly,
            "namespaced" if names.is_empty() => {
                anyhow::bail!("--access namespaced needs --access-namespaces NS,...")
            }
            "namespaced" => {
                for name in &names {
                    crate::model::names::check_dns_label(name)
                        .map_err(|m| anyhow::anyhow!("--access-namespaces {name:?}: {m}"))?;
                }
                return Ok(Access::Namespaced(names));
            }
            other => anyhow::bail!("--access {other:?}: must be {ACCESS_VALUES}"),
        };
        if !names.is_empty() {
            anyhow::bail!("--access-namespaces is for --access namespaced");
        }
        Ok(access)
    }

    fn manifest(&self) -> (&'static str, &'static str) {
        match self {
            Access::Full => (
                "deploy/leaf-rbac.yaml",
                include_str!("../../deploy/leaf-rbac.yaml"),
            ),
            Access::Namespaced(_) => (
                "deploy/leaf-rbac-namespaced.yaml",
                include_str!("../../deploy/leaf-rbac-namespaced.yaml"),
            ),
            Access::ExecOnly => (
                "deploy/leaf-rbac-exec-only.yaml",
                include_str!("../../deploy/leaf-rbac-exec-only.yaml"),
            ),
        }
    }

    /// Every access, for what `unjoin` removes and what `join` removes of the others.
    fn every() -> [Access; 3] {
        [
            Access::Full,
            Access::Namespaced(Vec::new()),
            Access::ExecOnly,
        ]
    }
}

/// The objects `join` applies for `access`, in order: its manifest's (the long-lived token
/// Secret left out), then a RoleBinding to the streams role in each namespace named.
pub fn objects(access: &Access) -> anyhow::Result<Vec<DynamicObject>> {
    let (file, text) = access.manifest();
    let mut out = Vec::new();
    for document in text.split("\n---\n") {
        let object: DynamicObject =
            serde_saphyr::from_str(document).with_context(|| format!("the embedded {file}"))?;
        let kind = object.types.as_ref().map(|t| t.kind.as_str());
        if kind != Some("Secret") {
            out.push(object);
        }
    }
    if let Access::Namespaced(namespaces) = access {
        for namespace in namespaces {
            out.push(streams_binding(namespace)?);
        }
    }
    Ok(out)
}

/// The namespaced manifest's RoleBinding in `namespace`, as its header tells an administrator
/// to make it.
fn streams_binding(namespace: &str) -> anyhow::Result<DynamicObject> {
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": STREAMS_ROLE,
            "namespace": namespace,
            "labels": { "app.kubernetes.io/name": "relaylet", COMPONENT.0: COMPONENT.1 },
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": STREAMS_ROLE,
        },
        "subjects": [{ "kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE }],
    });
    serde_json::from_value(binding).context("a RoleBinding")
}

/// Kind, namespace and name: what tells two objects of the manifests apart.
fn identity(object: &DynamicObject) -> (String, Option<String>, String) {
    (kind_of(object), object.namespace(), object.name_any())
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

/// Applies `access`'s objects (server-side apply), then removes what the other manifests, and
/// streams RoleBindings in namespaces not named, grant beyond them: what was applied and what
/// removed, for the user.
pub async fn apply(client: &Client, access: &Access) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let wanted = objects(access)?;
    if let Access::Namespaced(namespaces) = access {
        let all: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        for namespace in namespaces {
            if all.get_opt(namespace).await?.is_none() {
                anyhow::bail!(
                    "namespace {namespace} does not exist in the leaf: create it first (under --access namespaced relaylet creates no namespace)"
                );
            }
        }
    }
    let mut applied = Vec::new();
    for object in &wanted {
        let api = api_for(client, object).await?;
        let name = object.name_any();
        let kind = kind_of(object);
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
        .with_context(|| format!("applying {kind} {name} in the leaf"))?;
        applied.push(format!("{kind}/{name}"));
    }
    let keep: Vec<_> = wanted.iter().map(identity).collect();
    let removed = delete_except(client, &keep).await?;
    Ok((applied, removed))
}

/// Deletes what any manifest of `join` makes, and every streams RoleBinding it made; what was
/// there to delete.
pub async fn delete(client: &Client) -> anyhow::Result<Vec<String>> {
    delete_except(client, &[]).await
}

/// Deletes the objects of every access but those in `keep`, last first (the namespace, holding
/// the ServiceAccount, last); what was there to delete.
async fn delete_except(
    client: &Client,
    keep: &[(String, Option<String>, String)],
) -> anyhow::Result<Vec<String>> {
    let mut all: Vec<DynamicObject> = Vec::new();
    for access in Access::every() {
        for object in objects(&access)? {
            if !all.iter().any(|o| identity(o) == identity(&object)) {
                all.push(object);
            }
        }
    }
    // The streams RoleBindings join made, in whatever namespaces.
    let labelled = format!("{}={}", COMPONENT.0, COMPONENT.1);
    let bindings: Api<RoleBinding> = Api::all(client.clone());
    for binding in bindings
        .list(&ListParams::default().labels(&labelled))
        .await
        .context("listing relaylet's RoleBindings in the leaf")?
    {
        if binding.metadata.name.as_deref() == Some(STREAMS_ROLE) {
            let namespace = binding.metadata.namespace.clone().unwrap_or_default();
            all.push(streams_binding(&namespace)?);
        }
    }
    let mut done = Vec::new();
    for object in all.into_iter().rev() {
        if keep.contains(&identity(&object)) {
            continue;
        }
        let api = api_for(client, &object).await?;
        let name = object.name_any();
        let kind = kind_of(&object);
        let shown = match object.namespace() {
            Some(ns) if kind == "RoleBinding" && name == STREAMS_ROLE => {
                format!("{kind}/{name} in {ns}")
            }
            _ => format!("{kind}/{name}"),
        };
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => done.push(shown),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(err) => {
                return Err(err).with_context(|| format!("deleting {shown} in the leaf"));
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

    fn shown(access: &Access) -> Vec<String> {
        objects(access)
            .unwrap()
            .iter()
            .map(|o| {
                let (kind, namespace, name) = identity(o);
                match namespace {
                    Some(ns) => format!("{kind}/{ns}/{name}"),
                    None => format!("{kind}/{name}"),
                }
            })
            .collect()
    }

    #[test]
    fn each_access_is_its_manifest_without_its_long_lived_token() {
        let token = [
            "Role/relaylet/relaylet-leaf-token",
            "RoleBinding/relaylet/relaylet-leaf-token",
        ];
        let common = [
            "Namespace/relaylet",
            "ServiceAccount/relaylet/relaylet-leaf",
        ];
        let full = [
            &common[..],
            &[
                "ClusterRole/relaylet-leaf",
                "ClusterRoleBinding/relaylet-leaf",
            ],
            &token[..],
        ]
        .concat();
        assert_eq!(shown(&Access::Full), full);
        // exec-only: the same names, a smaller ClusterRole (tests/it/leaf_rbac.rs).
        assert_eq!(shown(&Access::ExecOnly), full);
        let namespaced = Access::Namespaced(vec!["team-a".into(), "team-b".into()]);
        assert_eq!(
            shown(&namespaced),
            [
                &common[..],
                &[
                    "ClusterRole/relaylet-leaf-read",
                    "ClusterRoleBinding/relaylet-leaf-read",
                    "ClusterRole/relaylet-leaf-streams",
                ],
                &token[..],
                &[
                    "RoleBinding/team-a/relaylet-leaf-streams",
                    "RoleBinding/team-b/relaylet-leaf-streams",
                ],
            ]
            .concat()
        );
        // The binding the namespaced manifest's header tells an administrator to make.
        let binding: RoleBinding = serde_json::from_value(
            serde_json::to_value(streams_binding("team-a").unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        assert_eq!(binding.role_ref.name, "relaylet-leaf-streams");
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(
            (
                subject.kind.as_str(),
                subject.name.as_str(),
                subject.namespace.as_deref()
            ),
            ("ServiceAccount", "relaylet-leaf", Some("relaylet"))
        );
        let ex = &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("deploy/leaf-rbac-namespaced.yaml"),
        )
        .unwrap();
        assert!(
            ex.contains("create rolebinding relaylet-leaf-streams")
                && ex.contains(
                    "--clusterrole=relaylet-leaf-streams --serviceaccount=relaylet:relaylet-leaf"
                ),
            "the manifest's own instructions make the same binding"
        );
    }

    #[test]
    fn access_flags() {
        let parse =
            |a: Option<&str>, n: Option<&str>| Access::parse(a, n).map_err(|e| e.to_string());
        assert_eq!(parse(None, None), Ok(Access::Full));
        assert_eq!(parse(Some("exec-only"), None), Ok(Access::ExecOnly));
        assert_eq!(
            parse(Some("namespaced"), Some("team-a, team-b,")),
            Ok(Access::Namespaced(vec!["team-a".into(), "team-b".into()]))
        );
        for (access, namespaces, error) in [
            (
                Some("namespaced"),
                None,
                "--access namespaced needs --access-namespaces NS,...",
            ),
            (
                Some("namespaced"),
                Some(" , "),
                "--access namespaced needs --access-namespaces NS,...",
            ),
            (
                Some("full"),
                Some("team-a"),
                "--access-namespaces is for --access namespaced",
            ),
            (
                Some("admin"),
                None,
                "--access \"admin\": must be full, namespaced or exec-only",
            ),
        ] {
            assert_eq!(
                parse(access, namespaces),
                Err(error.to_string()),
                "{access:?} {namespaces:?}"
            );
        }
        let bad = parse(Some("namespaced"), Some("Team_A")).unwrap_err();
        assert!(bad.starts_with("--access-namespaces \"Team_A\": "), "{bad}");
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

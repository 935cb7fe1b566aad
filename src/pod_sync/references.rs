//! What a pod names that must exist beside it in the leaf: the ConfigMaps and Secrets of its
//! volumes (projected ones included), its containers' `env` and `envFrom`, and its image pull
//! secrets; and their leaf copies, as pure functions of the root objects.
//!
//! A copy carries the marks of a pod copy (this install, this Node) and the root object's
//! resourceVersion it was made from, so it is written again only when the root object changed.
//! The root namespace's `kube-root-ca.crt` is copied only for pods whose tokens are the root's
//! (`tokens`), and then as [`ROOT_CA_COPY`], beside the leaf's own (which the leaf's tokens go
//! with). Service-account token Secrets are never copied.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::marks::{Marks, NODE_LABEL, OWNER_LABEL};

/// The annotation on a copy naming the root object's resourceVersion it was made from.
pub const SOURCE_VERSION: &str = "relaylet.io/source-version";

/// The ConfigMap every namespace has, of its own cluster's CA.
pub const ROOT_CA: &str = "kube-root-ca.crt";
/// The name of the root's `kube-root-ca.crt` in the leaf.
pub const ROOT_CA_COPY: &str = "relaylet-root-ca.crt";

/// A kind of object a pod names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
        }
    }
}

/// The objects one pod names, by kind and name (in the pod's namespace).
pub type References = BTreeSet<(Kind, String)>;

/// The leaf name of the copy of root object `name`.
pub fn leaf_name(kind: Kind, name: &str) -> &str {
    if kind == Kind::ConfigMap && name == ROOT_CA {
        ROOT_CA_COPY
    } else {
        name
    }
}

/// The ConfigMaps and Secrets `spec` names (`kube-root-ca.crt` only with `root_ca`: the pod's
/// tokens are the root's).
pub fn references(spec: &PodSpec, root_ca: bool) -> References {
    let mut out = References::new();
    let mut add = |kind: Kind, name: &str| {
        if !(name.is_empty() || !root_ca && kind == Kind::ConfigMap && name == ROOT_CA) {
            out.insert((kind, name.to_string()));
        }
    };
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            add(Kind::ConfigMap, &c.name);
        }
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) {
            add(Kind::Secret, s);
        }
        for source in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &source.config_map {
                add(Kind::ConfigMap, &c.name);
            }
            if let Some(s) = &source.secret {
                add(Kind::Secret, &s.name);
            }
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|e| (e.env.as_ref(), e.env_from.as_ref()));
    let regular = containers.map(|c: &Container| (c.env.as_ref(), c.env_from.as_ref()));
    for (env, env_from) in regular.chain(ephemeral) {
        for from in env
            .into_iter()
            .flatten()
            .filter_map(|e| e.value_from.as_ref())
        {
            if let Some(r) = &from.config_map_key_ref {
                add(Kind::ConfigMap, &r.name);
            }
            if let Some(r) = &from.secret_key_ref {
                add(Kind::Secret, &r.name);
            }
        }
        for from in env_from.into_iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                add(Kind::ConfigMap, &r.name);
            }
            if let Some(r) = &from.secret_ref {
                add(Kind::Secret, &r.name);
            }
        }
    }
    for s in spec.image_pull_secrets.iter().flatten() {
        add(Kind::Secret, &s.name);
    }
    out
}

/// The metadata of a copy of root object `root` (a `kind`) in `namespace`.
fn copy_meta(kind: Kind, root: &ObjectMeta, marks: &Marks, namespace: &str) -> ObjectMeta {
    let mut labels = root.labels.clone().unwrap_or_default();
    labels.insert(OWNER_LABEL.to_string(), marks.owner.clone());
    labels.insert(NODE_LABEL.to_string(), marks.node.clone());
    ObjectMeta {
        name: root.name.as_deref().map(|n| leaf_name(kind, n).to_string()),
        namespace: Some(namespace.to_string()),
        labels: Some(labels),
        annotations: Some(BTreeMap::from([(
            SOURCE_VERSION.to_string(),
            root.resource_version.clone().unwrap_or_default(),
        )])),
        ..ObjectMeta::default()
    }
}

/// The leaf copy of ConfigMap `root` in `namespace`.
pub fn config_map_copy(root: &ConfigMap, marks: &Marks, namespace: &str) -> ConfigMap {
    ConfigMap {
        metadata: copy_meta(Kind::ConfigMap, &root.metadata, marks, namespace),
        data: root.data.clone(),
        binary_data: root.binary_data.clone(),
        immutable: root.immutable,
    }
}

/// The leaf copy of Secret `root` in `namespace`; `None` for a service-account token Secret,
/// which only stands for the root's service account (and the leaf's controller would fill in
/// the leaf's token).
pub fn secret_copy(root: &Secret, marks: &Marks, namespace: &str) -> Option<Secret> {
    if root.type_.as_deref() == Some("kubernetes.io/service-account-token") {
        return None;
    }
    Some(Secret {
        metadata: copy_meta(Kind::Secret, &root.metadata, marks, namespace),
        data: root.data.clone(),
        string_data: None,
        type_: root.type_.clone(),
        immutable: root.immutable,
    })
}

/// Whether leaf copy `leaf` was made from root object version `version`.
pub fn current(leaf: &ObjectMeta, version: Option<&str>) -> bool {
    leaf.annotations
        .as_ref()
        .and_then(|a| a.get(SOURCE_VERSION))
        .map(String::as_str)
        == version
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_place_a_pod_names_a_config_map_or_secret() {
        let spec: PodSpec = serde_json::from_value(json!({
            "imagePullSecrets": [{"name": "registry"}],
            "volumes": [
                {"name": "a", "configMap": {"name": "cm-volume"}},
                {"name": "b", "secret": {"secretName": "secret-volume"}},
                {"name": "c", "projected": {"sources": [
                    {"configMap": {"name": "cm-projected"}},
                    {"secret": {"name": "secret-projected"}},
                    {"configMap": {"name": "kube-root-ca.crt"}},
                    {"serviceAccountToken": {"path": "token"}}
                ]}},
                {"name": "d", "emptyDir": {}}
            ],
            "initContainers": [{"name": "init", "env": [
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm-init-env", "key": "k"}}}
            ]}],
            "containers": [{"name": "main",
                "env": [
                    {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "secret-env", "key": "k"}}},
                    {"name": "Z", "value": "literal"},
                    {"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ],
                "envFrom": [{"configMapRef": {"name": "cm-env-from"}}, {"secretRef": {"name": "secret-env-from"}}]
            }],
            "ephemeralContainers": [{"name": "debug", "envFrom": [{"configMapRef": {"name": "cm-debug"}}]}]
        }))
        .unwrap();
        let got: Vec<String> = references(&spec, false)
            .into_iter()
            .map(|(k, n)| format!("{}/{n}", k.name()))
            .collect();
        assert_eq!(
            got,
            [
                "ConfigMap/cm-debug",
                "ConfigMap/cm-env-from",
                "ConfigMap/cm-init-env",
                "ConfigMap/cm-projected",
                "ConfigMap/cm-volume",
                "Secret/registry",
                "Secret/secret-env",
                "Secret/secret-env-from",
                "Secret/secret-projected",
                "Secret/secret-volume",
            ],
            "kube-root-ca.crt is the leaf's own"
        );
        // With the root's tokens, the root's CA goes with them, under another name.
        let with_tokens = references(&spec, true);
        assert!(with_tokens.contains(&(Kind::ConfigMap, ROOT_CA.to_string())));
        assert_eq!(leaf_name(Kind::ConfigMap, ROOT_CA), "relaylet-root-ca.crt");
        assert_eq!(
            leaf_name(Kind::Secret, ROOT_CA),
            ROOT_CA,
            "only the ConfigMap"
        );
        let root_ca: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "kube-root-ca.crt", "resourceVersion": "1"},
            "data": {"ca.crt": "PEM"}
        }))
        .unwrap();
        let copy = config_map_copy(&root_ca, &marks(), "leaf-team");
        assert_eq!(copy.metadata.name.as_deref(), Some("relaylet-root-ca.crt"));
    }

    fn marks() -> Marks {
        Marks {
            owner: "relaylet".into(),
            node: "relaylet-leaf-1".into(),
            marker: "relaylet.io/root-pod-uid".into(),
        }
    }

    #[test]
    fn copies_keep_the_data_and_carry_the_marks_and_source_version() {
        let root: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "team", "uid": "u", "resourceVersion": "7",
                "labels": {"app": "web"}, "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "p"}]},
            "data": {"index.html": "hello"},
            "binaryData": {"logo": "AAEC"}
        }))
        .unwrap();
        let copy = serde_json::to_value(config_map_copy(&root, &marks(), "leaf-team")).unwrap();
        assert_eq!(
            copy,
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "web", "namespace": "leaf-team",
                    "labels": {"app": "web", "relaylet.io/owner": "relaylet", "relaylet.io/node": "relaylet-leaf-1"},
                    "annotations": {"relaylet.io/source-version": "7"}},
                "data": {"index.html": "hello"},
                "binaryData": {"logo": "AAEC"}
            })
        );
        let made: ConfigMap = serde_json::from_value(copy).unwrap();
        assert!(current(&made.metadata, Some("7")));
        assert!(!current(&made.metadata, Some("8")));

        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "db", "resourceVersion": "3"},
            "type": "Opaque", "data": {"password": "cw=="}
        }))
        .unwrap();
        let copy = secret_copy(&secret, &marks(), "leaf-team").unwrap();
        assert_eq!(copy.type_.as_deref(), Some("Opaque"));
        assert_eq!(copy.data, secret.data);
        let token: Secret = serde_json::from_value(json!({
            "metadata": {"name": "t"}, "type": "kubernetes.io/service-account-token"
        }))
        .unwrap();
        assert!(
            secret_copy(&token, &marks(), "leaf-team").is_none(),
            "never copied"
        );
    }
}

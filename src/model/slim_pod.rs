//! A pod as relaylet's watches read it: only the fields relaylet uses (name, namespace, UID,
//! resourceVersion, node, phase and the reason it ended, resource requests). Everything else in each object's JSON
//! (annotations, labels, managedFields, env, volumes, most of the status) is skipped while it
//! is parsed and never allocated. So a pod with a 64 KiB annotation costs, even for the moment
//! its event is read, what a small pod costs (`tests/it/slim_decode.rs`).
//!
//! It is a [`kube::Resource`] of its own (same group, version and plural as `Pod`), so kube's
//! watcher and `Api` decode straight into it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

/// A pod, reduced as it is decoded.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimPod {
    #[serde(default, deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    pub spec: Option<SlimSpec>,
    pub status: Option<SlimStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimSpec {
    pub node_name: Option<String>,
    pub containers: Option<Vec<SlimContainer>>,
    pub init_containers: Option<Vec<SlimContainer>>,
    pub overhead: Option<BTreeMap<String, Quantity>>,
}

/// Of a container, only its resource requests.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimContainer {
    pub resources: Option<SlimResources>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimResources {
    pub requests: Option<BTreeMap<String, Quantity>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct SlimStatus {
    pub phase: Option<String>,
    /// Why a pod ended, when it did not end by itself (`Evicted`); rare, and short.
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// The metadata fields kept; the rest of `metadata` is skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let meta = Option::<SlimMeta>::deserialize(d)?;
    Ok(meta.map_or_else(ObjectMeta::default, |m| ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        ..ObjectMeta::default()
    }))
}

impl SlimPod {
    /// The node the pod is bound to.
    pub fn node_name(&self) -> Option<&str> {
        self.spec.as_ref()?.node_name.as_deref()
    }

    /// Its phase, if the status has one.
    pub fn phase(&self) -> Option<&str> {
        self.status.as_ref()?.phase.as_deref()
    }

    /// Its containers' requests, then its init containers', then its overhead.
    pub fn containers(&self) -> impl Iterator<Item = &SlimContainer> {
        self.spec.iter().flat_map(|s| s.containers.iter().flatten())
    }

    pub fn init_containers(&self) -> impl Iterator<Item = &SlimContainer> {
        self.spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
    }

    pub fn overhead(&self) -> impl Iterator<Item = (&String, &Quantity)> {
        self.spec.iter().flat_map(|s| s.overhead.iter().flatten())
    }
}

impl SlimContainer {
    pub fn requests(&self) -> impl Iterator<Item = (&String, &Quantity)> {
        self.resources
            .iter()
            .flat_map(|r| r.requests.iter().flatten())
    }
}

impl kube::Resource for SlimPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::{Resource, ResourceExt};
    use serde_json::json;

    /// A pod with every kind of bulk relaylet has no use for.
    fn fat_pod(bulk: usize) -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "namespace": "default",
                "name": "web",
                "uid": "u-1",
                "resourceVersion": "42",
                "annotations": {"example.com/big": "x".repeat(bulk)},
                "labels": {"app": "web"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:metadata": {}}}],
                "ownerReferences": null,
            },
            "spec": {
                "nodeName": "leaf-node-1",
                "containers": [{
                    "name": "main",
                    "image": "registry.example.com/web:1",
                    "env": [{"name": "BIG", "value": "y".repeat(bulk)}],
                    "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": null},
                }],
                "initContainers": null,
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
            "status": {"phase": "Running", "podIP": "10.0.0.7", "conditions": []},
        })
    }

    #[test]
    fn keeps_what_relaylet_uses_and_nothing_else() {
        let pod: SlimPod = serde_json::from_value(fat_pod(64 * 1024)).unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(pod.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(pod.resource_version().as_deref(), Some("42"));
        assert!(pod.metadata.annotations.is_none());
        assert!(pod.metadata.labels.is_none());
        assert!(pod.metadata.managed_fields.is_none());
        assert_eq!(pod.node_name(), Some("leaf-node-1"));
        assert_eq!(pod.phase(), Some("Running"));
        let requests: Vec<(String, String)> = pod
            .containers()
            .flat_map(|c| c.requests())
            .map(|(r, q)| (r.clone(), q.0.clone()))
            .collect();
        assert_eq!(
            requests,
            [
                ("cpu".to_string(), "250m".to_string()),
                ("memory".to_string(), "64Mi".to_string())
            ]
        );
        assert_eq!(pod.init_containers().count(), 0);
    }

    #[test]
    fn missing_and_null_parts_are_empty_not_errors() {
        for value in [
            json!({}),
            json!({"metadata": null, "spec": null, "status": null}),
            json!({"metadata": {"name": "p"}, "spec": {"containers": null}}),
            json!({"spec": {"containers": [{"resources": null}, {"resources": {"requests": null}}]}}),
        ] {
            let pod: SlimPod = serde_json::from_value(value.clone()).unwrap();
            assert_eq!(
                pod.containers().flat_map(|c| c.requests()).count(),
                0,
                "{value}"
            );
            assert_eq!(pod.node_name(), None);
        }
    }

    #[test]
    fn is_addressed_as_pods_in_the_core_group() {
        assert_eq!(SlimPod::api_version(&()), "v1");
        assert_eq!(SlimPod::kind(&()), "Pod");
        assert_eq!(
            SlimPod::url_path(&(), Some("ns")),
            "/api/v1/namespaces/ns/pods"
        );
    }
}

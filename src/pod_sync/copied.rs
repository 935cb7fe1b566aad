//! The ConfigMaps and Secrets one leaf's pods name, copied into the leaf and kept in step: each
//! copy is made before the first pod that names it, written again when its root object
//! changes (looked at every few seconds while a pod names it), deleted when the root object is
//! gone or no pod of this Node names it any more, and copies left by an earlier run are swept.
//! Only copies with relaylet's marks are ever written or deleted: a leaf object of the same name
//! that is not relaylet's is left alone (the pod uses it).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};

use super::marks::Marks;
use super::references::{Kind, References, config_map_copy, current, leaf_name, secret_copy};
use super::sync_error::SyncError;
use super::tokens::TOKENS_FOR_LABEL;
use crate::kube_client::{Calls, continued, paged};
use crate::ops::Metrics;

/// Copies per LIST page when sweeping.
const PAGE: u32 = 500;

/// relaylet's field manager in the leaf.
const MANAGER: &str = "relaylet";

/// A copied object: its kind, and its name in the root and the leaf namespace.
type Object = (Kind, String, String, String);

/// A pod's root namespace and name.
type Pod = (String, String);

/// Who names one object, and the root version its copy was made from (`None` until copied,
/// or while the root object is missing).
#[derive(Default)]
struct Entry {
    pods: HashSet<Pod>,
    version: Option<String>,
}

/// One leaf's copies and the pods (root namespace and name) that name each.
pub struct Copied {
    entries: Mutex<BTreeMap<Object, Entry>>,
}

impl Copied {
    pub fn new() -> Copied {
        Copied {
            entries: Mutex::new(BTreeMap::new()),
        }
    }

    /// Notes that pod `pod` (root namespace `namespace`, its copy in `leaf_namespace`) names
    /// `references` now, copying what it names that is not copied yet; copies no pod names any
    /// more are deleted. The objects the pod names that are gone are `Ok` (the pod waits in the
    /// leaf as it would in the root).
    pub async fn follow(
        &self,
        io: &Io<'_>,
        pod: &Pod,
        leaf_namespace: &str,
        references: &References,
    ) -> Result<(), SyncError> {
        let wanted: Vec<Object> = references
            .iter()
            .map(|(kind, name)| {
                (
                    *kind,
                    pod.0.clone(),
                    leaf_namespace.to_string(),
                    name.clone(),
                )
            })
            .collect();
        let (missing, unused) = {
            let mut entries = lock(&self.entries);
            let mut missing = Vec::new();
            for object in &wanted {
                let entry = entries.entry(object.clone()).or_default();
                entry.pods.insert(pod.clone());
                if entry.version.is_none() {
                    missing.push(object.clone());
                }
            }
            (missing, release(&mut entries, pod, &wanted))
        };
        for object in &missing {
            let version = io.copy(object).await?;
            self.copied(object, version);
        }
        for object in unused {
            io.delete(&object).await?;
        }
        Ok(())
    }

    /// Pod `pod` is gone: the copies it alone named are deleted.
    pub async fn forget(&self, io: &Io<'_>, pod: &Pod) -> Result<(), SyncError> {
        let unused = release(&mut lock(&self.entries), pod, &[]);
        for object in unused {
            io.delete(&object).await?;
        }
        Ok(())
    }

    /// Brings every copy a pod names in step with its root object: one metadata read of the
    /// root object each, spread over at least `round` and at most `per_second` a second; the
    /// object is read whole and copied again only when its version moved.
    pub async fn refresh(&self, io: &Io<'_>, round: Duration, per_second: u32) {
        let objects: Vec<(Object, Option<String>)> = lock(&self.entries)
            .iter()
            .map(|(o, e)| (o.clone(), e.version.clone()))
            .collect();
        if objects.is_empty() {
            tokio::time::sleep(round).await;
            return;
        }
        let gap =
            (round / objects.len().max(1) as u32).max(Duration::from_secs(1) / per_second.max(1));
        for (object, version) in objects {
            tokio::time::sleep(gap).await;
            let result = match io.root_version(&object).await {
                Ok(now) if now == version => Ok(()),
                Ok(_) => io.copy(&object).await.map(|v| self.copied(&object, v)),
                Err(err) => Err(err),
            };
            if let Err(err) = result {
                tracing::warn!(leaf = %io.leaf_name, kind = object.0.name(), namespace = %object.1, name = %object.3, %err, "keeping a copy in the leaf in step");
            }
        }
    }

    /// Deletes the copies in the leaf no pod names (left by an earlier run, or named by pods
    /// gone meanwhile). Without the right to list them in every namespace (the namespaced leaf
    /// RBAC), only the namespaces the pods use now are looked at.
    pub async fn sweep(&self, io: &Io<'_>) -> Result<(), SyncError> {
        let (named, namespaces) = {
            let entries = lock(&self.entries);
            let named: HashSet<(Kind, String, String)> = entries
                .keys()
                .map(|(k, _, leaf_ns, name)| (*k, leaf_ns.clone(), leaf_name(*k, name).to_string()))
                .collect();
            let namespaces: BTreeSet<String> = entries
                .keys()
                .map(|(_, _, leaf_ns, _)| leaf_ns.clone())
                .collect();
            (named, namespaces)
        };
        for kind in [Kind::ConfigMap, Kind::Secret] {
            let found = match io.copies(kind, None).await {
                Err(SyncError::Leaf(kube::Error::Api(e))) if e.code == 403 => {
                    let mut found = Vec::new();
                    for namespace in &namespaces {
                        found.extend(io.copies(kind, Some(namespace)).await?);
                    }
                    found
                }
                found => found?,
            };
            for (namespace, name, uid) in found {
                if !named.contains(&(kind, namespace.clone(), name.clone())) {
                    io.delete_copy(kind, &namespace, &name, uid).await?;
                }
            }
        }
        Ok(())
    }

    /// Notes the root version `object`'s copy was made from, if a pod still names it.
    fn copied(&self, object: &Object, version: Option<String>) {
        if let Some(entry) = lock(&self.entries).get_mut(object) {
            entry.version = version;
        }
    }
}

/// Takes `pod` off every object but `keep`; the objects no pod names any more.
fn release(entries: &mut BTreeMap<Object, Entry>, pod: &Pod, keep: &[Object]) -> Vec<Object> {
    let mut unused = Vec::new();
    entries.retain(|object, entry| {
        if !keep.contains(object) {
            entry.pods.remove(pod);
        }
        if entry.pods.is_empty() {
            unused.push(object.clone());
            false
        } else {
            true
        }
    });
    unused
}

fn meta_key(meta: ObjectMeta) -> (String, String, Option<String>) {
    (
        meta.namespace.unwrap_or_default(),
        meta.name.unwrap_or_default(),
        meta.uid,
    )
}

/// Where the copies are read and written.
pub struct Io<'a> {
    pub leaf_name: &'a str,
    pub root: &'a Client,
    pub leaf: Calls,
    pub marks: &'a Marks,
    pub metrics: &'a Metrics,
}

impl Io<'_> {
    /// The root object's resourceVersion (`None`: it is gone).
    async fn root_version(&self, object: &Object) -> Result<Option<String>, SyncError> {
        let (kind, namespace, _, name) = object;
        let meta = match kind {
            Kind::ConfigMap => Api::<ConfigMap>::namespaced(self.root.clone(), namespace)
                .get_metadata_opt(name)
                .await
                .map(|o| o.map(|o| o.metadata)),
            Kind::Secret => Api::<Secret>::namespaced(self.root.clone(), namespace)
                .get_metadata_opt(name)
                .await
                .map(|o| o.map(|o| o.metadata)),
        };
        Ok(meta
            .map_err(SyncError::Root)?
            .and_then(|m| m.resource_version))
    }

    /// The root object's leaf copy, and the root version it stands for (`None`, `None`: the
    /// root object is gone; `None`, `Some`: it is not to be copied).
    async fn root_copy(
        &self,
        object: &Object,
    ) -> Result<(Option<serde_json::Value>, Option<String>), SyncError> {
        let (kind, namespace, leaf_namespace, name) = object;
        let to_value = |v: Result<serde_json::Value, serde_json::Error>| {
            v.map_err(|e| SyncError::Root(kube::Error::SerdeError(e)))
        };
        Ok(match kind {
            Kind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(self.root.clone(), namespace);
                match api.get_opt(name).await.map_err(SyncError::Root)? {
                    Some(o) => (
                        Some(to_value(serde_json::to_value(config_map_copy(
                            &o,
                            self.marks,
                            leaf_namespace,
                        )))?),
                        o.metadata.resource_version,
                    ),
                    None => (None, None),
                }
            }
            Kind::Secret => {
                let api: Api<Secret> = Api::namespaced(self.root.clone(), namespace);
                match api.get_opt(name).await.map_err(SyncError::Root)? {
                    Some(o) => (
                        secret_copy(&o, self.marks, leaf_namespace)
                            .map(|c| to_value(serde_json::to_value(c)))
                            .transpose()?,
                        o.metadata.resource_version,
                    ),
                    None => (None, None),
                }
            }
        })
    }

    /// Copies `object` into the leaf unless its copy is current, and deletes the copy when the
    /// root object is gone; the root version the copy now stands for.
    async fn copy(&self, object: &Object) -> Result<Option<String>, SyncError> {
        let (kind, _, leaf_namespace, name) = object;
        let name = leaf_name(*kind, name);
        let (copy, version) = self.root_copy(object).await?;
        let existing = self.leaf_meta(*kind, leaf_namespace, name).await?;
        if let Some(meta) = &existing
            && !self.marks.ours(meta)
        {
            // A leaf object of that name that is not relaylet's: the pod uses it.
            return Ok(version);
        }
        let Some(copy) = copy else {
            if let Some(meta) = existing {
                self.delete_copy(*kind, leaf_namespace, name, meta.uid)
                    .await?;
            }
            return Ok(None);
        };
        if existing
            .as_ref()
            .is_some_and(|meta| current(meta, version.as_deref()))
        {
            return Ok(version);
        }
        let params = PatchParams::apply(MANAGER).force();
        let written = match kind {
            Kind::ConfigMap => self
                .leaf
                .patch::<ConfigMap, _>(Some(leaf_namespace), name, &params, &Patch::Apply(copy))
                .await
                .map(drop),
            Kind::Secret => self
                .leaf
                .patch::<Secret, _>(Some(leaf_namespace), name, &params, &Patch::Apply(copy))
                .await
                .map(drop),
        };
        written.map_err(SyncError::Leaf)?;
        self.metrics.pod_sync_action("leaf_copy");
        Ok(version)
    }

    /// relaylet's copies of `kind` in `namespace` (or every namespace): their namespace, name and
    /// UID, read a page at a time. Token Secrets (`tokens`) are not among them.
    async fn copies(
        &self,
        kind: Kind,
        namespace: Option<&str>,
    ) -> Result<Vec<(String, String, Option<String>)>, SyncError> {
        let selector = format!("{},!{TOKENS_FOR_LABEL}", self.marks.selector());
        let params = ListParams::default().labels(&selector).limit(PAGE);
        let listed = paged(|token| {
            let params = continued(&params, token);
            async move {
                match kind {
                    Kind::ConfigMap => self.copies_page::<ConfigMap>(namespace, &params).await,
                    Kind::Secret => self.copies_page::<Secret>(namespace, &params).await,
                }
            }
        })
        .await;
        listed.map_err(SyncError::Leaf)
    }

    /// One page of `K`s in the leaf: their keys, and where the next page starts.
    async fn copies_page<K>(
        &self,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<(Vec<(String, String, Option<String>)>, Option<String>), kube::Error>
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + Clone,
    {
        let list = self.leaf.list_metadata::<K>(namespace, params).await?;
        let keys = list
            .items
            .into_iter()
            .map(|o| meta_key(o.metadata))
            .collect();
        Ok((keys, list.metadata.continue_))
    }

    /// Deletes `object`'s copy, if it is relaylet's.
    async fn delete(&self, object: &Object) -> Result<(), SyncError> {
        let (kind, _, leaf_namespace, name) = object;
        let name = leaf_name(*kind, name);
        match self.leaf_meta(*kind, leaf_namespace, name).await? {
            Some(meta) if self.marks.ours(&meta) => {
                self.delete_copy(*kind, leaf_namespace, name, meta.uid)
                    .await
            }
            _ => Ok(()),
        }
    }

    /// Deletes copy `namespace/name` (UID `uid` as precondition).
    async fn delete_copy(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        uid: Option<String>,
    ) -> Result<(), SyncError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let result = match kind {
            Kind::ConfigMap => {
                self.leaf
                    .delete::<ConfigMap>(Some(namespace), name, &params)
                    .await
            }
            Kind::Secret => {
                self.leaf
                    .delete::<Secret>(Some(namespace), name, &params)
                    .await
            }
        };
        match result {
            Ok(_) => {
                self.metrics.pod_sync_action("leaf_uncopy");
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(err) => Err(SyncError::Leaf(err)),
        }
    }

    async fn leaf_meta(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ObjectMeta>, SyncError> {
        let meta = match kind {
            Kind::ConfigMap => self
                .leaf
                .get_metadata_opt::<ConfigMap>(namespace, name)
                .await
                .map(|o| o.map(|o| o.metadata)),
            Kind::Secret => self
                .leaf
                .get_metadata_opt::<Secret>(namespace, name)
                .await
                .map(|o| o.map(|o| o.metadata)),
        };
        meta.map_err(SyncError::Leaf)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(name: &str) -> Object {
        (Kind::ConfigMap, "team".into(), "team".into(), name.into())
    }

    fn pod(name: &str) -> Pod {
        ("team".into(), name.into())
    }

    #[test]
    fn an_object_is_unused_only_when_the_last_pod_naming_it_lets_go() {
        let mut entries = BTreeMap::new();
        for (p, named) in [("a", &["shared", "only-a"][..]), ("b", &["shared"][..])] {
            for o in named {
                entries
                    .entry(object(o))
                    .or_insert_with(Entry::default)
                    .pods
                    .insert(pod(p));
            }
        }
        // Pod a stops naming only-a (its spec changed): that one is unused, shared is kept.
        assert_eq!(
            release(&mut entries, &pod("a"), &[object("shared")]),
            [object("only-a")]
        );
        // Pod a goes: b still names shared.
        assert!(release(&mut entries, &pod("a"), &[]).is_empty());
        assert_eq!(release(&mut entries, &pod("b"), &[]), [object("shared")]);
        assert!(entries.is_empty());
    }
}

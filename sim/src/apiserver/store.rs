//! The in-memory object store: every object of every kind, one global resourceVersion counter,
//! and a bounded history of changes that watches replay.
//!
//! Like etcd behind kube-apiserver, each write bumps the global revision and stamps it on the
//! object; a watch resumes from any revision still in the history and gets 410 Gone for older
//! ones. The store is cheap to clone (shared state) so tests and the sandbox can seed and read
//! objects directly, typed or as JSON, while the HTTP layer serves the same data.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::clock;
use super::failure::Failure;
use super::kinds::{self, Flavor, Kind};

/// Changes kept for watches to resume from, unless changed with [`Store::set_history_limit`].
pub const DEFAULT_HISTORY: usize = 10_000;

/// Where one object lives.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjKey {
    pub group: &'static str,
    pub resource: &'static str,
    /// "" for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Added,
    Modified,
    Deleted,
}

/// One change, as recorded in the history.
#[derive(Clone, Debug)]
pub struct Event {
    pub rv: u64,
    pub change: Change,
    pub key: ObjKey,
    /// The object after the change (for deletes: the last state, stamped with the delete's RV).
    pub object: Arc<Value>,
    /// The object before the change, so watches with selectors can tell an object entering or
    /// leaving their selection.
    pub previous: Option<Arc<Value>>,
}

/// Why a watch cannot resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooOld {
    pub requested: u64,
    pub oldest: u64,
}

struct State {
    rv: u64,
    objects: BTreeMap<ObjKey, Arc<Value>>,
    history: VecDeque<Event>,
    history_limit: usize,
    /// Highest revision whose event is no longer in the history.
    compacted: u64,
}

struct Shared {
    state: Mutex<State>,
    /// The latest revision; watches wait on it for news.
    latest: watch::Sender<u64>,
    /// The latest revision per resource (group, plural) that a watch of it waits on, so a write
    /// wakes only the watches of its resource, as kube-apiserver's watch cache (one per
    /// resource) does. With one signal for all, each Lease renewal of a 1,000-leaf fleet woke
    /// thousands of Node and pod watches.
    by_resource: Mutex<HashMap<Resource, watch::Sender<u64>>>,
}

/// A resource as (group, plural).
type Resource = (&'static str, &'static str);

/// Whether a write is stored or only checked (`dryRun=All`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Write {
    Commit,
    DryRun,
}

/// The object store; clones share the same data.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    pub fn new() -> Self {
        let (latest, _) = watch::channel(0);
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    rv: 0,
                    objects: BTreeMap::new(),
                    history: VecDeque::new(),
                    history_limit: DEFAULT_HISTORY,
                    compacted: 0,
                }),
                latest,
                by_resource: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-written map (every write is one
        // insert or remove), so a poisoned lock is still consistent.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current global resourceVersion.
    pub fn revision(&self) -> u64 {
        self.lock().rv
    }

    /// A receiver that changes whenever the revision does.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.latest.subscribe()
    }

    /// A receiver that changes whenever an object of `kind`'s resource does (and on a
    /// namespace's deletion, which may remove any).
    pub fn subscribe_kind(&self, kind: &Kind) -> watch::Receiver<u64> {
        let mut map = self
            .shared
            .by_resource
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.entry((kind.group, kind.resource))
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Tells the watches that revision `rv` is stored: those of `resource`, or all of them.
    fn notify(&self, rv: u64, resource: Option<Resource>) {
        self.shared.latest.send_replace(rv);
        let map = self
            .shared
            .by_resource
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match resource {
            Some(r) => {
                if let Some(tx) = map.get(&r) {
                    tx.send_replace(rv);
                }
            }
            None => map.values().for_each(|tx| {
                tx.send_replace(rv);
            }),
        }
    }

    /// Keeps at most `limit` changes for watches (older resumes get 410 Gone).
    pub fn set_history_limit(&self, limit: usize) {
        let mut state = self.lock();
        state.history_limit = limit;
        trim(&mut state);
    }

    /// Forgets all history, as an etcd compaction does: every watch resuming from an older
    /// revision than now gets 410 Gone and must relist.
    pub fn compact(&self) {
        let mut state = self.lock();
        state.compacted = state.rv;
        state.history.clear();
    }

    /// Changes after `rv` and the revision they bring a watcher up to, or [`TooOld`] when
    /// some of them are no longer kept.
    pub fn events_since(&self, rv: u64) -> Result<(Vec<Event>, u64), TooOld> {
        let state = self.lock();
        if rv < state.compacted {
            return Err(TooOld {
                requested: rv,
                oldest: state.compacted + 1,
            });
        }
        // History is in revision order, so the first unseen event is found by bisection.
        let first = state.history.partition_point(|e| e.rv <= rv);
        let events = state.history.range(first..).cloned().collect();
        Ok((events, state.rv.max(rv)))
    }

    /// One object.
    pub fn get(&self, kind: &'static Kind, namespace: &str, name: &str) -> Result<Value, Failure> {
        let key = key(kind, namespace, name);
        self.lock()
            .objects
            .get(&key)
            .map(|v| (**v).clone())
            .ok_or_else(|| Failure::not_found(kind, name))
    }

    /// All objects of `kind` (in `namespace` when given), in key order, and the revision they
    /// were read at.
    pub fn list(&self, kind: &'static Kind, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let state = self.lock();
        let items = state
            .objects
            .iter()
            .filter(|(k, _)| k.group == kind.group && k.resource == kind.resource)
            .filter(|(k, _)| namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(_, v)| v.clone())
            .collect();
        (items, state.rv)
    }

    /// Stores a new object, filling in what the server owns (uid, resourceVersion,
    /// creationTimestamp, a name from `generateName`).
    pub fn create(
        &self,
        kind: &'static Kind,
        namespace: &str,
        obj: Value,
    ) -> Result<Value, Failure> {
        self.create_with(kind, namespace, obj, Write::Commit)
    }

    /// Everything [`Store::create`] checks and fills in, without storing (`dryRun=All`).
    pub fn create_dry_run(
        &self,
        kind: &'static Kind,
        namespace: &str,
        obj: Value,
    ) -> Result<Value, Failure> {
        self.create_with(kind, namespace, obj, Write::DryRun)
    }

    fn create_with(
        &self,
        kind: &'static Kind,
        namespace: &str,
        mut obj: Value,
        write: Write,
    ) -> Result<Value, Failure> {
        if kind.flavor == Flavor::Review {
            return Err(Failure::method_not_allowed("store", kind));
        }
        let Some(fields) = obj.as_object_mut() else {
            return Err(Failure::bad_request("the object must be a JSON object"));
        };
        fields.insert("apiVersion".into(), json!(kind.api_version()));
        fields.insert("kind".into(), json!(kind.kind));
        super::defaults::defaults(kind, &mut obj);
        let Some(fields) = obj.as_object_mut() else {
            return Err(Failure::bad_request("the object must be a JSON object"));
        };
        let meta = fields
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        let Some(meta) = meta.as_object_mut() else {
            return Err(Failure::bad_request("metadata must be an object"));
        };
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            let prefix = meta
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if prefix.is_empty() {
                return Err(Failure::invalid(
                    kind,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ));
            }
            name = format!("{prefix}{}", random_suffix());
        }
        validate_name(kind, &name)?;
        if kind.namespaced() {
            if namespace.is_empty() {
                return Err(Failure::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), json!(namespace));
        } else {
            meta.remove("namespace");
        }
        meta.insert("name".into(), json!(name));
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), json!(clock::now()));
        meta.remove("deletionTimestamp");
        meta.remove("selfLink");
        if kind.kind == "Namespace" {
            let phase = obj
                .pointer_mut("/status")
                .and_then(Value::as_object_mut)
                .map(|s| s.insert("phase".into(), json!("Active")));
            if phase.is_none() {
                obj["status"] = json!({ "phase": "Active" });
            }
            obj["spec"] = json!({ "finalizers": ["kubernetes"] });
        }

        let key = key(kind, namespace, &name);
        let mut state = self.lock();
        if kind.namespaced() {
            let ns_key = ObjKey {
                group: "",
                resource: "namespaces",
                namespace: String::new(),
                name: namespace.to_string(),
            };
            if !state.objects.contains_key(&ns_key)
                && let Some(namespaces) = kinds::by_resource("", "namespaces")
            {
                return Err(Failure::not_found(namespaces, namespace));
            }
        }
        if state.objects.contains_key(&key) {
            return Err(Failure::already_exists(kind, &name));
        }
        if write == Write::DryRun {
            return Ok(obj);
        }
        let rv = bump(&mut state);
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let stored = Arc::new(obj);
        state.objects.insert(key.clone(), stored.clone());
        let resource = (key.group, key.resource);
        record(&mut state, rv, Change::Added, key, stored.clone(), None);
        drop(state);
        self.notify(rv, Some(resource));
        Ok((*stored).clone())
    }

    /// Replaces an object with what `change` makes of the current one, atomically. `change`
    /// returns the new object; metadata the server owns is carried over, and a
    /// `metadata.resourceVersion` in the new object must match the stored one (409 otherwise).
    pub fn modify(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Value, Failure>,
    ) -> Result<Value, Failure> {
        self.modify_with(kind, namespace, name, change, Write::Commit)
    }

    /// Everything [`Store::modify`] checks and computes, without storing (`dryRun=All`).
    pub fn modify_dry_run(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Value, Failure>,
    ) -> Result<Value, Failure> {
        self.modify_with(kind, namespace, name, change, Write::DryRun)
    }

    fn modify_with(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Value, Failure>,
        write: Write,
    ) -> Result<Value, Failure> {
        let key = key(kind, namespace, name);
        let mut state = self.lock();
        let current = state
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| Failure::not_found(kind, name))?;
        let mut next = change(&current)?;
        let Some(fields) = next.as_object_mut() else {
            return Err(Failure::bad_request("the object must be a JSON object"));
        };
        fields.insert("apiVersion".into(), json!(kind.api_version()));
        fields.insert("kind".into(), json!(kind.kind));
        if !fields.get("metadata").is_some_and(Value::is_object) {
            fields.insert("metadata".into(), json!({}));
        }
        let given_name = next["metadata"]["name"].as_str().unwrap_or(name);
        if given_name != name {
            return Err(Failure::bad_request(format!(
                "the name of the object ({given_name}) does not match the name on the URL ({name})"
            )));
        }
        let sent_rv = next["metadata"]["resourceVersion"]
            .as_str()
            .filter(|rv| !rv.is_empty())
            .map(str::to_string);
        let stored_rv = current["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default();
        if sent_rv.as_deref().is_some_and(|rv| rv != stored_rv) {
            return Err(Failure::conflict(kind, name));
        }
        for owned in ["uid", "creationTimestamp", "namespace", "name"] {
            match current["metadata"].get(owned) {
                Some(v) => next["metadata"][owned] = v.clone(),
                None => {
                    if let Some(m) = next["metadata"].as_object_mut() {
                        m.remove(owned);
                    }
                }
            }
        }
        next["metadata"]["resourceVersion"] = json!(stored_rv);
        if next == *current {
            // Nothing changed: upstream skips the write and keeps the revision.
            return Ok((*current).clone());
        }
        if write == Write::DryRun {
            return Ok(next);
        }
        let rv = bump(&mut state);
        next["metadata"]["resourceVersion"] = json!(rv.to_string());
        let stored = Arc::new(next);
        state.objects.insert(key.clone(), stored.clone());
        let resource = (key.group, key.resource);
        record(
            &mut state,
            rv,
            Change::Modified,
            key,
            stored.clone(),
            Some(current),
        );
        drop(state);
        self.notify(rv, Some(resource));
        Ok((*stored).clone())
    }

    /// Removes an object; a `precondition_rv` that does not match gives 409. Deleting a
    /// namespace removes everything in it too.
    pub fn delete(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        precondition_rv: Option<&str>,
    ) -> Result<Value, Failure> {
        let key = key(kind, namespace, name);
        let mut state = self.lock();
        let current = state
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| Failure::not_found(kind, name))?;
        if let Some(want) = precondition_rv
            && current["metadata"]["resourceVersion"].as_str() != Some(want)
        {
            return Err(Failure::conflict(kind, name));
        }
        let mut doomed = vec![key];
        if kind.kind == "Namespace" {
            doomed.extend(
                state
                    .objects
                    .keys()
                    .filter(|k| k.namespace == name)
                    .cloned(),
            );
            // Contents go first, as the namespace controller does.
            doomed.rotate_left(1);
        }
        let mut last = Value::Null;
        for key in doomed {
            let Some(old) = state.objects.remove(&key) else {
                continue;
            };
            let rv = bump(&mut state);
            let mut gone = (*old).clone();
            gone["metadata"]["resourceVersion"] = json!(rv.to_string());
            let gone = Arc::new(gone);
            record(
                &mut state,
                rv,
                Change::Deleted,
                key,
                gone.clone(),
                Some(old),
            );
            last = (*gone).clone();
        }
        let rv = state.rv;
        drop(state);
        let resource = (kind.kind != "Namespace").then_some((kind.group, kind.resource));
        self.notify(rv, resource);
        Ok(last)
    }

    /// Creates an object given as JSON with its `apiVersion`, `kind` and (for namespaced
    /// kinds) `metadata.namespace`, as a manifest would carry them.
    pub fn create_object(&self, obj: Value) -> Result<Value, Failure> {
        let (kind, namespace) = manifest_kind(&obj)?;
        self.create(kind, &namespace, obj)
    }

    /// Creates the object, or replaces the stored one with it whatever its resourceVersion
    /// (for seeding state in tests and the sandbox).
    pub fn upsert_object(&self, mut obj: Value) -> Result<Value, Failure> {
        let (kind, namespace) = manifest_kind(&obj)?;
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        match self.modify(kind, &namespace, &name, |_| Ok(obj.clone())) {
            Err(f) if f.reason == "NotFound" => self.create(kind, &namespace, obj),
            other => other,
        }
    }

    /// Creates a typed object (`k8s_openapi` types), returning what was stored.
    pub fn create_typed<K>(&self, obj: &K) -> Result<K, Failure>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let kind = typed_kind::<K>()?;
        let value = to_value(obj)?;
        let namespace = value["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        from_value(self.create(kind, &namespace, value)?)
    }

    /// Reads a typed object.
    pub fn get_typed<K>(&self, namespace: &str, name: &str) -> Result<K, Failure>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        from_value(self.get(typed_kind::<K>()?, namespace, name)?)
    }

    /// Replaces a typed object (same optimistic concurrency as the API: a set
    /// resourceVersion must be current).
    pub fn update_typed<K>(&self, obj: &K) -> Result<K, Failure>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let kind = typed_kind::<K>()?;
        let value = to_value(obj)?;
        let namespace = value["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        from_value(self.modify(kind, &namespace, &name, |_| Ok(value))?)
    }

    /// Deletes a typed object.
    pub fn delete_typed<K>(&self, namespace: &str, name: &str) -> Result<K, Failure>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        from_value(self.delete(typed_kind::<K>()?, namespace, name, None)?)
    }

    /// Lists typed objects (all namespaces when `namespace` is None).
    pub fn list_typed<K>(&self, namespace: Option<&str>) -> Result<Vec<K>, Failure>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let (items, _) = self.list(typed_kind::<K>()?, namespace);
        items
            .into_iter()
            .map(|v| from_value((*v).clone()))
            .collect()
    }
}

fn key(kind: &'static Kind, namespace: &str, name: &str) -> ObjKey {
    ObjKey {
        group: kind.group,
        resource: kind.resource,
        namespace: if kind.namespaced() {
            namespace.to_string()
        } else {
            String::new()
        },
        name: name.to_string(),
    }
}

fn bump(state: &mut State) -> u64 {
    state.rv += 1;
    state.rv
}

fn record(
    state: &mut State,
    rv: u64,
    change: Change,
    key: ObjKey,
    object: Arc<Value>,
    previous: Option<Arc<Value>>,
) {
    state.history.push_back(Event {
        rv,
        change,
        key,
        object,
        previous,
    });
    trim(state);
}

fn trim(state: &mut State) {
    while state.history.len() > state.history_limit {
        if let Some(dropped) = state.history.pop_front() {
            state.compacted = dropped.rv;
        }
    }
}

/// Object names must be DNS subdomains (lowercase alphanumerics, '-', '.'), at most 253
/// characters, as upstream validates for every kind served here.
fn validate_name(kind: &Kind, name: &str) -> Result<(), Failure> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ok_ends = name
        .bytes()
        .next()
        .zip(name.bytes().last())
        .is_some_and(|(a, z)| a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric());
    // Node names and metrics objects follow the same rule; review objects are never stored.
    if name.len() <= 253 && ok_chars && ok_ends {
        return Ok(());
    }
    Err(Failure::invalid(
        kind,
        name,
        "metadata.name",
        &format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ),
    ))
}

/// The served kind and namespace a JSON manifest names.
fn manifest_kind(obj: &Value) -> Result<(&'static Kind, String), Failure> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind_name = obj["kind"].as_str().unwrap_or_default();
    let kind = kinds::by_kind(api_version, kind_name).ok_or_else(|| {
        Failure::bad_request(format!(
            "no kind {kind_name:?} is served in version {api_version:?}"
        ))
    })?;
    let namespace = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok((kind, namespace))
}

fn typed_kind<K: k8s_openapi::Resource>() -> Result<&'static Kind, Failure> {
    kinds::by_resource(K::GROUP, K::URL_PATH_SEGMENT)
        .ok_or_else(|| Failure::internal(format!("kind {} is not served", K::KIND)))
}

fn to_value<K: Serialize>(obj: &K) -> Result<Value, Failure> {
    serde_json::to_value(obj).map_err(|e| Failure::internal(format!("encoding object: {e}")))
}

fn from_value<K: DeserializeOwned>(value: Value) -> Result<K, Failure> {
    serde_json::from_value(value).map_err(|e| Failure::internal(format!("decoding object: {e}")))
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// 64 random bits from the standard library's randomly keyed hasher, mixed with a counter so
/// two calls never collide.
fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

/// A random RFC 4122 version-4 UUID, as upstream stamps on every object.
pub fn new_uid() -> String {
    let (a, b) = (random_u64(), random_u64());
    let b = (b & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    let a = (a & 0xffff_ffff_ffff_0fff) | 0x0000_0000_0000_4000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// Five characters from upstream's generateName alphabet (no vowels, no confusables).
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(resource: &str) -> &'static Kind {
        kinds::by_resource("", resource).unwrap()
    }

    fn seeded() -> Store {
        let store = Store::new();
        store
            .create(
                kind("namespaces"),
                "",
                json!({"metadata": {"name": "default"}}),
            )
            .unwrap();
        store
    }

    #[test]
    fn create_fills_server_fields_and_rejects_duplicates() {
        let store = seeded();
        let cm = store
            .create(
                kind("configmaps"),
                "default",
                json!({"metadata": {"generateName": "cm-"}, "data": {"a": "1"}}),
            )
            .unwrap();
        let name = cm["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("cm-") && name.len() == 8, "{name}");
        assert_eq!(cm["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert_eq!(cm["metadata"]["resourceVersion"], "2");
        assert_eq!(cm["kind"], "ConfigMap");
        let again = store.create(kind("configmaps"), "default", cm.clone());
        assert_eq!(again.unwrap_err().reason, "AlreadyExists");
        let elsewhere = store.create(
            kind("configmaps"),
            "nowhere",
            json!({"metadata": {"name": "x"}}),
        );
        assert_eq!(
            elsewhere.unwrap_err().message,
            "namespaces \"nowhere\" not found"
        );
    }

    #[test]
    fn stale_update_conflicts_and_history_compacts() {
        let store = seeded();
        let cm = store
            .create(
                kind("configmaps"),
                "default",
                json!({"metadata": {"name": "c"}}),
            )
            .unwrap();
        let mut newer = cm.clone();
        newer["data"] = json!({"k": "v"});
        let stored = store
            .modify(kind("configmaps"), "default", "c", |_| Ok(newer.clone()))
            .unwrap();
        assert_eq!(stored["metadata"]["resourceVersion"], "3");
        let stale = store.modify(kind("configmaps"), "default", "c", |_| Ok(newer));
        assert_eq!(stale.unwrap_err().reason, "Conflict");
        assert_eq!(store.events_since(1).unwrap().0.len(), 2);
        store.compact();
        assert_eq!(
            store.events_since(1).unwrap_err(),
            TooOld {
                requested: 1,
                oldest: 4
            }
        );
        assert!(store.events_since(3).unwrap().0.is_empty());
    }

    #[test]
    fn manifests_create_and_upsert() {
        let store = seeded();
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "m", "namespace": "default"}, "data": {"a": "1"}});
        store.create_object(cm.clone()).unwrap();
        let mut changed = cm.clone();
        changed["data"]["a"] = json!("2");
        changed["metadata"]["resourceVersion"] = json!("999");
        assert_eq!(store.upsert_object(changed).unwrap()["data"]["a"], "2");
        assert_eq!(
            store
                .create_object(json!({"apiVersion": "v9", "kind": "Pod"}))
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn uids_are_version_4() {
        let a = new_uid();
        assert_ne!(a, new_uid());
        assert_eq!(&a[14..15], "4");
    }
}

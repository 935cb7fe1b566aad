//! Field paths and field sets, the vocabulary of server-side apply's ownership tracking.
//!
//! A path names one field, list item or set value inside an object, using the element forms
//! of upstream's `FieldsV1` encoding: `f:<field>`, `k:<json of key fields>` (an item of a
//! list-map), `v:<json value>` (an item of a set). A field set is every path an object
//! populates: leaves (scalars, atomic lists, empty maps), plus the "member" paths upstream
//! also records for list items and granular maps (written as `.` in `FieldsV1`).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::schema::{self, SsaList};

/// One step of a path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Elem {
    Field(String),
    /// Key fields of a list-map item, as a JSON object with sorted keys.
    Key(String),
    /// A set item, as JSON.
    Value(String),
}

impl Elem {
    /// The `FieldsV1` spelling.
    fn encode(&self) -> String {
        match self {
            Elem::Field(f) => format!("f:{f}"),
            Elem::Key(k) => format!("k:{k}"),
            Elem::Value(v) => format!("v:{v}"),
        }
    }

    fn decode(s: &str) -> Option<Elem> {
        let (tag, rest) = s.split_at_checked(2)?;
        match tag {
            "f:" => Some(Elem::Field(rest.to_string())),
            "k:" => Some(Elem::Key(canonical(rest)?)),
            "v:" => Some(Elem::Value(canonical(rest)?)),
            _ => None,
        }
    }
}

/// Re-serializes JSON so equal values have equal text (serde_json maps are sorted).
fn canonical(json: &str) -> Option<String> {
    serde_json::from_str::<Value>(json)
        .ok()
        .map(|v| v.to_string())
}

pub type Path = Vec<Elem>;

/// A set of paths.
pub type FieldSet = BTreeSet<Path>;

/// The path as upstream prints it in conflict messages: `.data.key`,
/// `.status.conditions[type="Ready"].status`, `.metadata.finalizers[="x"]`.
pub fn display(path: &Path) -> String {
    let mut out = String::new();
    for elem in path {
        match elem {
            Elem::Field(f) => {
                out.push('.');
                out.push_str(f);
            }
            Elem::Key(k) => {
                let fields: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push('[');
                out.push_str(&parts.join(","));
                out.push(']');
            }
            Elem::Value(v) => {
                out.push_str("[=");
                out.push_str(v);
                out.push(']');
            }
        }
    }
    out
}

/// Fields never tracked: identity and server-owned metadata.
fn ignored(path: &str) -> bool {
    matches!(
        path,
        "apiVersion"
            | "kind"
            | "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "metadata.resourceVersion"
            | "metadata.generation"
            | "metadata.creationTimestamp"
            | "metadata.deletionTimestamp"
            | "metadata.deletionGracePeriodSeconds"
            | "metadata.selfLink"
            | "metadata.managedFields"
    )
}

/// Maps whose keys are data, not schema: upstream records the map itself as a member too.
fn granular_map(path: &str) -> bool {
    let last = path.rsplit('.').next().unwrap_or(path);
    matches!(
        last,
        "labels"
            | "annotations"
            | "data"
            | "binaryData"
            | "stringData"
            | "nodeSelector"
            | "capacity"
            | "allocatable"
            | "limits"
            | "requests"
    )
}

/// The key of a list-map item: its key fields as canonical JSON.
pub fn item_key(item: &Value, keys: &[&str]) -> Option<String> {
    let mut map = Map::new();
    for k in keys {
        // Upstream defaults `protocol` of container ports to TCP before keying.
        let value = match (item.get(*k), *k) {
            (Some(v), _) => v.clone(),
            (None, "protocol") => json!("TCP"),
            (None, _) if keys.len() > 1 => continue,
            (None, _) => return None,
        };
        map.insert(k.to_string(), value);
    }
    Some(Value::Object(map).to_string())
}

/// Every path `obj` (an object of `resource`) populates, skipping `skip` top-level fields.
pub fn of(resource: &str, obj: &Value, skip: &[&str]) -> FieldSet {
    let mut set = FieldSet::new();
    if let Some(map) = obj.as_object() {
        for (k, v) in map {
            if skip.contains(&k.as_str()) {
                continue;
            }
            walk(resource, k, v, &mut vec![Elem::Field(k.clone())], &mut set);
        }
    }
    set
}

fn walk(resource: &str, schema_path: &str, value: &Value, path: &mut Path, set: &mut FieldSet) {
    if ignored(schema_path) {
        return;
    }
    match value {
        Value::Object(map) if !map.is_empty() && !schema::atomic_map(resource, schema_path) => {
            if granular_map(schema_path) {
                set.insert(path.clone());
            }
            for (k, v) in map {
                let child = schema::child(schema_path, k);
                path.push(Elem::Field(k.clone()));
                walk(resource, &child, v, path, set);
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => match schema::ssa_list(resource, schema_path) {
            SsaList::Atomic => {
                set.insert(path.clone());
            }
            SsaList::Set => {
                for item in items {
                    path.push(Elem::Value(item.to_string()));
                    set.insert(path.clone());
                    path.pop();
                }
            }
            SsaList::Map(keys) => {
                for item in items {
                    let Some(key) = item_key(item, keys) else {
                        continue;
                    };
                    path.push(Elem::Key(key));
                    set.insert(path.clone());
                    if let Some(fields) = item.as_object() {
                        for (k, v) in fields {
                            let child = schema::child(schema_path, k);
                            path.push(Elem::Field(k.clone()));
                            walk(resource, &child, v, path, set);
                            path.pop();
                        }
                    }
                    path.pop();
                }
            }
        },
        Value::Null => {}
        _ => {
            set.insert(path.clone());
        }
    }
}

/// The value at `path` in `obj`, if present.
pub fn get<'a>(obj: &'a Value, path: &[Elem]) -> Option<&'a Value> {
    let mut cur = obj;
    for elem in path {
        cur = match elem {
            Elem::Field(f) => cur.get(f)?,
            Elem::Key(k) => {
                let keys: Map<String, Value> = serde_json::from_str(k).ok()?;
                let names: Vec<&str> = keys.keys().map(String::as_str).collect();
                cur.as_array()?
                    .iter()
                    .find(|item| item_key(item, &names).as_deref() == Some(k.as_str()))?
            }
            Elem::Value(v) => cur.as_array()?.iter().find(|item| item.to_string() == *v)?,
        };
    }
    Some(cur)
}

/// Removes the field, list item or set value at `path` from `obj` (no-op when absent).
pub fn remove(obj: &mut Value, path: &[Elem]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for elem in parent_path {
        let next = match elem {
            Elem::Field(f) => cur.get_mut(f),
            Elem::Key(k) => {
                let Some(names) = serde_json::from_str::<Map<String, Value>>(k).ok() else {
                    return;
                };
                let names: Vec<&str> = names.keys().map(String::as_str).collect();
                cur.as_array_mut().and_then(|items| {
                    items
                        .iter_mut()
                        .find(|item| item_key(item, &names).as_deref() == Some(k.as_str()))
                })
            }
            Elem::Value(v) => cur
                .as_array_mut()
                .and_then(|items| items.iter_mut().find(|item| item.to_string() == *v)),
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    match last {
        Elem::Field(f) => {
            if let Some(map) = cur.as_object_mut() {
                map.remove(f);
            }
        }
        Elem::Key(k) => {
            let Some(names) = serde_json::from_str::<Map<String, Value>>(k).ok() else {
                return;
            };
            let names: Vec<&str> = names.keys().map(String::as_str).collect();
            if let Some(items) = cur.as_array_mut() {
                items.retain(|item| item_key(item, &names).as_deref() != Some(k.as_str()));
            }
        }
        Elem::Value(v) => {
            let Ok(doomed) = serde_json::from_str::<Value>(v) else {
                return;
            };
            if let Some(items) = cur.as_array_mut() {
                items.retain(|item| *item != doomed);
            }
        }
    }
}

/// The `FieldsV1` tree for `set`.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for elem in path {
            let entry = node
                .entry(elem.encode())
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(next) = entry else {
                break;
            };
            node = next;
        }
    }
    // A member path that also has children is marked with ".".
    mark_members(&mut root, set, &mut Vec::new());
    Value::Object(root)
}

fn mark_members(node: &mut Map<String, Value>, set: &FieldSet, path: &mut Path) {
    for (key, child) in node.iter_mut() {
        let Some(elem) = Elem::decode(key) else {
            continue;
        };
        path.push(elem);
        if let Value::Object(children) = child {
            let has_children = children.keys().any(|k| k != ".");
            if has_children && set.contains(path) {
                children.insert(".".into(), json!({}));
            }
            mark_members(children, set, path);
        }
        path.pop();
    }
}

/// The set a `FieldsV1` tree describes; unknown element forms are skipped.
pub fn from_fields_v1(tree: &Value) -> FieldSet {
    let mut set = FieldSet::new();
    collect(tree, &mut Vec::new(), &mut set);
    set
}

fn collect(node: &Value, path: &mut Path, set: &mut FieldSet) {
    let Some(map) = node.as_object() else {
        return;
    };
    if !path.is_empty() && (map.is_empty() || map.contains_key(".")) {
        set.insert(path.clone());
    }
    for (key, child) in map {
        let Some(elem) = Elem::decode(key) else {
            continue;
        };
        path.push(elem);
        collect(child, path, set);
        path.pop();
    }
}

/// True when `set` holds `path` or anything beneath it.
pub fn covers(set: &FieldSet, path: &Path) -> bool {
    set.range(path.clone()..)
        .next()
        .is_some_and(|p| p.starts_with(path))
}

/// True when no other path in `set` lies beneath `path`.
pub fn is_leaf(set: &FieldSet, path: &Path) -> bool {
    !set.range(path.clone()..)
        .nth(1)
        .is_some_and(|p| p.starts_with(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> Elem {
        Elem::Field(s.into())
    }

    #[test]
    fn node_status_field_set_round_trips_through_fields_v1() {
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n", "labels": {"a": "1"}},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "capacity": {"cpu": "4"}
            },
            "spec": {"podCIDRs": ["10.0.0.0/24"], "taints": [{"key": "k", "effect": "NoSchedule"}]}
        });
        let set = of("nodes", &node, &[]);
        let key = r#"{"type":"InternalIP"}"#.to_string();
        assert!(set.contains(&vec![f("status"), f("addresses"), Elem::Key(key.clone())]));
        assert!(set.contains(&vec![
            f("status"),
            f("addresses"),
            Elem::Key(key.clone()),
            f("address")
        ]));
        assert!(
            set.contains(&vec![f("spec"), f("taints")]),
            "atomic list is a leaf"
        );
        assert!(set.contains(&vec![
            f("spec"),
            f("podCIDRs"),
            Elem::Value("\"10.0.0.0/24\"".into())
        ]));
        assert!(set.contains(&vec![f("metadata"), f("labels")]));
        assert!(!set.contains(&vec![f("metadata"), f("name")]));
        assert!(!set.contains(&vec![f("status")]), "structs are not members");

        let v1 = to_fields_v1(&set);
        assert_eq!(v1["f:metadata"]["f:labels"], json!({".": {}, "f:a": {}}));
        assert_eq!(
            v1["f:status"]["f:addresses"][format!("k:{key}")],
            json!({".": {}, "f:address": {}, "f:type": {}})
        );
        assert_eq!(from_fields_v1(&v1), set);

        let path = vec![f("status"), f("addresses"), Elem::Key(key), f("address")];
        assert_eq!(
            display(&path),
            ".status.addresses[type=\"InternalIP\"].address"
        );
        assert_eq!(get(&node, &path), Some(&json!("10.0.0.1")));
        let mut copy = node.clone();
        remove(&mut copy, &path[..3]);
        assert_eq!(copy["status"]["addresses"], json!([]));
        assert!(covers(&set, &vec![f("status")]));
        assert!(is_leaf(&set, &vec![f("spec"), f("taints")]));
        assert!(!is_leaf(&set, &vec![f("metadata"), f("labels")]));
    }
}

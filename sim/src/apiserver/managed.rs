//! Server-side apply and `metadata.managedFields`: who owns which field, and the rules that
//! make two appliers conflict.
//!
//! Follows upstream's structured-merge-diff updater: an apply merges the applied
//! configuration into the live object (maps by key, list-maps by their key fields, sets by
//! value, atomic lists whole), fields the manager applied before but no longer does are
//! removed unless another manager owns them, and a change to a field another manager owns is
//! a 409 Conflict unless `force` moves ownership. Plain writes (create, update, patch) record
//! an `Update` entry for their manager and take the fields they change from everyone else.

use serde_json::{Map, Value, json};

use super::clock;
use super::failure::Failure;
use super::fieldset::{self, FieldSet, Path};
use super::schema::{self, SsaList};

/// `Apply` or `Update`, as written in managedFields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One managedFields entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub fields: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: Operation, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }

    /// How upstream names a manager in conflict messages.
    fn describe(&self) -> String {
        let mut name = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            name = format!("{name} with subresource {:?}", self.subresource);
        }
        match self.operation {
            Operation::Apply => name,
            Operation::Update => format!("{name} using {} at {}", self.api_version, self.time),
        }
    }
}

/// The entries recorded in `obj`'s `metadata.managedFields`.
pub fn read(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let operation = match e.get("operation")?.as_str()? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            Some(Entry {
                manager: e.get("manager")?.as_str()?.to_string(),
                operation,
                api_version: e
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                time: e
                    .get("time")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                subresource: e
                    .get("subresource")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                fields: e
                    .get("fieldsV1")
                    .map(fieldset::from_fields_v1)
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// Writes `entries` as `obj`'s `metadata.managedFields` (removing it when empty).
pub fn write(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation.as_str(),
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": fieldset::to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// What one apply or update is about.
pub struct Request<'a> {
    /// Plural resource name (selects list semantics).
    pub resource: &'a str,
    pub api_version: &'a str,
    pub manager: &'a str,
    /// "" or "status".
    pub subresource: &'a str,
    /// Top-level fields this endpoint does not write (`status` on the main resource of kinds
    /// with a status subresource, `spec` on the status subresource).
    pub skip: &'a [&'a str],
}

/// Server-side apply of `config` onto `live` (None: the object does not exist yet). Returns
/// the new object with its managedFields.
pub fn apply(
    req: &Request<'_>,
    live: Option<&Value>,
    config: &Value,
    force: bool,
) -> Result<Value, Failure> {
    let empty = json!({});
    let live = live.unwrap_or(&empty);
    let mut entries = read(live);
    let mut merged = merge(req.resource, "", live, &strip(config, req.skip));
    let applied = fieldset::of(req.resource, config, req.skip);

    let mine = entries
        .iter()
        .position(|e| e.is(req.manager, Operation::Apply, req.subresource));
    let last = mine.map(|i| entries[i].fields.clone()).unwrap_or_default();
    let others: FieldSet = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != mine)
        .flat_map(|(_, e)| e.fields.iter().cloned())
        .collect();
    // Fields this manager stopped applying go, unless someone else still owns them.
    let mut disowned: Vec<&Path> = last
        .iter()
        .filter(|p| !fieldset::covers(&applied, p) && !fieldset::covers(&others, p))
        .collect();
    disowned.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for path in disowned {
        fieldset::remove(&mut merged, path);
    }

    let (changed, removed) = diff(req.resource, live, &merged, req.skip);
    let mut conflicts: Vec<(String, Path)> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if Some(i) == mine {
            continue;
        }
        for path in entry.fields.intersection(&changed) {
            conflicts.push((entry.describe(), path.clone()));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(&conflicts));
    }
    for (i, entry) in entries.iter_mut().enumerate() {
        if Some(i) != mine {
            entry.fields = entry.fields.difference(&changed).cloned().collect();
            entry.fields = entry.fields.difference(&removed).cloned().collect();
        }
    }
    let now = clock::now();
    match mine {
        Some(i) => {
            entries[i].fields = applied;
            entries[i].time = now;
            entries[i].api_version = req.api_version.to_string();
        }
        None => entries.push(Entry {
            manager: req.manager.to_string(),
            operation: Operation::Apply,
            api_version: req.api_version.to_string(),
            time: now,
            subresource: req.subresource.to_string(),
            fields: applied,
        }),
    }
    entries.retain(|e| !e.fields.is_empty());
    write(&mut merged, &entries);
    Ok(merged)
}

/// Records a plain write (`old` -> `new`) by `manager` in `new`'s managedFields.
pub fn track_update(req: &Request<'_>, old: Option<&Value>, new: &mut Value) {
    let empty = json!({});
    let old = old.unwrap_or(&empty);
    let mut entries = read(old);
    let (changed, removed) = diff(req.resource, old, new, req.skip);
    if changed.is_empty() && removed.is_empty() {
        write(new, &entries);
        return;
    }
    let mut mine = None;
    for (i, entry) in entries.iter_mut().enumerate() {
        if entry.is(req.manager, Operation::Update, req.subresource) {
            mine = Some(i);
            continue;
        }
        entry.fields = entry.fields.difference(&changed).cloned().collect();
        entry.fields = entry.fields.difference(&removed).cloned().collect();
    }
    let now = clock::now();
    match mine {
        Some(i) => {
            let e = &mut entries[i];
            e.fields = e.fields.difference(&removed).cloned().collect();
            e.fields.extend(changed);
            e.time = now;
            e.api_version = req.api_version.to_string();
        }
        None => entries.push(Entry {
            manager: req.manager.to_string(),
            operation: Operation::Update,
            api_version: req.api_version.to_string(),
            time: now,
            subresource: req.subresource.to_string(),
            fields: changed,
        }),
    }
    entries.retain(|e| !e.fields.is_empty());
    write(new, &entries);
}

/// Paths added or modified, and paths removed, going from `old` to `new`.
fn diff(resource: &str, old: &Value, new: &Value, skip: &[&str]) -> (FieldSet, FieldSet) {
    let old_set = fieldset::of(resource, old, skip);
    let new_set = fieldset::of(resource, new, skip);
    let changed = new_set
        .iter()
        .filter(|p| {
            !old_set.contains(*p)
                || (fieldset::is_leaf(&new_set, p)
                    && fieldset::get(old, p) != fieldset::get(new, p))
        })
        .cloned()
        .collect();
    let removed = old_set.difference(&new_set).cloned().collect();
    (changed, removed)
}

fn strip(config: &Value, skip: &[&str]) -> Value {
    let mut out = config.clone();
    if let Some(map) = out.as_object_mut() {
        for field in skip {
            map.remove(*field);
        }
    }
    out
}

/// Structured merge of an applied configuration into the live object.
fn merge(resource: &str, path: &str, live: &Value, config: &Value) -> Value {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) if !schema::atomic_map(resource, path) => {
            let mut out: Map<String, Value> = l.clone();
            for (k, v) in c {
                if v.is_null() {
                    out.remove(k);
                    continue;
                }
                let child = schema::child(path, k);
                let merged = match l.get(k) {
                    Some(existing) => merge(resource, &child, existing, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(c)) => match schema::ssa_list(resource, path) {
            SsaList::Atomic => config.clone(),
            SsaList::Set => Value::Array(merge_associative(
                l,
                c,
                |v| Some(v.to_string()),
                |_, r| r.clone(),
            )),
            SsaList::Map(keys) => Value::Array(merge_associative(
                l,
                c,
                |v| fieldset::item_key(v, keys),
                |live_item, item| match live_item {
                    Some(existing) => merge(resource, path, existing, item),
                    None => item.clone(),
                },
            )),
        },
        _ => config.clone(),
    }
}

/// Merges an associative list (list-map or set) the way structured-merge-diff orders it:
/// items only in the live list keep their places, applied items come in the applied order, and
/// an item in both is emitted where the applied order reaches it.
fn merge_associative(
    live: &[Value],
    applied: &[Value],
    key_of: impl Fn(&Value) -> Option<String>,
    merge_item: impl Fn(Option<&Value>, &Value) -> Value,
) -> Vec<Value> {
    use std::collections::{HashMap, HashSet, VecDeque};
    // Items without a key cannot be matched; give them keys no other item has.
    let keys = |items: &[Value], side: &str| -> Vec<String> {
        items
            .iter()
            .enumerate()
            .map(|(i, v)| key_of(v).unwrap_or_else(|| format!("\u{0}{side}{i}")))
            .collect()
    };
    let (lkeys, rkeys) = (keys(live, "l"), keys(applied, "r"));
    let in_applied: HashSet<&String> = rkeys.iter().collect();
    let mut in_live: HashMap<&String, &Value> = HashMap::new();
    for (k, v) in lkeys.iter().zip(live) {
        in_live.entry(k).or_insert(v);
    }
    let mut shared: VecDeque<&String> = rkeys.iter().filter(|k| in_live.contains_key(k)).collect();
    let mut next_shared = shared.pop_front();
    let mut merged: HashSet<&String> = HashSet::new();
    let mut out = Vec::with_capacity(live.len().max(applied.len()));
    let (mut li, mut ri) = (0, 0);
    while li < live.len() || ri < applied.len() {
        if li < live.len() && ri < applied.len() {
            let pe = &lkeys[li];
            if *pe == rkeys[ri] {
                merged.insert(pe);
                out.push(merge_item(in_live.get(pe).copied(), &applied[ri]));
                li += 1;
                ri += 1;
                next_shared = shared.pop_front();
                continue;
            }
            if in_applied.contains(pe) && next_shared.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < live.len() {
            let pe = &lkeys[li];
            if !in_applied.contains(pe) {
                out.push(live[li].clone());
                li += 1;
                continue;
            }
            if merged.contains(pe) {
                li += 1;
                continue;
            }
        }
        if ri < applied.len() {
            let pe = &rkeys[ri];
            merged.insert(pe);
            out.push(merge_item(in_live.get(pe).copied(), &applied[ri]));
            ri += 1;
            if next_shared == Some(pe) {
                next_shared = shared.pop_front();
            }
        } else {
            // Only live items that were already merged remain.
            li += 1;
        }
    }
    out
}

/// The 409 upstream returns when an apply would change fields other managers own.
fn conflict_error(conflicts: &[(String, Path)]) -> Failure {
    let message = if let [(manager, path)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {manager}: {}",
            fieldset::display(path)
        )
    } else {
        let mut managers: Vec<&String> = conflicts.iter().map(|(m, _)| m).collect();
        managers.sort();
        managers.dedup();
        let mut lines = Vec::new();
        for manager in managers {
            lines.push(format!("conflicts with {manager}:"));
            for (_, path) in conflicts.iter().filter(|(m, _)| m == manager) {
                lines.push(format!("- {}", fieldset::display(path)));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(manager, path)| {
            json!({
                "type": "FieldManagerConflict",
                "message": format!("conflict with {manager}"),
                "field": fieldset::display(path),
            })
        })
        .collect();
    let mut failure = Failure::new(http::StatusCode::CONFLICT, "Conflict", message);
    failure.details = Some(json!({ "causes": causes }));
    failure
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(manager: &'a str) -> Request<'a> {
        Request {
            resource: "configmaps",
            api_version: "v1",
            manager,
            subresource: "",
            skip: &[],
        }
    }

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data})
    }

    #[test]
    fn two_appliers_conflict_on_a_shared_field_unless_forced() {
        let a = apply(&req("a"), None, &cm(json!({"x": "1", "y": "1"})), false).unwrap();
        assert_eq!(a["data"], json!({"x": "1", "y": "1"}));
        // Same value from another manager: shared ownership, no conflict.
        let b = apply(&req("b"), Some(&a), &cm(json!({"x": "1"})), false).unwrap();
        let entries = read(&b);
        assert_eq!(entries.len(), 2);
        // A different value for a field "a" owns: 409 naming the field and the manager.
        let err = apply(&req("b"), Some(&b), &cm(json!({"y": "2"})), false).unwrap_err();
        assert_eq!(err.code, http::StatusCode::CONFLICT);
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"a\": .data.y"
        );
        assert_eq!(
            err.details.as_ref().unwrap()["causes"][0]["field"],
            ".data.y"
        );
        // Forced: the value changes and ownership moves to "b".
        let forced = apply(&req("b"), Some(&b), &cm(json!({"y": "2"})), true).unwrap();
        assert_eq!(forced["data"]["y"], "2");
        let a_entry = read(&forced)
            .into_iter()
            .find(|e| e.manager == "a")
            .unwrap();
        let y = vec![
            fieldset::Elem::Field("data".into()),
            fieldset::Elem::Field("y".into()),
        ];
        assert!(!a_entry.fields.contains(&y));
        // "b" stopped applying "x" (shared with "a"): it stays; "a" still owns it.
        assert_eq!(forced["data"]["x"], "1");
    }

    #[test]
    fn dropping_a_field_from_the_config_removes_it_when_unshared() {
        let a = apply(&req("a"), None, &cm(json!({"x": "1", "y": "1"})), false).unwrap();
        let a2 = apply(&req("a"), Some(&a), &cm(json!({"x": "1"})), false).unwrap();
        assert_eq!(a2["data"], json!({"x": "1"}));
    }

    #[test]
    fn updates_take_ownership_and_then_conflict_with_appliers() {
        let a = apply(&req("a"), None, &cm(json!({"x": "1"})), false).unwrap();
        let mut edited = a.clone();
        edited["data"]["x"] = json!("2");
        track_update(&req("kubectl-edit"), Some(&a), &mut edited);
        let entries = read(&edited);
        let editor = entries
            .iter()
            .find(|e| e.manager == "kubectl-edit")
            .unwrap();
        assert_eq!(editor.operation, Operation::Update);
        let x = vec![
            fieldset::Elem::Field("data".into()),
            fieldset::Elem::Field("x".into()),
        ];
        assert!(editor.fields.contains(&x));
        let a_entry = entries.iter().find(|e| e.manager == "a").unwrap();
        assert!(
            !a_entry.fields.contains(&x),
            "the editor took .data.x from a"
        );
        let err = apply(&req("a"), Some(&edited), &cm(json!({"x": "1"})), false).unwrap_err();
        assert!(
            err.message.starts_with(
                "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using v1 at "
            ),
            "{}",
            err.message
        );
    }

    #[test]
    fn associative_lists_keep_live_places_and_applied_order() {
        let key = |v: &Value| v.get("k").map(|k| k.to_string());
        let pick = |_: Option<&Value>, r: &Value| r.clone();
        let items = |ks: &[&str]| -> Vec<Value> { ks.iter().map(|k| json!({"k": k})).collect() };
        let names = |v: Vec<Value>| -> Vec<String> {
            v.iter()
                .map(|x| x["k"].as_str().unwrap().to_string())
                .collect()
        };
        // Live-only items keep their place; applied ones follow the applied order.
        let out = merge_associative(
            &items(&["a", "b", "c"]),
            &items(&["c", "x", "a"]),
            key,
            pick,
        );
        assert_eq!(names(out), ["b", "c", "x", "a"]);
        let out = merge_associative(&items(&["a", "b"]), &items(&["x"]), key, pick);
        assert_eq!(names(out), ["a", "b", "x"]);
        let out = merge_associative(&items(&[]), &items(&["y", "x"]), key, pick);
        assert_eq!(names(out), ["y", "x"]);
    }

    #[test]
    fn node_addresses_are_a_map_keyed_by_type() {
        let r = Request {
            resource: "nodes",
            api_version: "v1",
            manager: "a",
            subresource: "status",
            skip: &["spec"],
        };
        let node = |addrs: Value| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "status": {"addresses": addrs}});
        let live = apply(
            &r,
            None,
            &node(json!([{"type": "InternalIP", "address": "1"}])),
            false,
        )
        .unwrap();
        let rb = Request { manager: "b", ..r };
        let both = apply(
            &rb,
            Some(&live),
            &node(json!([{"type": "Hostname", "address": "h"}])),
            false,
        )
        .unwrap();
        assert_eq!(
            both["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "1"}, {"type": "Hostname", "address": "h"}])
        );
        let err = apply(
            &rb,
            Some(&both),
            &node(json!([{"type": "InternalIP", "address": "2"}])),
            false,
        )
        .unwrap_err();
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"a\" with subresource \"status\": .status.addresses[type=\"InternalIP\"].address"
        );
    }
}

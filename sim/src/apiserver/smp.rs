//! Strategic merge patch (`application/strategic-merge-patch+json`), the patch kubectl and
//! controllers send for built-in kinds.
//!
//! Maps merge key by key and `null` deletes; lists follow the field's patch strategy from
//! [`super::schema`]: replaced whole, merged as a set of scalars, or merged item by item on a
//! merge key (node `status.addresses` and `conditions` on `type`). The directives upstream
//! supports are honoured: `$patch: replace|delete|merge` on maps and list items,
//! `$retainKeys`, `$setElementOrder/<field>` and `$deleteFromPrimitiveList/<field>`. The order
//! of a merged list follows upstream's rule: items named in the patch come in patch order,
//! server-only items keep their place relative to them.

use serde_json::{Map, Value};

use super::failure::Failure;
use super::schema::{self, SmpList};

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder/";
const DELETE_FROM: &str = "$deleteFromPrimitiveList/";

/// Applies `patch` to `original`, an object of `resource`.
pub fn apply(resource: &str, original: &Value, patch: &Value) -> Result<Value, Failure> {
    let (Some(original), Some(patch)) = (original.as_object(), patch.as_object()) else {
        return Err(bad("a strategic merge patch must be a JSON object"));
    };
    Ok(merge_map(resource, "", original.clone(), patch)?
        .map_or(Value::Object(Map::new()), Value::Object))
}

fn bad(message: impl Into<String>) -> Failure {
    Failure::bad_request(message)
}

/// Merges `patch` into `original`; `None` means the patch deleted the whole map.
fn merge_map(
    resource: &str,
    path: &str,
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<Option<Map<String, Value>>, Failure> {
    match patch.get(DIRECTIVE).and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = patch.clone();
            replaced.remove(DIRECTIVE);
            return Ok(Some(replaced));
        }
        Some("delete") => return Ok(None),
        Some("merge") | None => {}
        Some(other) => return Err(bad(format!("unknown patch type: {other}"))),
    }

    for (key, value) in patch {
        if key == DIRECTIVE || key == RETAIN_KEYS || key.starts_with(SET_ORDER) {
            continue;
        }
        if let Some(field) = key.strip_prefix(DELETE_FROM) {
            let Some(doomed) = value.as_array() else {
                return Err(bad(format!("{key} must be a list")));
            };
            if let Some(Value::Array(items)) = original.get_mut(field) {
                items.retain(|item| !doomed.contains(item));
            }
            continue;
        }
        let child = schema::child(path, key);
        if value.is_null() {
            original.remove(key);
            continue;
        }
        let order = patch
            .get(&format!("{SET_ORDER}{key}"))
            .and_then(Value::as_array);
        let merged = match (original.remove(key), value) {
            (Some(Value::Object(o)), Value::Object(p)) => {
                merge_map(resource, &child, o, p)?.map(Value::Object)
            }
            (None, Value::Object(p)) => {
                merge_map(resource, &child, Map::new(), p)?.map(Value::Object)
            }
            (Some(Value::Array(o)), Value::Array(p)) => {
                Some(Value::Array(merge_list(resource, &child, o, p, order)?))
            }
            (None, Value::Array(p)) => Some(Value::Array(merge_list(
                resource,
                &child,
                Vec::new(),
                p,
                order,
            )?)),
            (_, scalar) => Some(scalar.clone()),
        };
        if let Some(merged) = merged {
            original.insert(key.clone(), merged);
        }
    }

    // `$setElementOrder` for a list the patch does not otherwise touch reorders it.
    for (key, value) in patch {
        let Some(field) = key.strip_prefix(SET_ORDER) else {
            continue;
        };
        if patch.contains_key(field) {
            continue;
        }
        let (Some(order), Some(Value::Array(items))) = (value.as_array(), original.remove(field))
        else {
            continue;
        };
        let child = schema::child(path, field);
        let merged = merge_list(resource, &child, items, &[], Some(order))?;
        original.insert(field.to_string(), Value::Array(merged));
    }

    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let Some(keep) = retain.as_array() else {
            return Err(bad("$retainKeys must be a list"));
        };
        original.retain(|k, _| keep.iter().any(|w| w.as_str() == Some(k)));
    }
    Ok(Some(original))
}

fn merge_list(
    resource: &str,
    path: &str,
    original: Vec<Value>,
    patch: &[Value],
    order: Option<&Vec<Value>>,
) -> Result<Vec<Value>, Failure> {
    match schema::smp_list(resource, path) {
        SmpList::Replace => Ok(patch.to_vec()),
        SmpList::MergeScalars => {
            let mut merged = original.clone();
            for item in patch {
                if !merged.contains(item) {
                    merged.push(item.clone());
                }
            }
            let patch_order = order.map_or(patch, |o| o.as_slice());
            Ok(normalize(merged, patch_order, &original, None))
        }
        SmpList::MergeByKey(merge_key) => {
            let mut server = original;
            let mut plain = Vec::new();
            let mut replace = false;
            for item in patch {
                let Some(fields) = item.as_object() else {
                    return Err(bad(format!("{path}: merging list items must be objects")));
                };
                match fields.get(DIRECTIVE).and_then(Value::as_str) {
                    None => plain.push(item.clone()),
                    Some("delete") => {
                        let Some(k) = fields.get(merge_key) else {
                            return Err(bad(format!(
                                "{path}: delete directive without merge key {merge_key}"
                            )));
                        };
                        server.retain(|s| s.get(merge_key) != Some(k));
                    }
                    Some("replace") => replace = true,
                    Some(other) => return Err(bad(format!("unknown patch type: {other}"))),
                }
            }
            if replace {
                return Ok(plain);
            }
            let server_order = server.clone();
            let mut merged = server;
            for item in &plain {
                let Some(k) = item.get(merge_key) else {
                    return Err(bad(format!(
                        "map: {item} does not contain declared merge key: {merge_key}"
                    )));
                };
                let Some(p) = item.as_object() else {
                    continue;
                };
                match merged.iter_mut().find(|s| s.get(merge_key) == Some(k)) {
                    Some(slot) => {
                        let base = slot.as_object().cloned().unwrap_or_default();
                        match merge_map(resource, path, base, p)? {
                            Some(m) => *slot = Value::Object(m),
                            None => *slot = Value::Null,
                        }
                    }
                    None => {
                        if let Some(m) = merge_map(resource, path, Map::new(), p)? {
                            merged.push(Value::Object(m));
                        }
                    }
                }
            }
            merged.retain(|v| !v.is_null());
            let patch_order = order.map_or(plain.as_slice(), |o| o.as_slice());
            Ok(normalize(
                merged,
                patch_order,
                &server_order,
                Some(merge_key),
            ))
        }
    }
}

/// Identity of a list item for ordering: its merge key value, or itself for scalars.
fn ident<'a>(item: &'a Value, key: Option<&str>) -> Option<&'a Value> {
    match key {
        Some(k) => item.get(k),
        None => Some(item),
    }
}

fn position(list: &[Value], item: &Value, key: Option<&str>) -> Option<usize> {
    let id = ident(item, key)?;
    list.iter().position(|x| ident(x, key) == Some(id))
}

/// Upstream's element ordering: split the merged items into those the patch names and
/// server-only ones, sort each by its own order, then interleave them by server position.
fn normalize(
    merged: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let (mut from_patch, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|item| position(patch_order, item, key).is_some());
    from_patch.sort_by_key(|item| position(patch_order, item, key).unwrap_or(usize::MAX));
    server_only.sort_by_key(|item| position(server_order, item, key).unwrap_or(usize::MAX));

    let mut out = Vec::with_capacity(from_patch.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        from_patch.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => {
                match (
                    position(server_order, l, key),
                    position(server_order, r, key),
                ) {
                    (Some(li), Some(ri)) => li < ri,
                    _ => false,
                }
            }
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn maps_merge_and_null_deletes() {
        let orig = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "data": {"x": "1"}});
        let patch = json!({"metadata": {"labels": {"b": null, "c": "3"}}, "data": {"x": "2"}});
        let out = apply("configmaps", &orig, &patch).unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"a": "1", "c": "3"}}, "data": {"x": "2"}})
        );
    }

    #[test]
    fn node_addresses_and_conditions_merge_by_type() {
        let orig = json!({"status": {
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": "n1"}
            ],
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "Down"},
                {"type": "MemoryPressure", "status": "False"}
            ]
        }});
        let patch = json!({"status": {
            "addresses": [{"type": "InternalDNS", "address": "relay.local"}, {"type": "InternalIP", "address": "10.0.0.9"}],
            "conditions": [{"type": "Ready", "status": "True", "reason": null}]
        }});
        let out = apply("nodes", &orig, &patch).unwrap();
        // Patch items in patch order; the server-only Hostname entry keeps its place after
        // InternalIP, which it followed on the server.
        assert_eq!(
            out["status"]["addresses"],
            json!([
                {"type": "InternalDNS", "address": "relay.local"},
                {"type": "InternalIP", "address": "10.0.0.9"},
                {"type": "Hostname", "address": "n1"}
            ])
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([
                {"type": "Ready", "status": "True"},
                {"type": "MemoryPressure", "status": "False"}
            ])
        );
    }

    #[test]
    fn list_directives() {
        let orig = json!({"status": {"addresses": [
            {"type": "InternalIP", "address": "a"}, {"type": "Hostname", "address": "h"}
        ]}});
        let del = json!({"status": {"addresses": [{"type": "Hostname", "$patch": "delete"}]}});
        assert_eq!(
            apply("nodes", &orig, &del).unwrap()["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "a"}])
        );
        let replace = json!({"status": {"addresses": [{"$patch": "replace"}, {"type": "ExternalIP", "address": "e"}]}});
        assert_eq!(
            apply("nodes", &orig, &replace).unwrap()["status"]["addresses"],
            json!([{"type": "ExternalIP", "address": "e"}])
        );
        let order = json!({"status": {"$setElementOrder/addresses": [{"type": "Hostname"}, {"type": "InternalIP"}]}});
        assert_eq!(
            apply("nodes", &orig, &order).unwrap()["status"]["addresses"],
            json!([{"type": "Hostname", "address": "h"}, {"type": "InternalIP", "address": "a"}])
        );
    }

    #[test]
    fn lists_without_strategy_are_replaced_and_scalar_sets_union() {
        let orig = json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}], "podCIDRs": ["10.0.0.0/24"]},
                          "metadata": {"finalizers": ["x"]}});
        let patch = json!({"spec": {"taints": [{"key": "b", "effect": "NoExecute"}], "podCIDRs": ["10.1.0.0/24"]},
                           "metadata": {"finalizers": ["y"], "$deleteFromPrimitiveList/finalizers": ["x"]}});
        let out = apply("nodes", &orig, &patch).unwrap();
        assert_eq!(
            out["spec"]["taints"],
            json!([{"key": "b", "effect": "NoExecute"}])
        );
        // Upstream's ordering puts items the patch names (and the server lacks) first.
        assert_eq!(
            out["spec"]["podCIDRs"],
            json!(["10.1.0.0/24", "10.0.0.0/24"])
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["y"]));
    }

    #[test]
    fn map_directives_and_containers() {
        let orig = json!({"spec": {"containers": [{"name": "a", "image": "1", "env": [{"name": "X", "value": "1"}]}, {"name": "b", "image": "2"}],
                                   "nodeSelector": {"k": "v"}}});
        let patch = json!({"spec": {"containers": [{"name": "a", "image": "9", "env": [{"name": "Y", "value": "2"}]}],
                                    "nodeSelector": {"z": "1"}}});
        let out = apply("pods", &orig, &patch).unwrap();
        assert_eq!(out["spec"]["containers"][0]["image"], "9");
        assert_eq!(
            out["spec"]["containers"][0]["env"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(out["spec"]["containers"][1]["name"], "b");
        // SMP merges every map without a patch strategy, `+mapType=atomic` or not.
        assert_eq!(out["spec"]["nodeSelector"], json!({"k": "v", "z": "1"}));
        let replace = json!({"data": {"$patch": "replace", "only": "1"}});
        let out = apply("configmaps", &json!({"data": {"a": "1"}}), &replace).unwrap();
        assert_eq!(out["data"], json!({"only": "1"}));
        let retain = json!({"spec": {"$retainKeys": ["b"], "b": 2}});
        let out = apply("pods", &json!({"spec": {"a": 1, "b": 1}}), &retain).unwrap();
        assert_eq!(out["spec"], json!({"b": 2}));
        assert!(apply("pods", &json!({}), &json!([])).is_err());
        assert!(
            apply(
                "nodes",
                &orig,
                &json!({"status": {"addresses": [{"address": "x"}]}})
            )
            .is_err()
        );
    }
}

//! The slice of OpenAPI v3 (`/openapi/v3`, `/openapi/v3/api/v1`...) that kubectl reads before
//! it writes: for each kind, the PATCH operation tagged with its group/version/kind and the
//! `fieldValidation` query parameter, so kubectl's field-validation check finds the server
//! validates and skips client-side schema validation (as with a real apiserver).
//!
//! No schemas are published. kubectl then computes client-side apply patches from its
//! built-in types, which is what it does for every kind whose schema it cannot find, so the
//! strategic merge content type is deliberately not advertised here.

use serde_json::{Map, Value, json};

use super::kinds::{self, Flavor, KINDS, Kind};

/// A fixed hash: the documents never change while a server runs.
const HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: where each group/version document lives.
pub fn root() -> Value {
    let mut paths = Map::new();
    let mut gvs = vec![("", "v1")];
    gvs.extend(kinds::groups());
    for (g, v) in gvs {
        let path = gv_path(g, v);
        paths.insert(
            path.clone(),
            json!({ "serverRelativeURL": format!("/openapi/v3/{path}?hash={HASH}") }),
        );
    }
    json!({ "paths": paths })
}

fn object_url(kind: &Kind) -> String {
    let base = format!("/{}", gv_path(kind.group, kind.version));
    if kind.namespaced() {
        format!("{base}/namespaces/{{namespace}}/{}/{{name}}", kind.resource)
    } else {
        format!("{base}/{}/{{name}}", kind.resource)
    }
}

/// `/openapi/v3/{api/v1 | apis/g/v}`, if served.
pub fn group_version(path: &str) -> Option<Value> {
    let (group, version) = match path.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        _ => return None,
    };
    let served: Vec<&Kind> = KINDS
        .iter()
        .filter(|k| k.group == group && k.version == version && k.flavor == Flavor::Stored)
        .collect();
    if !KINDS
        .iter()
        .any(|k| k.group == group && k.version == version)
    {
        return None;
    }
    let mut paths = Map::new();
    for kind in served {
        let gvk = json!({ "group": kind.group, "version": kind.version, "kind": kind.kind });
        let query = |name: &str| json!({ "name": name, "in": "query", "schema": { "type": "string", "uniqueItems": true } });
        let body = json!({ "schema": { "type": "object" } });
        paths.insert(
            object_url(kind),
            json!({
                "patch": {
                    "operationId": format!("patch{}", kind.kind),
                    "parameters": [query("dryRun"), query("fieldManager"), query("fieldValidation"), query("force")],
                    "requestBody": { "content": {
                        "application/apply-patch+yaml": body,
                        "application/json-patch+json": body,
                        "application/merge-patch+json": body,
                    }},
                    "responses": { "200": { "description": "OK" } },
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                }
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes", "version": "v1.35.0" },
        "paths": paths,
        "components": { "schemas": {} },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_tag_patch_operations() {
        let root = root();
        assert!(
            root["paths"]["apis/coordination.k8s.io/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/apis/coordination.k8s.io/v1?hash=")
        );
        let core = group_version("api/v1").unwrap();
        let op = &core["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"];
        assert_eq!(op["x-kubernetes-group-version-kind"]["kind"], "ConfigMap");
        assert!(
            op["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert!(group_version("apis/nope/v1").is_none());
    }
}

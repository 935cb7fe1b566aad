//! The slice of OpenAPI v3 (`/openapi/v3`, `/openapi/v3/api/v1`...) that kubectl reads before
//! it writes: for each kind, the PATCH operation tagged with its group/version/kind and the
//! `fieldValidation` query parameter, so kubectl's field-validation check finds the server
//! validates and skips client-side schema validation (as with a real apiserver).
//!
//! kubectl 1.27-1.29 read the OpenAPI v2 document instead, and only as protobuf
//! (gnostic's `openapi.v2.Document`), so [`v2_protobuf`] encodes the same operations that way.
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

/// Protobuf wire encoding of one length-delimited field.
fn pb(field: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 6);
    let mut key = u64::from(field << 3 | 2);
    let mut len = payload.len() as u64;
    for value in [&mut key, &mut len] {
        loop {
            let byte = (*value & 0x7f) as u8;
            *value >>= 7;
            if *value == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }
    out.extend_from_slice(payload);
    out
}

/// The content type of the protobuf `/openapi/v2` answer (kubectl asks for the `@v1.0`
/// spelling, which is not a valid media type, and upstream answers with this one).
pub const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// `/openapi/v2` as gnostic's `openapi.v2.Document` protobuf: one PATCH operation per kind,
/// tagged with its group/version/kind (as YAML, like upstream) and listing `fieldValidation`.
pub fn v2_protobuf() -> Vec<u8> {
    let query_param = |name: &str| {
        // QueryParameterSubSchema{in=2, name=4, type=6} in NonBodyParameter{query=3} in
        // Parameter{non_body=2} in ParametersItem{parameter=1}.
        let sub = [pb(2, b"query"), pb(4, name.as_bytes()), pb(6, b"string")].concat();
        pb(1, &pb(2, &pb(3, &sub)))
    };
    let mut paths = Vec::new();
    for kind in KINDS.iter().filter(|k| k.flavor == Flavor::Stored) {
        let gvk = format!(
            "group: {}\nkind: {}\nversion: {}\n",
            json!(kind.group),
            kind.kind,
            kind.version
        );
        // NamedAny{name=1, value=Any{yaml=2}}
        let extension = [
            pb(1, b"x-kubernetes-group-version-kind"),
            pb(2, &pb(2, gvk.as_bytes())),
        ]
        .concat();
        // Responses{response_code=NamedResponseValue{name, value=ResponseValue{response=Response{description}}}}
        let responses = pb(1, &[pb(1, b"200"), pb(2, &pb(1, &pb(1, b"OK")))].concat());
        let mut operation = pb(5, format!("patch{}", kind.kind).as_bytes());
        for name in ["dryRun", "fieldManager", "fieldValidation", "force"] {
            operation.extend(pb(8, &query_param(name)));
        }
        operation.extend(pb(9, &responses));
        operation.extend(pb(13, &extension));
        // NamedPathItem{name=1, value=PathItem{patch=8}}
        let item = [
            pb(1, object_url(kind).as_bytes()),
            pb(2, &pb(8, &operation)),
        ]
        .concat();
        paths.extend(pb(2, &item));
    }
    let info = [pb(1, b"Kubernetes"), pb(2, b"v1.35.0")].concat();
    [pb(1, b"2.0"), pb(2, &info), pb(8, &paths)].concat()
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
        let v2 = v2_protobuf();
        assert_eq!(&v2[..5], b"\x0a\x032.0");
        let needle = b"group: \"\"\nkind: ConfigMap\nversion: v1\n";
        assert!(v2.windows(needle.len()).any(|w| w == needle));
    }
}

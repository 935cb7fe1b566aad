//! Discovery documents: `/version`, the legacy `/api`, `/api/v1`, `/apis`, `/apis/{g}`,
//! `/apis/{g}/{v}` documents, and aggregated discovery (`apidiscovery.k8s.io` v2 and v2beta1)
//! that kubectl 1.30+ asks for with one request per root.
//!
//! All of them are generated from [`super::kinds::KINDS`], so what is advertised is exactly
//! what is routed.

use serde_json::{Value, json};

use super::kinds::{self, KINDS, Kind};

/// The Kubernetes version the stand-ins report (`/version`, node info).
pub const KUBERNETES_VERSION: &str = "v1.35.0-relaylet-sim";

/// `/version`, claiming the Kubernetes release whose API this stand-in mirrors.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "emulationMajor": "1",
        "emulationMinor": "35",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "34",
        "gitVersion": KUBERNETES_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

fn group_doc(group: &str, version: &str) -> Value {
    let gv = json!({ "groupVersion": format!("{group}/{version}"), "version": version });
    json!({ "name": group, "versions": [gv.clone()], "preferredVersion": gv })
}

/// `/apis`.
pub fn group_list() -> Value {
    let groups: Vec<Value> = kinds::groups()
        .into_iter()
        .map(|(g, v)| group_doc(g, v))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `/apis/{group}`, if served.
pub fn group(group: &str) -> Option<Value> {
    let (g, v) = kinds::groups().into_iter().find(|(g, _)| *g == group)?;
    let mut doc = group_doc(g, v);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

fn served(group: &str, version: &str) -> impl Iterator<Item = &'static Kind> {
    KINDS
        .iter()
        .filter(move |k| k.group == group && k.version == version)
}

/// `/api/v1` or `/apis/{group}/{version}`, if served.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for kind in served(group, version) {
        let mut r = json!({
            "name": kind.resource,
            "singularName": kind.singular,
            "namespaced": kind.namespaced(),
            "kind": kind.kind,
            "verbs": kind.verbs(),
        });
        if !kind.short_names.is_empty() {
            r["shortNames"] = json!(kind.short_names);
        }
        if !kind.categories.is_empty() {
            r["categories"] = json!(kind.categories);
        }
        resources.push(r);
        for sub in kind.subresources {
            resources.push(json!({
                "name": format!("{}/{sub}", kind.resource),
                "singularName": "",
                "namespaced": kind.namespaced(),
                "kind": kind.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        for (sub, verbs) in kinds::connect_subresources(kind) {
            resources.push(json!({
                "name": format!("{}/{sub}", kind.resource),
                "singularName": "",
                "namespaced": kind.namespaced(),
                "kind": connect_kind(kind, sub),
                "verbs": verbs,
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

/// The options kind upstream advertises for a connect subresource.
fn connect_kind(kind: &Kind, sub: &str) -> &'static str {
    match (kind.kind, sub) {
        ("Pod", "exec") => "PodExecOptions",
        ("Pod", "attach") => "PodAttachOptions",
        ("Pod", "portforward") => "PodPortForwardOptions",
        ("Pod", "log") => "Pod",
        ("Node", "proxy") => "NodeProxyOptions",
        _ => kind.kind,
    }
}

/// The aggregated discovery version a client accepts, from its `Accept` header:
/// "v2", "v2beta1" or None for the legacy documents.
pub fn aggregated_version(accept: &str) -> Option<&'static str> {
    let mut best = None;
    for part in accept.split(',') {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        let is_discovery = params.contains(&"g=apidiscovery.k8s.io")
            && params.contains(&"as=APIGroupDiscoveryList");
        if !is_discovery {
            continue;
        }
        if params.contains(&"v=v2") {
            return Some("v2");
        }
        if params.contains(&"v=v2beta1") {
            best = Some("v2beta1");
        }
    }
    best
}

/// The content type of an aggregated discovery answer.
pub fn aggregated_content_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}

fn response_kind(kind: &Kind, name: &str) -> Value {
    json!({ "group": kind.group, "version": kind.version, "kind": name })
}

fn aggregated_group(group: &str, version: &str) -> Value {
    let resources: Vec<Value> = served(group, version)
        .map(|kind| {
            let mut subs: Vec<Value> = kind
                .subresources
                .iter()
                .map(|sub| {
                    json!({
                        "subresource": sub,
                        "responseKind": response_kind(kind, kind.kind),
                        "verbs": ["get", "patch", "update"],
                    })
                })
                .collect();
            subs.extend(
                kinds::connect_subresources(kind)
                    .iter()
                    .map(|(sub, verbs)| {
                        json!({
                            "subresource": sub,
                            "responseKind": response_kind(kind, connect_kind(kind, sub)),
                            "verbs": verbs,
                        })
                    }),
            );
            let mut r = json!({
                "resource": kind.resource,
                "responseKind": response_kind(kind, kind.kind),
                "scope": if kind.namespaced() { "Namespaced" } else { "Cluster" },
                "singularResource": kind.singular,
                "verbs": kind.verbs(),
            });
            if !kind.short_names.is_empty() {
                r["shortNames"] = json!(kind.short_names);
            }
            if !kind.categories.is_empty() {
                r["categories"] = json!(kind.categories);
            }
            if !subs.is_empty() {
                r["subresources"] = json!(subs);
            }
            r
        })
        .collect();
    let mut metadata = json!({ "creationTimestamp": null });
    if !group.is_empty() {
        metadata["name"] = json!(group);
    }
    json!({
        "metadata": metadata,
        "versions": [{ "version": version, "resources": resources, "freshness": "Current" }],
    })
}

/// Aggregated discovery for `/api` (core only) or `/apis` (every other group).
pub fn aggregated(core: bool, version: &str) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group("", "v1")]
    } else {
        kinds::groups()
            .into_iter()
            .map(|(g, v)| aggregated_group(g, v))
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(aggregated_version(kubectl), Some("v2"));
        let old = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(aggregated_version(old), Some("v2beta1"));
        assert_eq!(aggregated_version("application/json, */*"), None);
    }

    #[test]
    fn documents_list_served_kinds() {
        let core = resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"pods")
                && names.contains(&"pods/exec")
                && names.contains(&"nodes/proxy")
        );
        let agg = aggregated(false, "v2");
        let groups: Vec<&str> = agg["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["metadata"]["name"].as_str().unwrap())
            .collect();
        assert!(groups.contains(&"coordination.k8s.io"));
        assert!(group("nope.io").is_none());
    }
}

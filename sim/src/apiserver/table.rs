//! Server-side printing: `meta.k8s.io/v1` Table answers for clients that ask with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` (kubectl get does).
//!
//! Columns and cell text follow upstream's printers for the kinds served here (pods and nodes
//! in particular, so `kubectl get pods -o wide` and `kubectl get nodes -o wide` show READY,
//! STATUS, IP, NODE, INTERNAL-IP...). Other kinds get upstream's default Name / Created At.

use serde_json::{Value, json};

use super::clock;
use super::kinds::Kind;

/// What each row carries besides its cells (`?includeObject=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Include {
    None,
    Metadata,
    Object,
}

impl Include {
    pub fn parse(value: Option<&str>) -> Include {
        match value {
            Some("None") => Include::None,
            Some("Object") => Include::Object,
            _ => Include::Metadata,
        }
    }
}

/// The Table version a client asked for in `accept` ("v1" or "v1beta1"), if any.
pub fn requested(accept: &str) -> Option<&'static str> {
    for part in accept.split(',') {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        if params.contains(&"as=Table") && params.contains(&"g=meta.k8s.io") {
            if params.contains(&"v=v1") {
                return Some("v1");
            }
            if params.contains(&"v=v1beta1") {
                return Some("v1beta1");
            }
        }
    }
    None
}

fn col(name: &str, ty: &str, priority: u8, description: &str) -> Value {
    let mut c = json!({ "name": name, "type": ty, "format": "", "description": description, "priority": priority });
    if name == "Name" {
        c["format"] = json!("name");
    }
    c
}

fn columns(kind: &Kind) -> Vec<Value> {
    let name = col(
        "Name",
        "string",
        0,
        "Name must be unique within a namespace.",
    );
    let age = col(
        "Age",
        "string",
        0,
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    match kind.kind {
        "Pod" => vec![
            name,
            col(
                "Ready",
                "string",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),
            col(
                "Status",
                "string",
                0,
                "The aggregate status of the containers in this pod.",
            ),
            col(
                "Restarts",
                "string",
                0,
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
            ),
            age,
            col("IP", "string", 1, "podIP address allocated to the pod."),
            col(
                "Node",
                "string",
                1,
                "NodeName indicates in which node this pod is scheduled.",
            ),
            col(
                "Nominated Node",
                "string",
                1,
                "nominatedNodeName is set only when this pod preempts other pods on the node.",
            ),
            col(
                "Readiness Gates",
                "string",
                1,
                "If specified, all readiness gates will be evaluated for pod readiness.",
            ),
        ],
        // The CRD's additionalPrinterColumns, as the real apiserver renders them.
        "LeafCluster" => vec![
            name,
            col(
                "Ready",
                "string",
                0,
                "Whether the leaf's virtual Node is Ready",
            ),
            col("Reason", "string", 0, "Why, in one word"),
            col("Version", "string", 0, "The leaf apiserver's version"),
            col("Node", "string", 0, "The virtual Node"),
            col(
                "Served-By",
                "string",
                0,
                "The relaylet replica serving the Node",
            ),
            col("Pods", "integer", 0, "Root pods bound to the Node"),
            col(
                "Credential-Expires",
                "date",
                0,
                "When the leaf credential expires",
            ),
            age,
            col("Message", "string", 1, "Why, in a sentence"),
        ],
        "Node" => vec![
            name,
            col("Status", "string", 0, "The status of the node"),
            col("Roles", "string", 0, "The roles of the node"),
            age,
            col(
                "Version",
                "string",
                0,
                "Kubelet Version reported by the node.",
            ),
            col(
                "Internal-IP",
                "string",
                1,
                "List of addresses reachable to the node.",
            ),
            col(
                "External-IP",
                "string",
                1,
                "List of addresses reachable to the node.",
            ),
            col(
                "OS-Image",
                "string",
                1,
                "OS Image reported by the node from /etc/os-release.",
            ),
            col(
                "Kernel-Version",
                "string",
                1,
                "Kernel Version reported by the node.",
            ),
            col(
                "Container-Runtime",
                "string",
                1,
                "ContainerRuntime Version reported by the node.",
            ),
        ],
        "ConfigMap" => vec![
            name,
            col(
                "Data",
                "integer",
                0,
                "Data contains the configuration data.",
            ),
            age,
        ],
        "Secret" => vec![
            name,
            col("Type", "string", 0, "The type of secret"),
            col("Data", "integer", 0, "Data contains the secret data."),
            age,
        ],
        "Namespace" => vec![
            name,
            col("Status", "string", 0, "The status of the namespace"),
            age,
        ],
        "Lease" => vec![
            name,
            col("Holder", "string", 0, "The holder of the lease"),
            age,
        ],
        "ServiceAccount" => vec![
            name,
            col(
                "Secrets",
                "string",
                0,
                "Secrets is a list of the secrets in the same namespace.",
            ),
            age,
        ],
        "Event" => vec![
            col("Last Seen", "string", 0, "Time of the last occurrence."),
            col("Type", "string", 0, "Type of this event."),
            col("Reason", "string", 0, "Why the action was taken."),
            col("Object", "string", 0, "The object this Event is about."),
            col(
                "Message",
                "string",
                0,
                "A human-readable description of the status of this operation.",
            ),
        ],
        _ => vec![
            name,
            col(
                "Created At",
                "date",
                0,
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
            ),
        ],
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn or_none(v: &Value) -> String {
    match v.as_str() {
        Some(x) if !x.is_empty() => x.to_string(),
        _ => "<none>".to_string(),
    }
}

fn created(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
}

fn count(v: &Value) -> usize {
    v.as_object().map_or(0, |m| m.len())
}

fn cells(kind: &Kind, obj: &Value) -> Vec<Value> {
    let name = json!(s(&obj["metadata"]["name"]));
    let age = json!(clock::age(created(obj)));
    match kind.kind {
        "Pod" => pod_cells(obj, name, age),
        "Node" => node_cells(obj, name, age),
        "ConfigMap" => vec![
            name,
            json!(count(&obj["data"]) + count(&obj["binaryData"])),
            age,
        ],
        "Secret" => vec![
            name,
            json!(s(&obj["type"])),
            json!(count(&obj["data"])),
            age,
        ],
        "LeafCluster" => {
            let st = &obj["status"];
            let cell = |v: &Value| if v.is_null() { Value::Null } else { v.clone() };
            vec![
                name,
                cell(&st["ready"]),
                cell(&st["reason"]),
                cell(&st["version"]),
                cell(&st["node"]),
                cell(&st["servedBy"]),
                cell(&st["pods"]),
                cell(&st["credentialExpires"]),
                age,
                cell(&st["message"]),
            ]
        }
        "Namespace" => vec![name, json!(s(&obj["status"]["phase"])), age],
        "Lease" => vec![name, json!(s(&obj["spec"]["holderIdentity"])), age],
        "ServiceAccount" => vec![
            name,
            json!(obj["secrets"].as_array().map_or(0, Vec::len)),
            age,
        ],
        "Event" => {
            let last = obj["lastTimestamp"]
                .as_str()
                .or_else(|| obj["eventTime"].as_str())
                .or_else(|| created(obj));
            // core/v1 names the object `involvedObject`, events.k8s.io/v1 `regarding`.
            let involved = if obj["involvedObject"].is_object() {
                &obj["involvedObject"]
            } else {
                &obj["regarding"]
            };
            let message = obj["message"].as_str().or_else(|| obj["note"].as_str());
            vec![
                json!(clock::age(last)),
                json!(s(&obj["type"])),
                json!(s(&obj["reason"])),
                json!(format!(
                    "{}/{}",
                    s(&involved["kind"]).to_lowercase(),
                    s(&involved["name"])
                )),
                json!(message.unwrap_or_default()),
            ]
        }
        _ => vec![name, json!(created(obj).unwrap_or_default())],
    }
}

fn pod_cells(pod: &Value, name: Value, age: Value) -> Vec<Value> {
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = statuses
        .iter()
        .filter(|c| c["ready"] == json!(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .map(|c| c["restartCount"].as_i64().unwrap_or(0))
        .sum();

    let mut reason = s(&pod["status"]["phase"]).to_string();
    if let Some(r) = pod["status"]["reason"].as_str().filter(|r| !r.is_empty()) {
        reason = r.to_string();
    }
    let mut running = false;
    for c in statuses.iter().rev() {
        let state = &c["state"];
        if let Some(r) = state["waiting"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            reason = r.to_string();
        } else if state["terminated"].is_object() {
            let t = &state["terminated"];
            reason = match (
                t["reason"].as_str().filter(|r| !r.is_empty()),
                t["signal"].as_i64(),
            ) {
                (Some(r), _) => r.to_string(),
                (None, Some(sig)) if sig != 0 => format!("Signal:{sig}"),
                _ => format!("ExitCode:{}", t["exitCode"].as_i64().unwrap_or(0)),
            };
        } else if c["ready"] == json!(true) && state["running"].is_object() {
            running = true;
        }
    }
    if reason == "Completed" && running {
        let pod_ready = pod["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        reason = if pod_ready { "Running" } else { "NotReady" }.to_string();
    }
    if pod["metadata"]["deletionTimestamp"].is_string() {
        reason = "Terminating".to_string();
    }
    let gates = pod["spec"]["readinessGates"].as_array().map_or(0, Vec::len);
    let gates = if gates == 0 {
        "<none>".to_string()
    } else {
        let passing = pod["spec"]["readinessGates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| {
                pod["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == g["conditionType"] && c["status"] == "True")
                })
            })
            .count();
        format!("{passing}/{gates}")
    };
    vec![
        name,
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts.to_string()),
        age,
        json!(or_none(&pod["status"]["podIP"])),
        json!(or_none(&pod["spec"]["nodeName"])),
        json!(or_none(&pod["status"]["nominatedNodeName"])),
        json!(gates),
    ]
}

fn node_cells(node: &Value, name: Value, age: Value) -> Vec<Value> {
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| c["status"].clone());
    let mut status = match ready.as_ref().and_then(Value::as_str) {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if node["spec"]["unschedulable"] == json!(true) {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<String> = node["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                Some(role.to_string())
            } else if k == "kubernetes.io/role" {
                v.as_str().map(str::to_string)
            } else {
                None
            }
        })
        .filter(|r| !r.is_empty())
        .collect();
    roles.sort();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    };
    let address = |ty: &str| {
        node["status"]["addresses"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["type"] == ty))
            .map_or("<none>".to_string(), |x| s(&x["address"]).to_string())
    };
    let info = &node["status"]["nodeInfo"];
    let unknown = |v: &Value| match v.as_str() {
        Some(x) if !x.is_empty() => x.to_string(),
        _ => "<unknown>".to_string(),
    };
    vec![
        name,
        json!(status),
        json!(roles),
        age,
        json!(s(&info["kubeletVersion"])),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(unknown(&info["osImage"])),
        json!(unknown(&info["kernelVersion"])),
        json!(unknown(&info["containerRuntimeVersion"])),
    ]
}

fn row(kind: &Kind, obj: &Value, include: Include) -> Value {
    let mut row = json!({ "cells": cells(kind, obj) });
    match include {
        Include::None => {}
        Include::Object => row["object"] = obj.clone(),
        Include::Metadata => {
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"].clone(),
            });
        }
    }
    row
}

/// A Table of `objects`; `list_meta` is the list's metadata (resourceVersion, continue).
pub fn table(
    kind: &Kind,
    version: &str,
    objects: &[&Value],
    list_meta: Value,
    include: Include,
) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": list_meta,
        "columnDefinitions": columns(kind),
        "rows": objects.iter().map(|o| row(kind, o, include)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::kinds;

    #[test]
    fn pod_rows_show_readiness_status_and_placement() {
        let pod = json!({
            "metadata": {"name": "web", "creationTimestamp": clock::now()},
            "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}}},
                {"name": "b", "ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
            ]}
        });
        let kind = kinds::by_resource("", "pods").unwrap();
        let t = table(kind, "v1", &[&pod], json!({}), Include::Metadata);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "web");
        assert_eq!(cells[1], "1/2");
        assert_eq!(cells[2], "CrashLoopBackOff");
        assert_eq!(cells[3], "3");
        assert_eq!(cells[5], "10.0.0.5");
        assert_eq!(cells[6], "n1");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(
            t["columnDefinitions"].as_array().unwrap().len(),
            cells.as_array().unwrap().len()
        );
    }

    #[test]
    fn node_rows_and_accept_parsing() {
        let node = json!({
            "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/agent": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": "10.1.1.1"}],
                       "nodeInfo": {"kubeletVersion": "v1.35.0"}}
        });
        let kind = kinds::by_resource("", "nodes").unwrap();
        let t = table(kind, "v1", &[&node], json!({}), Include::None);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[1], "Ready,SchedulingDisabled");
        assert_eq!(cells[2], "agent");
        assert_eq!(cells[4], "v1.35.0");
        assert_eq!(cells[5], "10.1.1.1");
        assert_eq!(cells[6], "<none>");
        assert!(t["rows"][0].get("object").is_none());
        assert_eq!(
            requested(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            ),
            Some("v1")
        );
        assert_eq!(requested("application/json"), None);
    }
}

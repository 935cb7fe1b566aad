//! The kubelet-facing subresources: `pods/{exec,attach,portforward,log}` and `nodes/proxy`.
//!
//! As kube-apiserver does, the handler resolves the pod and its node from the store, checks
//! what upstream checks before dialling (the pod is bound to a node, the container exists or
//! can be defaulted), then hands the whole request, upgrade included, to the kubelet client.

use axum::extract::Request;
use axum::response::Response;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::Value;

use super::api::App;
use super::failure::Failure;
use super::kinds;
use super::route::ResourcePath;

/// Serves one connect request.
pub async fn connect(app: &App, req: Request, target: &ResourcePath) -> Result<Response, Failure> {
    let nodes =
        kinds::by_resource("", "nodes").ok_or_else(|| Failure::internal("nodes are not served"))?;
    if target.kind.kind == "Node" {
        let node: Node = typed(app.store.get(nodes, "", &target.name)?)?;
        return forward_node(app, req, node, &target.rest).await;
    }
    let pod_value = app
        .store
        .get(target.kind, &target.namespace, &target.name)?;
    let node_name = pod_value
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if node_name.is_empty() {
        return Err(Failure::bad_request(format!(
            "pod {} does not have a host assigned",
            target.name
        )));
    }
    let req = if target.subresource == "portforward" {
        req
    } else {
        default_container(req, &pod_value, &target.name)?
    };
    let pod: Pod = typed(pod_value)?;
    let node: Node = typed(app.store.get(nodes, "", &node_name)?)?;
    forward_pod(app, req, pod, node, &target.subresource).await
}

fn typed<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, Failure> {
    serde_json::from_value(value)
        .map_err(|e| Failure::internal(format!("decoding stored object: {e}")))
}

fn names(list: Option<&Value>) -> Vec<String> {
    list.and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks the `container` parameter against the pod, filling it in when the pod has exactly
/// one container, as upstream's pod strategy does before building the kubelet URL.
fn default_container(mut req: Request, pod: &Value, name: &str) -> Result<Request, Failure> {
    let query: Vec<(String, String)> =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(req.uri())
            .map(|q| q.0)
            .map_err(|e| Failure::bad_request(format!("invalid query: {e}")))?;
    let containers = names(pod.pointer("/spec/containers"));
    let init = names(pod.pointer("/spec/initContainers"));
    let ephemeral = names(pod.pointer("/spec/ephemeralContainers"));
    let requested = query
        .iter()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.clone());
    match requested.filter(|c| !c.is_empty()) {
        Some(c) => {
            if containers.contains(&c) || init.contains(&c) || ephemeral.contains(&c) {
                Ok(req)
            } else {
                Err(Failure::bad_request(format!(
                    "container {c} is not valid for pod {name}"
                )))
            }
        }
        None if containers.len() == 1 => {
            let mut pairs = query.clone();
            pairs.push(("container".to_string(), containers[0].clone()));
            let encoded = encode_query(&pairs);
            let path = req.uri().path().to_string();
            let uri = format!("{path}?{encoded}")
                .parse::<http::Uri>()
                .map_err(|e| Failure::internal(format!("rebuilding the request URI: {e}")))?;
            *req.uri_mut() = uri;
            Ok(req)
        }
        None => {
            let mut message = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            );
            if !init.is_empty() {
                message.push_str(&format!(
                    " or one of the init containers: [{}]",
                    init.join(" ")
                ));
            }
            if !ephemeral.is_empty() {
                message.push_str(&format!(
                    " or one of the ephemeral containers: [{}]",
                    ephemeral.join(" ")
                ));
            }
            Err(Failure::bad_request(message))
        }
    }
}

/// Percent-encodes query pairs (RFC 3986 unreserved characters kept).
fn encode_query(pairs: &[(String, String)]) -> String {
    fn enc(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    }
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

async fn forward_pod(
    app: &App,
    req: Request,
    pod: Pod,
    node: Node,
    subresource: &str,
) -> Result<Response, Failure> {
    let _ = (app, req, pod, node, subresource);
    Err(Failure::new(
        http::StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        "no kubelet client is configured for this API server",
    ))
}

async fn forward_node(
    app: &App,
    req: Request,
    node: Node,
    path: &str,
) -> Result<Response, Failure> {
    let _ = (app, req, node, path);
    Err(Failure::new(
        http::StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        "no kubelet client is configured for this API server",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(uri: &str) -> Request {
        http::Request::builder()
            .uri(uri)
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn containers_are_checked_and_defaulted() {
        let one = json!({"spec": {"containers": [{"name": "main"}]}});
        let req = default_container(
            request("/api/v1/namespaces/d/pods/p/exec?command=ls&command=-l%20a"),
            &one,
            "p",
        )
        .unwrap();
        assert_eq!(
            req.uri().query(),
            Some("command=ls&command=-l%20a&container=main")
        );
        let err = default_container(request("/x?container=nope"), &one, "p").unwrap_err();
        assert_eq!(err.message, "container nope is not valid for pod p");
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "i"}]}});
        let err = default_container(request("/x?command=ls"), &two, "p").unwrap_err();
        assert_eq!(
            err.message,
            "a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [i]"
        );
        assert!(default_container(request("/x?container=i"), &two, "p").is_ok());
    }
}

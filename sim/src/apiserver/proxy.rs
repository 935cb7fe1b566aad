//! The kubelet-facing subresources: `pods/{exec,attach,portforward,log}` and `nodes/proxy`.
//!
//! As kube-apiserver does, the handler resolves the pod and its node from the store (404 when
//! either is missing, 400 when the pod is not bound to a node), then hands the whole request,
//! upgrade included, to [`KubeletClient`], which defaults and checks the container, picks the
//! node address and relays or translates the stream.

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::Value;

use super::failure::Failure;
use super::kinds;
use super::route::ResourcePath;
use super::store::Store;
use crate::kubelet_proxy::{KubeletClient, PodSubresource};

/// Serves one connect request.
pub async fn connect(
    store: &Store,
    kubelet_client: Option<&KubeletClient>,
    req: Request,
    target: &ResourcePath,
) -> Result<Response, Failure> {
    let nodes =
        kinds::by_resource("", "nodes").ok_or_else(|| Failure::internal("nodes are not served"))?;
    if target.kind.kind == "Node" {
        let node: Node = typed(store.get(nodes, "", &target.name)?)?;
        let client = kubelet(kubelet_client)?;
        return Ok(client.proxy_node(req, &node, &target.rest).await);
    }
    let Some(sub) = PodSubresource::from_name(&target.subresource) else {
        return Err(Failure::no_route());
    };
    let pod_value = store.get(target.kind, &target.namespace, &target.name)?;
    let node_name = pod_value
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if node_name.is_empty() {
        if sub == PodSubresource::Log {
            // Upstream streams an empty log for a pod not yet bound to a node.
            return Ok((
                http::StatusCode::OK,
                [(http::header::CONTENT_TYPE, "text/plain")],
                "",
            )
                .into_response());
        }
        return Err(Failure::bad_request(format!(
            "pod {} does not have a host assigned",
            target.name
        )));
    }
    let pod: Pod = typed(pod_value)?;
    let node: Node = typed(store.get(nodes, "", &node_name)?)?;
    let client = kubelet(kubelet_client)?;
    Ok(client.proxy_pod(req, &pod, &node, sub).await)
}

/// The kubelet client, or the error a server without one gives (it cannot dial anything).
fn kubelet(client: Option<&KubeletClient>) -> Result<&KubeletClient, Failure> {
    client.ok_or_else(|| {
        Failure::new(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "error dialing backend: this API server has no kubelet client configured",
        )
    })
}

fn typed<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, Failure> {
    serde_json::from_value(value)
        .map_err(|e| Failure::internal(format!("decoding stored object: {e}")))
}

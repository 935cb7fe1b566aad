//! The node-level paths of a virtual node's kubelet: `/healthz`, `/metrics`,
//! `/metrics/resource`, `/stats/summary` and `/pods`, each behind the access a 1.36 kubelet
//! checks for it.

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode, Uri};

use super::NodeServer;
use crate::auth::{Access, Caller};
use crate::resource_metrics::encode;
use crate::status::Refusal;

impl NodeServer {
    /// The virtual node a node-level path (`/metrics`, `/stats/summary`, `/pods`) is about: the
    /// node of this listener, or on the shared port the only virtual node there is. With several,
    /// the shared port cannot tell which node a scraper means (they share relaylet's address), so
    /// it answers 404 naming the nodes' own ports.
    fn node_for_path(&self) -> Result<String, Refusal> {
        if let Some(node) = &self.node {
            return Ok(node.clone());
        }
        let nodes: Vec<String> = self
            .registry
            .snapshot()
            .values()
            .map(|l| l.node_name.clone())
            .collect();
        match nodes.as_slice() {
            [only] => Ok(only.clone()),
            _ => Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!(
                    "this port serves {} virtual nodes; node-level paths are served on each node's own kubelet port (status.daemonEndpoints.kubeletEndpoint.Port)",
                    nodes.len()
                ),
            )),
        }
    }

    /// Authorizes `method` on the node-level `path` on the listener's node, like a 1.36
    /// kubelet (`Access::for_path`); the node on success. With `any_node`, a shared port serving
    /// several nodes authorizes against all of them instead of answering 404 (for `/healthz`,
    /// which is the same for every node).
    async fn authorize_node_path(
        &self,
        caller: &Caller,
        path: &Uri,
        method: &Method,
        any_node: bool,
    ) -> Result<String, Refusal> {
        let node = match self.node_for_path() {
            Ok(node) => node,
            Err(_) if any_node => String::new(),
            Err(refusal) => return Err(refusal),
        };
        let access = Access::for_path(path.path(), method, &node);
        self.authorize(caller, &access).await?;
        Ok(node)
    }
}

/// The kubelet's `/healthz`, behind `nodes/healthz` (or `nodes/proxy`) like a 1.36 kubelet's.
/// The pod's probes use the metrics port instead, which needs no credentials.
pub(super) async fn healthz(
    State(server): State<Arc<NodeServer>>,
    Extension(caller): Extension<Caller>,
    method: Method,
    path: Uri,
) -> Result<&'static str, Refusal> {
    server
        .authorize_node_path(&caller, &path, &method, true)
        .await?;
    Ok("ok")
}

/// relaylet's own metrics, behind `nodes/metrics` (the apiserver's `nodes/{name}/proxy/metrics`).
pub(super) async fn metrics(
    State(server): State<Arc<NodeServer>>,
    Extension(caller): Extension<Caller>,
    method: Method,
    path: Uri,
) -> Result<Response, Refusal> {
    server
        .authorize_node_path(&caller, &path, &method, false)
        .await?;
    Ok(server.metrics.response())
}

/// The node's pods' usage in the kubelet's `/metrics/resource` format (what metrics-server
/// scrapes).
pub(super) async fn resource_metrics(
    State(server): State<Arc<NodeServer>>,
    Extension(caller): Extension<Caller>,
    method: Method,
    path: Uri,
) -> Result<Response, Refusal> {
    let node = server
        .authorize_node_path(&caller, &path, &method, false)
        .await?;
    let text = match server.stats.usage(&node).await {
        Ok(usage) => encode::encode_resource_metrics(Some(&usage)),
        Err(err) => {
            tracing::warn!(%node, %err, "resource metrics unavailable");
            encode::encode_resource_metrics(None)
        }
    };
    let mut resp = Response::new(Body::from(text));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(encode::TEXT_CONTENT_TYPE),
    );
    Ok(resp)
}

/// The node's pods' usage as the kubelet's stats Summary.
pub(super) async fn summary(
    State(server): State<Arc<NodeServer>>,
    Extension(caller): Extension<Caller>,
    method: Method,
    path: Uri,
) -> Result<Response, Refusal> {
    let node = server
        .authorize_node_path(&caller, &path, &method, false)
        .await?;
    let usage = server
        .stats
        .usage(&node)
        .await
        .map_err(|err| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    Ok(axum::Json(encode::summary(&usage)).into_response())
}

/// The root pods bound to the node, as the kubelet's `/pods` PodList.
pub(super) async fn pods(
    State(server): State<Arc<NodeServer>>,
    Extension(caller): Extension<Caller>,
    method: Method,
    path: Uri,
) -> Result<Response, Refusal> {
    let node = server
        .authorize_node_path(&caller, &path, &method, false)
        .await?;
    let items = server
        .stats
        .pods(&node)
        .await
        .map_err(|err| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    Ok(axum::Json(serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    }))
    .into_response())
}

//! The node-level paths of a virtual node's kubelet: `/healthz`, `/metrics`,
//! `/metrics/resource`, `/stats/summary` and `/pods`, each behind the access a 1.36 kubelet
//! checks for it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use super::server::{NodeServer, ThisNode};
use crate::model::status::Refusal;
use crate::node_server::auth::{Access, Caller};
use crate::node_server::resource_metrics::encode;

impl NodeServer {
    /// The virtual node a node-level path (`/metrics`, `/stats/summary`, `/pods`) is about: the
    /// node of this listener, or on the shared port the only virtual node there is. With several,
    /// the shared port cannot tell which node a scraper means (they share relaylet's address), so
    /// it answers 404 naming the nodes' own ports. Asked only once the caller is authorized: how
    /// many nodes there are is not told to strangers.
    fn node_for_path(&self, this: &ThisNode) -> Result<String, Refusal> {
        if let Some(node) = this.name() {
            return Ok(node.to_string());
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
}

/// The virtual node a node-level path is about (see `node_for_path`), once the caller is
/// authorized for the path (`Access::for_path`, as a 1.36 kubelet does it).
pub(super) struct AuthorizedNode(String);

/// For `/healthz`, which is the same for every node: a shared port serving several nodes
/// answers it too instead of 404.
pub(super) struct AuthorizedAnyNode;

impl FromRequestParts<Arc<NodeServer>> for AuthorizedNode {
    type Rejection = Refusal;

    async fn from_request_parts(
        parts: &mut Parts,
        server: &Arc<NodeServer>,
    ) -> Result<Self, Refusal> {
        let this = ThisNode::of(&parts.extensions)?;
        authorize_path(parts, server, this.to_authorize()).await?;
        Ok(AuthorizedNode(server.node_for_path(this)?))
    }
}

impl FromRequestParts<Arc<NodeServer>> for AuthorizedAnyNode {
    type Rejection = Refusal;

    async fn from_request_parts(
        parts: &mut Parts,
        server: &Arc<NodeServer>,
    ) -> Result<Self, Refusal> {
        authorize_path(
            parts,
            server,
            ThisNode::of(&parts.extensions)?.to_authorize(),
        )
        .await?;
        Ok(AuthorizedAnyNode)
    }
}

/// Whether the caller (authenticated by the filter in front) may have the path on `node`
/// (every node when empty).
async fn authorize_path(parts: &Parts, server: &NodeServer, node: &str) -> Result<(), Refusal> {
    let caller = parts.extensions.get::<Caller>().ok_or_else(|| {
        Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "a request reached a node path without authentication",
        )
    })?;
    let access = Access::for_path(parts.uri.path(), &parts.method, node);
    server.authorize(caller, &access).await
}

/// The kubelet's `/healthz`, behind `nodes/healthz` (or `nodes/proxy`) like a 1.36 kubelet's.
/// The pod's probes use the metrics port instead, which needs no credentials.
pub(super) async fn healthz(_: AuthorizedAnyNode) -> &'static str {
    "ok"
}

/// relaylet's own metrics, behind `nodes/metrics` (the apiserver's `nodes/{name}/proxy/metrics`).
pub(super) async fn metrics(State(server): State<Arc<NodeServer>>, _: AuthorizedNode) -> Response {
    server.metrics.response()
}

/// The node's pods' usage in the kubelet's `/metrics/resource` format (what metrics-server
/// scrapes).
pub(super) async fn resource_metrics(
    State(server): State<Arc<NodeServer>>,
    AuthorizedNode(node): AuthorizedNode,
) -> Result<Response, Refusal> {
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
    AuthorizedNode(node): AuthorizedNode,
) -> Result<Response, Refusal> {
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
    AuthorizedNode(node): AuthorizedNode,
) -> Result<Response, Refusal> {
    let items = server
        .stats
        .pods(&node)
        .await
        .map_err(|err| Refusal::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    Ok(axum::Json(serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": &*items,
    }))
    .into_response())
}

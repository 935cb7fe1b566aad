//! The kubelet API's routes, behind its filters: the node-level paths, the pod calls for every
//! other path, and the kubelet's 405 for a wrong method.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use http::StatusCode;

use super::server::NodeServer;
use super::{filters, node_paths, pod_calls};
use crate::model::status;

impl NodeServer {
    /// The routes, behind the filters, with this server as their state.
    pub(super) fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/healthz", axum::routing::get(node_paths::healthz))
            .route("/metrics", axum::routing::get(node_paths::metrics))
            .route(
                "/metrics/resource",
                axum::routing::get(node_paths::resource_metrics),
            )
            .route("/stats/summary", axum::routing::get(node_paths::summary))
            .route("/pods", axum::routing::get(node_paths::pods))
            .fallback(pod_calls::call)
            .method_not_allowed_fallback(method_not_allowed)
            // Layers run outside in: logs refusals in the kubelet's text, then authentication.
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                filters::authenticate,
            ))
            .layer(axum::middleware::from_fn(filters::logs_as_kubelet_text))
            .with_state(self)
    }
}

/// axum's 405 for the fixed routes, with a `metav1.Status` body like every other error.
async fn method_not_allowed(req: Request) -> Response {
    status::response(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not served for {}", req.method(), req.uri().path()),
    )
}

//! The kubelet's plain-text answers: its errors are text, not `metav1.Status`.

use axum::body::Body;
use axum::response::Response;
use http::StatusCode;

/// A plain-text answer, the way the kubelet writes its errors.
pub fn text(code: StatusCode, msg: impl Into<String>) -> Response {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(msg.into()))
        .unwrap_or_default()
}

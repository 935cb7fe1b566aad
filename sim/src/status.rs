//! `metav1.Status` answers, the error body every Kubernetes component returns.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::json;

/// A `metav1.Status` failure body for `code`, with the `reason` Kubernetes uses for it.
pub fn failure(code: StatusCode, message: impl Into<String>) -> serde_json::Value {
    let reason = match code.as_u16() {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    };
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.into(),
        "reason": reason,
        "code": code.as_u16(),
    })
}

/// An HTTP response carrying a `metav1.Status` failure.
pub fn response(code: StatusCode, message: impl Into<String>) -> Response {
    (
        code,
        [(http::header::CONTENT_TYPE, "application/json")],
        failure(code, message).to_string(),
    )
        .into_response()
}

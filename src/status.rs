//! `metav1.Status` error answers, so `kubectl` prints relaylet's errors like any kubelet's.

use axum::body::Body;
use axum::response::Response;
use http::{StatusCode, header};
use serde_json::json;

/// The `reason` Kubernetes uses for an HTTP status.
fn reason(code: StatusCode) -> &'static str {
    match code.as_u16() {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        413 => "RequestEntityTooLarge",
        429 => "TooManyRequests",
        500 => "InternalError",
        502 | 503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// A response with a `metav1.Status` failure body.
pub fn response(code: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason(code),
        "code": code.as_u16(),
    });
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

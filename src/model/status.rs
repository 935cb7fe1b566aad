//! `metav1.Status` error answers, so `kubectl` prints relaylet's errors like any kubelet's.
//!
//! Upgrade calls (exec, attach, portForward) answer errors with a Status body, which the root
//! apiserver passes through to kubectl. Plain calls (containerLogs) answer them as text, like a
//! kubelet: the root apiserver turns a kubelet's error body into the message kubectl prints, so a
//! JSON body would reach the user as raw JSON.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
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

/// A refused call. It renders itself as the `metav1.Status` [`response`] makes, so a handler
/// can stop at the first refusal with `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: StatusCode,
    pub message: String,
    /// The `Allow` header of a 405.
    pub allow: Option<String>,
}

impl Refusal {
    pub fn new(code: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
            allow: None,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut resp = response(self.code, self.message);
        if let Some(value) = self
            .allow
            .and_then(|a| http::HeaderValue::from_str(&a).ok())
        {
            resp.headers_mut().insert(header::ALLOW, value);
        }
        resp
    }
}

/// Most bytes of an error body turned into text.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// An error response in the kubelet's plain-text form: a `metav1.Status` body becomes its
/// message. Successes and bodies that are not JSON pass unchanged.
pub async fn as_kubelet_text(resp: Response) -> Response {
    use http_body_util::BodyExt;
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if resp.status().is_success() || !json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = match http_body_util::Limited::new(body, MAX_ERROR_BODY)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(_) => bytes::Bytes::from_static(b"error body unreadable or too large"),
    };
    let message = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("message")?.as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Response::from_parts(parts, Body::from(message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn text(resp: Response) -> (StatusCode, String, String) {
        let code = resp.status();
        let kind = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (code, kind, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn status_bodies_become_their_message() {
        let leaf = response(
            StatusCode::BAD_REQUEST,
            "previous terminated container \"main\" in pod \"demo-2\" not found",
        );
        assert_eq!(
            text(as_kubelet_text(leaf).await).await,
            (
                StatusCode::BAD_REQUEST,
                "text/plain; charset=utf-8".to_string(),
                "previous terminated container \"main\" in pod \"demo-2\" not found".to_string()
            )
        );
        let ok = Response::new(Body::from("{\"a\":1}"));
        assert_eq!(text(as_kubelet_text(ok).await).await.2, "{\"a\":1}");
    }
}

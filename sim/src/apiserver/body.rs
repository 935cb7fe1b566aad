//! Request and response bodies: reading with upstream's size limit, decoding JSON, YAML or
//! the protobuf kubectl's typed clients send, and writing JSON answers.

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::failure::Failure;
use super::kinds::Kind;

/// Largest request body accepted, as upstream's 3 MiB limit.
pub(super) const MAX_BODY: usize = 3 * 1024 * 1024;

pub(super) fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(super) async fn read_body(req: Request) -> Result<bytes::Bytes, Failure> {
    axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(|_| {
            Failure::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                "the request body is too large or could not be read",
            )
        })
}

pub(super) async fn read_json(req: Request) -> Result<Value, Failure> {
    let content_type = content_type(req.headers());
    let body = read_body(req).await?;
    decode(&body, &content_type)
}

/// A request body for `kind`: JSON, YAML, or the protobuf kubectl's typed clients send.
pub(super) async fn read_object(req: Request, kind: &Kind) -> Result<Value, Failure> {
    if content_type(req.headers()) == "application/vnd.kubernetes.protobuf" {
        let body = read_body(req).await?;
        return super::protobuf::decode_object(&body, kind.kind);
    }
    read_json(req).await
}

pub(super) async fn read_optional_json(req: Request) -> Result<Value, Failure> {
    let body = read_body(req).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    decode(&body, "application/json")
}

/// Decodes a JSON or (for YAML content types) YAML body.
pub(super) fn decode(body: &[u8], content_type: &str) -> Result<Value, Failure> {
    if content_type.contains("protobuf") || content_type.contains("cbor") {
        return Err(Failure::unsupported_media_type(content_type));
    }
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(_) if content_type.contains("yaml") => serde_saphyr::from_slice::<Value>(body)
            .map_err(|e| Failure::bad_request(format!("error decoding YAML: {e}"))),
        Err(e) => Err(Failure::bad_request(format!(
            "error decoding the request body: {e}"
        ))),
    }
}

pub(super) fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

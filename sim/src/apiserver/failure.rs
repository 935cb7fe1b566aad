//! API errors as kube-apiserver reports them: an HTTP status plus a `metav1.Status` body whose
//! `reason`, `message` and `details` clients act on.
//!
//! client-go and kube-rs branch on `reason` (NotFound, AlreadyExists, Conflict, Expired...), and
//! kubectl prints `message` verbatim, so both follow upstream's wording.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use super::kinds::Kind;

/// One failed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code.as_u16(),
            self.reason,
            self.message
        )
    }
}

impl std::error::Error for Failure {}

impl Failure {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, kind: &Kind, name: &str) -> Self {
        let mut details = json!({ "name": name, "kind": kind.resource });
        if !kind.group.is_empty() {
            details["group"] = json!(kind.group);
        }
        self.details = Some(details);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    pub fn not_found(kind: &Kind, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", kind.qualified()),
        )
        .with_details(kind, name)
    }

    /// 404 for a URL that names no served resource. Upstream builds it with
    /// `NewGenericServerResponse`, which always sets (empty) details: kubectl debug reads
    /// `details.name` of this 404 without a nil check.
    pub fn no_route() -> Self {
        let mut failure = Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
        failure.details = Some(json!({}));
        failure
    }

    pub fn already_exists(kind: &Kind, name: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", kind.qualified()),
        )
        .with_details(kind, name)
    }

    /// The optimistic-concurrency failure of an update carrying a stale resourceVersion.
    pub fn conflict(kind: &Kind, name: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                kind.qualified()
            ),
        )
        .with_details(kind, name)
    }

    /// 422 with one field error, worded like upstream's field validation.
    pub fn invalid(kind: &Kind, name: &str, field: &str, detail: &str) -> Self {
        let mut failure = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{} \"{name}\" is invalid: {field}: {detail}", kind.kind),
        );
        failure.details = Some(json!({
            "name": name,
            "group": kind.group,
            "kind": kind.kind,
            "causes": [{ "reason": "FieldValueInvalid", "message": detail, "field": field }],
        }));
        failure
    }

    pub fn method_not_allowed(verb: &str, kind: &Kind) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({verb} {})",
                kind.qualified()
            ),
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {content_type:?}"
            ),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }

    /// 410 for a watch or continue token older than the retained history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, "Expired", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", message)
    }

    /// The `metav1.Status` body.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (
            self.code,
            [(http::header::CONTENT_TYPE, "application/json")],
            self.status().to_string(),
        )
            .into_response()
    }
}

//! Why a proxied call failed, and how each failure answers (kube-apiserver's wording and codes).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

/// Why a proxied call failed before or while reaching the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// 400 with this message.
    #[error("{0}")]
    BadRequest(String),
    /// 422: a complete `metav1.Status` (PodLogOptions validation).
    #[error("{}", .0["message"].as_str().unwrap_or("invalid"))]
    Invalid(serde_json::Value),
    /// The node has no address of a preferred type.
    #[error("no preferred addresses found; known addresses: [{0}]")]
    NoAddress(String),
    /// Dialing or talking to the kubelet failed.
    #[error("{0}")]
    Dial(String),
    /// 500 with this message.
    #[error("{0}")]
    Internal(String),
}

impl ProxyError {
    /// The upgrade path's wording for a kubelet it could not reach.
    pub(super) fn dialing_backend(self) -> ProxyError {
        match self {
            ProxyError::Dial(msg) => ProxyError::Internal(format!("error dialing backend: {msg}")),
            other => other,
        }
    }

    /// The node proxy's wording for a kubelet it could not reach (503).
    pub(super) fn reaching_service(self) -> ProxyError {
        match self {
            ProxyError::Dial(msg) => {
                ProxyError::Dial(format!("error trying to reach service: {msg}"))
            }
            other => other,
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        match self {
            ProxyError::BadRequest(msg) => crate::status::response(StatusCode::BAD_REQUEST, msg),
            ProxyError::Invalid(status) => {
                let mut response = Response::new(Body::from(status.to_string()));
                *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                response
            }
            ProxyError::Dial(msg) => crate::status::response(StatusCode::SERVICE_UNAVAILABLE, msg),
            err @ (ProxyError::NoAddress(_) | ProxyError::Internal(_)) => {
                crate::status::response(StatusCode::INTERNAL_SERVER_ERROR, err.to_string())
            }
        }
    }
}

//! The filters in front of every route: who is calling (authentication, once per request, as
//! the kubelet's filter chain does it), and the kubelet's plain-text form of logs refusals.
//! Authorization belongs to each route, which knows what is asked; the helper is here, and it
//! is what takes a connection out of the budget of connections not authorized yet.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rustls::pki_types::CertificateDer;

use super::server::NodeServer;
use crate::caps::Standing;
use crate::config::AuthMode;
use crate::model::status::{self, Refusal};
use crate::node_server::auth::{Access, AuthError, Caller};

tokio::task_local! {
    /// The standing of the connection the request being handled came on (`caps::gate`), for
    /// [`NodeServer::authorize`]: set by [`authenticate`] around every route, so that whichever
    /// route authorizes a request proves its connection, without each route passing it along.
    static STANDING: Standing;
}

/// The client certificate the caller presented in the TLS handshake (its leaf certificate),
/// put on each of the connection's requests by the connection layer.
#[derive(Clone, Default)]
pub(super) struct PeerCert(pub(super) Option<Arc<CertificateDer<'static>>>);

/// Authenticates the caller (a verified client certificate, or a bearer token) and hands it
/// to the routes as a request extension; a refusal answers at once.
pub(super) async fn authenticate(
    State(server): State<Arc<NodeServer>>,
    mut req: Request,
    next: Next,
) -> Response {
    let cert = req
        .extensions()
        .get::<PeerCert>()
        .cloned()
        .unwrap_or_default();
    let source = req
        .extensions()
        .get::<std::net::SocketAddr>()
        .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |peer| peer.ip());
    let caller = match server
        .auth
        .authenticate(cert.0.as_deref(), req.headers(), source)
        .await
    {
        Ok(caller) => caller,
        Err(err) => return server.auth_refusal(err).into_response(),
    };
    if server.auth.mode() == AuthMode::None {
        tracing::warn!(user = %caller.user, path = %req.uri().path(), "AUTH_MODE=none: serving an unauthenticated caller");
    }
    // Knowing the caller is not enough to leave the budget of connections not authorized yet
    // (a token the root accepts may be allowed nothing): authorizing a request is.
    let standing = req
        .extensions()
        .get::<Standing>()
        .cloned()
        .unwrap_or_default();
    req.extensions_mut().insert(caller);
    STANDING.scope(standing, next.run(req)).await
}

/// `containerLogs` refusals in the kubelet's plain text, which the root apiserver shows as the
/// message (a `metav1.Status` body would be shown as raw JSON).
pub(super) async fn logs_as_kubelet_text(req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with("/containerLogs/") {
        return next.run(req).await;
    }
    let path = req.uri().path().to_string();
    let resp = status::as_kubelet_text(next.run(req).await).await;
    if !resp.status().is_success() {
        tracing::info!(code = resp.status().as_u16(), path = %path, "containerLogs refused");
    }
    resp
}

impl NodeServer {
    /// Whether `caller` may do `access`; counted either way. Once allowed, the request's
    /// connection leaves the budget of connections not authorized yet, and its certificate
    /// identity is proven for its next connections.
    pub(super) async fn authorize(&self, caller: &Caller, access: &Access) -> Result<(), Refusal> {
        match self.auth.authorize(caller, access).await {
            Ok(()) => {
                self.metrics.auth_decision("allowed");
                let _ = STANDING.try_with(Standing::authorized);
                Ok(())
            }
            Err(err) => {
                tracing::info!(user = %caller.user, verb = %access.verb, node = %access.node, "access denied");
                Err(self.auth_refusal(err))
            }
        }
    }

    /// A refused caller, counted in the auth metrics.
    fn auth_refusal(&self, err: AuthError) -> Refusal {
        self.metrics.auth_decision(match err {
            AuthError::Forbidden { .. } | AuthError::NotAllowed { .. } => "denied",
            AuthError::Unavailable(_) | AuthError::Throttled(_) | AuthError::ThrottledAll => {
                "error"
            }
            _ => "unauthenticated",
        });
        Refusal::new(err.status(), err.to_string())
    }
}

//! Byte-for-byte relaying: upgrades (SPDY, WebSocket v1-v4) and plain requests (logs, node proxy).
//!
//! Like `UpgradeAwareHandler`: the client's upgrade request goes to the kubelet with its upgrade
//! headers; a 101 is relayed with the kubelet's headers and the two connections are spliced until
//! either side ends, which closes the other at once; an error answer (4xx/5xx) is relayed as is;
//! any other status is an error of ours.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{Request, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::backend::{Backend, forward_request, relay_headers};
use super::error::ProxyError;

/// Relays an upgrade request to the kubelet and, on 101, splices the connections.
pub(crate) async fn upgrade(
    backend: &Backend,
    req: Request<Body>,
    path_and_query: &str,
) -> Response {
    let mut sender = match backend.connect().await {
        Ok(sender) => sender,
        Err(err) => return err.dialing_backend().into_response(),
    };
    let (mut parts, _body) = req.into_parts();
    // Upgrade requests carry no body (SPDY's POST has Content-Length: 0).
    let request = match forward_request(
        parts.method,
        &parts.headers,
        backend,
        path_and_query,
        true,
        Body::empty(),
    ) {
        Ok(request) => request,
        Err(err) => return err.into_response(),
    };
    let mut response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(err) => {
            return ProxyError::Dial(err.to_string())
                .dialing_backend()
                .into_response();
        }
    };
    let status = response.status();
    if status == StatusCode::SWITCHING_PROTOCOLS {
        // Like the hijack upstream, this is the last step: only a 101 takes the client's socket.
        let Some(client_upgrade) = parts.extensions.remove::<OnUpgrade>() else {
            return ProxyError::Internal("unable to upgrade: unable to hijack response".into())
                .into_response();
        };
        let backend_upgrade = hyper::upgrade::on(&mut response);
        let mut relayed = Response::new(Body::empty());
        *relayed.status_mut() = status;
        *relayed.headers_mut() = response.headers().clone();
        tokio::spawn(async move {
            let (client, kubelet) = tokio::join!(client_upgrade, backend_upgrade);
            match (client, kubelet) {
                (Ok(client), Ok(kubelet)) => {
                    splice(TokioIo::new(client), TokioIo::new(kubelet)).await
                }
                (Err(err), _) | (_, Err(err)) => {
                    tracing::debug!(%err, "upgrade did not complete");
                }
            }
        });
        return relayed;
    }
    if status.as_u16() >= 400 {
        return relay(response);
    }
    ProxyError::Internal(format!(
        "invalid upgrade response: status code {}",
        status.as_u16()
    ))
    .into_response()
}

/// Copies both ways until either direction ends, then drops (closes) both connections, as the
/// apiserver's proxy does: a half-closed session must not outlive its peer.
pub(crate) async fn splice<A, B>(a: A, b: B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    let a_to_b = async {
        let result = tokio::io::copy(&mut a_read, &mut b_write).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut b_write).await;
        result
    };
    let b_to_a = async {
        let result = tokio::io::copy(&mut b_read, &mut a_write).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut a_write).await;
        result
    };
    tokio::select! {
        result = a_to_b => tracing::debug!(?result, "client side of the splice ended"),
        result = b_to_a => tracing::debug!(?result, "kubelet side of the splice ended"),
    }
}

/// Relays a kubelet response: status, end-to-end headers and a streamed body.
pub(crate) fn relay(response: http::Response<hyper::body::Incoming>) -> Response {
    let (parts, body) = response.into_parts();
    let mut relayed = Response::new(Body::new(body));
    *relayed.status_mut() = parts.status;
    relay_headers(&parts.headers, relayed.headers_mut());
    relayed
}

/// A plain (non-upgrade) request relayed to the kubelet, body streamed both ways.
pub(crate) async fn plain(backend: &Backend, req: Request<Body>, path_and_query: &str) -> Response {
    let mut sender = match backend.connect().await {
        Ok(sender) => sender,
        Err(err) => return err.reaching_service().into_response(),
    };
    let (parts, body) = req.into_parts();
    let request = match forward_request(
        parts.method,
        &parts.headers,
        backend,
        path_and_query,
        false,
        body,
    ) {
        Ok(request) => request,
        Err(err) => return err.into_response(),
    };
    match sender.send_request(request).await {
        Ok(response) => relay(response),
        Err(err) => ProxyError::Dial(err.to_string())
            .reaching_service()
            .into_response(),
    }
}

//! The "hold the upgrade open" leaf used for the idle-session memory figure.
//!
//! Ten thousand idle exec sessions each backed by a real process (and by the leaf apiserver's
//! and kubelet's own connections) is more than this machine holds, and relaylet's per-session
//! memory does not depend on what is behind the leaf: relaylet only splices bytes. So relaylet
//! is given a second leaf whose "apiserver" is this endpoint: it answers every SPDY upgrade with
//! 101 (choosing the first offered protocol, as the kubelet's handshake does) and then holds the
//! connection, discarding whatever arrives, until the peer closes. A GET of the held pod answers
//! with its leaf copy's metadata, marked with the root pod's UID as a syncer would mark it (so
//! relaylet's counterpart check passes, at the cost of one request like a real leaf's). Every
//! other request is a 404 `Status`, which relaylet's virtual-node controller treats as an
//! unhealthy leaf.

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use http::{Request, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use relaylet_sim::serve::{Served, serve_tls};
use relaylet_sim::spdy;
use relaylet_sim::tls::Identity;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use relaylet::model::counterpart::ROOT_UID_MARKER;

/// Starts the endpoint on a loopback port with the serving `identity`, holding sessions of the
/// root pod `held`.
pub async fn start(identity: &Identity, held: &Pod) -> anyhow::Result<Served> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let tls = identity.server_config()?;
    let namespace = held.metadata.namespace.clone().unwrap_or_default();
    let name = held.metadata.name.clone().unwrap_or_default();
    let copy = serde_json::json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "annotations": {ROOT_UID_MARKER: held.metadata.uid.clone().unwrap_or_default()},
        },
    })
    .to_string();
    let pod_path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
    Ok(serve_tls(
        listener,
        tls,
        Router::new().fallback(move |req: Request<Body>| {
            let copy = (req.method() == http::Method::GET && req.uri().path() == pod_path)
                .then(|| copy.clone());
            async move {
                match copy {
                    Some(copy) => json(copy),
                    None => answer(req),
                }
            }
        }),
    ))
}

fn json(body: String) -> Response {
    let mut resp = Response::new(Body::from(body));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn answer(mut req: Request<Body>) -> Response {
    let protocol = match spdy::negotiate(req.headers(), &["v4.channel.k8s.io"]) {
        Ok(Some(p)) => p,
        _ => {
            return relaylet_sim::status::response(
                StatusCode::NOT_FOUND,
                "the bench hold endpoint only accepts SPDY exec upgrades (v4.channel.k8s.io)",
            );
        }
    };
    let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
        return relaylet_sim::status::response(
            StatusCode::BAD_REQUEST,
            "not an upgradable request",
        );
    };
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut io = TokioIo::new(upgraded);
        let mut sink = [0u8; 512];
        // Hold until the peer closes or fails.
        while let Ok(n) = io.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    });
    spdy::upgrade_response(Some(&protocol))
}

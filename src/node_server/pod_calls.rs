//! The pod calls: exec, attach, portForward and containerLogs, each parsed strictly,
//! authorized like the kubelet does (before anything about the pod is said), matched to its
//! proven leaf counterpart and handed to the relay.

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use http::StatusCode;
use tracing::Instrument;

use super::server::{NodeServer, ThisNode};
use crate::caps::Standing;
use crate::model::kubelet_request::{KubeletRequest, RequestError};
use crate::model::status::Refusal;
use crate::node_server::auth::{Access, Caller};
use crate::relay::SessionInfo;
use crate::routing::RouteError;
use crate::routing::{RootPod, verify_counterpart};

/// Parses, authorizes, finds the leaf pod and relays one kubelet call (exec, attach,
/// portForward, containerLogs) of an authenticated caller.
pub(super) async fn call(
    State(server): State<Arc<NodeServer>>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Response, Refusal> {
    let kreq = KubeletRequest::parse(req.uri().path(), req.uri().query()).map_err(|err| {
        let code = match err {
            RequestError::UnknownRoute(_) => StatusCode::NOT_FOUND,
            _ => StatusCode::BAD_REQUEST,
        };
        Refusal::new(code, err.to_string())
    })?;
    served(&kreq, &req)?;

    // Authorize before saying anything about the pod (whether it exists, its UID, its node),
    // like the kubelet. A node's own port is that node's kubelet: the caller is authorized for
    // that node, and only that node's pods exist there. The root apiserver's node proxy
    // (`nodes/A/proxy/...`) authorizes its user for node A alone and then calls A's port with
    // its own identity, so a pod of node B must not be reachable through A's port. The shared
    // port, which no Node names, authorizes against the pod's own node (every node when the
    // pod is on none).
    let route = match ThisNode::of(req.extensions())?.name() {
        Some(own) => {
            let access = Access::for_call(kreq.kind, req.method(), own);
            server.authorize(&caller, &access).await?;
            // Not on this node, or on none: the same answer either way, as a kubelet gives for
            // a pod it does not run, so nothing says where (or whether) the pod is.
            server
                .pods
                .route_on_node(&kreq.namespace, &kreq.pod, own)
                .await
                .map_err(|err| server.route_refusal(err))?
                .ok_or_else(|| not_on_node(&kreq, own))?
        }
        None => {
            let route = server.pods.route(&kreq.namespace, &kreq.pod).await;
            let access_node = route.as_ref().map_or("", |r| r.node_name.as_str());
            let access = Access::for_call(kreq.kind, req.method(), access_node);
            server.authorize(&caller, &access).await?;
            route.map_err(|err| server.route_refusal(err))?
        }
    };
    if let (Some(asked), Some(actual)) = (&kreq.uid, &route.uid)
        && !actual.is(asked)
    {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!(
                "pod {}/{} with UID {asked} not found (the pod now has UID {actual})",
                kreq.namespace, kreq.pod
            ),
        ));
    }
    let leaf = server.registry.by_node(&route.node_name).ok_or_else(|| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "virtual node {} has no registered leaf cluster",
                route.node_name
            ),
        )
    })?;

    // The leaf pod is the one the administrator's mapping and the syncer's marker name, read
    // fresh from the leaf: never one the root pod's author chose.
    let uid = route.uid.as_ref().map(ToString::to_string);
    let root = RootPod {
        namespace: &kreq.namespace,
        name: &kreq.pod,
        uid: uid.as_deref(),
    };
    let target = verify_counterpart(&leaf, &server.leaf_pod_match, root)
        .await
        .map_err(|err| {
            server.metrics.counterpart_refusal(&leaf.name, err.reason());
            tracing::warn!(
                user = %caller.user,
                verb = %kreq.kind,
                namespace = %kreq.namespace,
                pod = %kreq.pod,
                leaf = %leaf.name,
                rule = %server.leaf_pod_match,
                %err,
                "call refused: no proven leaf counterpart"
            );
            Refusal::new(err.status(), err.to_string())
        })?;

    // Every stream, log streams as much as sessions, holds a caller connection and a leaf
    // connection for as long as it runs: each counts against its caps, in total, per user and
    // per namespace (behind the root apiserver every call is the apiserver's: the pod's
    // namespace is what tells tenants apart).
    let permit = server
        .gate
        .stream(kreq.kind, &caller.user, &kreq.namespace)
        .map_err(|err| {
            tracing::warn!(user = %caller.user, verb = %kreq.kind, namespace = %kreq.namespace, %err, "stream refused");
            server.metrics.limit_refusal(err.cap());
            Refusal::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
        })?;
    // A log stream's connection is closed after it (the kubelet keeps it open): it reads no
    // further request head, so its large head permit, if it has one, can serve another caller
    // for as long as the stream runs (an upgraded connection gives it back when it upgrades).
    let logs = !kreq.kind.is_streaming();
    if logs && let Some(standing) = req.extensions().get::<Standing>() {
        standing.streaming();
    }
    let path = kreq.leaf_path(&target.namespace, &target.name);
    let info = SessionInfo {
        kind: kreq.kind,
        user: caller.user.clone(),
        namespace: kreq.namespace.clone(),
        pod: kreq.pod.clone(),
        container: kreq.container.clone(),
        leaf: leaf.name.clone(),
        leaf_namespace: target.namespace,
        leaf_pod: target.name,
        node: route.node_name.clone(),
    };
    let span = info.span();
    let mut resp = async move {
        server
            .relay
            .forward(req.map(Body::new), info, leaf, path, permit)
            .await
    }
    .instrument(span)
    .await;
    if logs {
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    Ok(resp)
}

/// The 404 of a node's own port for a pod that is not on the node: the same whether the pod is
/// on another node or nowhere.
fn not_on_node(kreq: &KubeletRequest, node: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        format!(
            "pod {}/{} does not exist on node {node}",
            kreq.namespace, kreq.pod
        ),
    )
}

/// A 405 for a method the kubelet does not serve on this call, and a 400 for an upgrade that
/// HTTP/1.0 cannot carry; checked before anything reaches the leaf.
fn served(kreq: &KubeletRequest, req: &Request) -> Result<(), Refusal> {
    let methods = kreq.kind.methods();
    if !methods.contains(req.method()) {
        let allowed: Vec<&str> = methods.iter().map(http::Method::as_str).collect();
        let mut refusal = Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "{} is not served for {}; use {}",
                req.method(),
                kreq.kind,
                allowed.join(" or ")
            ),
        );
        refusal.allow = Some(allowed.join(", "));
        return Err(refusal);
    }
    if kreq.kind.is_streaming() && req.version() < http::Version::HTTP_11 {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{} needs a connection upgrade, which {:?} cannot carry: use HTTP/1.1",
                kreq.kind,
                req.version()
            ),
        ));
    }
    Ok(())
}

impl NodeServer {
    /// Why a call's pod cannot be reached through this relaylet.
    fn route_refusal(&self, err: RouteError) -> Refusal {
        match err {
            RouteError::NotOnVirtualNode { node, .. }
                if !self.node_name_prefix.is_empty()
                    && node.starts_with(&self.node_name_prefix) =>
            {
                Refusal::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "virtual node {node} has no registered leaf cluster: its leaf Secret is missing or invalid (see relaylet's log)"
                    ),
                )
            }
            err @ (RouteError::NotFound { .. } | RouteError::NotOnVirtualNode { .. }) => {
                Refusal::new(StatusCode::NOT_FOUND, err.to_string())
            }
            err @ (RouteError::Root { .. } | RouteError::Busy { .. }) => {
                Refusal::new(StatusCode::SERVICE_UNAVAILABLE, err.to_string())
            }
        }
    }
}

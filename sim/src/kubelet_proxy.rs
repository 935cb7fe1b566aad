//! How kube-apiserver proxies pod subresources and node proxy calls to a kubelet.
//!
//! The API server stand-in authenticates and authorizes `pods/exec`, `pods/attach`,
//! `pods/portforward`, `pods/log` and `nodes/proxy`, looks up the pod and its node, and hands the
//! request to [`KubeletClient`], which behaves like the real apiserver's kubelet client and
//! upgrade-aware proxy:
//!
//! - the node endpoint is the first address whose type comes first in the preferred list (with
//!   the `kubernetes.io/hostname` label standing in for a missing `Hostname` address), and the
//!   port is the node's `daemonEndpoints.kubeletEndpoint.Port`, else the default;
//! - the container is defaulted and validated and the query translated to the kubelet's names;
//! - SPDY and WebSocket v1-v4 upgrades are relayed byte for byte, WebSocket `v5.channel.k8s.io`
//!   exec/attach is translated to SPDY ([`translator`]), and port-forward WebSockets offering
//!   `SPDY/3.1+portforward.k8s.io` are tunnelled ([`tunnel`]) - unless the node declares
//!   `ExtendWebSocketsToKubelet` (1.36), then WebSockets are relayed to the kubelet as well;
//! - logs are a plain streamed GET body that stops when the client goes.
//!
//! relaylet sits exactly where the kubelet would, so these details decide whether the tests
//! exercise relaylet the way a real cluster would.

mod backend;
mod error;
mod location;
mod passthrough;
mod translator;
mod tunnel;
mod websocket;

use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Request, StatusCode, header};
use k8s_openapi::api::core::v1::{Node, Pod};

use backend::Backend;
pub use error::ProxyError;
use location::Query;

/// The address types kube-apiserver prefers by default (`--kubelet-preferred-address-types`).
pub const DEFAULT_PREFERRED_ADDRESS_TYPES: &[&str] = &[
    "Hostname",
    "InternalDNS",
    "InternalIP",
    "ExternalDNS",
    "ExternalIP",
];

/// kube-apiserver's default kubelet port.
pub const DEFAULT_KUBELET_PORT: u16 = 10250;

/// The apiserver's client for kubelets.
#[derive(Clone)]
pub struct KubeletClient {
    /// Address types in preference order.
    pub preferred_address_types: Vec<String>,
    /// Used when the node reports no kubelet port.
    pub default_port: u16,
    /// The apiserver's kubelet client certificate and the trust it has in kubelets.
    pub tls: Arc<rustls::ClientConfig>,
    /// The `ExtendWebSocketsToKubelet` gate (beta, on by default in 1.36): WebSockets go to
    /// kubelets whose Node declares the feature untouched, instead of being translated (v5
    /// exec/attach) or tunnelled (port-forward) here.
    pub extend_websockets_to_kubelet: bool,
}

/// The node-declared feature that lets WebSockets through to the kubelet.
pub const EXTEND_WEBSOCKETS_TO_KUBELET: &str = "ExtendWebSocketsToKubelet";

/// The pod subresources that reach the kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSubresource {
    Exec,
    Attach,
    PortForward,
    Log,
}

impl PodSubresource {
    /// The subresource named by the last segment of a pod URL (`pods/<name>/<subresource>`).
    pub fn from_name(name: &str) -> Option<PodSubresource> {
        match name {
            "exec" => Some(PodSubresource::Exec),
            "attach" => Some(PodSubresource::Attach),
            "portforward" => Some(PodSubresource::PortForward),
            "log" => Some(PodSubresource::Log),
            _ => None,
        }
    }
}

impl KubeletClient {
    /// A client with the upstream default address preference and port.
    pub fn new(tls: Arc<rustls::ClientConfig>) -> KubeletClient {
        KubeletClient {
            preferred_address_types: DEFAULT_PREFERRED_ADDRESS_TYPES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            default_port: DEFAULT_KUBELET_PORT,
            tls,
            extend_websockets_to_kubelet: true,
        }
    }

    /// Whether WebSockets for this node go straight to its kubelet: the gate is on and the
    /// node lists the feature in `status.declaredFeatures` (`checkNodeSupportsWebsockets`).
    pub fn websockets_reach_kubelet(&self, node: &Node) -> bool {
        self.extend_websockets_to_kubelet
            && node
                .status
                .as_ref()
                .and_then(|s| s.declared_features.as_ref())
                .is_some_and(|f| f.iter().any(|f| f == EXTEND_WEBSOCKETS_TO_KUBELET))
    }

    /// node -> (host, port) exactly as kube-apiserver picks: for each preferred type in order,
    /// the first address of that type; for `Hostname` with no such address, the
    /// `kubernetes.io/hostname` label. Port from `daemonEndpoints.kubeletEndpoint.Port`, else the
    /// default.
    pub fn node_endpoint(&self, node: &Node) -> Result<(String, u16), ProxyError> {
        let status = node.status.as_ref();
        let addresses = status.and_then(|s| s.addresses.as_deref()).unwrap_or(&[]);
        let mut host = None;
        for wanted in &self.preferred_address_types {
            if let Some(address) = addresses.iter().find(|a| &a.type_ == wanted) {
                host = Some(address.address.clone());
                break;
            }
            if wanted == "Hostname"
                && let Some(label) = node
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/hostname"))
                    .filter(|l| !l.is_empty())
            {
                host = Some(label.clone());
                break;
            }
        }
        let Some(host) = host else {
            let known: Vec<String> = addresses
                .iter()
                .map(|a| format!("{{{} {}}}", a.type_, a.address))
                .collect();
            return Err(ProxyError::NoAddress(known.join(" ")));
        };
        let port = status
            .and_then(|s| s.daemon_endpoints.as_ref())
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .map(|e| e.port)
            .filter(|p| *p > 0)
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(self.default_port);
        Ok((host, port))
    }

    fn backend(&self, node: &Node) -> Result<Backend, ProxyError> {
        let (host, port) = self.node_endpoint(node)?;
        Ok(Backend {
            host,
            port,
            tls: self.tls.clone(),
        })
    }

    /// Handles `/api/v1/namespaces/{ns}/pods/{name}/{exec|attach|portforward|log}?...` for an
    /// already authenticated and authorized request; `pod` and `node` come from the store.
    pub async fn proxy_pod(
        &self,
        req: Request<Body>,
        pod: &Pod,
        node: &Node,
        sub: PodSubresource,
    ) -> Response {
        use tracing::Instrument;
        let span = tracing::debug_span!(
            "kubelet_proxy",
            namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
            pod = pod.metadata.name.as_deref().unwrap_or(""),
            node = node.metadata.name.as_deref().unwrap_or(""),
            subresource = ?sub,
        );
        match self
            .proxy_pod_inner(req, pod, node, sub)
            .instrument(span)
            .await
        {
            Ok(response) => response,
            Err(err) => {
                tracing::debug!(%err, "kubelet proxy refused the request");
                err.into_response()
            }
        }
    }

    async fn proxy_pod_inner(
        &self,
        req: Request<Body>,
        pod: &Pod,
        node: &Node,
        sub: PodSubresource,
    ) -> Result<Response, ProxyError> {
        let query = Query::parse(req.uri().query());
        match sub {
            PodSubresource::Log => {
                let Some(target) = location::log_target(pod, &query)? else {
                    // No node yet: the apiserver streams an empty log.
                    return Ok(text_response(Body::empty()));
                };
                let backend = self.backend(node)?;
                let name = pod.metadata.name.as_deref().unwrap_or("");
                Ok(logs(&backend, req, &target.path_and_query(), name).await)
            }
            PodSubresource::Exec | PodSubresource::Attach => {
                let verb = if sub == PodSubresource::Exec {
                    "exec"
                } else {
                    "attach"
                };
                let (target, options) = location::stream_target(pod, &query, verb)?;
                let backend = self.backend(node)?;
                if translator::is_v5_request(req.headers()) && !self.websockets_reach_kubelet(node)
                {
                    return Ok(translator::translate(backend, req, target, options));
                }
                upgrade_required(&req)?;
                Ok(passthrough::upgrade(&backend, req, &target.path_and_query()).await)
            }
            PodSubresource::PortForward => {
                let target = location::port_forward_target(pod, &query)?;
                let backend = self.backend(node)?;
                if tunnel::is_tunnel_request(req.headers()) && !self.websockets_reach_kubelet(node)
                {
                    return Ok(tunnel::tunnel(&backend, req, &target.path_and_query()).await);
                }
                upgrade_required(&req)?;
                Ok(passthrough::upgrade(&backend, req, &target.path_and_query()).await)
            }
        }
    }

    /// Handles `/api/v1/nodes/{name}/proxy/{path}`: the request goes to the kubelet's `/{path}`
    /// with its query; upgrades are relayed like the pod subresources' are.
    pub async fn proxy_node(&self, req: Request<Body>, node: &Node, path: &str) -> Response {
        let backend = match self.backend(node) {
            Ok(backend) => backend,
            Err(err) => return err.into_response(),
        };
        let mut target = format!("/{}", path.trim_start_matches('/'));
        if let Some(query) = req.uri().query() {
            target.push('?');
            target.push_str(query);
        }
        if is_upgrade_request(&req) {
            passthrough::upgrade(&backend, req, &target).await
        } else {
            passthrough::plain(&backend, req, &target).await
        }
    }
}

/// `httpstream.IsUpgradeRequest`: a `Connection` header mentioning `upgrade`.
fn is_upgrade_request(req: &Request<Body>) -> bool {
    req.headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("upgrade"))
}

/// Exec, attach and port-forward go through an upgrade-required proxy.
fn upgrade_required(req: &Request<Body>) -> Result<(), ProxyError> {
    if is_upgrade_request(req) {
        Ok(())
    } else {
        Err(ProxyError::BadRequest(
            "Upgrade request required".to_string(),
        ))
    }
}

fn text_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// `LocationStreamer` with the pods/log response checker: a GET to the kubelet whose body is
/// streamed back chunk by chunk as `text/plain`; kubelet errors become Status errors.
async fn logs(
    backend: &Backend,
    req: Request<Body>,
    path_and_query: &str,
    pod_name: &str,
) -> Response {
    let url = backend.url(path_and_query);
    let mut sender = match backend.connect().await {
        Ok(sender) => sender,
        Err(err) => {
            return ProxyError::Internal(format!("Get {url:?}: {err}")).into_response();
        }
    };
    let request = match backend::forward_request(
        http::Method::GET,
        &http::HeaderMap::new(),
        backend,
        path_and_query,
        false,
        Body::empty(),
    ) {
        Ok(request) => request,
        Err(err) => return err.into_response(),
    };
    drop(req);
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(err) => return ProxyError::Internal(format!("Get {url:?}: {err}")).into_response(),
    };
    let status = response.status();
    if !(200..=206).contains(&status.as_u16()) {
        // The checker reads at most 50000 bytes of the error.
        let body = read_prefix(response.into_body(), 50_000).await;
        return log_error(status, &String::from_utf8_lossy(&body), pod_name);
    }
    text_response(Body::new(response.into_body()))
}

/// Up to `limit` bytes of a body (like Go's `io.LimitReader`), however long the body is.
async fn read_prefix(mut body: hyper::body::Incoming, limit: usize) -> Vec<u8> {
    use http_body_util::BodyExt;
    let mut out = Vec::new();
    while out.len() < limit {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    let take = data.len().min(limit - out.len());
                    out.extend_from_slice(&data[..take]);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    out
}

/// `GenericHttpResponseChecker` for `pods/log`: a kubelet error becomes the Status the
/// apiserver returns (`NewInternalError` for 500, `NewBadRequest` for 400, otherwise
/// `NewGenericServerResponse` naming `pods/log` and the pod).
fn log_error(status: StatusCode, body: &str, pod_name: &str) -> Response {
    let code = status.as_u16();
    let value = match code {
        500 => serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("Internal error occurred: {body}"),
            "reason": "InternalError",
            "details": {"causes": [{"message": body}]},
            "code": 500,
        }),
        400 => serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": body, "reason": "BadRequest", "code": 400,
        }),
        _ => {
            let (reason, message) = match code {
                409 => ("Conflict", "the server reported a conflict".to_string()),
                404 => (
                    "NotFound",
                    "the server could not find the requested resource".to_string(),
                ),
                401 => (
                    "Unauthorized",
                    "the server has asked for the client to provide credentials".to_string(),
                ),
                403 => ("Forbidden", body.to_string()),
                405 => (
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource".to_string(),
                ),
                422 => (
                    "Invalid",
                    "the server rejected our request due to an error in our request".to_string(),
                ),
                504 => (
                    "Timeout",
                    "the server was unable to return a response in the time allotted, but may still be processing the request".to_string(),
                ),
                429 => (
                    "TooManyRequests",
                    "the server has received too many requests and has asked us to try again later".to_string(),
                ),
                c if c >= 500 => (
                    "InternalError",
                    format!("an error on the server ({body:?}) has prevented the request from succeeding"),
                ),
                c => (
                    "Unknown",
                    format!("the server responded with the status code {c} but did not return more information"),
                ),
            };
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                // The checker passes an empty verb, hence the double space upstream prints too.
                "message": format!("{message} ( pods/log {pod_name})"),
                "reason": reason,
                "details": {"name": pod_name, "kind": "pods/log"},
                "code": code,
            })
        }
    };
    let mut response = Response::new(Body::from(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

//! The kubelet's HTTP routes and the checks it makes before a streaming session starts.
//!
//! Order and answers follow upstream `pkg/kubelet/server/server.go`: stream flags are checked
//! first (400), then the pod (404 `pod does not exist`), then the container — for exec and
//! attach the kubelet learns of a missing or stopped container only from the runtime, which
//! makes it a 500 (`container not found ("name")`), while containerLogs checks the pod spec
//! and answers 404. The streaming request itself then goes through the kubelet's
//! upgrade-aware proxy to the runtime's streaming server: a request that is no upgrade at all
//! gets that proxy's `500 Upgrade request required`; SPDY and WebSocket handshakes are
//! answered like the streaming server does. Errors are plain text, as the kubelet writes them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use axum::routing::get;
use http::StatusCode;
use tracing::Instrument;

use super::pods::{Container, Pod};
use super::portforward::{self, Target};
use super::shared::Shared;
use super::status::Outcome;
use super::streams::{self, StreamOptions};
use super::text::text;
use super::{attach, exec, logs, query, spdy_transport, websocket, ws_tunnel};
use crate::spdy;

/// The kubelet API router.
pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/exec/{namespace}/{pod}/{container}",
            get(exec_route).post(exec_route),
        )
        .route(
            "/exec/{namespace}/{pod}/{uid}/{container}",
            get(exec_route).post(exec_route),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(attach_route).post(attach_route),
        )
        .route(
            "/attach/{namespace}/{pod}/{uid}/{container}",
            get(attach_route).post(attach_route),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(port_forward_route).post(port_forward_route),
        )
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            get(port_forward_route).post(port_forward_route),
        )
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(logs_route),
        )
        // What metrics-server scrapes (cAdvisor's figures for the running containers).
        .route("/metrics/resource", get(resource_metrics_route))
        // The kubelet's health check, which node proxies and probes use.
        .route("/healthz", get(|| async { text(StatusCode::OK, "ok") }))
        .fallback(|| async { text(StatusCode::NOT_FOUND, "404 page not found\n") })
        .with_state(shared)
}

type Params = HashMap<String, String>;

async fn resource_metrics_route(State(shared): State<Arc<Shared>>) -> Response {
    // Reading /proc is blocking file I/O.
    let text = tokio::task::spawn_blocking(move || super::usage::resource_metrics(&shared.pods))
        .await
        .unwrap_or_else(|_| "resource_scrape_error 1\n".to_string());
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(super::usage::TEXT_CONTENT_TYPE),
    );
    response
}

/// The kubelet hands streaming requests to the runtime's streaming server through an
/// upgrade-aware proxy that insists on an upgrade (`Connection: upgrade`); its error
/// responder answers everything with 500, so a plain request gets
/// `500 Upgrade request required`.
fn require_upgrade(req: &Request) -> Option<Response> {
    let upgrade = req
        .headers()
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("upgrade"));
    (!upgrade).then(|| {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Upgrade request required\n",
        )
    })
}

fn param<'a>(p: &'a Params, name: &str) -> &'a str {
    p.get(name).map(String::as_str).unwrap_or_default()
}

async fn logs_route(
    State(shared): State<Arc<Shared>>,
    Path(p): Path<Params>,
    req: Request,
) -> Response {
    logs::serve(
        shared,
        param(&p, "namespace"),
        param(&p, "pod"),
        param(&p, "container"),
        req.uri().query(),
    )
    .await
}

/// What a remote command session runs.
enum Command {
    Exec(Vec<String>),
    Attach,
}

async fn exec_route(state: State<Arc<Shared>>, path: Path<Params>, req: Request) -> Response {
    remote_command(state, path, req, true).await
}

async fn attach_route(state: State<Arc<Shared>>, path: Path<Params>, req: Request) -> Response {
    remote_command(state, path, req, false).await
}

async fn remote_command(
    State(shared): State<Arc<Shared>>,
    Path(p): Path<Params>,
    mut req: Request,
    is_exec: bool,
) -> Response {
    let pairs = match query::parse(req.uri().query()) {
        Ok(p) => p,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    let opts = match StreamOptions::from_query(&pairs) {
        Ok(o) => o,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    let (namespace, pod_name, container) = (
        param(&p, "namespace"),
        param(&p, "pod"),
        param(&p, "container"),
    );
    let Some(pod) = shared.pods.get(namespace, pod_name) else {
        return text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    let Some(container) = pod.container(container).cloned() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("container not found ({container:?})"),
        );
    };
    // The runtime refuses exec and attach for a container that is not running (containerd:
    // "container is in CONTAINER_EXITED state"), which the kubelet relays as a 500.
    if !container.current().is_some_and(|i| i.is_running()) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "rpc error: code = Unknown desc = container is in CONTAINER_EXITED state",
        );
    }
    let command = if is_exec {
        Command::Exec(
            query::all(&pairs, "command")
                .into_iter()
                .map(String::from)
                .collect(),
        )
    } else {
        Command::Attach
    };
    let span = tracing::info_span!(
        "remote_command",
        node = %shared.node_name,
        %namespace,
        pod = %pod_name,
        container = %container.spec.name,
        exec = is_exec
    );

    if let Some(refused) = require_upgrade(&req) {
        return refused;
    }
    if !websocket::is_websocket(req.headers()) {
        return spdy_remote_command(&shared, &mut req, opts, command, &pod, container, span);
    }
    let (protocol, response) = match websocket::accept(
        req.method(),
        req.headers(),
        websocket::REMOTE_COMMAND_PROTOCOLS,
    ) {
        Ok(accepted) => accepted,
        Err(refused) => return refused,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let gone = shared.stop.child_token();
    let (streams, ends) = streams::pair(opts, true, gone.clone());
    let idle = shared.stream_idle_timeout;
    let pod_name = pod.name.clone();
    tokio::spawn(
        async move {
            let Ok(upgraded) = on_upgrade.await else {
                gone.cancel();
                return;
            };
            let ws = websocket::from_upgraded(upgraded).await;
            let transport = tokio::spawn(
                async move {
                    websocket::run_remote_command(ws, &protocol, opts, ends, idle).await;
                }
                .in_current_span(),
            );
            run_command(command, container, pod_name, streams).await;
            let _ = transport.await;
        }
        .instrument(span),
    );
    response
}

/// A remote command over SPDY: negotiate like `httpstream.Handshake`, upgrade, wait for the
/// client's streams, then run the command.
fn spdy_remote_command(
    shared: &Arc<Shared>,
    req: &mut Request,
    opts: StreamOptions,
    command: Command,
    pod: &Arc<Pod>,
    container: Arc<Container>,
    span: tracing::Span,
) -> Response {
    let protocol = match spdy::negotiate(req.headers(), spdy_transport::REMOTE_COMMAND_PROTOCOLS) {
        Ok(Some(protocol)) => protocol,
        Ok(None) => return spdy::missing_protocol_response(),
        Err(refused) => {
            // `Handshake` writes the 403 and its message; remotecommand then calls http.Error
            // again with the same error, which can no longer change the status but appends
            // the message a second time. Clients see both copies.
            let message = refused.to_string();
            let mut response = refused.into_response();
            *response.body_mut() = Body::from(format!("{message}\n{message}\n"));
            return response;
        }
    };
    let (response, accepting) = match spdy::accept(req, Some(&protocol)) {
        Ok(accepted) => accepted,
        Err(refused) => return refused,
    };
    let gone = shared.stop.child_token();
    let creation = shared.stream_creation_timeout;
    let idle = shared.stream_idle_timeout;
    let pod_name = pod.name.clone();
    tokio::spawn(
        async move {
            let Ok((conn, incoming)) = accepting.connection().await else {
                return;
            };
            let Some((streams, transport)) =
                spdy_transport::start(conn, incoming, Some(protocol), opts, creation, idle, gone)
                    .await
            else {
                return;
            };
            run_command(command, container, pod_name, streams).await;
            let _ = transport.await;
        }
        .instrument(span),
    );
    response
}

async fn run_command(
    command: Command,
    container: Arc<Container>,
    pod_name: String,
    streams: streams::Streams,
) {
    match command {
        Command::Exec(argv) => exec::run(container, pod_name, argv, streams).await,
        Command::Attach => match container.current() {
            Some(instance) => attach::run(instance, streams).await,
            None => {
                let outcome =
                    Outcome::Failed("error attaching to container: container is gone".into());
                streams.output.finish(outcome).await;
            }
        },
    }
}

async fn port_forward_route(
    State(shared): State<Arc<Shared>>,
    Path(p): Path<Params>,
    mut req: Request,
) -> Response {
    let is_ws = websocket::is_websocket(req.headers());
    let pairs = match query::parse(req.uri().query()) {
        Ok(p) => p,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    // SPDY tunnelled through WebSocket (`SPDY/3.1+portforward.k8s.io`) carries its ports in
    // SPDY streams; plain WebSocket requests name their ports up front.
    let tunnel = if is_ws {
        tunneled_protocols(req.headers())
    } else {
        Vec::new()
    };
    let ports = if is_ws && tunnel.is_empty() {
        match portforward::ws_ports(&pairs) {
            Ok(ports) => ports,
            Err(why) => return text(StatusCode::BAD_REQUEST, why),
        }
    } else {
        Vec::new()
    };
    let (namespace, pod_name) = (param(&p, "namespace"), param(&p, "pod"));
    let Some(pod) = shared.pods.get(namespace, pod_name) else {
        return text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    let span = tracing::info_span!(
        "port_forward",
        node = %shared.node_name,
        %namespace,
        pod = %pod_name
    );
    if let Some(uid) = p.get("uid")
        && !uid.is_empty()
        && *uid != pod.uid
    {
        return text(StatusCode::NOT_FOUND, "pod not found");
    }
    let target = Target {
        sandbox_id: pod.sandbox_id(),
        ports: pod
            .containers
            .iter()
            .flat_map(|c| c.spec.ports.iter().copied())
            .collect(),
    };
    if let Some(refused) = require_upgrade(&req) {
        return refused;
    }
    if !tunnel.is_empty() {
        return tunneled_port_forward(&shared, &mut req, &tunnel, target, span);
    }
    if !is_ws {
        return spdy_port_forward(&shared, &mut req, target, span);
    }
    let (protocol, response) = match websocket::accept(
        req.method(),
        req.headers(),
        websocket::PORT_FORWARD_PROTOCOLS,
    ) {
        Ok(accepted) => accepted,
        Err(refused) => return refused,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let gone = shared.stop.child_token();
    let idle = shared.stream_idle_timeout;
    tokio::spawn(
        async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            let ws = websocket::from_upgraded(upgraded).await;
            portforward::run_websocket(ws, &protocol, ports, target, idle, gone).await;
        }
        .instrument(span),
    );
    response
}

/// A port-forward over SPDY (`portforward.k8s.io`).
fn spdy_port_forward(
    shared: &Arc<Shared>,
    req: &mut Request,
    target: Target,
    span: tracing::Span,
) -> Response {
    let protocol = match spdy::negotiate(req.headers(), portforward::SPDY_PROTOCOLS) {
        Ok(Some(protocol)) => protocol,
        Ok(None) => return spdy::missing_protocol_response(),
        Err(refused) => return refused.into_response(),
    };
    let (response, accepting) = match spdy::accept(req, Some(&protocol)) {
        Ok(accepted) => accepted,
        Err(refused) => return refused,
    };
    let gone = shared.stop.child_token();
    let creation = shared.stream_creation_timeout;
    let idle = shared.stream_idle_timeout;
    tokio::spawn(
        async move {
            let Ok((conn, incoming)) = accepting.connection().await else {
                return;
            };
            portforward::run_spdy(conn, incoming, target, creation, idle, gone).await;
        }
        .instrument(span),
    );
    response
}

/// The SPDY protocols a WebSocket request asks to tunnel (`SPDY/3.1+<protocol>` entries of
/// every `Sec-WebSocket-Protocol` header, comma-separated, prefix removed).
fn tunneled_protocols(headers: &http::HeaderMap) -> Vec<String> {
    headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|p| p.trim().strip_prefix(ws_tunnel::TUNNEL_PREFIX))
        .map(str::to_string)
        .collect()
}

/// Port-forward with SPDY inside a WebSocket, as a kubelet with `ExtendWebSocketsToKubelet`
/// serves it: the SPDY handshake is negotiated as if the tunnelled protocols had been offered
/// in `X-Stream-Protocol-Version` (refusals pass through unchanged), then the WebSocket is
/// accepted with `SPDY/3.1+<protocol>` and carries the SPDY session.
fn tunneled_port_forward(
    shared: &Arc<Shared>,
    req: &mut Request,
    offered: &[String],
    target: Target,
    span: tracing::Span,
) -> Response {
    let mut offered_headers = http::HeaderMap::new();
    for protocol in offered {
        if let Ok(value) = http::HeaderValue::from_str(protocol) {
            offered_headers.append(spdy::upgrade::PROTOCOL_VERSION_HEADER, value);
        }
    }
    let protocol = match spdy::negotiate(&offered_headers, portforward::SPDY_PROTOCOLS) {
        Ok(Some(protocol)) => protocol,
        Ok(None) => {
            return text(
                StatusCode::BAD_REQUEST,
                "unable to upgrade: no tunneling spdy protocols provided\n",
            );
        }
        Err(refused) => return refused.into_response(),
    };
    let ws_protocol = format!("{}{protocol}", ws_tunnel::TUNNEL_PREFIX);
    let (_, response) = match websocket::accept(req.method(), req.headers(), &[&ws_protocol]) {
        Ok(accepted) => accepted,
        Err(refused) => return refused,
    };
    let on_upgrade = hyper::upgrade::on(req);
    let gone = shared.stop.child_token();
    let creation = shared.stream_creation_timeout;
    let idle = shared.stream_idle_timeout;
    tokio::spawn(
        async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            let ws = websocket::from_upgraded(upgraded).await;
            let (conn, incoming) =
                spdy::Connection::new(ws_tunnel::WsByteStream::new(ws), spdy::Role::Server);
            portforward::run_spdy(conn, incoming, target, creation, idle, gone).await;
        }
        .instrument(span),
    );
    response
}

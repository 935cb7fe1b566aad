//! The request handler: authenticate, route, authorize, then serve discovery, a kubelet
//! subresource, a review, or one REST verb on the store (reads here and in [`super::read`],
//! writes in [`super::write`]), with the status-code and body conventions of kube-apiserver.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode};

use super::auth::{self, Attributes, Policy, UserInfo};
use super::body::{
    content_type, json_response, read_body, read_json, read_object, read_optional_json,
};
use super::discovery;
use super::failure::Failure;
use super::kinds::Flavor;
use super::query::Query;
use super::read::{list, watch_request};
use super::render::Render;
use super::reviews;
use super::route::{self, ResourcePath, Target};
use super::store::Store;
use super::watch;
use super::write::{self, Writer, field_manager};
use crate::serve::{PeerAddr, PeerCert, Stop};

/// Everything a request handler needs.
pub struct App {
    pub store: Store,
    pub policy: Policy,
    pub tokens: Vec<(String, UserInfo)>,
    /// The service-account tokens TokenRequests issued.
    pub issued: super::token_request::Issued,
    /// How to reach kubelets; None answers kubelet calls with 503.
    pub kubelet: Option<crate::kubelet_proxy::KubeletClient>,
    /// `host:port` advertised in `/api`.
    pub server_address: String,
    /// Requests served, for tests that assert what a client cost the apiserver (the real one
    /// counts them in `apiserver_request_total`).
    pub requests: Requests,
    /// Watches open now, by path.
    pub open_watches: watch::OpenWatches,
    /// While set, lists wait (a leaf too slow to list; everything else works).
    pub stall_lists: Arc<std::sync::atomic::AtomicBool>,
    /// How often a watch that allows bookmarks gets one.
    pub bookmark_every: std::time::Duration,
}

/// How many requests the server was sent, by method and path. Cheap to clone.
#[derive(Clone, Default)]
pub struct Requests(Arc<std::sync::Mutex<std::collections::HashMap<(String, String), u64>>>);

impl Requests {
    fn count(&self, method: &Method, path: &str) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry((method.to_string(), path.to_string()))
            .or_default() += 1;
    }

    /// Requests with `method` whose path starts with `prefix`.
    pub fn matching(&self, method: &str, prefix: &str) -> u64 {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .filter(|((m, p), _)| m == method && p.starts_with(prefix))
            .map(|(_, n)| n)
            .sum()
    }
}

/// The axum handler for every path.
pub async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    app.requests.count(&method, &path);
    match serve(app, req).await {
        Ok(response) => response,
        Err(failure) => {
            tracing::debug!(%method, %path, %failure, "request failed");
            failure.into_response()
        }
    }
}

async fn serve(app: Arc<App>, req: Request) -> Result<Response, Failure> {
    let user = auth::authenticate(
        req.headers(),
        req.extensions().get::<PeerCert>(),
        &app.tokens,
    )
    .or_else(|failure| {
        auth::bearer_token(req.headers())
            .and_then(|token| app.issued.user(&token, &app.store))
            .map(UserInfo::authenticated)
            .ok_or(failure)
    })?;
    let query = Query::parse(&req)?;
    match route::parse(req.uri().path())? {
        Target::NonResource => non_resource(&app, &user, &req),
        Target::Resource(target) => resource(app, user, req, target, query).await,
    }
}

fn accept(headers: &HeaderMap) -> &str {
    headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

fn non_resource(app: &App, user: &UserInfo, req: &Request) -> Result<Response, Failure> {
    let path = req.uri().path().trim_end_matches('/');
    let path = if path.is_empty() { "/" } else { path };
    let verb = match *req.method() {
        Method::GET | Method::HEAD => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    };
    app.policy.authorize(&Attributes {
        user: user.clone(),
        verb: verb.to_string(),
        resource_request: false,
        path: path.to_string(),
        ..Attributes::default()
    })?;
    if verb != "get" {
        return Err(Failure::no_route());
    }
    let aggregated = discovery::aggregated_version(accept(req.headers()));
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let doc = match segments.as_slice() {
        ["version"] => discovery::version(),
        ["healthz" | "livez" | "readyz"] => return Ok((StatusCode::OK, "ok").into_response()),
        ["api"] | ["apis"] => {
            let core = segments[0] == "api";
            if let Some(version) = aggregated {
                let body = discovery::aggregated(core, version);
                return Ok((
                    StatusCode::OK,
                    [(
                        http::header::CONTENT_TYPE,
                        discovery::aggregated_content_type(version),
                    )],
                    body.to_string(),
                )
                    .into_response());
            }
            if core {
                discovery::core_versions(&app.server_address)
            } else {
                discovery::group_list()
            }
        }
        ["openapi", "v2"] => {
            return Ok((
                StatusCode::OK,
                [(http::header::CONTENT_TYPE, super::openapi::V2_PROTOBUF)],
                super::openapi::v2_protobuf(),
            )
                .into_response());
        }
        ["openapi", "v3"] => super::openapi::root(),
        ["openapi", "v3", rest @ ..] => {
            super::openapi::group_version(&rest.join("/")).ok_or_else(Failure::no_route)?
        }
        ["api", "v1"] => discovery::resource_list("", "v1").ok_or_else(Failure::no_route)?,
        ["apis", group] => discovery::group(group).ok_or_else(Failure::no_route)?,
        ["apis", group, version] => {
            discovery::resource_list(group, version).ok_or_else(Failure::no_route)?
        }
        _ => return Err(Failure::no_route()),
    };
    Ok(json_response(StatusCode::OK, &doc))
}

async fn resource(
    app: Arc<App>,
    user: UserInfo,
    req: Request,
    target: ResourcePath,
    query: Query,
) -> Result<Response, Failure> {
    let watch = query.flag("watch");
    let verb = route::verb(req.method(), &target, watch);
    if verb.is_empty() {
        return Err(Failure::method_not_allowed(
            req.method().as_str(),
            target.kind,
        ));
    }
    let attributes = Attributes {
        user: user.clone(),
        verb: verb.to_string(),
        resource_request: true,
        path: req.uri().path().to_string(),
        api_group: target.kind.group.to_string(),
        resource: target.kind.resource.to_string(),
        subresource: target.subresource.clone(),
        namespace: target.namespace.clone(),
        name: authorized_name(&target, verb, &query),
    };
    app.policy.authorize(&attributes)?;

    if route::is_connect(&target) {
        // Since 1.35 (AuthorizePodWebsocketUpgradeCreatePermission, on by default) a
        // WebSocket GET on exec/attach/portforward also needs `create`, like the SPDY POST.
        let streaming = matches!(
            target.subresource.as_str(),
            "exec" | "attach" | "portforward"
        );
        if streaming && verb == "get" {
            app.policy.authorize(&Attributes {
                verb: "create".to_string(),
                ..attributes
            })?;
        }
        return super::proxy::connect(&app.store, app.kubelet.as_ref(), req, &target).await;
    }

    let kind = target.kind;
    if kind.resource == "serviceaccounts" && target.subresource == "token" {
        if verb != "create" {
            return Err(Failure::method_not_allowed(verb, kind));
        }
        let body = read_json(req).await?;
        return super::token_request::issue(&app.store, &app.issued, &target, body);
    }
    match kind.flavor {
        Flavor::Review => {
            if verb != "create" {
                return Err(Failure::method_not_allowed(verb, kind));
            }
            let body = if content_type(req.headers()) == "application/vnd.kubernetes.protobuf" {
                super::protobuf::decode_review(&read_body(req).await?, kind.kind)?
            } else {
                read_json(req).await?
            };
            let answer = reviews::answer(kind, body, &user, &app.policy, &app.tokens)?;
            return Ok(json_response(StatusCode::CREATED, &answer));
        }
        Flavor::ReadOnly if !matches!(verb, "get" | "list" | "watch") => {
            return Err(Failure::method_not_allowed(verb, kind));
        }
        _ => {}
    }

    let render = Render::from_accept(accept(req.headers()), query.get("includeObject"));
    let manager = field_manager(&query, req.headers());
    let store = Writer {
        store: &app.store,
        dry_run: match query.get("dryRun") {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                return Err(Failure::bad_request(format!(
                    "dryRun: Unsupported value: {other:?}: supported values: \"All\""
                )));
            }
        },
    };
    let stop = req
        .extensions()
        .get::<Stop>()
        .map(|s| s.0.clone())
        .unwrap_or_default();
    match verb {
        "get" => {
            let obj = app.store.get(kind, &target.namespace, &target.name)?;
            Ok(json_response(StatusCode::OK, &render.one(kind, &obj)))
        }
        "list" => {
            // A stalled list answers once lists are let go (the answer as of then).
            while app.stall_lists.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            list(&app.store, &target, &query, render)
        }
        "watch" => {
            let watch = watch_request(&target, &query, render)?;
            // Counted by path and field selector (`?fieldSelector=spec.nodeName=n`), so a test
            // can tell one node's pod watch from another's.
            // Counted under the path and its selectors, so tests can tell watches apart.
            let selectors: Vec<String> = ["fieldSelector", "labelSelector"]
                .into_iter()
                .filter_map(|name| {
                    let value = query.get(name).filter(|v| !v.is_empty())?;
                    Some(format!("{name}={value}"))
                })
                .collect();
            let path = if selectors.is_empty() {
                req.uri().path().to_string()
            } else {
                format!("{}?{}", req.uri().path(), selectors.join("&"))
            };
            let peer = req.extensions().get::<PeerAddr>().map(|p| p.0);
            let body = watch::serve(
                app.store.clone(),
                watch,
                stop,
                &app.open_watches,
                &path,
                peer,
                app.bookmark_every,
            );
            Ok((
                StatusCode::OK,
                [(http::header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response())
        }
        "create" => {
            if kind.namespaced() && target.namespace.is_empty() {
                return Err(Failure::method_not_allowed("create", kind));
            }
            let body = read_object(req, kind).await?;
            write::create(&store, &target, body, &manager)
        }
        "update" => {
            let body = read_json(req).await?;
            write::update(&store, &target, body, &manager)
        }
        "patch" => write::patch(&store, &target, &query, req, &manager).await,
        "delete" => {
            let options = read_optional_json(req).await?;
            write::delete(&store, &target, &options)
        }
        "deletecollection" => write::delete_collection(&store, &target, &query),
        _ => Err(Failure::method_not_allowed(verb, kind)),
    }
}

/// The name a request is authorized against. Like upstream's RequestInfo, a list or watch with a
/// `metadata.name=<name>` field selector counts as a request for that one object, so a rule
/// limited by `resourceNames` can allow watching it.
fn authorized_name(target: &ResourcePath, verb: &str, query: &Query) -> String {
    if !target.name.is_empty() || !matches!(verb, "list" | "watch") {
        return target.name.clone();
    }
    query
        .get("fieldSelector")
        .into_iter()
        .flat_map(|selector| selector.split(','))
        .find_map(|term| {
            let term = term.trim();
            term.strip_prefix("metadata.name==")
                .or_else(|| term.strip_prefix("metadata.name="))
                .filter(|name| !name.starts_with('='))
        })
        .unwrap_or("")
        .to_string()
}

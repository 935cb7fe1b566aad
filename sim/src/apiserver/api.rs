//! The request handler: authenticate, route, authorize, then serve discovery or one REST verb
//! on the store (get, list, watch, create, update, patch in its four flavours, delete), with
//! the status-code and body conventions of kube-apiserver.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};

use super::auth::{self, Attributes, Policy, UserInfo};
use super::discovery;
use super::failure::Failure;
use super::kinds::{Flavor, Kind};
use super::managed;
use super::render::Render;
use super::reviews;
use super::route::{self, ResourcePath, Target};
use super::selector::{FieldSelector, LabelSelector};
use super::smp;
use super::store::Store;
use super::watch::{self, Watch};
use crate::serve::{PeerCert, Stop};

/// Largest request body accepted, as upstream's 3 MiB limit.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Namespaces upstream refuses to delete.
const PROTECTED_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

/// Everything a request handler needs.
pub struct App {
    pub store: Store,
    pub policy: Policy,
    pub tokens: Vec<(String, UserInfo)>,
    /// How to reach kubelets; None answers kubelet calls with 503.
    pub kubelet: Option<crate::kubelet_proxy::KubeletClient>,
    /// `host:port` advertised in `/api`.
    pub server_address: String,
}

/// The axum handler for every path.
pub async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    match serve(app, req).await {
        Ok(response) => response,
        Err(failure) => {
            tracing::debug!(%method, %path, %failure, "request failed");
            failure.into_response()
        }
    }
}

/// Query parameters in order (repeated keys kept).
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(req: &Request) -> Result<Self, Failure> {
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(req.uri())
            .map(|q| Query(q.0))
            .map_err(|e| Failure::bad_request(format!("invalid query: {e}")))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

async fn serve(app: Arc<App>, req: Request) -> Result<Response, Failure> {
    let user = auth::authenticate(
        req.headers(),
        req.extensions().get::<PeerCert>(),
        &app.tokens,
    )?;
    let query = Query::parse(&req)?;
    match route::parse(req.uri().path())? {
        Target::NonResource => non_resource(&app, &user, &req),
        Target::Resource(target) => resource(app, user, req, target, query).await,
    }
}

/// The store as one request writes to it: for real, or checked only (`dryRun=All`).
struct Writer<'a> {
    store: &'a Store,
    dry_run: bool,
}

impl Writer<'_> {
    fn create(&self, kind: &'static Kind, namespace: &str, obj: Value) -> Result<Value, Failure> {
        if self.dry_run {
            self.store.create_dry_run(kind, namespace, obj)
        } else {
            self.store.create(kind, namespace, obj)
        }
    }

    fn modify(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Value, Failure>,
    ) -> Result<Value, Failure> {
        if self.dry_run {
            self.store.modify_dry_run(kind, namespace, name, change)
        } else {
            self.store.modify(kind, namespace, name, change)
        }
    }

    fn delete(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        precondition_rv: Option<&str>,
    ) -> Result<Value, Failure> {
        if !self.dry_run {
            return self.store.delete(kind, namespace, name, precondition_rv);
        }
        let live = self.store.get(kind, namespace, name)?;
        if precondition_rv
            .is_some_and(|rv| live["metadata"]["resourceVersion"].as_str() != Some(rv))
        {
            return Err(Failure::conflict(kind, name));
        }
        Ok(live)
    }
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
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
        name: target.name.clone(),
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
        return super::proxy::connect(&app, req, &target).await;
    }

    let kind = target.kind;
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
        "list" => list(&app.store, &target, &query, render),
        "watch" => {
            let watch = watch_request(&target, &query, render)?;
            let body = watch::serve(app.store.clone(), watch, stop);
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
            create(&store, &target, body, &manager)
        }
        "update" => {
            let body = read_json(req).await?;
            update(&store, &target, body, &manager)
        }
        "patch" => patch(&store, &target, &query, req, &manager).await,
        "delete" => {
            let options = read_optional_json(req).await?;
            delete(&store, &target, &options)
        }
        "deletecollection" => delete_collection(&store, &target, &query),
        _ => Err(Failure::method_not_allowed(verb, kind)),
    }
}

/// The manager a write is recorded under: `fieldManager`, else the User-Agent's product
/// name, as upstream derives it.
fn field_manager(query: &Query, headers: &HeaderMap) -> String {
    if let Some(m) = query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.to_string();
    }
    let agent = headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let product: String = agent
        .split('/')
        .next()
        .unwrap_or_default()
        .chars()
        .take(128)
        .collect();
    if product.is_empty() {
        "unknown".to_string()
    } else {
        product
    }
}

async fn read_body(req: Request) -> Result<bytes::Bytes, Failure> {
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

async fn read_json(req: Request) -> Result<Value, Failure> {
    let content_type = content_type(req.headers());
    let body = read_body(req).await?;
    decode(&body, &content_type)
}

/// A request body for `kind`: JSON, YAML, or the protobuf kubectl's typed clients send.
async fn read_object(req: Request, kind: &Kind) -> Result<Value, Failure> {
    if content_type(req.headers()) == "application/vnd.kubernetes.protobuf" {
        let body = read_body(req).await?;
        return super::protobuf::decode_object(&body, kind.kind);
    }
    read_json(req).await
}

async fn read_optional_json(req: Request) -> Result<Value, Failure> {
    let body = read_body(req).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    decode(&body, "application/json")
}

/// Decodes a JSON or (for YAML content types) YAML body.
fn decode(body: &[u8], content_type: &str) -> Result<Value, Failure> {
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

fn content_type(headers: &HeaderMap) -> String {
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

/// A list continue token: the revision of the first page and the last key returned.
fn encode_continue(rv: u64, last: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(
        json!({ "v": "meta.k8s.io/v1", "rv": rv, "start": format!("{last}\u{0}") }).to_string(),
    )
}

fn decode_continue(token: &str) -> Result<(u64, String), Failure> {
    let bad = || {
        Failure::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    let start = v["start"]
        .as_str()
        .ok_or_else(bad)?
        .trim_end_matches('\u{0}')
        .to_string();
    Ok((rv, start))
}

fn object_key(obj: &Value) -> String {
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    format!("{ns}/{name}")
}

fn selectors(
    kind: &'static Kind,
    query: &Query,
) -> Result<(LabelSelector, FieldSelector), Failure> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), kind)?;
    Ok((labels, fields))
}

fn namespace_filter(target: &ResourcePath) -> Option<String> {
    (target.kind.namespaced() && !target.namespace.is_empty()).then(|| target.namespace.clone())
}

fn list(
    store: &Store,
    target: &ResourcePath,
    query: &Query,
    render: Render,
) -> Result<Response, Failure> {
    let kind = target.kind;
    let (labels, fields) = selectors(kind, query)?;
    let (items, current_rv) = store.list(kind, namespace_filter(target).as_deref());
    let (rv, start) = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, start) = decode_continue(token)?;
            (rv, Some(start))
        }
        None => (current_rv, None),
    };
    let limit = match query.get("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| Failure::bad_request(format!("invalid limit: {l:?}")))?,
        None => 0,
    };
    let mut selected: Vec<&Value> = items
        .iter()
        .map(|v| &**v)
        .filter(|o| start.as_ref().is_none_or(|s| object_key(o) > *s))
        .filter(|o| labels.matches(o.pointer("/metadata/labels")) && fields.matches(o))
        .collect();
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if limit > 0 && selected.len() > limit {
        let remaining = selected.len() - limit;
        selected.truncate(limit);
        let last = selected.last().map(|o| object_key(o)).unwrap_or_default();
        metadata["continue"] = json!(encode_continue(rv, &last));
        metadata["remainingItemCount"] = json!(remaining);
    }
    Ok(json_response(
        StatusCode::OK,
        &render.list(kind, &selected, metadata),
    ))
}

fn watch_request(target: &ResourcePath, query: &Query, render: Render) -> Result<Watch, Failure> {
    let kind = target.kind;
    let (labels, mut fields) = selectors(kind, query)?;
    if !target.name.is_empty() {
        // A watch on a single object URL is a watch with a name field selector.
        let text = format!("metadata.name={}", target.name);
        fields = FieldSelector::parse(&text, kind)?;
    }
    let since = match query.get("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| Failure::bad_request(format!("invalid resource version: {rv:?}")))?,
        ),
    };
    let timeout = match query.get("timeoutSeconds") {
        Some(t) => Some(Duration::from_secs(t.parse::<u64>().map_err(|_| {
            Failure::bad_request(format!("invalid timeoutSeconds: {t:?}"))
        })?)),
        None => None,
    };
    let send_initial_events = query.flag("sendInitialEvents");
    if send_initial_events && query.get("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(Failure::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "sendInitialEvents is forbidden for watch unless resourceVersionMatch is set to NotOlderThan",
        ));
    }
    Ok(Watch {
        kind,
        namespace: namespace_filter(target),
        labels,
        fields,
        since,
        bookmarks: query.flag("allowWatchBookmarks"),
        send_initial_events,
        timeout,
        render,
    })
}

/// Fields of a kind's objects that the main resource endpoint does not write because a
/// `status` subresource owns them, or that the status endpoint does not write.
fn skipped_fields(kind: &Kind, subresource: &str) -> &'static [&'static str] {
    if !kind.subresources.contains(&"status") {
        return &[];
    }
    if subresource == "status" {
        &["spec"]
    } else {
        &["status"]
    }
}

/// Keeps what this endpoint may not change from the live object.
fn reconcile(kind: &Kind, subresource: &str, live: &Value, mut next: Value) -> Value {
    if !kind.subresources.contains(&"status") {
        return next;
    }
    if subresource == "status" {
        let mut out = live.clone();
        out["status"] = next["status"].take();
        out["metadata"]["resourceVersion"] = next["metadata"]["resourceVersion"].take();
        if out["status"].is_null()
            && let Some(m) = out.as_object_mut()
        {
            m.remove("status");
        }
        out
    } else {
        match live.get("status") {
            Some(status) => next["status"] = status.clone(),
            None => {
                if let Some(m) = next.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        next
    }
}

/// Upstream's defaulting for the fields clients commonly leave out.
fn defaults(kind: &Kind, body: &mut Value) {
    if kind.group.is_empty()
        && kind.kind == "Secret"
        && body.get("type").is_none_or(|t| t.as_str() == Some(""))
    {
        body["type"] = json!("Opaque");
    }
}

fn check_type(kind: &Kind, body: &Value) -> Result<(), Failure> {
    if !body.is_object() {
        return Err(Failure::bad_request("the object must be a JSON object"));
    }
    if let Some(v) = body.get("apiVersion").and_then(Value::as_str)
        && v != kind.api_version()
    {
        return Err(Failure::bad_request(format!(
            "the API version in the data ({v}) does not match the expected API version ({})",
            kind.api_version()
        )));
    }
    if let Some(k) = body.get("kind").and_then(Value::as_str)
        && k != kind.kind
    {
        return Err(Failure::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            kind.kind
        )));
    }
    Ok(())
}

fn check_namespace(target: &ResourcePath, body: &Value) -> Result<(), Failure> {
    if !target.kind.namespaced() {
        return Ok(());
    }
    match body.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != target.namespace => Err(Failure::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => Ok(()),
    }
}

fn managed_request<'a>(
    target: &'a ResourcePath,
    manager: &'a str,
    api_version: &'a str,
) -> managed::Request<'a> {
    managed::Request {
        resource: target.kind.resource,
        api_version,
        manager,
        subresource: &target.subresource,
        skip: skipped_fields(target.kind, &target.subresource),
    }
}

fn create(
    store: &Writer<'_>,
    target: &ResourcePath,
    mut body: Value,
    manager: &str,
) -> Result<Response, Failure> {
    let kind = target.kind;
    check_type(kind, &body)?;
    check_namespace(target, &body)?;
    if body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(Failure::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    defaults(kind, &mut body);
    if kind.kind == "Pod" {
        // Upstream's pod strategy resets status on create; the kubelet reports it later.
        body["status"] = json!({ "phase": "Pending" });
    }
    let api_version = kind.api_version();
    managed::track_update(
        &managed_request(target, manager, &api_version),
        None,
        &mut body,
    );
    let created = store.create(kind, &target.namespace, body)?;
    Ok(json_response(StatusCode::CREATED, &created))
}

fn update(
    store: &Writer<'_>,
    target: &ResourcePath,
    mut body: Value,
    manager: &str,
) -> Result<Response, Failure> {
    let kind = target.kind;
    defaults(kind, &mut body);
    check_type(kind, &body)?;
    check_namespace(target, &body)?;
    let api_version = kind.api_version();
    let req = managed_request(target, manager, &api_version);
    let updated = store.modify(kind, &target.namespace, &target.name, |live| {
        let mut next = reconcile(kind, &target.subresource, live, body);
        managed::track_update(&req, Some(live), &mut next);
        Ok(next)
    })?;
    Ok(json_response(StatusCode::OK, &updated))
}

async fn patch(
    store: &Writer<'_>,
    target: &ResourcePath,
    query: &Query,
    req: Request,
    manager: &str,
) -> Result<Response, Failure> {
    let kind = target.kind;
    let content_type = content_type(req.headers());
    let body = read_body(req).await?;
    let api_version = kind.api_version();
    let mreq = managed_request(target, manager, &api_version);
    if content_type == "application/apply-patch+yaml" {
        let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) else {
            return Err(Failure::bad_request(
                "PATCH: fieldManager is required for apply requests",
            ));
        };
        let mreq = managed::Request { manager, ..mreq };
        let config = decode(&body, &content_type)?;
        check_type(kind, &config)?;
        check_namespace(target, &config)?;
        if config.get("apiVersion").is_none() || config.get("kind").is_none() {
            return Err(Failure::bad_request(
                "apiVersion and kind must be set in an apply configuration",
            ));
        }
        if let Some(name) = config.pointer("/metadata/name").and_then(Value::as_str)
            && name != target.name
        {
            return Err(Failure::bad_request(format!(
                "the name of the object ({name}) does not match the name on the URL ({})",
                target.name
            )));
        }
        let force = query.flag("force");
        let applied = store.modify(kind, &target.namespace, &target.name, |live| {
            let merged = managed::apply(&mreq, Some(live), &config, force)?;
            Ok(reconcile(kind, &target.subresource, live, merged))
        });
        return match applied {
            Ok(obj) => Ok(json_response(StatusCode::OK, &obj)),
            Err(f) if f.reason == "NotFound" && target.subresource.is_empty() => {
                let mut obj = managed::apply(&mreq, None, &config, force)?;
                obj["metadata"]["name"] = json!(target.name);
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove("resourceVersion");
                }
                let created = store.create(kind, &target.namespace, obj)?;
                Ok(json_response(StatusCode::CREATED, &created))
            }
            Err(f) => Err(f),
        };
    }
    let patch: Value = match content_type.as_str() {
        "application/json-patch+json"
        | "application/merge-patch+json"
        | "application/strategic-merge-patch+json" => serde_json::from_slice(&body)
            .map_err(|e| Failure::bad_request(format!("error decoding patch: {e}")))?,
        other => return Err(Failure::unsupported_media_type(other)),
    };
    let patched = store.modify(kind, &target.namespace, &target.name, |live| {
        let mut doc = live.clone();
        match content_type.as_str() {
            "application/json-patch+json" => {
                let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                    .map_err(|e| Failure::bad_request(format!("error decoding JSON patch: {e}")))?;
                json_patch::patch(&mut doc, &ops).map_err(|e| {
                    Failure::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Invalid",
                        format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ),
                    )
                })?;
            }
            "application/merge-patch+json" => json_patch::merge(&mut doc, &patch),
            _ => doc = smp::apply(kind.resource, &doc, &patch)?,
        }
        let mut next = reconcile(kind, &target.subresource, live, doc);
        managed::track_update(&mreq, Some(live), &mut next);
        Ok(next)
    })?;
    Ok(json_response(StatusCode::OK, &patched))
}

fn delete(store: &Writer<'_>, target: &ResourcePath, options: &Value) -> Result<Response, Failure> {
    let kind = target.kind;
    if kind.kind == "Namespace" && PROTECTED_NAMESPACES.contains(&target.name.as_str()) {
        return Err(Failure::forbidden(format!(
            "namespaces \"{}\" is forbidden: this namespace may not be deleted",
            target.name
        )));
    }
    let preconditions = &options["preconditions"];
    if let Some(uid) = preconditions["uid"].as_str() {
        let live = store.store.get(kind, &target.namespace, &target.name)?;
        if live.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid) {
            return Err(Failure::conflict(kind, &target.name));
        }
    }
    let gone = store.delete(
        kind,
        &target.namespace,
        &target.name,
        preconditions["resourceVersion"].as_str(),
    )?;
    let mut details = json!({
        "name": target.name,
        "kind": kind.resource,
        "uid": gone.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
    });
    if !kind.group.is_empty() {
        details["group"] = json!(kind.group);
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }),
    ))
}

fn delete_collection(
    store: &Writer<'_>,
    target: &ResourcePath,
    query: &Query,
) -> Result<Response, Failure> {
    let kind = target.kind;
    let (labels, fields) = selectors(kind, query)?;
    let (items, _) = store.store.list(kind, namespace_filter(target).as_deref());
    let mut deleted = Vec::new();
    for obj in items
        .iter()
        .filter(|o| labels.matches(o.pointer("/metadata/labels")) && fields.matches(o))
    {
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if kind.kind == "Namespace" && PROTECTED_NAMESPACES.contains(&name) {
            continue;
        }
        match store.delete(kind, ns, name, None) {
            Ok(gone) => deleted.push(gone),
            Err(f) if f.reason == "NotFound" => {}
            Err(f) => return Err(f),
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": kind.list_kind,
            "apiVersion": kind.api_version(),
            "metadata": { "resourceVersion": store.store.revision().to_string() },
            "items": deleted,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let token = encode_continue(42, "default/web");
        assert_eq!(
            decode_continue(&token).unwrap(),
            (42, "default/web".to_string())
        );
        assert_eq!(decode_continue("???").unwrap_err().code, 400);
    }
}

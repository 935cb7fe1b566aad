//! The write verbs: create, update, the four patch flavours, delete and deletecollection,
//! with upstream's status-subresource split, defaulting, type checks, managedFields tracking
//! and server-side dry run.

use axum::extract::Request;
use axum::response::Response;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::body::{content_type, decode, json_response, read_body};
use super::defaults;
use super::failure::Failure;
use super::kinds::Kind;
use super::managed;
use super::query::Query;
use super::read::{namespace_filter, selectors};
use super::route::ResourcePath;
use super::smp;
use super::store::Store;

/// Namespaces upstream refuses to delete.
pub(super) const PROTECTED_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

/// The store as one request writes to it: for real, or checked only (`dryRun=All`).
pub(super) struct Writer<'a> {
    pub(super) store: &'a Store,
    pub(super) dry_run: bool,
}

impl Writer<'_> {
    pub(super) fn create(
        &self,
        kind: &'static Kind,
        namespace: &str,
        obj: Value,
    ) -> Result<Value, Failure> {
        if self.dry_run {
            self.store.create_dry_run(kind, namespace, obj)
        } else {
            self.store.create(kind, namespace, obj)
        }
    }

    pub(super) fn modify(
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

    pub(super) fn delete(
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

/// The manager a write is recorded under: `fieldManager`, else the User-Agent's product
/// name, as upstream derives it.
pub(super) fn field_manager(query: &Query, headers: &HeaderMap) -> String {
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

/// Fields of a kind's objects that the main resource endpoint does not write because a
/// `status` subresource owns them, or that the status endpoint does not write.
pub(super) fn skipped_fields(kind: &Kind, subresource: &str) -> &'static [&'static str] {
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
pub(super) fn reconcile(kind: &Kind, subresource: &str, live: &Value, mut next: Value) -> Value {
    if !kind.subresources.contains(&"status") {
        return next;
    }
    if subresource == super::ephemeral::SUBRESOURCE {
        // A patch's new ephemeral container gets the defaults a created pod's containers get.
        let mut out = super::ephemeral::take(live, next);
        defaults::defaults(kind, &mut out);
        return out;
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

/// The validation a subresource adds to an update.
fn check_subresource(
    kind: &Kind,
    subresource: &str,
    live: &Value,
    next: &Value,
) -> Result<(), Failure> {
    if subresource == super::ephemeral::SUBRESOURCE {
        super::ephemeral::validate(kind, live, next)?;
    }
    Ok(())
}

/// What upstream's strategies do to every new object: defaulting, and for pods a status
/// reset (the kubelet reports status later).
fn prepare_for_create(kind: &Kind, body: &mut Value) {
    defaults::defaults(kind, body);
    if kind.group.is_empty() && kind.kind == "Pod" {
        body["status"] = json!({ "phase": "Pending" });
    }
}

pub(super) fn check_type(kind: &Kind, body: &Value) -> Result<(), Failure> {
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

pub(super) fn check_namespace(target: &ResourcePath, body: &Value) -> Result<(), Failure> {
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

pub(super) fn managed_request<'a>(
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

pub(super) fn create(
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
    prepare_for_create(kind, &mut body);
    let api_version = kind.api_version();
    managed::track_update(
        &managed_request(target, manager, &api_version),
        None,
        &mut body,
    );
    let created = store.create(kind, &target.namespace, body)?;
    Ok(json_response(StatusCode::CREATED, &created))
}

pub(super) fn update(
    store: &Writer<'_>,
    target: &ResourcePath,
    mut body: Value,
    manager: &str,
) -> Result<Response, Failure> {
    let kind = target.kind;
    defaults::defaults(kind, &mut body);
    check_type(kind, &body)?;
    check_namespace(target, &body)?;
    let api_version = kind.api_version();
    let req = managed_request(target, manager, &api_version);
    let updated = store.modify(kind, &target.namespace, &target.name, |live| {
        let mut next = reconcile(kind, &target.subresource, live, body);
        check_subresource(kind, &target.subresource, live, &next)?;
        managed::track_update(&req, Some(live), &mut next);
        Ok(next)
    })?;
    Ok(json_response(StatusCode::OK, &updated))
}

pub(super) async fn patch(
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
            let next = reconcile(kind, &target.subresource, live, merged);
            check_subresource(kind, &target.subresource, live, &next)?;
            Ok(next)
        });
        return match applied {
            Ok(obj) => Ok(json_response(StatusCode::OK, &obj)),
            Err(f) if f.reason == "NotFound" && target.subresource.is_empty() => {
                let mut obj = managed::apply(&mreq, None, &config, force)?;
                obj["metadata"]["name"] = json!(target.name);
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove("resourceVersion");
                }
                prepare_for_create(kind, &mut obj);
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
        check_subresource(kind, &target.subresource, live, &next)?;
        managed::track_update(&mreq, Some(live), &mut next);
        Ok(next)
    })?;
    Ok(json_response(StatusCode::OK, &patched))
}

pub(super) fn delete(
    store: &Writer<'_>,
    target: &ResourcePath,
    options: &Value,
) -> Result<Response, Failure> {
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
    if kind.group.is_empty() && kind.kind == "Pod" {
        let live = store.store.get(kind, &target.namespace, &target.name)?;
        let period = pod_grace_period(&live, options);
        if period > 0 {
            // Graceful: the pod stays, marked, until its kubelet has stopped it and deletes it
            // with grace 0 (upstream's `CheckGracefulDelete` and `BeforeDelete`).
            let marked = store.modify(kind, &target.namespace, &target.name, |live| {
                let mut next = live.clone();
                let deadline = k8s_openapi::jiff::Timestamp::now()
                    + k8s_openapi::jiff::SignedDuration::from_secs(period);
                let earlier = next["metadata"]["deletionGracePeriodSeconds"]
                    .as_i64()
                    .is_some_and(|set| set <= period);
                if !earlier {
                    next["metadata"]["deletionTimestamp"] =
                        json!(crate::apiserver::clock::format(deadline));
                    next["metadata"]["deletionGracePeriodSeconds"] = json!(period);
                }
                Ok(next)
            })?;
            return Ok(json_response(StatusCode::OK, &marked));
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

/// A pod's deletion grace period, as upstream's pod strategy decides it: the request's, else
/// the pod's own; 0 for a pod not bound to a node or already finished (they go at once).
fn pod_grace_period(pod: &Value, options: &Value) -> i64 {
    let asked = options["gracePeriodSeconds"]
        .as_i64()
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(0);
    let bound = pod["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    if !bound || finished { 0 } else { asked.max(0) }
}

pub(super) fn delete_collection(
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

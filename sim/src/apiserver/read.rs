//! The read verbs on collections: list (selectors, `limit`/`continue` pages) and the
//! parameters of a watch.

use std::time::Duration;

use axum::response::Response;
use base64::Engine;
use http::StatusCode;
use serde_json::{Value, json};

use super::body::json_response;
use super::failure::Failure;
use super::kinds::Kind;
use super::query::Query;
use super::render::Render;
use super::route::ResourcePath;
use super::selector::{FieldSelector, LabelSelector};
use super::store::Store;
use super::watch::Watch;

/// A list continue token: the revision of the first page and the last key returned.
pub(super) fn encode_continue(rv: u64, last: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(
        json!({ "v": "meta.k8s.io/v1", "rv": rv, "start": format!("{last}\u{0}") }).to_string(),
    )
}

pub(super) fn decode_continue(token: &str) -> Result<(u64, String), Failure> {
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

pub(super) fn object_key(obj: &Value) -> String {
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

pub(super) fn selectors(
    kind: &'static Kind,
    query: &Query,
) -> Result<(LabelSelector, FieldSelector), Failure> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), kind)?;
    Ok((labels, fields))
}

pub(super) fn namespace_filter(target: &ResourcePath) -> Option<String> {
    (target.kind.namespaced() && !target.namespace.is_empty()).then(|| target.namespace.clone())
}

pub(super) fn list(
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

pub(super) fn watch_request(
    target: &ResourcePath,
    query: &Query,
    render: Render,
) -> Result<Watch, Failure> {
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

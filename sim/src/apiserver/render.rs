//! How objects are rendered for one request, as the client's `Accept` header asks: whole
//! objects, a `meta.k8s.io` Table (kubectl get), or `PartialObjectMetadata` (kube-rs
//! `list_metadata` and metadata watchers, client-go metadata informers).

use serde_json::{Value, json};

use super::kinds::Kind;
use super::table::{self, Include};

/// The rendering a request asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Render {
    Object,
    /// Table in this `meta.k8s.io` version, rows carrying what `includeObject` asked.
    Table(&'static str, Include),
    /// PartialObjectMetadata in this `meta.k8s.io` version.
    Metadata(&'static str),
}

/// The meta.k8s.io version of the first `as=<what>;g=meta.k8s.io` entry of `accept`.
fn meta_as(accept: &str, what: &str) -> Option<&'static str> {
    let wanted = format!("as={what}");
    for part in accept.split(',') {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        if params.contains(&wanted.as_str()) && params.contains(&"g=meta.k8s.io") {
            if params.contains(&"v=v1") {
                return Some("v1");
            }
            if params.contains(&"v=v1beta1") {
                return Some("v1beta1");
            }
        }
    }
    None
}

impl Render {
    /// What `accept` asks for; `include_object` is the `includeObject` query parameter.
    pub fn from_accept(accept: &str, include_object: Option<&str>) -> Render {
        if let Some(version) = table::requested(accept) {
            return Render::Table(version, Include::parse(include_object));
        }
        if let Some(version) = meta_as(accept, "PartialObjectMetadataList")
            .or_else(|| meta_as(accept, "PartialObjectMetadata"))
        {
            return Render::Metadata(version);
        }
        Render::Object
    }

    fn partial(version: &str, obj: &Value) -> Value {
        json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": format!("meta.k8s.io/{version}"),
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        })
    }

    /// One object (a GET, or a watch event's object).
    pub fn one(self, kind: &Kind, obj: &Value) -> Value {
        match self {
            Render::Object => obj.clone(),
            Render::Table(version, include) => {
                table::table(kind, version, &[obj], json!({}), include)
            }
            Render::Metadata(version) => Self::partial(version, obj),
        }
    }

    /// A list with `metadata` (resourceVersion, continue).
    pub fn list(self, kind: &Kind, items: &[&Value], metadata: Value) -> Value {
        match self {
            Render::Object => json!({
                "kind": kind.list_kind,
                "apiVersion": kind.api_version(),
                "metadata": metadata,
                "items": items,
            }),
            Render::Table(version, include) => {
                table::table(kind, version, items, metadata, include)
            }
            Render::Metadata(version) => json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": format!("meta.k8s.io/{version}"),
                "metadata": metadata,
                "items": items.iter().map(|o| Self::partial(version, o)).collect::<Vec<_>>(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::kinds;

    #[test]
    fn accept_headers_choose_the_rendering() {
        let kube_rs = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        assert_eq!(Render::from_accept(kube_rs, None), Render::Metadata("v1"));
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
        assert_eq!(
            Render::from_accept(kubectl, Some("Object")),
            Render::Table("v1", Include::Object)
        );
        assert_eq!(
            Render::from_accept("application/json", None),
            Render::Object
        );
        let kind = kinds::by_resource("", "nodes").unwrap();
        let node = json!({"kind": "Node", "metadata": {"name": "n"}, "status": {"phase": "x"}});
        let list = Render::Metadata("v1").list(kind, &[&node], json!({"resourceVersion": "7"}));
        assert_eq!(list["kind"], "PartialObjectMetadataList");
        assert_eq!(
            list["items"][0],
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "n"}})
        );
    }
}

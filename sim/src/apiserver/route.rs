//! Turning a request line into what it addresses and the verb it performs, as upstream's
//! `RequestInfoFactory` does: discovery and other non-resource paths, or a resource URL
//! (`/api/v1/namespaces/{ns}/pods/{name}/{subresource}`, `/apis/{g}/{v}/{resource}`...).

use http::Method;

use super::failure::Failure;
use super::kinds::{self, Kind};

/// A resource URL, resolved against the served kinds.
#[derive(Clone, Debug)]
pub struct ResourcePath {
    pub kind: &'static Kind,
    /// "" for cluster-scoped kinds or all-namespace lists.
    pub namespace: String,
    /// "" for collections.
    pub name: String,
    /// "" for the object itself; `status`, `exec`, `log`, `proxy`...
    pub subresource: String,
    /// What follows the subresource (the path of a node proxy call).
    pub rest: String,
}

/// What a request addresses.
#[derive(Clone, Debug)]
pub enum Target {
    /// Discovery, version, health and other paths outside the resource tree.
    NonResource,
    Resource(ResourcePath),
}

/// Parses `path` (without query).
pub fn parse(path: &str) -> Result<Target, Failure> {
    let segments: Vec<&str> = path
        .trim_start_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => ("", "v1", rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return Ok(Target::NonResource),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, resource, tail @ ..] if !matches!(*resource, "status" | "finalize") => (
            *ns,
            std::iter::once(resource)
                .chain(tail)
                .copied()
                .collect::<Vec<_>>(),
        ),
        other => ("", other.to_vec()),
    };
    let Some((resource, tail)) = rest.split_first() else {
        return Err(Failure::no_route());
    };
    let kind = kinds::lookup(group, version, resource).ok_or_else(Failure::no_route)?;
    if !namespace.is_empty() && !kind.namespaced() {
        return Err(Failure::no_route());
    }
    let name = tail.first().copied().unwrap_or_default();
    let subresource = tail.get(1).copied().unwrap_or_default();
    let rest = if tail.len() > 2 {
        tail[2..].join("/")
    } else {
        String::new()
    };
    if !subresource.is_empty() {
        let known = kind.subresources.contains(&subresource)
            || kinds::connect_subresources(kind)
                .iter()
                .any(|(s, _)| *s == subresource);
        if !known {
            return Err(Failure::no_route());
        }
        // Only node proxy takes a path after its subresource.
        if !rest.is_empty() && subresource != "proxy" {
            return Err(Failure::no_route());
        }
    }
    Ok(Target::Resource(ResourcePath {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
        subresource: subresource.to_string(),
        rest,
    }))
}

/// The authorization verb of a request, as upstream derives it from the method.
pub fn verb(method: &Method, target: &ResourcePath, watch: bool) -> &'static str {
    let collection = target.name.is_empty();
    match *method {
        Method::GET | Method::HEAD => {
            if !target.subresource.is_empty() && !collection {
                "get"
            } else if watch {
                "watch"
            } else if collection {
                "list"
            } else {
                "get"
            }
        }
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => {
            if collection {
                "deletecollection"
            } else {
                "delete"
            }
        }
        _ => "",
    }
}

/// True for subresources answered by a kubelet rather than the store.
pub fn is_connect(target: &ResourcePath) -> bool {
    kinds::connect_subresources(target.kind)
        .iter()
        .any(|(s, _)| *s == target.subresource)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match parse(path).unwrap() {
            Target::Resource(r) => r,
            Target::NonResource => panic!("{path} is a resource path"),
        }
    }

    #[test]
    fn resource_paths() {
        let r = res("/api/v1/namespaces/default/pods/web/exec");
        assert_eq!(
            (
                r.kind.kind,
                r.namespace.as_str(),
                r.name.as_str(),
                r.subresource.as_str()
            ),
            ("Pod", "default", "web", "exec")
        );
        let r = res("/api/v1/namespaces/default");
        assert_eq!((r.kind.kind, r.name.as_str()), ("Namespace", "default"));
        let r = res("/api/v1/namespaces/kube-system/status");
        assert_eq!(
            (r.kind.kind, r.subresource.as_str()),
            ("Namespace", "status")
        );
        let r = res("/api/v1/pods");
        assert!(r.namespace.is_empty() && r.name.is_empty());
        let r = res("/api/v1/nodes/n1/proxy/stats/summary");
        assert_eq!(
            (r.subresource.as_str(), r.rest.as_str()),
            ("proxy", "stats/summary")
        );
        let r = res("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1");
        assert_eq!(r.kind.kind, "Lease");
        assert!(matches!(parse("/api/v1").unwrap(), Target::NonResource));
        assert!(matches!(parse("/version").unwrap(), Target::NonResource));
        assert_eq!(parse("/api/v1/namespaces/x/nodes").unwrap_err().code, 404);
        assert_eq!(parse("/api/v1/widgets").unwrap_err().code, 404);
        assert_eq!(
            parse("/api/v1/namespaces/d/pods/p/bogus").unwrap_err().code,
            404
        );
    }

    #[test]
    fn verbs() {
        let pod = res("/api/v1/namespaces/d/pods/p");
        let pods = res("/api/v1/namespaces/d/pods");
        let exec = res("/api/v1/namespaces/d/pods/p/exec");
        assert_eq!(verb(&Method::GET, &pods, true), "watch");
        assert_eq!(verb(&Method::GET, &pods, false), "list");
        assert_eq!(verb(&Method::GET, &pod, false), "get");
        assert_eq!(verb(&Method::DELETE, &pods, false), "deletecollection");
        assert_eq!(verb(&Method::POST, &exec, false), "create");
        assert_eq!(verb(&Method::GET, &exec, false), "get");
        assert!(is_connect(&exec) && !is_connect(&pod));
    }
}

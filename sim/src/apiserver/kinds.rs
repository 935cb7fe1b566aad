//! The resource types the API server serves: one table that routing, discovery, storage and
//! authorization all read, so a kind is declared once.
//!
//! Names, short names, scopes, verbs and subresources mirror what a real kube-apiserver
//! advertises for the same group/version, because kubectl resolves `po`, `no`, `cm` and friends
//! from discovery, and kube-rs builds URLs from the same facts.

/// How an object of a kind is addressed: inside a namespace or cluster-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    Cluster,
}

/// What a kind supports beyond the usual CRUD verbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Stored objects: get, list, watch, create, update, patch, delete, deletecollection.
    Stored,
    /// Create-only review objects answered on the spot and never stored
    /// (TokenReview, SubjectAccessReview and their self variants).
    Review,
    /// Read-only objects the test harness writes through the store (metrics).
    ReadOnly,
}

/// One served resource type.
#[derive(Debug)]
pub struct Kind {
    /// API group; "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// Plural resource name used in URLs.
    pub resource: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    pub scope: Scope,
    pub flavor: Flavor,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Subresources that read and write the object itself (`status`).
    pub subresources: &'static [&'static str],
}

impl Kind {
    /// `apiVersion` as written in objects: `v1` for core, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The verbs a real apiserver advertises for this kind in discovery.
    pub fn verbs(&self) -> &'static [&'static str] {
        match self.flavor {
            Flavor::Stored => &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ],
            Flavor::Review => &["create"],
            Flavor::ReadOnly => &["get", "list"],
        }
    }

    /// `group/resource`, the name of a kind in error messages ("pods", "leases.coordination.k8s.io").
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    pub fn namespaced(&self) -> bool {
        self.scope == Scope::Namespaced
    }
}

/// The `all` category: `kubectl get all` includes pods.
const ALL_CATEGORY: &[&str] = &["all"];

/// Every kind served, in discovery order.
pub static KINDS: &[Kind] = &[
    Kind {
        group: "",
        version: "v1",
        resource: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        list_kind: "NamespaceList",
        scope: Scope::Cluster,
        flavor: Flavor::Stored,
        short_names: &["ns"],
        categories: &[],
        subresources: &["status"],
    },
    Kind {
        group: "",
        version: "v1",
        resource: "nodes",
        singular: "node",
        kind: "Node",
        list_kind: "NodeList",
        scope: Scope::Cluster,
        flavor: Flavor::Stored,
        short_names: &["no"],
        categories: &[],
        subresources: &["status"],
    },
    Kind {
        group: "",
        version: "v1",
        resource: "pods",
        singular: "pod",
        kind: "Pod",
        list_kind: "PodList",
        scope: Scope::Namespaced,
        flavor: Flavor::Stored,
        short_names: &["po"],
        categories: ALL_CATEGORY,
        subresources: &["status", "ephemeralcontainers"],
    },
    Kind {
        group: "",
        version: "v1",
        resource: "secrets",
        singular: "secret",
        kind: "Secret",
        list_kind: "SecretList",
        scope: Scope::Namespaced,
        flavor: Flavor::Stored,
        short_names: &[],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "",
        version: "v1",
        resource: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        list_kind: "ConfigMapList",
        scope: Scope::Namespaced,
        flavor: Flavor::Stored,
        short_names: &["cm"],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "",
        version: "v1",
        resource: "events",
        singular: "event",
        kind: "Event",
        list_kind: "EventList",
        scope: Scope::Namespaced,
        flavor: Flavor::Stored,
        short_names: &["ev"],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "",
        version: "v1",
        resource: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        list_kind: "ServiceAccountList",
        scope: Scope::Namespaced,
        flavor: Flavor::Stored,
        short_names: &["sa"],
        categories: &[],
        subresources: &["token"],
    },
    Kind {
        group: "events.k8s.io",
        version: "v1",
        resource: "events",
        singular: "event",
        kind: "Event",
        list_kind: "EventList",
        scope: Scope::Namespaced,
        flavor: Flavor::Stored,
        short_names: &["ev"],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "coordination.k8s.io",
        version: "v1",
        resource: "leases",
        singular: "lease",
        kind: "Lease",
        list_kind: "LeaseList",
        scope: Scope::Namespaced,
        flavor: Flavor::Stored,
        short_names: &[],
        categories: &[],
        subresources: &[],
    },
    // relaylet's own CRD (charts/relaylet/templates/crd-leafclusters.yaml): the row per leaf.
    Kind {
        group: "relaylet.io",
        version: "v1alpha1",
        resource: "leafclusters",
        singular: "leafcluster",
        kind: "LeafCluster",
        list_kind: "LeafClusterList",
        scope: Scope::Namespaced,
        flavor: Flavor::Stored,
        short_names: &["leaves"],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "authentication.k8s.io",
        version: "v1",
        resource: "tokenreviews",
        singular: "tokenreview",
        kind: "TokenReview",
        list_kind: "TokenReviewList",
        scope: Scope::Cluster,
        flavor: Flavor::Review,
        short_names: &[],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "authentication.k8s.io",
        version: "v1",
        resource: "selfsubjectreviews",
        singular: "selfsubjectreview",
        kind: "SelfSubjectReview",
        list_kind: "SelfSubjectReviewList",
        scope: Scope::Cluster,
        flavor: Flavor::Review,
        short_names: &[],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "authorization.k8s.io",
        version: "v1",
        resource: "subjectaccessreviews",
        singular: "subjectaccessreview",
        kind: "SubjectAccessReview",
        list_kind: "SubjectAccessReviewList",
        scope: Scope::Cluster,
        flavor: Flavor::Review,
        short_names: &[],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "authorization.k8s.io",
        version: "v1",
        resource: "selfsubjectaccessreviews",
        singular: "selfsubjectaccessreview",
        kind: "SelfSubjectAccessReview",
        list_kind: "SelfSubjectAccessReviewList",
        scope: Scope::Cluster,
        flavor: Flavor::Review,
        short_names: &[],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "metrics.k8s.io",
        version: "v1beta1",
        resource: "pods",
        singular: "",
        kind: "PodMetrics",
        list_kind: "PodMetricsList",
        scope: Scope::Namespaced,
        flavor: Flavor::ReadOnly,
        short_names: &[],
        categories: &[],
        subresources: &[],
    },
    Kind {
        group: "metrics.k8s.io",
        version: "v1beta1",
        resource: "nodes",
        singular: "",
        kind: "NodeMetrics",
        list_kind: "NodeMetricsList",
        scope: Scope::Cluster,
        flavor: Flavor::ReadOnly,
        short_names: &[],
        categories: &[],
        subresources: &[],
    },
];

/// The kind served at `group/version/resource`, if any.
pub fn lookup(group: &str, version: &str, resource: &str) -> Option<&'static Kind> {
    KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.resource == resource)
}

/// The kind whose objects carry `apiVersion` and `kind`, if any.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static Kind> {
    KINDS
        .iter()
        .find(|k| k.kind == kind && k.api_version() == api_version)
}

/// The kind stored under `group` and plural `resource` (version-independent), if any.
pub fn by_resource(group: &str, resource: &str) -> Option<&'static Kind> {
    KINDS
        .iter()
        .find(|k| k.group == group && k.resource == resource)
}

/// The API groups other than core, each with its one served version, in discovery order.
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for k in KINDS.iter().filter(|k| !k.group.is_empty()) {
        if !out.iter().any(|(g, _)| *g == k.group) {
            out.push((k.group, k.version));
        }
    }
    out
}

/// Subresources that are not the object itself but are proxied elsewhere; they appear in
/// discovery like upstream's so kubectl and RBAC tooling see the same surface.
pub fn connect_subresources(kind: &Kind) -> &'static [(&'static str, &'static [&'static str])] {
    match (kind.group, kind.resource) {
        ("", "pods") => &[
            ("attach", &["create", "get"]),
            ("exec", &["create", "get"]),
            ("log", &["get"]),
            ("portforward", &["create", "get"]),
        ],
        ("", "nodes") => &[("proxy", &["create", "delete", "get", "patch", "update"])],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_agree() {
        let pods = lookup("", "v1", "pods").unwrap();
        assert_eq!(pods.kind, "Pod");
        assert!(std::ptr::eq(by_kind("v1", "Pod").unwrap(), pods));
        let lease = by_resource("coordination.k8s.io", "leases").unwrap();
        assert_eq!(lease.api_version(), "coordination.k8s.io/v1");
        assert_eq!(lease.qualified(), "leases.coordination.k8s.io");
        assert!(lookup("", "v1", "deployments").is_none());
        assert!(groups().contains(&("metrics.k8s.io", "v1beta1")));
    }
}

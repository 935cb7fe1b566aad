//! How lists inside objects merge: the slice of upstream's OpenAPI schema that strategic merge
//! patch (`patchStrategy`/`patchMergeKey`) and server-side apply (`listType`/`listMapKeys`) need
//! for the kinds served here.
//!
//! Paths are field names from the object root joined by '.', list items adding no segment
//! (`spec.containers.ports`). A list not named here is replaced whole by SMP and atomic for
//! SSA, which is upstream's default for lists without markers.

/// How strategic merge patch treats a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmpList {
    /// No patch strategy: the patch's list replaces the stored one.
    Replace,
    /// `patchStrategy: merge` on scalars: union, order kept.
    MergeScalars,
    /// `patchStrategy: merge` with `patchMergeKey`: items matched by that field.
    MergeByKey(&'static str),
}

/// How server-side apply treats a list (`x-kubernetes-list-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SsaList {
    Atomic,
    Set,
    Map(&'static [&'static str]),
}

struct Rule {
    /// Resource the rule applies to; "*" for every kind (object metadata).
    resource: &'static str,
    path: &'static str,
    smp: SmpList,
    ssa: SsaList,
}

const NAME: &[&str] = &["name"];
const TYPE: &[&str] = &["type"];
const IP: &[&str] = &["ip"];

static RULES: &[Rule] = &[
    Rule {
        resource: "*",
        path: "metadata.finalizers",
        smp: SmpList::MergeScalars,
        ssa: SsaList::Set,
    },
    Rule {
        resource: "*",
        path: "metadata.ownerReferences",
        smp: SmpList::MergeByKey("uid"),
        ssa: SsaList::Map(&["uid"]),
    },
    Rule {
        resource: "pods",
        path: "spec.containers",
        smp: SmpList::MergeByKey("name"),
        ssa: SsaList::Map(NAME),
    },
    Rule {
        resource: "pods",
        path: "spec.initContainers",
        smp: SmpList::MergeByKey("name"),
        ssa: SsaList::Map(NAME),
    },
    Rule {
        resource: "pods",
        path: "spec.ephemeralContainers",
        smp: SmpList::MergeByKey("name"),
        ssa: SsaList::Map(NAME),
    },
    Rule {
        resource: "pods",
        path: "spec.volumes",
        smp: SmpList::MergeByKey("name"),
        ssa: SsaList::Map(NAME),
    },
    Rule {
        resource: "pods",
        path: "spec.imagePullSecrets",
        smp: SmpList::MergeByKey("name"),
        ssa: SsaList::Map(NAME),
    },
    Rule {
        resource: "pods",
        path: "spec.hostAliases",
        smp: SmpList::MergeByKey("ip"),
        ssa: SsaList::Map(IP),
    },
    Rule {
        resource: "pods",
        path: "spec.schedulingGates",
        smp: SmpList::MergeByKey("name"),
        ssa: SsaList::Map(NAME),
    },
    Rule {
        resource: "pods",
        path: "spec.resourceClaims",
        smp: SmpList::MergeByKey("name"),
        ssa: SsaList::Map(NAME),
    },
    Rule {
        resource: "pods",
        path: "status.conditions",
        smp: SmpList::MergeByKey("type"),
        ssa: SsaList::Map(TYPE),
    },
    Rule {
        resource: "pods",
        path: "status.podIPs",
        smp: SmpList::MergeByKey("ip"),
        ssa: SsaList::Map(IP),
    },
    Rule {
        resource: "pods",
        path: "status.hostIPs",
        smp: SmpList::MergeByKey("ip"),
        ssa: SsaList::Map(IP),
    },
    Rule {
        resource: "nodes",
        path: "spec.podCIDRs",
        smp: SmpList::MergeScalars,
        ssa: SsaList::Set,
    },
    Rule {
        resource: "nodes",
        path: "status.addresses",
        smp: SmpList::MergeByKey("type"),
        ssa: SsaList::Map(TYPE),
    },
    Rule {
        resource: "nodes",
        path: "status.conditions",
        smp: SmpList::MergeByKey("type"),
        ssa: SsaList::Map(TYPE),
    },
];

/// Container fields, the same in `containers`, `initContainers` and `ephemeralContainers`.
fn container_rule(field: &str) -> Option<(SmpList, SsaList)> {
    match field {
        "ports" => Some((
            SmpList::MergeByKey("containerPort"),
            SsaList::Map(&["containerPort", "protocol"]),
        )),
        "env" => Some((SmpList::MergeByKey("name"), SsaList::Map(NAME))),
        "volumeMounts" => Some((
            SmpList::MergeByKey("mountPath"),
            SsaList::Map(&["mountPath"]),
        )),
        "volumeDevices" => Some((
            SmpList::MergeByKey("devicePath"),
            SsaList::Map(&["devicePath"]),
        )),
        "resizePolicy" | "args" | "command" | "envFrom" => {
            Some((SmpList::Replace, SsaList::Atomic))
        }
        _ => None,
    }
}

fn rule(resource: &str, path: &str) -> Option<(SmpList, SsaList)> {
    if resource == "pods" {
        for parent in [
            "spec.containers.",
            "spec.initContainers.",
            "spec.ephemeralContainers.",
        ] {
            if let Some(field) = path.strip_prefix(parent) {
                return container_rule(field);
            }
        }
    }
    RULES
        .iter()
        .find(|r| (r.resource == "*" || r.resource == resource) && r.path == path)
        .map(|r| (r.smp, r.ssa))
}

/// The SMP strategy for the list at `path` in objects of `resource`.
pub fn smp_list(resource: &str, path: &str) -> SmpList {
    rule(resource, path).map_or(SmpList::Replace, |(smp, _)| smp)
}

/// The SSA list type for the list at `path` in objects of `resource`.
pub fn ssa_list(resource: &str, path: &str) -> SsaList {
    rule(resource, path).map_or(SsaList::Atomic, |(_, ssa)| ssa)
}

/// Maps upstream marks `+mapType=atomic`: owned and replaced whole by SSA (SMP ignores the
/// marker and merges them like any map).
pub fn atomic_map(resource: &str, path: &str) -> bool {
    resource == "pods" && path == "spec.nodeSelector"
}

/// Joins a parent path and a field name.
pub fn child(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_merge_by_type_and_unknown_lists_are_atomic() {
        assert_eq!(
            smp_list("nodes", "status.addresses"),
            SmpList::MergeByKey("type")
        );
        assert_eq!(ssa_list("nodes", "status.addresses"), SsaList::Map(TYPE));
        assert_eq!(smp_list("nodes", "spec.taints"), SmpList::Replace);
        assert_eq!(ssa_list("nodes", "spec.taints"), SsaList::Atomic);
        assert_eq!(
            ssa_list("pods", "spec.initContainers.ports"),
            SsaList::Map(&["containerPort", "protocol"])
        );
        assert_eq!(
            smp_list("configmaps", "metadata.finalizers"),
            SmpList::MergeScalars
        );
    }
}

//! Which leaf pod stands for a root pod, and the proof, read in the leaf, that it does.
//!
//! relaylet's leaf credentials may exec into every pod of a leaf cluster, so the leaf pod a call
//! reaches must be decided by parties the root pod's author does not control, and checked before
//! any byte is relayed:
//! - the **leaf namespace** comes from the administrator: the leaf Secret's
//!   `relaylet.io/namespace-map` annotation (or `LEAF_NAMESPACE_MAP` for `LEAF_KUBECONFIG`), and
//!   is the root pod's own namespace when no map is set. With a map, only mapped namespaces are
//!   served, and no two root namespaces may share a leaf namespace;
//! - the **leaf pod name** is the root pod's name (what Kosmos-style syncers keep);
//! - the **proof** (`LEAF_POD_MATCH`) is written on the leaf pod by the syncing controller, in the
//!   leaf, where root users cannot write: by default the root pod's UID under
//!   `relaylet.io/root-pod-uid` (an annotation or a label). A pod recreated under the same name
//!   has a new UID, so a stale leaf copy, a pod created straight in the leaf, or any other pod of
//!   that name is refused. `label` accepts any leaf pod carrying a syncer's label (Kosmos writes
//!   `kosmos-io/pod=true`), and `name` accepts any leaf pod of that name: both are opt-ins for
//!   syncers that write no UID, with the risks docs/install.md, "Which leaf pod a call
//!   reaches", states.
//!
//! Root pod annotations are never read: they belong to the pod's author.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Default key of the marker that names the root pod's UID on its leaf copy.
pub const ROOT_UID_MARKER: &str = "relaylet.io/root-pod-uid";
/// Default label of `LEAF_POD_MATCH=label`: the one Kosmos' syncer puts on every leaf copy.
pub const DEFAULT_SYNCER_LABEL: (&str, &str) = ("kosmos-io/pod", "true");
/// Leaf Secret annotation: `root-ns=leaf-ns,other=other-leaf`.
pub const NAMESPACE_MAP_ANNOTATION: &str = "relaylet.io/namespace-map";

/// What a leaf pod must show to count as a root pod's counterpart (`LEAF_POD_MATCH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafPodMatch {
    /// Annotation or label `key` equals the root pod's UID.
    RootUid { key: String },
    /// Label `key=value`, written by the syncer on every leaf copy.
    Label { key: String, value: String },
    /// Any leaf pod with the mapped namespace and name.
    Name,
}

impl Default for LeafPodMatch {
    fn default() -> Self {
        LeafPodMatch::RootUid {
            key: ROOT_UID_MARKER.to_string(),
        }
    }
}

impl LeafPodMatch {
    /// Reads `LEAF_POD_MATCH` (`root-uid`, `label`, `name`) and `LEAF_POD_MARKER` (the key for
    /// `root-uid`, `key=value` for `label`).
    pub fn parse(mode: Option<&str>, marker: Option<&str>) -> Result<LeafPodMatch, String> {
        match (mode.unwrap_or("root-uid"), marker) {
            ("root-uid", None) => Ok(LeafPodMatch::default()),
            ("root-uid", Some(key)) => {
                super::names::check_label_key(key)?;
                Ok(LeafPodMatch::RootUid {
                    key: key.to_string(),
                })
            }
            ("label", None) => Ok(LeafPodMatch::Label {
                key: DEFAULT_SYNCER_LABEL.0.to_string(),
                value: DEFAULT_SYNCER_LABEL.1.to_string(),
            }),
            ("label", Some(pair)) => {
                let (key, value) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("{pair:?} is not key=value"))?;
                super::names::check_label_key(key)?;
                Ok(LeafPodMatch::Label {
                    key: key.to_string(),
                    value: value.to_string(),
                })
            }
            ("name", None) => Ok(LeafPodMatch::Name),
            ("name", Some(_)) => Err("LEAF_POD_MARKER means nothing with name".to_string()),
            (other, _) => Err(format!("{other:?} is not one of root-uid, label, name")),
        }
    }

    /// Why `leaf` is not the counterpart of the root pod with UID `root_uid`, if it is not.
    pub fn refusal(&self, root_uid: Option<&str>, leaf: &ObjectMeta) -> Option<String> {
        let get = |map: &Option<BTreeMap<String, String>>, key: &str| {
            map.as_ref().and_then(|m| m.get(key)).cloned()
        };
        match self {
            LeafPodMatch::RootUid { key } => {
                let marker = get(&leaf.annotations, key).or_else(|| get(&leaf.labels, key));
                match (marker, root_uid) {
                    (None, _) => Some(format!("it carries no {key} marker")),
                    (Some(_), None) => Some("the root pod has no UID".to_string()),
                    (Some(m), Some(uid)) if m != uid => {
                        // The marker's value is the leaf's text: quoted short.
                        Some(format!(
                            "its {key} marker names another root pod ({})",
                            crate::model::quote::quote(&m)
                        ))
                    }
                    _ => None,
                }
            }
            LeafPodMatch::Label { key, value } => (get(&leaf.labels, key).as_deref()
                != Some(value.as_str()))
            .then(|| format!("it has no label {key}={value}")),
            LeafPodMatch::Name => None,
        }
    }
}

impl fmt::Display for LeafPodMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeafPodMatch::RootUid { key } => write!(f, "root-uid ({key})"),
            LeafPodMatch::Label { key, value } => write!(f, "label ({key}={value})"),
            LeafPodMatch::Name => write!(f, "name"),
        }
    }
}

/// Root namespace → leaf namespace, set by the administrator. Empty means "the same namespace".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceMap(BTreeMap<String, String>);

impl NamespaceMap {
    /// Parses `root=leaf,root2=leaf2`; refuses two root namespaces mapped to one leaf namespace
    /// (their pods of the same name would be each other's counterparts).
    pub fn parse(text: &str) -> Result<NamespaceMap, String> {
        let mut map = BTreeMap::new();
        let mut targets = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (root, leaf) = pair
                .split_once('=')
                .map(|(r, l)| (r.trim(), l.trim()))
                .ok_or_else(|| format!("{pair:?} is not root-namespace=leaf-namespace"))?;
            for ns in [root, leaf] {
                crate::model::names::check_dns_label(ns).map_err(|m| format!("{ns:?}: {m}"))?;
            }
            if map.insert(root.to_string(), leaf.to_string()).is_some() {
                return Err(format!("root namespace {root:?} is mapped twice"));
            }
            if let Some(other) = targets.insert(leaf.to_string(), root.to_string()) {
                return Err(format!(
                    "root namespaces {other:?} and {root:?} both map to leaf namespace {leaf:?}"
                ));
            }
        }
        // An empty map means "every namespace as itself": an annotation that is present but
        // empty (or only commas) is a mistake, never read as that.
        if map.is_empty() {
            return Err(
                "is empty: list root-namespace=leaf-namespace pairs, or remove it to map every namespace to itself"
                    .to_string(),
            );
        }
        Ok(NamespaceMap(map))
    }

    /// The leaf namespace of root namespace `root`, or `None` when a map is set without it.
    pub fn leaf_namespace<'a>(&'a self, root: &'a str) -> Option<&'a str> {
        if self.0.is_empty() {
            Some(root)
        } else {
            self.0.get(root).map(String::as_str)
        }
    }

    /// The root namespace whose pods run in leaf namespace `leaf` (at most one: the map is
    /// refused otherwise).
    pub fn root_namespace<'a>(&'a self, leaf: &'a str) -> Option<&'a str> {
        if self.0.is_empty() {
            Some(leaf)
        } else {
            self.0
                .iter()
                .find(|(_, l)| l.as_str() == leaf)
                .map(|(root, _)| root.as_str())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(annotations: &[(&str, &str)], labels: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        ObjectMeta {
            annotations: map(annotations),
            labels: map(labels),
            ..Default::default()
        }
    }

    #[test]
    fn root_uid_needs_the_exact_uid() {
        let rule = LeafPodMatch::default();
        let good = meta(&[(ROOT_UID_MARKER, "u1")], &[]);
        assert_eq!(rule.refusal(Some("u1"), &good), None);
        let as_label = meta(&[], &[(ROOT_UID_MARKER, "u1")]);
        assert_eq!(rule.refusal(Some("u1"), &as_label), None);
        assert!(
            rule.refusal(Some("u2"), &good)
                .unwrap()
                .contains("another root pod")
        );
        assert!(rule.refusal(None, &good).unwrap().contains("no UID"));
        assert!(
            rule.refusal(Some("u1"), &meta(&[], &[]))
                .unwrap()
                .contains("no relaylet.io/root-pod-uid marker")
        );
    }

    #[test]
    fn label_and_name_rules() {
        let rule = LeafPodMatch::parse(Some("label"), None).unwrap();
        assert_eq!(
            rule.refusal(None, &meta(&[], &[("kosmos-io/pod", "true")])),
            None
        );
        assert!(
            rule.refusal(None, &meta(&[("kosmos-io/pod", "true")], &[]))
                .is_some(),
            "an annotation is not the label"
        );
        assert!(
            rule.refusal(None, &meta(&[], &[("kosmos-io/pod", "false")]))
                .is_some()
        );
        assert_eq!(LeafPodMatch::Name.refusal(None, &meta(&[], &[])), None);
    }

    #[test]
    fn match_settings_parse_or_say_why() {
        assert_eq!(
            LeafPodMatch::parse(None, None).unwrap(),
            LeafPodMatch::default()
        );
        assert_eq!(
            LeafPodMatch::parse(Some("root-uid"), Some("example.com/origin-uid")).unwrap(),
            LeafPodMatch::RootUid {
                key: "example.com/origin-uid".into()
            }
        );
        assert_eq!(
            LeafPodMatch::parse(Some("label"), Some("sync.example/copy=yes")).unwrap(),
            LeafPodMatch::Label {
                key: "sync.example/copy".into(),
                value: "yes".into()
            }
        );
        assert!(
            LeafPodMatch::parse(Some("label"), Some("novalue"))
                .unwrap_err()
                .contains("key=value")
        );
        assert!(
            LeafPodMatch::parse(Some("annotations"), None)
                .unwrap_err()
                .contains("root-uid, label, name")
        );
        assert!(LeafPodMatch::parse(Some("name"), Some("x")).is_err());
        assert!(LeafPodMatch::parse(Some("root-uid"), Some("bad key!")).is_err());
    }

    #[test]
    fn namespace_maps_are_explicit_and_one_to_one() {
        let identity = NamespaceMap::default();
        assert_eq!(identity.leaf_namespace("team-a"), Some("team-a"));
        let map = NamespaceMap::parse("team-a=leaf-a, team-b = leaf-b").unwrap();
        assert_eq!(map.leaf_namespace("team-a"), Some("leaf-a"));
        assert_eq!(map.leaf_namespace("team-b"), Some("leaf-b"));
        assert_eq!(
            map.leaf_namespace("kube-system"),
            None,
            "unmapped is refused"
        );
        // Back from the leaf, for the copies relaylet finds there.
        assert_eq!(map.root_namespace("leaf-b"), Some("team-b"));
        assert_eq!(map.root_namespace("team-b"), None);
        assert_eq!(identity.root_namespace("x"), Some("x"));
        assert!(
            NamespaceMap::parse("a=x,b=x")
                .unwrap_err()
                .contains("both map to leaf namespace \"x\"")
        );
        assert!(
            NamespaceMap::parse("a=x,a=y")
                .unwrap_err()
                .contains("twice")
        );
        assert!(
            NamespaceMap::parse("a")
                .unwrap_err()
                .contains("root-namespace=leaf-namespace")
        );
        assert!(NamespaceMap::parse("a=Not_Valid").is_err());
        // Present but empty is a mistake, never "every namespace".
        for empty in ["", " ", ",", " , "] {
            assert!(
                NamespaceMap::parse(empty).unwrap_err().contains("is empty"),
                "{empty:?}"
            );
        }
    }
}

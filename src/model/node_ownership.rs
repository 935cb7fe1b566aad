//! Whose a root Node is: this relaylet install's, an older relaylet's (unclaimed, adoptable),
//! another install's, or not relaylet's at all. One rule for the virtual node controller (which
//! writes and deletes only its own Nodes) and the leaf Secret checks (a Secret may not name a
//! Node this install does not own).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

/// Label marking Nodes relaylet owns, so it can tidy up after leaves that vanished while it was
/// down.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "relaylet");
/// Label naming the leaf cluster a virtual Node stands for.
pub const LEAF_LABEL: &str = "relaylet.io/leaf-cluster";
/// Label naming the install (its namespace) that owns a Node.
pub const OWNER_LABEL: &str = "relaylet.io/owner";

/// Whose a Node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Labelled with this install's owner.
    Ours,
    /// relaylet's, from a version that wrote no owner: adopted.
    Unclaimed,
    /// Another relaylet install's (its owner label).
    Install(String),
    /// Not relaylet's at all (a real node, or another tool's).
    Foreign,
}

impl Ownership {
    /// Whether this install may write the Node (its own, or an unclaimed one it adopts).
    pub fn writable(&self) -> bool {
        matches!(self, Ownership::Ours | Ownership::Unclaimed)
    }
}

impl std::fmt::Display for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ownership::Ours => f.write_str("this relaylet install"),
            Ownership::Unclaimed => f.write_str("an older relaylet without an owner label"),
            Ownership::Install(owner) => write!(f, "the relaylet install in namespace {owner}"),
            Ownership::Foreign => f.write_str("something other than relaylet"),
        }
    }
}

/// Whose `node` is, for the install whose owner label value is `owner`.
pub fn ownership(node: &Node, owner: &str) -> Ownership {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    match labels.get(OWNER_LABEL) {
        Some(found) if found == owner => Ownership::Ours,
        Some(found) => Ownership::Install(found.clone()),
        None if labels.get(MANAGED_BY_LABEL.0).map(String::as_str) == Some(MANAGED_BY_LABEL.1) => {
            Ownership::Unclaimed
        }
        None => Ownership::Foreign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        node
    }

    #[test]
    fn owner_label_then_managed_by() {
        assert_eq!(
            ownership(&node(&[(OWNER_LABEL, "relaylet")]), "relaylet"),
            Ownership::Ours
        );
        assert_eq!(
            ownership(&node(&[(OWNER_LABEL, "other")]), "relaylet"),
            Ownership::Install("other".into())
        );
        assert_eq!(
            ownership(&node(&[MANAGED_BY_LABEL]), "relaylet"),
            Ownership::Unclaimed
        );
        assert_eq!(ownership(&node(&[]), "relaylet"), Ownership::Foreign);
        assert_eq!(ownership(&Node::default(), "relaylet"), Ownership::Foreign);
        assert!(Ownership::Unclaimed.writable() && Ownership::Ours.writable());
        assert!(!Ownership::Foreign.writable() && !Ownership::Install("x".into()).writable());
    }
}

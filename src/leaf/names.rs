//! Which leaf Secret gets a leaf name and a virtual node name when several ask for the same.
//!
//! The registry keys leaves by node name and the pod index routes a node's pods to its leaf,
//! so a second Secret naming a taken node (or leaf) would silently take over its routing. The
//! rule: the `LEAF_KUBECONFIG` leaf first, then Secrets oldest first (`creationTimestamp`, then
//! name); each gets its names unless someone before it has either. It depends only on the
//! Secrets themselves, so every replica (and every restart) decides alike. A Secret refused for
//! its own content still holds its names: a broken edit of the holder neither hands its node to
//! another Secret nor takes its working leaf down.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use crate::leaf::refusal::SecretRefusal;

/// The names one Secret asks for.
#[derive(Debug, Clone)]
pub struct Claim {
    pub secret: String,
    pub created: Option<Timestamp>,
    pub leaf: String,
    pub node: String,
}

/// The names the `LEAF_KUBECONFIG` leaf has: no Secret may take them.
#[derive(Debug, Clone)]
pub struct Reserved {
    pub leaf: String,
    pub node: String,
}

const STATIC_HOLDER: &str = "the LEAF_KUBECONFIG leaf";

/// Each claiming Secret's verdict, by Secret name.
pub fn resolve(
    reserved: Option<&Reserved>,
    mut claims: Vec<Claim>,
) -> BTreeMap<String, Result<(), SecretRefusal>> {
    // Secrets without a creationTimestamp (never from a real apiserver) come last.
    claims.sort_by(|a, b| {
        (a.created.is_none(), a.created, &a.secret).cmp(&(
            b.created.is_none(),
            b.created,
            &b.secret,
        ))
    });
    let mut leaves: BTreeMap<String, String> = BTreeMap::new();
    let mut nodes: BTreeMap<String, String> = BTreeMap::new();
    if let Some(reserved) = reserved {
        leaves.insert(reserved.leaf.clone(), STATIC_HOLDER.to_string());
        nodes.insert(reserved.node.clone(), STATIC_HOLDER.to_string());
    }
    let mut verdicts = BTreeMap::new();
    for claim in claims {
        let holder = |by: &String| format!("leaf Secret {by:?}");
        let verdict = if let Some(by) = nodes.get(&claim.node) {
            Err(SecretRefusal::NodeNameTaken {
                node: claim.node.clone(),
                holder: if by == STATIC_HOLDER {
                    by.clone()
                } else {
                    holder(by)
                },
            })
        } else if let Some(by) = leaves.get(&claim.leaf) {
            Err(SecretRefusal::LeafNameTaken {
                leaf: claim.leaf.clone(),
                holder: if by == STATIC_HOLDER {
                    by.clone()
                } else {
                    holder(by)
                },
            })
        } else {
            leaves.insert(claim.leaf.clone(), claim.secret.clone());
            nodes.insert(claim.node.clone(), claim.secret.clone());
            Ok(())
        };
        verdicts.insert(claim.secret, verdict);
    }
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(secret: &str, created: Option<i64>, leaf: &str, node: &str) -> Claim {
        Claim {
            secret: secret.into(),
            created: created.map(|s| Timestamp::from_second(s).unwrap()),
            leaf: leaf.into(),
            node: node.into(),
        }
    }

    #[test]
    fn the_older_secret_keeps_a_node_name_whatever_the_order() {
        let older = claim("b-older", Some(100), "one", "shared");
        let younger = claim("a-younger", Some(200), "two", "shared");
        for claims in [
            vec![older.clone(), younger.clone()],
            vec![younger.clone(), older.clone()],
        ] {
            let verdicts = resolve(None, claims);
            assert_eq!(verdicts["b-older"], Ok(()));
            assert_eq!(
                verdicts["a-younger"],
                Err(SecretRefusal::NodeNameTaken {
                    node: "shared".into(),
                    holder: "leaf Secret \"b-older\"".into()
                })
            );
        }
    }

    #[test]
    fn the_name_breaks_a_tie_and_unknown_ages_come_last() {
        let verdicts = resolve(
            None,
            vec![
                claim("b", Some(100), "one", "n"),
                claim("a", Some(100), "two", "n"),
                claim("0", None, "three", "n"),
            ],
        );
        assert_eq!(verdicts["a"], Ok(()));
        assert!(verdicts["b"].is_err() && verdicts["0"].is_err());
    }

    #[test]
    fn a_leaf_name_is_taken_like_a_node_name() {
        let verdicts = resolve(
            None,
            vec![
                claim("first", Some(1), "same", "node-a"),
                claim("second", Some(2), "same", "node-b"),
            ],
        );
        assert_eq!(verdicts["first"], Ok(()));
        assert!(matches!(
            &verdicts["second"],
            Err(SecretRefusal::LeafNameTaken { leaf, .. }) if leaf == "same"
        ));
    }

    #[test]
    fn a_refused_secret_holds_nothing() {
        // "second" loses its node to "first", so "third" may have second's leaf name.
        let verdicts = resolve(
            None,
            vec![
                claim("first", Some(1), "one", "n"),
                claim("second", Some(2), "two", "n"),
                claim("third", Some(3), "two", "m"),
            ],
        );
        assert!(verdicts["second"].is_err());
        assert_eq!(verdicts["third"], Ok(()));
    }

    #[test]
    fn the_static_leaf_comes_first() {
        let reserved = Reserved {
            leaf: "admin".into(),
            node: "relaylet-admin".into(),
        };
        let verdicts = resolve(
            Some(&reserved),
            vec![
                claim("old", Some(1), "other", "relaylet-admin"),
                claim("older", Some(0), "admin", "elsewhere"),
            ],
        );
        assert_eq!(
            verdicts["old"],
            Err(SecretRefusal::NodeNameTaken {
                node: "relaylet-admin".into(),
                holder: "the LEAF_KUBECONFIG leaf".into()
            })
        );
        assert!(matches!(
            verdicts["older"],
            Err(SecretRefusal::LeafNameTaken { .. })
        ));
    }
}

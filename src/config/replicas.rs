//! Which pods are this install's replicas: `REPLICA_SELECTOR`.

use super::vars::Vars;
use crate::model::names::{check_label_key, check_label_value};

/// Labels that select this install's relaylet pods: equality only, at least one, as a
/// Deployment's `matchLabels`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSelector(pub std::collections::BTreeMap<String, String>);

impl ReplicaSelector {
    /// Parses `key=value,key=value`; every key and value checked as the apiserver checks labels.
    pub fn parse(spec: &str) -> Result<ReplicaSelector, String> {
        let mut labels = std::collections::BTreeMap::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value"))?;
            // `k==v` is the same selector as `k=v` in kube's syntax; `!=` is not a Deployment's.
            let value = value.strip_prefix('=').unwrap_or(value);
            let (key, value) = (key.trim(), value.trim());
            check_label_key(key).map_err(|e| format!("label key {key:?}: {e}"))?;
            check_label_value(value).map_err(|e| format!("label value {value:?}: {e}"))?;
            if labels.insert(key.to_string(), value.to_string()).is_some() {
                return Err(format!("label key {key:?} is given twice"));
            }
        }
        if labels.is_empty() {
            return Err(
                "no labels: name at least one key=value (the Deployment's selector)".into(),
            );
        }
        Ok(ReplicaSelector(labels))
    }

    /// The selector as a `labelSelector` query value.
    pub fn query(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `REPLICA_SELECTOR`: optional; meaningless (and refused) with `LEADER_ELECT=false`, where
/// there are no other replicas to tell apart.
pub(super) fn replica_selector(vars: &mut Vars<'_>, leader_elect: bool) -> Option<ReplicaSelector> {
    let raw = vars.get("REPLICA_SELECTOR")?;
    let selector = vars.parse("REPLICA_SELECTOR", &raw, None, |v| {
        ReplicaSelector::parse(v).map(Some)
    })?;
    if !leader_elect {
        vars.error(
            "REPLICA_SELECTOR",
            "means nothing with LEADER_ELECT=false (a single replica has no peers to check)",
        );
    }
    Some(selector)
}

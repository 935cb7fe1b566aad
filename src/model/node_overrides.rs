//! What a leaf Secret's annotations may change about its virtual Node: extra labels and
//! taints, in the kubelet's own flag syntax (`--node-labels`, `--register-with-taints`). Read
//! with the leaf's configuration (`leaf`) and applied when the Node is built (virtual_node),
//! so it belongs to neither.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

use super::names::{check_label_key, check_label_value};

/// Extra labels and taints a leaf Secret's annotations ask for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub labels: BTreeMap<String, String>,
    /// `None` keeps the default taint.
    pub taints: Option<Vec<Taint>>,
}

/// Reads [`Overrides`] from a leaf Secret's annotations.
pub fn overrides(annotations: &BTreeMap<String, String>) -> Result<Overrides, String> {
    let labels = match annotations.get(NODE_LABELS_ANNOTATION) {
        Some(spec) => parse_labels(spec).map_err(|e| format!("{NODE_LABELS_ANNOTATION}: {e}"))?,
        None => BTreeMap::new(),
    };
    let taints = match annotations.get(NODE_TAINTS_ANNOTATION) {
        Some(spec) => {
            Some(parse_taints(spec).map_err(|e| format!("{NODE_TAINTS_ANNOTATION}: {e}"))?)
        }
        None => None,
    };
    Ok(Overrides { labels, taints })
}

/// Annotation on a leaf Secret adding Node labels (`key=value,...`).
pub const NODE_LABELS_ANNOTATION: &str = "relaylet.io/node-labels";
/// Annotation on a leaf Secret replacing the default taint (`key[=value]:Effect,...`; empty for
/// none).
pub const NODE_TAINTS_ANNOTATION: &str = "relaylet.io/node-taints";

/// Parses taints in the kubelet's `--register-with-taints` form: `key[=value]:Effect`, comma
/// separated.
pub fn parse_taints(spec: &str) -> Result<Vec<Taint>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (kv, effect) = t
                .rsplit_once(':')
                .ok_or_else(|| format!("taint {t:?} has no :Effect"))?;
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(format!(
                    "taint {t:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute"
                ));
            }
            let (key, value) = match kv.split_once('=') {
                Some((k, v)) => (k, Some(v.to_string())),
                None => (kv, None),
            };
            if key.is_empty() {
                return Err(format!("taint {t:?} has an empty key"));
            }
            check_label_key(key).map_err(|e| format!("taint key {key:?}: {e}"))?;
            if let Some(value) = &value {
                check_label_value(value).map_err(|e| format!("taint value {value:?}: {e}"))?;
            }
            Ok(Taint {
                key: key.to_string(),
                value,
                effect: effect.to_string(),
                time_added: None,
            })
        })
        .collect()
}

/// Parses labels in the kubelet's `--node-labels` form: `key=value`, comma separated.
pub fn parse_labels(spec: &str) -> Result<BTreeMap<String, String>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .ok_or_else(|| format!("label {l:?} is not key=value"))?;
            check_label_key(k).map_err(|e| format!("label key {k:?}: {e}"))?;
            check_label_value(v).map_err(|e| format!("label value {v:?}: {e}"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taint_and_label_overrides_parse_like_kubelet_flags() {
        let t = parse_taints("dedicated=gpu:NoSchedule, spot:PreferNoSchedule").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            ("dedicated", Some("gpu"), "NoSchedule")
        );
        assert_eq!(t[1].value, None);
        assert!(parse_taints("x=y").is_err());
        assert!(parse_taints("x=y:Sometimes").is_err());
        assert_eq!(parse_taints("").unwrap(), vec![]);
        let l = parse_labels("zone=a,tier=gold").unwrap();
        assert_eq!(l["zone"], "a");
        assert!(!l.contains_key("kubernetes.io/hostname"));
        assert!(parse_labels("novalue").is_err());
        // Keys and values as the apiserver checks them, so a bad one refuses the Secret
        // instead of every write of its Node.
        assert!(parse_labels("bad key=a").is_err());
        assert!(parse_labels("zone=-a").is_err());
        assert!(parse_labels("example.com/zone=a").is_ok());
        assert!(parse_labels(&format!("zone={}", "a".repeat(64))).is_err());
        assert!(parse_taints("bad key=gpu:NoSchedule").is_err());
        assert!(parse_taints("dedicated=gpu!:NoSchedule").is_err());
    }
}

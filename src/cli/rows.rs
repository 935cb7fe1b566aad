//! The leaves' `LeafCluster` rows (`model::leaf_row`) as a command reads them, and the table
//! `relaylet status` prints: the columns of `kubectl get leafclusters`, from the same rows.

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};

use crate::model::leaf_row::{self, LeafStatus};

/// The rows in `namespace`.
pub fn api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &leaf_row::api_resource())
}

/// A row's status, if it has one relaylet wrote.
pub fn status(row: &DynamicObject) -> Option<LeafStatus> {
    serde_json::from_value(row.data.get("status")?.clone()).ok()
}

/// Every row in `namespace`, by name.
pub async fn list(client: &Client, namespace: &str) -> anyhow::Result<Vec<DynamicObject>> {
    let rows = api(client, namespace)
        .list(&ListParams::default())
        .await
        .map_err(|err| match err {
            kube::Error::Api(e) if e.code == 404 => anyhow::anyhow!(
                "the root cluster has no LeafCluster API: is relaylet installed (its chart installs the CRD)?"
            ),
            err => anyhow::anyhow!("listing the LeafCluster rows in {namespace}: {err}"),
        })?;
    let mut items = rows.items;
    items.sort_by_key(|r| r.name_any());
    Ok(items)
}

/// The rows as a table, one leaf per line, as `kubectl get leafclusters` shows them, with the
/// message of every leaf that is not Ready below the table.
pub fn table(rows: &[DynamicObject], now: Timestamp) -> String {
    let header = [
        "NAME",
        "READY",
        "REASON",
        "VERSION",
        "NODE",
        "SERVED-BY",
        "PODS",
        "CREDENTIAL-EXPIRES",
        "AGE",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    let mut notes = Vec::new();
    for row in rows {
        let name = row.name_any();
        let s = status(row).unwrap_or_default();
        let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "<none>".into());
        let age = row
            .creation_timestamp()
            .map_or_else(|| "<unknown>".into(), |t| short_age(now, t.0));
        let expires = s.credential_expires.as_deref().map_or_else(
            || "<none>".to_string(),
            |t| match t.parse::<Timestamp>() {
                Ok(at) if at <= now => "expired".to_string(),
                Ok(at) => format!("in {}", short_age(at, now)),
                Err(_) => t.to_string(),
            },
        );
        if s.ready != "True" {
            notes.push(format!(
                "{name}: {}",
                if s.message.is_empty() {
                    "no status yet"
                } else {
                    &s.message
                }
            ));
        }
        lines.push(vec![
            name,
            if s.ready.is_empty() {
                "Unknown".into()
            } else {
                s.ready
            },
            or_none(&Some(s.reason).filter(|r| !r.is_empty())),
            or_none(&s.version),
            or_none(&s.node),
            or_none(&s.served_by),
            s.pods.map_or_else(|| "<none>".into(), |p| p.to_string()),
            expires,
            age,
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    for note in notes {
        out.push_str(&format!("\n{note}"));
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// `later - earlier` as kubectl shows ages: `45s`, `12m`, `5h`, `3d`.
fn short_age(later: Timestamp, earlier: Timestamp) -> String {
    let seconds = later.as_second().saturating_sub(earlier.as_second()).max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, status: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "relaylet.io/v1alpha1",
            "kind": "LeafCluster",
            "metadata": { "name": name, "creationTimestamp": "2026-11-29T10:00:00Z" },
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn one_line_per_leaf_and_why_the_others_are_not_ready() {
        let now: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
        let rows = [
            row(
                "relaylet-leaf-a",
                serde_json::json!({
                    "ready": "True", "reason": "LeafReady", "message": "fine", "version": "v1.35.0",
                    "node": "relaylet-a", "servedBy": "relaylet-7d-x", "pods": 4,
                    "credentialExpires": "2026-11-30T12:00:00Z",
                }),
            ),
            row(
                "relaylet-leaf-b",
                serde_json::json!({
                    "ready": "False", "reason": "SecretRefusedExecPlugin",
                    "message": "exec is not allowed in a leaf Secret",
                }),
            ),
        ];
        let text = table(&rows, now);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[0][..3], ["NAME", "READY", "REASON"]);
        assert_eq!(
            lines[1],
            [
                "relaylet-leaf-a",
                "True",
                "LeafReady",
                "v1.35.0",
                "relaylet-a",
                "relaylet-7d-x",
                "4",
                "in",
                "24h",
                "2h"
            ]
        );
        assert_eq!(
            lines[2],
            [
                "relaylet-leaf-b",
                "False",
                "SecretRefusedExecPlugin",
                "<none>",
                "<none>",
                "<none>",
                "<none>",
                "<none>",
                "2h"
            ]
        );
        assert!(
            text.contains("\nrelaylet-leaf-b: exec is not allowed in a leaf Secret\n"),
            "{text}"
        );
        assert!(!text.contains("relaylet-leaf-a: fine"));
    }

    #[test]
    fn ages_as_kubectl_shows_them() {
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let base = t("2026-01-01T00:00:00Z");
        for (later, shown) in [
            ("2026-01-01T00:00:45Z", "45s"),
            ("2026-01-01T00:30:00Z", "30m"),
            ("2026-01-01T05:00:00Z", "5h"),
            ("2026-01-04T00:00:00Z", "3d"),
        ] {
            assert_eq!(short_age(t(later), base), shown);
        }
    }
}

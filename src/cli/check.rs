//! `relaylet check`: whether an install works, as the chart's `helm test` hook asks it (the image
//! has no shell, so the hook runs relaylet itself). From the root cluster (in-cluster, with
//! relaylet's own ServiceAccount, or `KUBECONFIG`), one line per check on stdout:
//! - relaylet's pods (`--selector` in `--namespace`) are Ready: their readiness probe asks
//!   `/readyz`, so the pod's Ready condition is the honest signal (and needs no way through the
//!   NetworkPolicy). At least one must be;
//! - every leaf Secret (`--leaf-label` in `--leaf-namespace`) has its virtual Node, this
//!   install's, naming that leaf, and Ready; the node name is what relaylet itself derives
//!   ([`secret_names`]). When it is not, the Secret's `LeafCluster` row (`model::leaf_row`,
//!   which lasts, unlike the refusal's Event) says why: a refusal's reason and message are
//!   printed.
//!
//! It waits up to `--timeout` for every check to pass, then exits 0 only if none failed.
//! [`judge`] is the whole decision, from what was read, with no I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use super::output::Output;
use super::rows;
use crate::config::{DEFAULT_LEAF_SECRET_LABEL, parse_duration};
use crate::leaf::secret_names;
use crate::model::leaf_row::LeafStatus;
use crate::model::node_ownership::{LEAF_LABEL, MANAGED_BY_LABEL, OWNER_LABEL, ownership};
use crate::model::quote::quote;

pub const USAGE: &str = "usage: relaylet check --selector <label selector> [--namespace <ns>] [--leaf-namespace <ns>]
                      [--leaf-label <key>] [--node-name-prefix <prefix>] [--timeout <duration>]

  Checks an install from the root cluster (in-cluster, or KUBECONFIG): relaylet's pods are Ready,
  and every leaf Secret has its virtual Node, Ready (or the reason relaylet refused the Secret).
  One line per check; exit 0 only if all pass. The chart's `helm test` hook runs it with its values.

  --selector          the labels of relaylet's pods (the chart's: app.kubernetes.io/name=...,app.kubernetes.io/instance=...)
  --namespace         relaylet's namespace (default: the client's namespace); its Nodes' owner
  --leaf-namespace    where the leaf Secrets are (default: --namespace)
  --leaf-label        the label of leaf Secrets (LEAF_SECRET_LABEL; default relaylet.io/leaf-cluster)
  --node-name-prefix  NODE_NAME_PREFIX (default relaylet-)
  --timeout           how long to wait for every check to pass (default 120s)";

/// How often the checks are read again while one has not passed.
const ROUND: Duration = Duration::from_secs(2);

/// What to check, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub namespace: Option<String>,
    pub selector: String,
    pub leaf_namespace: Option<String>,
    pub leaf_label: String,
    pub node_name_prefix: String,
    pub timeout: Duration,
}

impl Args {
    /// `args` after `check`; an error is a sentence with the usage.
    pub fn parse(args: &[String]) -> Result<Args, String> {
        let mut namespace = None;
        let mut selector = None;
        let mut leaf_namespace = None;
        let mut leaf_label = DEFAULT_LEAF_SECRET_LABEL.to_string();
        let mut node_name_prefix = "relaylet-".to_string();
        let mut timeout = Duration::from_secs(120);
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) => (flag, Some(value.to_string())),
                None => (arg.as_str(), None),
            };
            if matches!(flag, "-h" | "--help") {
                return Err(USAGE.to_string());
            }
            let value = match inline.or_else(|| rest.next().cloned()) {
                Some(value) => value,
                None => return Err(format!("{flag} needs a value\n{USAGE}")),
            };
            match flag {
                "--namespace" | "-n" => namespace = Some(value),
                "--selector" | "-l" => selector = Some(value),
                "--leaf-namespace" => leaf_namespace = Some(value),
                "--leaf-label" => leaf_label = value,
                "--node-name-prefix" => node_name_prefix = value,
                "--timeout" => {
                    timeout = parse_duration(&value).map_err(|e| format!("--timeout: {e}"))?;
                }
                other => return Err(format!("unknown flag {other:?}\n{USAGE}")),
            }
        }
        let selector = match selector {
            Some(s) if !s.trim().is_empty() => s,
            _ => return Err(format!("--selector is required\n{USAGE}")),
        };
        Ok(Args {
            namespace: namespace.filter(|n| !n.is_empty()),
            selector,
            leaf_namespace: leaf_namespace.filter(|n| !n.is_empty()),
            leaf_label,
            node_name_prefix,
            timeout,
        })
    }
}

/// Where the checks look, the namespaces resolved.
#[derive(Debug, Clone)]
pub struct Scope {
    pub namespace: String,
    pub selector: String,
    pub leaf_namespace: String,
    pub leaf_label: String,
    pub node_name_prefix: String,
}

/// What one round read from the root; a read that failed is its error's text.
#[derive(Debug, Clone)]
pub struct Observed {
    pub pods: Result<Vec<Pod>, String>,
    /// The leaf Secrets' metadata (their kubeconfigs are never read).
    pub secrets: Result<Vec<ObjectMeta>, String>,
    pub nodes: Result<BTreeMap<String, Node>, String>,
    /// This install's `LeafCluster` rows in the leaf namespace, by name (the Secret's).
    pub rows: Result<BTreeMap<String, LeafStatus>, String>,
}

/// How one check stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Passed,
    /// Passes, but more is expected soon (some of relaylet's pods not Ready yet): waited for.
    Partly,
    Failed,
}

/// One check's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub status: Status,
    pub text: String,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let word = match self.status {
            Status::Passed | Status::Partly => "ok  ",
            Status::Failed => "FAIL",
        };
        write!(f, "{word} {}", self.text)
    }
}

/// Every check's line, from what was read.
pub fn judge(scope: &Scope, seen: &Observed) -> Vec<Line> {
    let mut lines = vec![pods_line(scope, &seen.pods)];
    let secrets = match &seen.secrets {
        Ok(secrets) => secrets,
        Err(err) => {
            lines.push(failed(format!(
                "leaf Secrets: listing those labelled {} in namespace {}: {err}",
                scope.leaf_label, scope.leaf_namespace
            )));
            return lines;
        }
    };
    if secrets.is_empty() {
        lines.push(passed(format!(
            "leaf Secrets: none labelled {} in namespace {}, so no virtual Node to check",
            scope.leaf_label, scope.leaf_namespace
        )));
        return lines;
    }
    let mut secrets: Vec<&ObjectMeta> = secrets.iter().collect();
    secrets.sort_by(|a, b| a.name.cmp(&b.name));
    for secret in secrets {
        lines.push(leaf_line(scope, seen, secret));
    }
    if let Err(err) = &seen.rows {
        lines.push(passed(format!(
            "(the LeafCluster rows that say why a leaf has no Node could not be read: {err})"
        )));
    }
    lines
}

/// Whether every check passed fully (nothing left to wait for).
pub fn settled(lines: &[Line]) -> bool {
    lines.iter().all(|l| l.status == Status::Passed)
}

/// Whether no check failed.
pub fn passed_all(lines: &[Line]) -> bool {
    lines.iter().all(|l| l.status != Status::Failed)
}

fn passed(text: String) -> Line {
    Line {
        status: Status::Passed,
        text,
    }
}

fn failed(text: String) -> Line {
    Line {
        status: Status::Failed,
        text,
    }
}

fn pods_line(scope: &Scope, pods: &Result<Vec<Pod>, String>) -> Line {
    let pods = match pods {
        Ok(pods) => pods,
        Err(err) => {
            return failed(format!(
                "relaylet pods: listing {} in namespace {}: {err}",
                scope.selector, scope.namespace
            ));
        }
    };
    if pods.is_empty() {
        return failed(format!(
            "relaylet pods: none match {} in namespace {}",
            scope.selector, scope.namespace
        ));
    }
    let not_ready: Vec<String> = pods
        .iter()
        .filter(|p| !condition_true(pod_conditions(p), "Ready"))
        .map(|p| {
            let name = p.metadata.name.as_deref().unwrap_or("?");
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Unknown");
            format!("{name} ({phase})")
        })
        .collect();
    let ready = pods.len() - not_ready.len();
    let mut text = format!(
        "relaylet pods: {ready} of {} Ready ({} in namespace {})",
        pods.len(),
        scope.selector,
        scope.namespace
    );
    if !not_ready.is_empty() {
        text.push_str(&format!("; not Ready: {}", not_ready.join(", ")));
    }
    let status = match ready {
        0 => Status::Failed,
        n if n == pods.len() => Status::Passed,
        _ => Status::Partly,
    };
    Line { status, text }
}

fn pod_conditions(pod: &Pod) -> impl Iterator<Item = (&str, &str)> {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .map(|c| (c.type_.as_str(), c.status.as_str()))
}

fn condition_true<'a>(
    mut conditions: impl Iterator<Item = (&'a str, &'a str)>,
    kind: &str,
) -> bool {
    conditions.any(|(t, s)| t == kind && s == "True")
}

/// One leaf Secret's line: its Node Ready, or why not.
fn leaf_line(scope: &Scope, seen: &Observed, secret: &ObjectMeta) -> Line {
    let secret_name = secret.name.as_deref().unwrap_or("?");
    let (leaf, node_name) = match secret_names(secret, &scope.leaf_label, &scope.node_name_prefix) {
        Ok(names) => names,
        Err(refusal) => {
            return failed(format!(
                "leaf Secret {secret_name}: refused by relaylet's rules: {refusal}"
            ));
        }
    };
    let about = format!("leaf {leaf} (Secret {secret_name}, Node {node_name})");
    let row = seen
        .rows
        .as_ref()
        .ok()
        .and_then(|rows| rows.get(secret_name));
    let refusal = row.and_then(|row| Refusal::of(row, secret));
    let nodes = match &seen.nodes {
        Ok(nodes) => nodes,
        Err(err) => return failed(format!("{about}: listing Nodes: {err}")),
    };
    let Some(node) = nodes.get(&node_name) else {
        return failed(match (&refusal, row) {
            (Some(r), _) => format!(
                "{about}: no Node; relaylet refused the Secret: {}",
                r.said()
            ),
            (None, Some(row)) => format!(
                "{about}: no Node yet; its LeafCluster row says {}: {}",
                row.reason, row.message
            ),
            (None, None) => format!(
                "{about}: no Node, and no LeafCluster row for the Secret (is relaylet watching {} with label {}?)",
                scope.leaf_namespace, scope.leaf_label
            ),
        });
    };
    let why_refused = |text: String| match &refusal {
        Some(r) => format!("{text}; relaylet refused the Secret: {}", r.said()),
        None => text,
    };
    let owner = ownership(node, &scope.namespace);
    if !owner.writable() {
        return failed(why_refused(format!(
            "{about}: the Node belongs to {owner}, not to the install in namespace {}",
            scope.namespace
        )));
    }
    let node_leaf = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LEAF_LABEL))
        .map(String::as_str);
    if node_leaf != Some(leaf.as_str()) {
        return failed(why_refused(format!(
            "{about}: the Node is leaf {:?}'s",
            node_leaf.unwrap_or("-")
        )));
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => match refusal {
            // This very version of the Secret refused: the Node goes on from an earlier
            // version, or is another Secret's that kept the names.
            Some(r) if r.current => failed(format!(
                "{about}: the Node is Ready but relaylet refused this Secret: {}",
                r.said()
            )),
            _ => passed(format!("{about}: Ready")),
        },
        Some(c) => {
            let reason = c.reason.as_deref().unwrap_or("no reason given");
            let message = c.message.as_deref().map(quote).unwrap_or_default();
            failed(why_refused(format!(
                "{about}: not Ready ({}): {reason}: {message}",
                c.status
            )))
        }
        None => failed(why_refused(format!("{about}: no Ready condition yet"))),
    }
}

/// A refusal a Secret's row tells of.
struct Refusal {
    /// The row's reason and message.
    said: String,
    /// About the Secret as it is now (its resourceVersion), not an earlier version of it.
    current: bool,
}

impl Refusal {
    fn of(row: &LeafStatus, secret: &ObjectMeta) -> Option<Refusal> {
        row.refused().then(|| Refusal {
            said: format!("{}: {}", row.reason, row.message),
            current: row.secret_resource_version.is_some()
                && row.secret_resource_version == secret.resource_version,
        })
    }

    fn said(&self) -> String {
        if self.current {
            self.said.clone()
        } else {
            format!("{} (about an earlier version of the Secret)", self.said)
        }
    }
}

/// `relaylet check ARGS`: prints the lines; an error when a check failed (or none could run).
pub async fn check(args: &[String]) -> anyhow::Result<()> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    let args = Args::parse(args).map_err(anyhow::Error::msg)?;
    let root = crate::kube_client::root().await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| root.default_namespace().to_string());
    let scope = Scope {
        leaf_namespace: args
            .leaf_namespace
            .clone()
            .unwrap_or_else(|| namespace.clone()),
        namespace,
        selector: args.selector.clone(),
        leaf_label: args.leaf_label.clone(),
        node_name_prefix: args.node_name_prefix.clone(),
    };
    let mut out = Output::stderr();
    let mut last = String::new();
    let deadline = tokio::time::Instant::now() + args.timeout;
    let lines = loop {
        let seen = observe(&root, &scope).await;
        let lines = judge(&scope, &seen);
        if settled(&lines) || tokio::time::Instant::now() + ROUND > deadline {
            break lines;
        }
        // Without a countdown: off a terminal, a line is printed only when what is waited for
        // changes.
        if let Some(waiting) = lines.iter().find(|l| l.status != Status::Passed) {
            out.waiting(
                &format!(
                    "waiting (up to {} s) for: {}",
                    args.timeout.as_secs(),
                    waiting.text
                ),
                &mut last,
            );
        }
        tokio::time::sleep(ROUND).await;
    };
    if !last.is_empty() {
        out.done("done waiting; where it stands:");
    }
    for line in &lines {
        println!("{line}");
    }
    if passed_all(&lines) {
        println!("relaylet check: all {} checks passed", lines.len());
        Ok(())
    } else {
        let failed = lines.iter().filter(|l| l.status == Status::Failed).count();
        anyhow::bail!(
            "check: {failed} of {} checks failed (after waiting up to {} s)",
            lines.len(),
            args.timeout.as_secs()
        )
    }
}

/// One round's reads from the root.
async fn observe(root: &Client, scope: &Scope) -> Observed {
    let pods: Api<Pod> = Api::namespaced(root.clone(), &scope.namespace);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(root.clone(), &scope.leaf_namespace);
    let nodes: Api<Node> = Api::all(root.clone());
    let rows = rows::api(root, &scope.leaf_namespace);
    let text = |e: kube::Error| e.to_string();
    // relaylet's Nodes only: a Secret naming another's Node is refused, and its row says so.
    let managed_by = format!("{}={}", MANAGED_BY_LABEL.0, MANAGED_BY_LABEL.1);
    let (by_selector, by_leaf_label, by_owner, by_install) = (
        ListParams::default().labels(&scope.selector),
        ListParams::default().labels(&scope.leaf_label),
        ListParams::default().labels(&managed_by),
        ListParams::default().labels(&format!("{OWNER_LABEL}={}", scope.namespace)),
    );
    let (pods, secrets, nodes, rows) = tokio::join!(
        pods.list(&by_selector),
        secrets.list_metadata(&by_leaf_label),
        nodes.list(&by_owner),
        rows.list(&by_install),
    );
    Observed {
        pods: pods.map(|l| l.items).map_err(text),
        secrets: secrets
            .map(|l| l.items.into_iter().map(|m| m.metadata).collect())
            .map_err(text),
        nodes: nodes
            .map(|l| {
                l.items
                    .into_iter()
                    .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
                    .collect()
            })
            .map_err(text),
        rows: rows
            .map(|l| {
                l.items
                    .iter()
                    .filter_map(|row| Some((row.name_any(), rows::status(row)?)))
                    .collect()
            })
            .map_err(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope() -> Scope {
        Scope {
            namespace: "relaylet".into(),
            selector: "app.kubernetes.io/name=relaylet,app.kubernetes.io/instance=relaylet".into(),
            leaf_namespace: "relaylet".into(),
            leaf_label: DEFAULT_LEAF_SECRET_LABEL.into(),
            node_name_prefix: "relaylet-".into(),
        }
    }

    fn pod(name: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "relaylet"},
            "status": {
                "phase": if ready { "Running" } else { "Pending" },
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        }))
        .expect("a pod")
    }

    fn secret(name: &str, leaf: &str, annotations: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(json!({
            "name": name, "namespace": "relaylet", "uid": format!("uid-{name}"),
            "resourceVersion": "7",
            "labels": {DEFAULT_LEAF_SECRET_LABEL: leaf},
            "annotations": annotations,
        }))
        .expect("a Secret's metadata")
    }

    /// A Node of relaylet's for `leaf`, owned by `owner`, Ready `ready` since 12:00.
    fn node(name: &str, leaf: &str, owner: &str, ready: &str) -> (String, Node) {
        let node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                LEAF_LABEL: leaf, "relaylet.io/owner": owner,
                "app.kubernetes.io/managed-by": "relaylet",
            }},
            "status": {"conditions": [{
                "type": "Ready", "status": ready,
                "reason": if ready == "True" { "LeafReachable" } else { "LeafUnreachable" },
                "message": "dial tcp 10.9.9.9:6443: connect: connection refused\nsecond line",
                "lastTransitionTime": "2026-11-29T12:00:00Z",
            }]},
        }))
        .expect("a Node");
        (name.to_string(), node)
    }

    /// A row as relaylet writes it: `reason` and `message` about the Secret's version
    /// `resource_version`.
    fn row(
        secret: &str,
        resource_version: &str,
        reason: &str,
        message: &str,
    ) -> (String, LeafStatus) {
        let status = LeafStatus {
            ready: if reason == "LeafReady" {
                "True"
            } else {
                "False"
            }
            .into(),
            reason: reason.into(),
            message: message.into(),
            secret_resource_version: Some(resource_version.into()),
            ..LeafStatus::default()
        };
        (secret.to_string(), status)
    }

    struct Case {
        name: &'static str,
        pods: Vec<Pod>,
        secrets: Vec<ObjectMeta>,
        nodes: Vec<(String, Node)>,
        rows: Vec<(String, LeafStatus)>,
        /// Each line's start, in order.
        lines: Vec<&'static str>,
        settled: bool,
        passed: bool,
    }

    #[test]
    fn lines_and_verdict_from_what_was_read() {
        let ready_pods = || vec![pod("relaylet-a", true), pod("relaylet-b", true)];
        let leaf_1 = || secret("relaylet-leaf-leaf-1", "leaf-1", json!({}));
        let cases = vec![
            Case {
                name: "a fresh install: pods Ready, no leaf yet",
                pods: ready_pods(),
                secrets: vec![],
                nodes: vec![],
                rows: vec![],
                lines: vec![
                    "ok   relaylet pods: 2 of 2 Ready (app.kubernetes.io/name=relaylet,app.kubernetes.io/instance=relaylet in namespace relaylet)",
                    "ok   leaf Secrets: none labelled relaylet.io/leaf-cluster in namespace relaylet",
                ],
                settled: true,
                passed: true,
            },
            Case {
                name: "every leaf's Node Ready",
                pods: ready_pods(),
                secrets: vec![
                    leaf_1(),
                    secret(
                        "leaf-two",
                        "leaf-2",
                        json!({"relaylet.io/node-name": "relaylet-second"}),
                    ),
                ],
                nodes: vec![
                    node("relaylet-leaf-1", "leaf-1", "relaylet", "True"),
                    node("relaylet-second", "leaf-2", "relaylet", "True"),
                ],
                rows: vec![],
                lines: vec![
                    "ok   relaylet pods: 2 of 2",
                    "ok   leaf leaf-2 (Secret leaf-two, Node relaylet-second): Ready",
                    "ok   leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): Ready",
                ],
                settled: true,
                passed: true,
            },
            Case {
                name: "one pod of two not Ready: passes, but is waited for",
                pods: vec![pod("relaylet-a", true), pod("relaylet-b", false)],
                secrets: vec![],
                nodes: vec![],
                rows: vec![],
                lines: vec![
                    "ok   relaylet pods: 1 of 2 Ready (app.kubernetes.io/name=relaylet,app.kubernetes.io/instance=relaylet in namespace relaylet); not Ready: relaylet-b (Pending)",
                    "ok   leaf Secrets: none",
                ],
                settled: false,
                passed: true,
            },
            Case {
                name: "no pod Ready, or none at all",
                pods: vec![pod("relaylet-a", false)],
                secrets: vec![],
                nodes: vec![],
                rows: vec![],
                lines: vec![
                    "FAIL relaylet pods: 0 of 1 Ready",
                    "ok   leaf Secrets: none",
                ],
                settled: false,
                passed: false,
            },
            Case {
                name: "a leaf's Node NotReady: its condition, the leaf's text quoted on one line",
                pods: ready_pods(),
                secrets: vec![leaf_1()],
                nodes: vec![node("relaylet-leaf-1", "leaf-1", "relaylet", "False")],
                rows: vec![],
                lines: vec![
                    "ok   relaylet pods",
                    "FAIL leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): not Ready (False): LeafUnreachable: dial tcp 10.9.9.9:6443: connect: connection refused",
                ],
                settled: false,
                passed: false,
            },
            Case {
                name: "a refused Secret: no Node, the row's reason and message",
                pods: ready_pods(),
                secrets: vec![leaf_1()],
                nodes: vec![],
                rows: vec![row(
                    "relaylet-leaf-leaf-1",
                    "7",
                    "SecretRefusedExecPlugin",
                    "kubeconfig: user \"u\" has an exec plugin",
                )],
                lines: vec![
                    "ok   relaylet pods",
                    "FAIL leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): no Node; relaylet refused the Secret: SecretRefusedExecPlugin: kubeconfig: user \"u\" has an exec plugin",
                ],
                settled: false,
                passed: false,
            },
            Case {
                name: "a refusal of an earlier version is said so",
                pods: ready_pods(),
                secrets: vec![leaf_1()],
                nodes: vec![],
                rows: vec![row(
                    "relaylet-leaf-leaf-1",
                    "3",
                    "SecretRefusedKubeconfig",
                    "no \"kubeconfig\" key",
                )],
                lines: vec![
                    "ok   relaylet pods",
                    "FAIL leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): no Node; relaylet refused the Secret: SecretRefusedKubeconfig: no \"kubeconfig\" key (about an earlier version of the Secret)",
                ],
                settled: false,
                passed: false,
            },
            Case {
                name: "no Node and no row: not seen yet",
                pods: ready_pods(),
                secrets: vec![leaf_1()],
                nodes: vec![],
                rows: vec![],
                lines: vec![
                    "ok   relaylet pods",
                    "FAIL leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): no Node, and no LeafCluster row for the Secret (is relaylet watching relaylet with label relaylet.io/leaf-cluster?)",
                ],
                settled: false,
                passed: false,
            },
            Case {
                name: "no Node, a row not refused: what it says",
                pods: ready_pods(),
                secrets: vec![leaf_1()],
                nodes: vec![],
                rows: vec![row(
                    "relaylet-leaf-leaf-1",
                    "7",
                    "Registered",
                    "no replica serves its Node yet",
                )],
                lines: vec![
                    "ok   relaylet pods",
                    "FAIL leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): no Node yet; its LeafCluster row says Registered: no replica serves its Node yet",
                ],
                settled: false,
                passed: false,
            },
            Case {
                name: "a NotReady Node and a refused newer version: both said",
                pods: ready_pods(),
                secrets: vec![leaf_1()],
                nodes: vec![node("relaylet-leaf-1", "leaf-1", "relaylet", "False")],
                rows: vec![row(
                    "relaylet-leaf-leaf-1",
                    "7",
                    "SecretRefusedProxy",
                    "the Secret's latest version was refused (the Node goes on from the earlier one): proxy-url: not https",
                )],
                lines: vec![
                    "ok   relaylet pods",
                    "FAIL leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): not Ready (False): LeafUnreachable: dial tcp 10.9.9.9:6443: connect: connection refused second line; relaylet refused the Secret: SecretRefusedProxy: the Secret's latest version was refused",
                ],
                settled: false,
                passed: false,
            },
            Case {
                name: "a Ready Node whose names an older Secret kept: this one is refused",
                pods: ready_pods(),
                secrets: vec![leaf_1()],
                nodes: vec![node("relaylet-leaf-1", "leaf-1", "relaylet", "True")],
                rows: vec![row(
                    "relaylet-leaf-leaf-1",
                    "7",
                    "SecretRefusedLeafNameTaken",
                    "leaf name \"leaf-1\" is already used by leaf Secret old",
                )],
                lines: vec![
                    "ok   relaylet pods",
                    "FAIL leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): the Node is Ready but relaylet refused this Secret: SecretRefusedLeafNameTaken: leaf name",
                ],
                settled: false,
                passed: false,
            },
            Case {
                name: "a refusal of an earlier version, the Node Ready: the row not rewritten yet",
                pods: ready_pods(),
                secrets: vec![leaf_1()],
                nodes: vec![node("relaylet-leaf-1", "leaf-1", "relaylet", "True")],
                rows: vec![row(
                    "relaylet-leaf-leaf-1",
                    "3",
                    "SecretRefusedKubeconfig",
                    "no \"kubeconfig\" key",
                )],
                lines: vec![
                    "ok   relaylet pods",
                    "ok   leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): Ready",
                ],
                settled: true,
                passed: true,
            },
            Case {
                name: "another install's Node, another leaf's Node",
                pods: ready_pods(),
                secrets: vec![leaf_1(), secret("b", "leaf-b", json!({}))],
                nodes: vec![
                    node("relaylet-leaf-1", "leaf-1", "other-ns", "True"),
                    node("relaylet-leaf-b", "leaf-x", "relaylet", "True"),
                ],
                rows: vec![],
                lines: vec![
                    "ok   relaylet pods",
                    "FAIL leaf leaf-b (Secret b, Node relaylet-leaf-b): the Node is leaf \"leaf-x\"'s",
                    "FAIL leaf leaf-1 (Secret relaylet-leaf-leaf-1, Node relaylet-leaf-1): the Node belongs to the relaylet install in namespace other-ns",
                ],
                settled: false,
                passed: false,
            },
            Case {
                name: "names relaylet refuses by its own rules, before any row",
                pods: ready_pods(),
                secrets: vec![
                    secret("bad", "Leaf_1", json!({})),
                    secret(
                        "evil",
                        "e",
                        json!({"relaylet.io/node-name": "kubernetes.default.svc"}),
                    ),
                ],
                nodes: vec![],
                rows: vec![],
                lines: vec![
                    "ok   relaylet pods",
                    "FAIL leaf Secret bad: refused by relaylet's rules: label relaylet.io/leaf-cluster: \"Leaf_1\" must be a DNS label",
                    "FAIL leaf Secret evil: refused by relaylet's rules: annotation relaylet.io/node-name: \"kubernetes.default.svc\" must be NODE_NAME_PREFIX",
                ],
                settled: false,
                passed: false,
            },
        ];
        for case in cases {
            let seen = Observed {
                pods: Ok(case.pods),
                secrets: Ok(case.secrets),
                nodes: Ok(case.nodes.into_iter().collect()),
                rows: Ok(case.rows.into_iter().collect()),
            };
            let lines = judge(&scope(), &seen);
            let shown: Vec<String> = lines.iter().map(ToString::to_string).collect();
            assert_eq!(shown.len(), case.lines.len(), "{}: {shown:#?}", case.name);
            for (line, start) in shown.iter().zip(&case.lines) {
                assert!(
                    line.starts_with(start),
                    "{}: {line:?} should start {start:?}",
                    case.name
                );
                assert!(!line.contains('\n'), "{}: one line: {line:?}", case.name);
            }
            assert_eq!(
                settled(&lines),
                case.settled,
                "{}: settled {shown:#?}",
                case.name
            );
            assert_eq!(
                passed_all(&lines),
                case.passed,
                "{}: passed {shown:#?}",
                case.name
            );
        }
    }

    #[test]
    fn reads_that_fail_are_failed_lines() {
        let seen = Observed {
            pods: Err("pods is forbidden: cannot list".into()),
            secrets: Ok(vec![secret("s", "leaf-1", json!({}))]),
            nodes: Err("nodes is forbidden".into()),
            rows: Err("leafclusters.relaylet.io is forbidden".into()),
        };
        let shown: Vec<String> = judge(&scope(), &seen)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            [
                "FAIL relaylet pods: listing app.kubernetes.io/name=relaylet,app.kubernetes.io/instance=relaylet in namespace relaylet: pods is forbidden: cannot list",
                "FAIL leaf leaf-1 (Secret s, Node relaylet-leaf-1): listing Nodes: nodes is forbidden",
                "ok   (the LeafCluster rows that say why a leaf has no Node could not be read: leafclusters.relaylet.io is forbidden)",
            ]
        );
        let secrets_forbidden = Observed {
            pods: Ok(vec![pod("p", true)]),
            secrets: Err("secrets is forbidden".into()),
            nodes: Ok(BTreeMap::new()),
            rows: Ok(BTreeMap::new()),
        };
        let lines = judge(&scope(), &secrets_forbidden);
        assert!(!passed_all(&lines));
        assert_eq!(
            lines[1].to_string(),
            "FAIL leaf Secrets: listing those labelled relaylet.io/leaf-cluster in namespace relaylet: secrets is forbidden"
        );
    }

    #[test]
    fn arguments() {
        let args = |a: &[&str]| Args::parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let parsed = args(&[
            "--namespace",
            "ops",
            "--selector=app=r",
            "--leaf-label",
            "example.com/leaf",
            "--leaf-namespace=leaves",
            "--node-name-prefix",
            "vk-",
            "--timeout",
            "30s",
        ])
        .expect("parses");
        assert_eq!(
            parsed,
            Args {
                namespace: Some("ops".into()),
                selector: "app=r".into(),
                leaf_namespace: Some("leaves".into()),
                leaf_label: "example.com/leaf".into(),
                node_name_prefix: "vk-".into(),
                timeout: Duration::from_secs(30),
            }
        );
        let defaults = args(&["-l", "app=r"]).expect("parses");
        assert_eq!(defaults.timeout, Duration::from_secs(120));
        assert_eq!(defaults.leaf_label, "relaylet.io/leaf-cluster");
        assert_eq!(defaults.namespace, None);
        for (bad, says) in [
            (&["--namespace", "x"][..], "--selector is required"),
            (&["-l", "a=b", "--timeout", "soon"][..], "--timeout: "),
            (&["-l", "a=b", "--color"][..], "--color needs a value"),
            (
                &["-l", "a=b", "--color", "x"][..],
                "unknown flag \"--color\"",
            ),
        ] {
            let err = args(bad).expect_err("refused");
            assert!(err.starts_with(says), "{bad:?}: {err}");
        }
    }
}

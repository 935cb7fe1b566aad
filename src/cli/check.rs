//! `relaylet check`: whether an install works, as the chart's `helm test` hook asks it (the image
//! has no shell, so the hook runs relaylet itself). From the root cluster (in-cluster, with
//! relaylet's own ServiceAccount, or `KUBECONFIG`), one line per check on stdout:
//! - relaylet's pods (`--selector` in `--namespace`) are Ready: their readiness probe asks
//!   `/readyz`, so the pod's Ready condition is the honest signal (and needs no way through the
//!   NetworkPolicy). At least one must be;
//! - every leaf Secret (`--leaf-label` in `--leaf-namespace`) has its virtual Node, this
//!   install's, naming that leaf, and Ready; the node name is what relaylet itself derives
//!   ([`secret_names`]). A Secret relaylet refused has a `LeafSecretRefused` Warning Event: its
//!   note is printed.
//!
//! It waits up to `--timeout` for every check to pass, then exits 0 only if none failed.
//! [`judge`] is the whole decision, from what was read, with no I/O.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};

use super::Output;
use crate::config::{DEFAULT_LEAF_SECRET_LABEL, parse_duration};
use crate::leaf::{REFUSAL_EVENT_REASON, secret_names};
use crate::model::node_ownership::{LEAF_LABEL, MANAGED_BY_LABEL, ownership};
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
    /// `LeafSecretRefused` Events in the leaf namespace (none when they cannot be read).
    pub refusals: Result<Vec<Event>, String>,
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
    if let Err(err) = &seen.refusals {
        lines.push(passed(format!(
            "(the Events that say why relaylet refused a Secret could not be read: {err})"
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

fn condition_true<'a>(mut conditions: impl Iterator<Item = (&'a str, &'a str)>, kind: &str) -> bool {
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
    let refusal = latest_refusal(seen, secret);
    let nodes = match &seen.nodes {
        Ok(nodes) => nodes,
        Err(err) => return failed(format!("{about}: listing Nodes: {err}")),
    };
    let Some(node) = nodes.get(&node_name) else {
        return failed(match refusal {
            Some(r) => format!("{about}: no Node; relaylet refused the Secret: {}", r.said()),
            None => format!(
                "{about}: no Node, and no refusal Event on the Secret (is relaylet watching {} with label {}?)",
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
        Some(c) if c.status == "True" => {
            // A refusal of this very version of the Secret after the Node turned Ready: the
            // Node is another Secret's (an older one kept the names).
            let since = c.last_transition_time.as_ref().map(|t| t.0);
            match refusal {
                Some(r) if r.current && since.is_none_or(|since| r.at > since) => {
                    failed(format!(
                        "{about}: the Node is Ready but relaylet refused this Secret: {}",
                        r.said()
                    ))
                }
                _ => passed(format!("{about}: Ready")),
            }
        }
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

/// The latest `LeafSecretRefused` Event about a Secret.
struct Refusal {
    note: String,
    at: Timestamp,
    /// About the Secret as it is now (its resourceVersion), not an earlier version of it.
    current: bool,
}

impl Refusal {
    fn said(&self) -> String {
        if self.current {
            self.note.clone()
        } else {
            format!("{} (about an earlier version of the Secret)", self.note)
        }
    }
}

fn latest_refusal(seen: &Observed, secret: &ObjectMeta) -> Option<Refusal> {
    let events = seen.refusals.as_ref().ok()?;
    events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(REFUSAL_EVENT_REASON))
        .filter_map(|e| {
            let about = e.regarding.as_ref()?;
            let same = about.kind.as_deref() == Some("Secret")
                && about.name == secret.name
                && (about.uid.is_none() || secret.uid.is_none() || about.uid == secret.uid);
            if !same {
                return None;
            }
            let at = e
                .event_time
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .unwrap_or(Timestamp::UNIX_EPOCH);
            Some(Refusal {
                note: quote(e.note.as_deref().unwrap_or("no note")),
                at,
                current: about.resource_version.is_some()
                    && about.resource_version == secret.resource_version,
            })
        })
        .max_by_key(|r| r.at)
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
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if let Some(waiting) = lines.iter().find(|l| l.status != Status::Passed) {
            out.waiting(
                &format!("waiting (up to {} s more): {}", left.as_secs(), waiting.text),
                &mut last,
            );
        }
        tokio::time::sleep(ROUND).await;
    };
    if !last.is_empty() {
        out.done("done waiting");
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
    let events: Api<Event> = Api::namespaced(root.clone(), &scope.leaf_namespace);
    let text = |e: kube::Error| e.to_string();
    // relaylet's Nodes only: a Secret naming another's Node is refused, and its Event says so.
    let managed_by = format!("{}={}", MANAGED_BY_LABEL.0, MANAGED_BY_LABEL.1);
    let (by_selector, by_leaf_label, by_owner, by_reason) = (
        ListParams::default().labels(&scope.selector),
        ListParams::default().labels(&scope.leaf_label),
        ListParams::default().labels(&managed_by),
        ListParams::default().fields(&format!("reason={REFUSAL_EVENT_REASON}")),
    );
    let (pods, secrets, nodes, refusals) = tokio::join!(
        pods.list(&by_selector),
        secrets.list_metadata(&by_leaf_label),
        nodes.list(&by_owner),
        events.list(&by_reason),
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
        refusals: refusals.map(|l| l.items).map_err(text),
    }
}

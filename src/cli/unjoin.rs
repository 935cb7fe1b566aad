//! `relaylet unjoin`: the way back from `join`. Deletes the leaf Secret in the root, waits
//! for relaylet to delete the leaf's Node and for the pods bound to it to go (deleting those
//! the root's pod garbage collector has not, as it would), then removes from the leaf what
//! relaylet made there (its pod copies, the ConfigMaps, Secrets and tokens copied for them: all
//! carry this install's and this Node's labels) and what `join` applied.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};

use super::args::{Flags, Takes};
use super::contexts::Cluster;
use super::join::{DEFAULT_NAMESPACE, secret_name};
use super::leaf_access;
use super::output::Output;
use super::rows;
use crate::model::node_ownership::OWNER_LABEL;
use crate::pod_sync::NODE_LABEL;

pub const USAGE: &str = "usage: relaylet unjoin --name LEAF [flags]

Removes a leaf: its Secret in the root, then (once relaylet has deleted its Node) the pods
relaylet ran in the leaf and what `relaylet join` applied there.

  --name LEAF              leaf name, as given to join (required)
  --leaf-context CONTEXT   kubeconfig context of the leaf (default: the current context)
  --root-context CONTEXT   kubeconfig context of the root (default: the current context)
  --namespace NS           where relaylet watches leaf Secrets (default: relaylet)
  --node-name NAME         the virtual Node (default: what the leaf's row says, or relaylet-LEAF)
  --keep-leaf-access       leave relaylet's ServiceAccount and RBAC in the leaf
  --timeout D              how long to wait for the Node and its pods (default 2m)";

const TAKES: Takes<'static> = Takes {
    values: &[
        "name",
        "leaf-context",
        "root-context",
        "namespace",
        "node-name",
        "timeout",
    ],
    switches: &["keep-leaf-access"],
};

pub async fn run(args: &[String]) -> anyhow::Result<()> {
    let flags = Flags::parse(args, &TAKES).with_context(|| format!("\n{USAGE}"))?;
    let name = flags.required("name")?;
    let namespace = flags.get("namespace").unwrap_or(DEFAULT_NAMESPACE);
    let timeout = flags.duration("timeout", Duration::from_secs(120))?;
    let mut out = Output::stderr();
    let root = Cluster::of(flags.get("root-context"), "root").await?;
    let leaf = Cluster::of(flags.get("leaf-context"), "leaf").await?;
    let secret = secret_name(name);

    // The Node's name, before the row goes with the Secret.
    let row_node = rows::api(&root.client, namespace)
        .get_opt(&secret)
        .await
        .ok()
        .flatten()
        .as_ref()
        .and_then(rows::status)
        .and_then(|s| s.node);
    let node = flags
        .get("node-name")
        .map(str::to_string)
        .or(row_node)
        .unwrap_or_else(|| format!("relaylet-{name}"));

    let secrets: Api<Secret> = Api::namespaced(root.client.clone(), namespace);
    match secrets.delete(&secret, &DeleteParams::default()).await {
        Ok(_) => out.done(&format!(
            "root ({}): deleted Secret {namespace}/{secret}",
            root.context
        )),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            out.done(&format!(
                "root: no Secret {namespace}/{secret} (already gone)"
            ));
        }
        Err(err) => return Err(err).context(format!("deleting Secret {namespace}/{secret}")),
    }

    let started = Instant::now();
    let nodes: Api<Node> = Api::all(root.client.clone());
    let mut last = String::new();
    while nodes.get_opt(&node).await?.is_some() {
        if started.elapsed() >= timeout {
            anyhow::bail!(
                "Node {node} is still there after {} s: is relaylet running (its leader deletes the Nodes of removed leaves)?",
                timeout.as_secs()
            );
        }
        out.waiting(
            &format!("waiting for relaylet to delete Node {node}"),
            &mut last,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    out.done(&format!("root: Node {node} deleted"));
    let gone = pods_gone(&root.client, &node, started, timeout, &mut out).await?;
    out.done(&format!(
        "root: the pods bound to {node} are gone ({gone} deleted here)"
    ));

    // The copies carry the install's namespace, which is where its leaf Secrets are (unless
    // LEAF_SECRET_NAMESPACE moved them: not a case join makes).
    let removed = clean_leaf(&leaf.client, namespace, &node).await?;
    out.done(&format!(
        "leaf ({}): deleted {removed} object(s) relaylet made for {node}",
        leaf.context
    ));
    if !flags.switch("keep-leaf-access") {
        let deleted = leaf_access::delete(&leaf.client).await?;
        out.done(&format!(
            "leaf: deleted {}",
            if deleted.is_empty() {
                "nothing (none left)".to_string()
            } else {
                deleted.join(", ")
            }
        ));
    }
    out.done(&format!(
        "leaf {name} unjoined in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Waits for the root pods bound to the deleted `node` to go; deletes those still there once
/// the pod garbage collector had its chance (it deletes pods of Nodes that are gone, after
/// 40 s; a root without one never does). How many it deleted.
async fn pods_gone(
    root: &Client,
    node: &str,
    started: Instant,
    timeout: Duration,
    out: &mut Output,
) -> anyhow::Result<usize> {
    let pods: Api<Pod> = Api::all(root.clone());
    let bound = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let gc_grace = Duration::from_secs(60).min(timeout / 2);
    let waited = Instant::now();
    let mut last = String::new();
    let mut deleted = 0;
    loop {
        let left = pods.list_metadata(&bound).await?.items;
        if left.is_empty() {
            return Ok(deleted);
        }
        if started.elapsed() >= timeout {
            anyhow::bail!("{} pod(s) are still bound to {node}", left.len());
        }
        if waited.elapsed() >= gc_grace {
            for pod in &left {
                let ns = pod.namespace().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(root.clone(), &ns);
                match api
                    .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                    .await
                {
                    Ok(_) => deleted += 1,
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(err) => {
                        return Err(err).context(format!("deleting pod {ns}/{}", pod.name_any()));
                    }
                }
            }
        }
        out.waiting(
            &format!(
                "waiting for the {} pod(s) bound to {node} to go",
                left.len()
            ),
            &mut last,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes, in every namespace of the leaf, the pods, ConfigMaps and Secrets relaylet made for
/// `node` (its install's and the node's labels: a tenant's objects never carry both).
async fn clean_leaf(leaf: &Client, owner: &str, node: &str) -> anyhow::Result<usize> {
    let selector =
        ListParams::default().labels(&format!("{OWNER_LABEL}={owner},{NODE_LABEL}={node}"));
    let mut deleted = 0;
    deleted += delete_all::<Pod>(leaf, &selector).await?;
    deleted += delete_all::<ConfigMap>(leaf, &selector).await?;
    deleted += delete_all::<Secret>(leaf, &selector).await?;
    Ok(deleted)
}

async fn delete_all<K>(client: &Client, selector: &ListParams) -> anyhow::Result<usize>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let all: Api<K> = Api::all(client.clone());
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let mut deleted = 0;
    for item in all
        .list_metadata(selector)
        .await
        .with_context(|| format!("listing relaylet's {kind}s in the leaf"))?
        .items
    {
        let api: Api<K> = Api::namespaced(client.clone(), &item.namespace().unwrap_or_default());
        match api.delete(&item.name_any(), &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(err) => return Err(err).context(format!("deleting {kind} {}", item.name_any())),
        }
    }
    Ok(deleted)
}

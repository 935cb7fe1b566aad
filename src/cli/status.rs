//! `relaylet status`: one row per registered leaf, refused ones included, from the leaves'
//! `LeafCluster` rows in the root (what `kubectl get leafclusters -n NS` shows), with why each
//! leaf that is not Ready is not.

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;

use super::args::{Flags, Takes};
use super::contexts::Cluster;
use super::join::DEFAULT_NAMESPACE;
use super::rows;

pub const USAGE: &str = "usage: relaylet status [flags]

One line per leaf registered with the relaylet in the root: READY, REASON, VERSION, NODE,
SERVED-BY, PODS, CREDENTIAL-EXPIRES and AGE; why a leaf is not Ready below.

  --root-context CONTEXT   kubeconfig context of the root (default: the current context)
  --namespace NS           where relaylet watches leaf Secrets (default: relaylet)";

const TAKES: Takes<'static> = Takes {
    values: &["root-context", "namespace"],
    switches: &[],
};

pub async fn run(args: &[String]) -> anyhow::Result<()> {
    let flags = Flags::parse(args, &TAKES).with_context(|| format!("\n{USAGE}"))?;
    let namespace = flags.get("namespace").unwrap_or(DEFAULT_NAMESPACE);
    let root = Cluster::of(flags.get("root-context"), "root").await?;
    let rows = rows::list(&root.client, namespace).await?;
    if rows.is_empty() {
        println!("no leaves registered in namespace {namespace}");
    } else {
        print!("{}", rows::table(&rows, Timestamp::now()));
    }
    Ok(())
}

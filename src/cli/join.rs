//! `relaylet join`: registers a leaf cluster with the relaylet in the root cluster and says how
//! it went. In the leaf (as the user of the leaf context): relaylet's ServiceAccount and RBAC,
//! and a bounded token for it. In the root: the labelled Secret with a kubeconfig holding that
//! token and the leaf's CA (never the user's credentials). Then it waits for the leaf's
//! `LeafCluster` row to speak of that Secret: Ready (exit 0, with the time it took), refused
//! (exit 1 at once, with relaylet's reason), or not Ready by `--timeout` (exit 1, with the last
//! reason: the leaf unreachable from relaylet's pods, RBAC missing, ...).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};

use super::args::{Flags, Takes};
use super::contexts::Cluster;
use super::leaf_access::{self, Access, LeafKubeconfig};
use super::output::Output;
use super::rows;
use crate::config::DEFAULT_LEAF_SECRET_LABEL;
use crate::leaf::{
    KUBECONFIG_KEY, NODE_NAME_ANNOTATION, PROXY_CA_KEY, PROXY_CLIENT_CERT_KEY, PROXY_CLIENT_KEY_KEY,
};
use crate::model::leaf_row::LeafStatus;
use crate::model::names::check_dns_label;
use crate::model::node_overrides::{NODE_LABELS_ANNOTATION, NODE_TAINTS_ANNOTATION};

pub const USAGE: &str = "usage: relaylet join --name LEAF [flags]

Registers a leaf cluster: relaylet's ServiceAccount and RBAC in the leaf (a deploy/leaf-rbac*.yaml,
built in), a token for it, the leaf Secret in the root; then waits for the leaf's Node.

  --name LEAF              leaf name, a DNS label (the Secret is relaylet-leaf-LEAF) (required)
  --leaf-context CONTEXT   kubeconfig context of the leaf (default: the current context)
  --root-context CONTEXT   kubeconfig context of the root (default: the current context)
  --namespace NS           where relaylet watches leaf Secrets (default: relaylet)
  --leaf-server URL        the leaf apiserver as relaylet's pods reach it (default: the context's)
  --access KIND            what relaylet may do in the leaf: full (default: streams to every pod,
                           pods run in any namespace; deploy/leaf-rbac.yaml), namespaced (streams
                           and pods only in --access-namespaces, which must exist;
                           deploy/leaf-rbac-namespaced.yaml) or exec-only (the relay alone, for an
                           install whose pods another syncer runs; deploy/leaf-rbac-exec-only.yaml).
                           What another kind granted beyond it is removed
  --access-namespaces NS,...  the leaf namespaces of --access namespaced
  --proxy-url URL          reach the leaf through this proxy (http://, https://, socks5://)
  --proxy-ca FILE          PEM CA that verifies an https:// proxy
  --proxy-client-cert FILE, --proxy-client-key FILE
                           PEM client certificate and key for an https:// proxy
  --node-name NAME         the virtual Node's name (default: relaylet's prefix and LEAF)
  --node-labels K=V,...    extra labels of the virtual Node
  --node-taints SPEC       taints replacing the default one (key[=value]:Effect,...)
  --token-duration D       how long the leaf token lasts (default 168h; relaylet renews it at
                           LEAF_CREDENTIAL_RENEW_AT; the leaf may cap it)
  --timeout D              how long to wait for the Node (default 2m)
  --no-wait                register and exit

Uses the kubeconfig in $KUBECONFIG (or ~/.kube/config). Exit 0: the Node is Ready.";

const TAKES: Takes<'static> = Takes {
    values: &[
        "name",
        "leaf-context",
        "root-context",
        "namespace",
        "leaf-server",
        "access",
        "access-namespaces",
        "proxy-url",
        "proxy-ca",
        "proxy-client-cert",
        "proxy-client-key",
        "node-name",
        "node-labels",
        "node-taints",
        "token-duration",
        "timeout",
    ],
    switches: &["no-wait"],
};

/// The default namespace of relaylet's leaf Secrets (the chart's release namespace in the
/// README's install).
pub const DEFAULT_NAMESPACE: &str = "relaylet";
/// Field manager of the Secret `join` writes.
const MANAGER: &str = "relaylet-join";

/// The root Secret of leaf `name`.
pub fn secret_name(name: &str) -> String {
    format!("relaylet-leaf-{name}")
}

pub async fn run(args: &[String]) -> anyhow::Result<()> {
    let flags = Flags::parse(args, &TAKES).with_context(|| format!("\n{USAGE}"))?;
    let name = flags.required("name")?;
    check_dns_label(name).map_err(|m| anyhow::anyhow!("--name {name:?}: {m}"))?;
    let namespace = flags.get("namespace").unwrap_or(DEFAULT_NAMESPACE);
    let token_duration = flags.duration("token-duration", Duration::from_secs(168 * 3600))?;
    let timeout = flags.duration("timeout", Duration::from_secs(120))?;
    let proxy_files = proxy_files(&flags)?;
    let access = Access::parse(flags.get("access"), flags.get("access-namespaces"))?;
    let mut out = Output::stderr();
    let leaf = Cluster::of(flags.get("leaf-context"), "leaf").await?;
    let root = Cluster::of(flags.get("root-context"), "root").await?;

    let (applied, removed) = leaf_access::apply(&leaf.client, &access).await?;
    out.done(&format!(
        "leaf ({}): applied {}",
        leaf.context,
        applied.join(", ")
    ));
    if !removed.is_empty() {
        out.done(&format!(
            "leaf: removed what the access asked for does not grant: {}",
            removed.join(", ")
        ));
    }
    let (token, expires) = leaf_access::token(&leaf.client, token_duration).await?;
    out.done(&format!(
        "leaf: a token for {}/{} that expires at {expires}",
        leaf_access::NAMESPACE,
        leaf_access::SERVICE_ACCOUNT
    ));
    let server = flags
        .get("leaf-server")
        .map_or_else(|| leaf.server(), str::to_string);
    if is_loopback(&server) {
        out.done(&format!(
            "warning: {server} is a loopback address; relaylet's pods cannot reach it (pass --leaf-server)"
        ));
    }
    let ca = leaf.ca_pem();
    let kubeconfig = LeafKubeconfig {
        name,
        server: &server,
        ca_pem: ca.as_deref(),
        proxy_url: flags.get("proxy-url"),
        token: &token,
    }
    .render();

    let secret_name = secret_name(name);
    let secret = secret_body(&flags, name, namespace, kubeconfig, proxy_files);
    let secrets: Api<Secret> = Api::namespaced(root.client.clone(), namespace);
    let written = secrets
        .patch(
            &secret_name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .with_context(|| {
            format!(
                "root ({}): writing Secret {namespace}/{secret_name}",
                root.context
            )
        })?;
    let version = written.metadata.resource_version.unwrap_or_default();
    out.done(&format!(
        "root ({}): wrote Secret {namespace}/{secret_name}",
        root.context
    ));
    if flags.switch("no-wait") {
        return Ok(());
    }
    wait(&root, namespace, &secret_name, &version, timeout, &mut out).await
}

/// The Secret's keys beside the kubeconfig: an `https://` proxy's CA and client certificate,
/// read from the files the flags name.
fn proxy_files(flags: &Flags) -> anyhow::Result<Vec<(&'static str, String)>> {
    let proxy = flags.get("proxy-url").unwrap_or_default();
    if !proxy.is_empty()
        && !["http://", "https://", "socks5://"]
            .iter()
            .any(|s| proxy.starts_with(s))
    {
        anyhow::bail!("--proxy-url must start with http://, https:// or socks5://");
    }
    let mut out = Vec::new();
    for (flag, key) in [
        ("proxy-ca", PROXY_CA_KEY),
        ("proxy-client-cert", PROXY_CLIENT_CERT_KEY),
        ("proxy-client-key", PROXY_CLIENT_KEY_KEY),
    ] {
        if let Some(path) = flags.get(flag) {
            if !proxy.starts_with("https://") {
                anyhow::bail!("--{flag} is for an https:// --proxy-url");
            }
            let pem = std::fs::read_to_string(path).with_context(|| format!("--{flag} {path}"))?;
            out.push((key, pem));
        }
    }
    if proxy.starts_with("https://") && !out.iter().any(|(k, _)| *k == PROXY_CA_KEY) {
        anyhow::bail!("an https:// --proxy-url needs --proxy-ca");
    }
    let has = |key| out.iter().any(|(k, _)| *k == key);
    if has(PROXY_CLIENT_CERT_KEY) != has(PROXY_CLIENT_KEY_KEY) {
        anyhow::bail!("--proxy-client-cert and --proxy-client-key go together");
    }
    Ok(out)
}

/// The leaf Secret, as relaylet reads it: labelled with the leaf name, the Node's annotations
/// from the flags, the kubeconfig and the proxy's files.
fn secret_body(
    flags: &Flags,
    name: &str,
    namespace: &str,
    kubeconfig: String,
    proxy_files: Vec<(&'static str, String)>,
) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    for (flag, key) in [
        ("node-name", NODE_NAME_ANNOTATION),
        ("node-labels", NODE_LABELS_ANNOTATION),
        ("node-taints", NODE_TAINTS_ANNOTATION),
    ] {
        if let Some(value) = flags.get(flag) {
            annotations.insert(key.to_string(), value.into());
        }
    }
    let mut data = serde_json::Map::new();
    data.insert(KUBECONFIG_KEY.to_string(), kubeconfig.into());
    for (key, pem) in proxy_files {
        data.insert(key.to_string(), pem.into());
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name(name),
            "namespace": namespace,
            "labels": { DEFAULT_LEAF_SECRET_LABEL: name },
            "annotations": annotations,
        },
        "stringData": data,
    })
}

/// Waits for the row of `secret` at `version` to say Ready (or refused).
async fn wait(
    root: &Cluster,
    namespace: &str,
    secret: &str,
    version: &str,
    timeout: Duration,
    out: &mut Output,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let api = rows::api(&root.client, namespace);
    let mut last = String::new();
    let mut said =
        "no LeafCluster row yet: is relaylet running in this namespace, with its CRD?".to_string();
    while started.elapsed() < timeout {
        let status = match api.get_opt(secret).await {
            Ok(row) => row.as_ref().and_then(rows::status),
            Err(err) => {
                said = format!("reading the LeafCluster row: {err}");
                None
            }
        };
        if let Some(status) = status {
            match verdict(&status, version) {
                Verdict::Ready => {
                    out.done(&format!(
                        "leaf joined: Node {} Ready after {:.1} s (served by {})",
                        status.node.as_deref().unwrap_or("?"),
                        started.elapsed().as_secs_f64(),
                        status.served_by.as_deref().unwrap_or("?"),
                    ));
                    return Ok(());
                }
                Verdict::Refused(why) => anyhow::bail!("relaylet refused the leaf Secret: {why}"),
                Verdict::Waiting(why) => said = why,
            }
        }
        out.waiting(&format!("waiting for the leaf's Node: {said}"), &mut last);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!(
        "the leaf's Node was not Ready within {} s: {said}",
        timeout.as_secs()
    )
}

/// What a row says about the Secret version `join` wrote.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Ready,
    Refused(String),
    Waiting(String),
}

fn verdict(status: &LeafStatus, version: &str) -> Verdict {
    if status.secret_resource_version.as_deref() != Some(version) {
        return Verdict::Waiting("relaylet has not read the new Secret yet".into());
    }
    if status.refused() {
        return Verdict::Refused(format!("{}: {}", status.reason, status.message));
    }
    match status.ready.as_str() {
        "True" => Verdict::Ready,
        _ if status.served_by.is_none() => {
            Verdict::Waiting("no replica serves its Node yet".into())
        }
        _ => Verdict::Waiting(format!("{}: {}", status.reason, status.message)),
    }
}

fn is_loopback(server: &str) -> bool {
    let host = server
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    host.starts_with("127.") || host.starts_with("localhost") || host.starts_with("[::1]")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(rv: &str, ready: &str, reason: &str, served: bool) -> LeafStatus {
        LeafStatus {
            ready: ready.into(),
            reason: reason.into(),
            message: "why".into(),
            served_by: served.then(|| "relaylet-0".into()),
            secret_resource_version: Some(rv.into()),
            ..LeafStatus::default()
        }
    }

    #[test]
    fn only_a_row_about_the_written_secret_decides() {
        // A row about the Secret before join rewrote it decides nothing, Ready or not.
        assert!(matches!(
            verdict(&status("6", "True", "LeafReady", true), "7"),
            Verdict::Waiting(_)
        ));
        assert_eq!(
            verdict(&status("7", "True", "LeafReady", true), "7"),
            Verdict::Ready
        );
        assert_eq!(
            verdict(&status("7", "False", "SecretRefusedExecPlugin", false), "7"),
            Verdict::Refused("SecretRefusedExecPlugin: why".into())
        );
        assert_eq!(
            verdict(&status("7", "False", "LeafUnreachable", true), "7"),
            Verdict::Waiting("LeafUnreachable: why".into())
        );
        assert_eq!(
            verdict(&status("7", "Unknown", "Registered", false), "7"),
            Verdict::Waiting("no replica serves its Node yet".into())
        );
    }

    fn flags(args: &[&str]) -> Flags {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Flags::parse(&args, &TAKES).unwrap()
    }

    #[test]
    fn the_secret_carries_the_node_annotations_and_an_https_proxys_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("PEM of {name}")).unwrap();
            path.display().to_string()
        };
        let (ca, cert, key) = (file("ca"), file("cert"), file("key"));
        let f = flags(&[
            "--name",
            "a",
            "--node-taints",
            "",
            "--proxy-url",
            "https://konnectivity:8090",
            "--proxy-ca",
            &ca,
            "--proxy-client-cert",
            &cert,
            "--proxy-client-key",
            &key,
        ]);
        let secret = secret_body(&f, "a", "ns", "KUBECONFIG".into(), proxy_files(&f).unwrap());
        assert_eq!(secret["metadata"]["name"], "relaylet-leaf-a");
        assert_eq!(secret["metadata"]["labels"][DEFAULT_LEAF_SECRET_LABEL], "a");
        assert_eq!(
            secret["metadata"]["annotations"][NODE_TAINTS_ANNOTATION],
            ""
        );
        assert_eq!(secret["stringData"][KUBECONFIG_KEY], "KUBECONFIG");
        assert_eq!(secret["stringData"][PROXY_CA_KEY], "PEM of ca");
        assert_eq!(secret["stringData"][PROXY_CLIENT_CERT_KEY], "PEM of cert");
        assert_eq!(secret["stringData"][PROXY_CLIENT_KEY_KEY], "PEM of key");

        for (args, error) in [
            (
                vec!["--proxy-url", "ftp://x"],
                "--proxy-url must start with http://, https:// or socks5://",
            ),
            (
                vec!["--proxy-url", "https://x"],
                "an https:// --proxy-url needs --proxy-ca",
            ),
            (
                vec!["--proxy-url", "http://x", "--proxy-ca", &ca],
                "--proxy-ca is for an https:// --proxy-url",
            ),
            (
                vec![
                    "--proxy-url",
                    "https://x",
                    "--proxy-ca",
                    &ca,
                    "--proxy-client-cert",
                    &cert,
                ],
                "--proxy-client-cert and --proxy-client-key go together",
            ),
        ] {
            assert_eq!(proxy_files(&flags(&args)).unwrap_err().to_string(), error);
        }
    }

    #[test]
    fn loopback_servers_are_noticed() {
        for (server, loopback) in [
            ("https://127.0.0.1:6443", true),
            ("https://localhost:6443", true),
            ("https://[::1]:6443", true),
            ("https://10.0.0.1:6443", false),
        ] {
            assert_eq!(is_loopback(server), loopback, "{server}");
        }
    }
}

//! The leaves: the `LEAF_KUBECONFIG` leaf, which leaf pod stands for a root pod
//! (`LEAF_POD_MATCH`), and how much of one leaf is kept (`LEAF_MAX_PODS`, `LEAF_MAX_NODES`).

use std::path::PathBuf;

use super::vars::Vars;
use crate::model::counterpart::{LeafPodMatch, NamespaceMap};
use crate::model::names::check_dns_label;

/// The label that marks a Secret as a leaf cluster's kubeconfig; its value is the leaf name.
pub const DEFAULT_LEAF_SECRET_LABEL: &str = "relaylet.io/leaf-cluster";

/// One leaf cluster given directly by kubeconfig file (`LEAF_KUBECONFIG`), without a Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticLeaf {
    pub name: String,
    pub kubeconfig: PathBuf,
    /// `LEAF_NAMESPACE_MAP`: root namespace → leaf namespace (see `counterpart`).
    pub namespaces: NamespaceMap,
}

/// How many objects of one leaf relaylet keeps. A leaf is not trusted: one that holds more
/// (or claims to) is not watched until it holds fewer, and its virtual Node says so; no other
/// leaf notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeafBounds {
    /// Leaf pods kept per leaf (`LEAF_MAX_PODS`).
    pub max_pods: usize,
    /// Leaf nodes kept per leaf (`LEAF_MAX_NODES`).
    pub max_nodes: usize,
}

impl Default for LeafBounds {
    /// Kubernetes' own scalability limits for one cluster: 150,000 pods and 5,000 nodes. A leaf
    /// at both costs each replica about 50 MB (a leaf pod about 330 bytes, docs/performance.md;
    /// a stripped node about 1 KiB).
    fn default() -> Self {
        LeafBounds {
            max_pods: 150_000,
            max_nodes: 5_000,
        }
    }
}

/// `LEAF_KUBECONFIG`, `LEAF_CLUSTER_NAME`, `LEAF_NAMESPACE_MAP`: one leaf without Secrets.
pub(super) fn static_leaf(vars: &mut Vars<'_>) -> Option<StaticLeaf> {
    match (vars.get("LEAF_KUBECONFIG"), vars.get("LEAF_CLUSTER_NAME")) {
        (Some(path), name) => {
            let name = name.unwrap_or_else(|| "leaf".to_string());
            if let Err(message) = check_dns_label(&name) {
                vars.error("LEAF_CLUSTER_NAME", &message);
            }
            let namespaces = match vars.get("LEAF_NAMESPACE_MAP") {
                None => NamespaceMap::default(),
                Some(raw) => vars.parse(
                    "LEAF_NAMESPACE_MAP",
                    &raw,
                    NamespaceMap::default(),
                    NamespaceMap::parse,
                ),
            };
            Some(StaticLeaf {
                name,
                kubeconfig: path.into(),
                namespaces,
            })
        }
        (None, Some(_)) => {
            vars.error(
                "LEAF_CLUSTER_NAME",
                "set without LEAF_KUBECONFIG: name a kubeconfig file for the leaf, or drop it",
            );
            None
        }
        (None, None) => {
            if vars.get("LEAF_NAMESPACE_MAP").is_some() {
                vars.error(
                    "LEAF_NAMESPACE_MAP",
                    "set without LEAF_KUBECONFIG: a leaf Secret carries its map in its relaylet.io/namespace-map annotation",
                );
            }
            None
        }
    }
}

/// `LEAF_CREDENTIAL_RENEW_AT`: when, in percent of its life, the replica serving a leaf asks
/// the leaf for a new token of its ServiceAccount (80, as the kubelet renews projected tokens).
pub(super) fn leaf_credential_renew_at(vars: &mut Vars<'_>) -> u8 {
    match vars.get("LEAF_CREDENTIAL_RENEW_AT") {
        None => 80,
        Some(raw) => vars.parse("LEAF_CREDENTIAL_RENEW_AT", &raw, 80, |v| {
            v.parse::<u8>()
                .ok()
                .filter(|p| (1..=99).contains(p))
                .ok_or_else(|| format!("{v:?} is not a percentage from 1 to 99"))
        }),
    }
}

/// `LEAF_POD_MATCH` and `LEAF_POD_MARKER`.
pub(super) fn leaf_pod_match(vars: &mut Vars<'_>) -> LeafPodMatch {
    let mode = vars.get("LEAF_POD_MATCH");
    let marker = vars.get("LEAF_POD_MARKER");
    match LeafPodMatch::parse(mode.as_deref(), marker.as_deref()) {
        Ok(rule) => rule,
        Err(message) => {
            let known = ["root-uid", "label", "name"];
            let var = match &mode {
                Some(m) if !known.contains(&m.as_str()) => "LEAF_POD_MATCH",
                _ => "LEAF_POD_MARKER",
            };
            vars.error(var, &message);
            LeafPodMatch::default()
        }
    }
}

/// `LEAF_MAX_PODS`, `LEAF_MAX_NODES`.
pub(super) fn leaf_bounds(vars: &mut Vars<'_>) -> LeafBounds {
    let defaults = LeafBounds::default();
    LeafBounds {
        max_pods: vars.count("LEAF_MAX_PODS", defaults.max_pods),
        max_nodes: vars.count("LEAF_MAX_NODES", defaults.max_nodes),
    }
}

/// `LEAF_POD_SYNC`: on by default. relaylet then writes its own counterpart marker on the copies
/// it makes, so it needs `LEAF_POD_MATCH=root-uid`; `label` and `name` are for the pods of
/// another syncer, which runs them instead.
pub(super) fn leaf_pod_sync(vars: &mut Vars<'_>, proof: &LeafPodMatch) -> bool {
    let on = vars.flag("LEAF_POD_SYNC", true);
    if on && !matches!(proof, LeafPodMatch::RootUid { .. }) {
        vars.error(
            "LEAF_POD_SYNC",
            &format!(
                "relaylet runs the pods itself and marks their copies with the root pod's UID, but LEAF_POD_MATCH is {proof} (another syncer's pods): set LEAF_POD_SYNC=false, or LEAF_POD_MATCH=root-uid"
            ),
        );
    }
    on
}

/// Where the pods relaylet runs in the leaves reach the root apiserver
/// (`LEAF_POD_ROOT_APISERVER`, `https://host:port`). With it, a pod's service-account tokens
/// are the root's, bound to the root pod, and its in-cluster configuration points here;
/// without it, a pod in a leaf uses the leaf's own service account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodApiserver {
    pub host: String,
    pub port: u16,
}

impl PodApiserver {
    pub fn parse(text: &str) -> Result<PodApiserver, String> {
        let bad = |why: &str| format!("{text:?} is not an https://host:port address: {why}");
        let uri: http::Uri = text.parse().map_err(|_| bad("it does not parse"))?;
        if uri.scheme_str() != Some("https") {
            return Err(bad("the scheme must be https"));
        }
        if uri.path() != "/" && !uri.path().is_empty() || uri.query().is_some() {
            return Err(bad("no path or query"));
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(bad("no user info"));
        }
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.parse::<std::net::IpAddr>().is_err()
            && crate::model::names::check_dns_subdomain(host).is_err()
        {
            return Err(bad("the host is neither an IP address nor a DNS name"));
        }
        Ok(PodApiserver {
            host: host.to_string(),
            port: uri.port_u16().unwrap_or(443),
        })
    }
}

/// `LEAF_POD_ROOT_APISERVER`: only with `LEAF_POD_SYNC`.
pub(super) fn pod_apiserver(vars: &mut Vars<'_>, sync: bool) -> Option<PodApiserver> {
    let raw = vars.get("LEAF_POD_ROOT_APISERVER")?;
    if !sync {
        vars.error(
            "LEAF_POD_ROOT_APISERVER",
            "relaylet forwards tokens only to the pods it runs itself: set LEAF_POD_SYNC=true, or leave this unset",
        );
        return None;
    }
    match PodApiserver::parse(raw.trim()) {
        Ok(a) => Some(a),
        Err(message) => {
            vars.error("LEAF_POD_ROOT_APISERVER", &message);
            None
        }
    }
}

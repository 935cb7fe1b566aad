//! Where the client CA comes from, and keeping it current.
//!
//! `APISERVER_CA_CERT_LOCATION` names a PEM bundle (re-read when it changes); otherwise relaylet
//! uses the root cluster's own client CA as kube-apiserver publishes it in
//! `kube-system/extension-apiserver-authentication` (`client-ca-file`), watched, so a rotated or
//! added CA is trusted without a restart. A bad new bundle is reported and the old one kept.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::certs::tls::{self, ClientCa};
use crate::config::Config;

/// The ConfigMap kube-apiserver publishes its client CA in.
pub const CONFIGMAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");
const KEY: &str = "client-ca-file";
/// How often a CA file is checked for changes.
const FILE_POLL: Duration = Duration::from_secs(10);

/// Loads the client CA and keeps it current until `stop` fires.
pub async fn start_client_ca(
    config: &Config,
    root: &Client,
    stop: CancellationToken,
) -> anyhow::Result<Arc<ClientCa>> {
    if let Some(path) = &config.client_ca {
        let ca = ClientCa::new(tls::read_roots(path).context("APISERVER_CA_CERT_LOCATION")?)?;
        tokio::spawn(poll_file(path.clone(), ca.clone(), stop));
        return Ok(ca);
    }
    let api: Api<ConfigMap> = Api::namespaced(root.clone(), CONFIGMAP.0);
    let cm = api.get(CONFIGMAP.1).await.with_context(|| {
        format!(
            "reading the root client CA from {}/{} (set APISERVER_CA_CERT_LOCATION to give it directly)",
            CONFIGMAP.0, CONFIGMAP.1
        )
    })?;
    let roots =
        roots_of(&cm).map_err(|e| anyhow::anyhow!("{}/{}: {e}", CONFIGMAP.0, CONFIGMAP.1))?;
    let ca = ClientCa::new(roots)?;
    tokio::spawn(watch_configmap(api, ca.clone(), stop));
    Ok(ca)
}

fn roots_of(cm: &ConfigMap) -> Result<rustls::RootCertStore, String> {
    let pem = cm
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .ok_or_else(|| format!("no {KEY}"))?;
    tls::roots_from_pem(pem.as_bytes())
}

async fn watch_configmap(api: Api<ConfigMap>, ca: Arc<ClientCa>, stop: CancellationToken) {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", CONFIGMAP.1));
    let mut events = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => match event {
                Some(event) => event,
                None => return,
            },
        };
        match event
            .map_err(|e| e.to_string())
            .and_then(|cm| roots_of(&cm))
        {
            Ok(roots) => match ca.replace(roots) {
                Ok(()) => tracing::info!(
                    "root client CA (re)loaded from {}/{}",
                    CONFIGMAP.0,
                    CONFIGMAP.1
                ),
                Err(err) => {
                    tracing::warn!(%err, "new root client CA unusable; keeping the old one")
                }
            },
            Err(err) => tracing::warn!(%err, "root client CA not updated; keeping the old one"),
        }
    }
}

async fn poll_file(path: PathBuf, ca: Arc<ClientCa>, stop: CancellationToken) {
    let stamp = |p: &PathBuf| -> Option<(SystemTime, u64)> {
        let m = std::fs::metadata(p).ok()?;
        Some((m.modified().ok()?, m.len()))
    };
    let mut seen = stamp(&path);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(FILE_POLL) => {}
        }
        let now = stamp(&path);
        if now.is_none() || now == seen {
            continue;
        }
        seen = now;
        match tls::read_roots(&path)
            .map_err(anyhow::Error::from)
            .and_then(|r| Ok(ca.replace(r)?))
        {
            Ok(()) => tracing::info!(path = %path.display(), "client CA reloaded"),
            Err(err) => {
                tracing::warn!(path = %path.display(), %err, "client CA changed but cannot be used; keeping the old one")
            }
        }
    }
}

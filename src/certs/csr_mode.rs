//! `SERVING_CERT_MODE=csr`: the serving certificate requested from the root cluster's
//! kubelet-serving signer (`serving_csr`) and, when enabled, the approver of relaylet's own
//! CSRs (`csr_approver`), started together.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::Client;

use super::serving_csr::{CsrCert, Subject};
use crate::config::{Config, ServingCert};
use crate::ops::{Metrics, Shutdown};

/// With `SERVING_CERT_MODE=csr`: requests (and renews) the serving certificate from the
/// root cluster's kubelet-serving signer for the virtual nodes `names` gives, and starts
/// the approver of relaylet's own CSRs when enabled (in `namespace`, relaylet's own).
/// `None` in the other modes.
pub fn start_csr_mode(
    config: &Config,
    root: &Client,
    namespace: &str,
    names: impl Fn() -> BTreeSet<String> + Clone + Send + Sync + 'static,
    metrics: &Metrics,
    shutdown: &Shutdown,
) -> Option<Arc<CsrCert>> {
    let ServingCert::Csr(settings) = config.serving_cert else {
        return None;
    };
    let cert = CsrCert::new(settings.approver);
    if settings.approver {
        let approver = super::csr_approver::run(
            root.clone(),
            namespace.to_string(),
            names.clone(),
            metrics.clone(),
        );
        let stop = shutdown.begin.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = approver => {}
                _ = stop.cancelled() => {}
            }
        });
    }
    let subject = Subject {
        name: config.replica_name(),
        ip: config.leaf_node_ip,
    };
    tokio::spawn(cert.clone().run(
        root.clone(),
        subject,
        settings,
        names,
        metrics.clone(),
        shutdown.begin.clone(),
    ));
    Some(cert)
}

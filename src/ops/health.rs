//! The plain-HTTP operations port (`METRICS_ADDR`): `/metrics`, `/livez`, `/healthz`, `/readyz`,
//! and the probes that keep the reachability gauges and readiness current. The root is probed
//! here; each leaf by its virtual node's loop (`virtual_node`), which reports every probe with
//! [`Health::leaf_probed`], so a leaf's health is one fact with one probe.
//!
//! - `/livez` and `/healthz`: the process serves HTTP (a restart would not help otherwise).
//! - `/readyz`: the root apiserver answered the last probe, at least one leaf did (when this
//!   replica watches any: a fresh install without leaves, or a replica serving no Node, is
//!   ready; a leaf it started watching but has not probed yet does not count as answering), the serving certificate is loaded
//!   (in `SERVING_CERT_MODE=csr`: issued and not expired; the reason names a pending CSR),
//!   and shutdown has not begun. A replica that is not ready is taken out
//!   of the Service but keeps relaying the sessions it has.
//!
//! The port carries no secrets and no pod data, only counts, so it is unauthenticated like the
//! kubelet's own health port; keep it off the public network. Being open to anyone, it has its
//! own small connection budget and cuts clients that send no request in time.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use kube::Client;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tower::ServiceExt;

use crate::caps::Gate;
use crate::config::Limits;
use crate::ops::metrics::Metrics;

/// Open connections the metrics port serves at once, in total and from one address.
const MAX_CONNECTIONS: usize = 64;
const MAX_CONNECTIONS_PER_CLIENT: usize = 16;
/// How long a client has to send a request's headers, the first or the next on a kept-alive
/// connection; idle and slow clients are cut after it.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the root and every leaf are probed.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What readiness is judged on. Cheap to share.
pub struct Health {
    pub metrics: Metrics,
    root_ok: AtomicBool,
    /// Per leaf this replica watches: whether its apiserver answered the last probe (`None`: not yet
    /// probed).
    leaves_ok: Mutex<BTreeMap<String, Option<bool>>>,
    /// Why no valid serving certificate is served (`None` until one is loaded).
    certificate: Mutex<Option<CertificateCheck>>,
    stopping: CancellationToken,
}

/// Says why the serving certificate is not usable, or `None` when it is.
pub type CertificateCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

impl Health {
    /// `stopping` fires when shutdown begins (readiness turns false at once).
    pub fn new(metrics: Metrics, stopping: CancellationToken) -> Arc<Health> {
        Arc::new(Health {
            metrics,
            root_ok: AtomicBool::new(false),
            leaves_ok: Mutex::new(BTreeMap::new()),
            certificate: Mutex::new(None),
            stopping,
        })
    }

    /// Marks the serving certificate as loaded; `check` says from then on whether it is usable
    /// (a CSR-issued one may still be pending, or have expired).
    pub fn certificates_loaded(&self, check: CertificateCheck) {
        *self.certificate.lock().unwrap_or_else(|e| e.into_inner()) = Some(check);
    }

    /// Why relaylet is not ready, or `None` when it is.
    pub fn not_ready(&self) -> Option<String> {
        if self.stopping.is_cancelled() {
            return Some("shutting down".to_string());
        }
        let certificate = self
            .certificate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match certificate {
            None => return Some("serving certificate not loaded".to_string()),
            Some(check) => {
                if let Some(problem) = check() {
                    return Some(problem);
                }
            }
        }
        if !self.root_ok.load(Ordering::Relaxed) {
            return Some("root apiserver unreachable".to_string());
        }
        let leaves = self.leaves_ok.lock().unwrap_or_else(|e| e.into_inner());
        // No leaf registered yet is not a fault (a fresh install before its first leaf Secret;
        // a replica that is not ready would only block drains and rollouts); leaves that are
        // all unreachable are.
        if !leaves.is_empty() && !leaves.values().any(|ok| *ok == Some(true)) {
            let each: Vec<String> = leaves
                .iter()
                .map(|(name, ok)| match ok {
                    None => format!("{name}: not probed yet"),
                    Some(_) => name.clone(),
                })
                .collect();
            return Some(format!("no leaf cluster reachable ({})", each.join(", ")));
        }
        None
    }

    /// This replica started watching a leaf (it serves the leaf's Node); it is probed soon.
    pub fn leaf_registered(&self, leaf: &str) {
        let mut leaves = self.leaves_ok.lock().unwrap_or_else(|e| e.into_inner());
        leaves.entry(leaf.to_string()).or_insert(None);
    }

    /// The last probe of `leaf`'s apiserver: whether it answered.
    pub fn leaf_probed(&self, leaf: &str, reachable: bool) {
        self.metrics
            .leaf_reachable
            .get_or_create(&[("leaf", leaf.to_string())])
            .set(i64::from(reachable));
        let mut leaves = self.leaves_ok.lock().unwrap_or_else(|e| e.into_inner());
        leaves.insert(leaf.to_string(), Some(reachable));
    }

    /// `leaf` left the registry, or this replica no longer watches it: it leaves readiness and
    /// the gauge too.
    pub fn leaf_gone(&self, leaf: &str) {
        self.metrics
            .leaf_reachable
            .remove(&[("leaf", leaf.to_string())]);
        let mut leaves = self.leaves_ok.lock().unwrap_or_else(|e| e.into_inner());
        leaves.remove(leaf);
    }

    /// Probes the root every [`PROBE_EVERY`], until dropped.
    pub async fn probe(self: Arc<Self>, root: Client) {
        loop {
            let root_ok = reachable(&root).await;
            self.metrics.root_reachable.set(i64::from(root_ok));
            self.root_ok.store(root_ok, Ordering::Relaxed);
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }
}

/// Whether an apiserver answers `/version` (every authenticated identity may read it).
async fn reachable(client: &Client) -> bool {
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, client.apiserver_version()).await,
        Ok(Ok(_))
    )
}

/// Serves the operations port on `listener` until `stop` fires.
pub async fn serve_health(listener: TcpListener, health: Arc<Health>, stop: CancellationToken) {
    let app = Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .route("/livez", axum::routing::get(|| async { "ok" }))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route("/readyz", axum::routing::get(readyz))
        .with_state(health);
    // The port is unauthenticated, so it gets a small budget of its own: it can never hold the
    // descriptors the kubelet port needs, and one client cannot take all of it from the
    // kubelet's probes.
    let gate = Gate::new(Limits {
        connections: MAX_CONNECTIONS,
        connections_per_client: MAX_CONNECTIONS_PER_CLIENT,
        ..Limits::default()
    });
    loop {
        let Some((tcp, peer)) = crate::ops::listener::next(&listener, &stop, "metrics").await
        else {
            return;
        };
        let permit = match gate.connection(peer.ip()) {
            Ok(permit) => permit,
            Err(err) => {
                tracing::debug!(%peer, %err, "metrics port: connection refused");
                continue;
            }
        };
        let app = app.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                app.clone().oneshot(req)
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(HEADER_READ_TIMEOUT, conn).await;
                }
            }
        });
    }
}

/// Binds `addr` for [`serve`].
pub async fn bind_health(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

async fn metrics(State(health): State<Arc<Health>>) -> Response {
    health.metrics.response()
}

async fn readyz(State(health): State<Arc<Health>>) -> Response {
    match health.not_ready() {
        None => "ok".into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_root_a_reachable_leaf_if_any_certificates_and_no_shutdown() {
        let stop = CancellationToken::new();
        let h = Health::new(Metrics::new(), stop.clone());
        assert!(h.not_ready().unwrap().contains("certificate"));
        h.certificates_loaded(Arc::new(|| None));
        assert!(h.not_ready().unwrap().contains("root"));
        h.root_ok.store(true, Ordering::Relaxed);
        assert_eq!(h.not_ready(), None, "no leaf registered yet is ready");
        h.leaf_registered("a");
        h.leaf_registered("b");
        assert_eq!(
            h.not_ready().as_deref(),
            Some("no leaf cluster reachable (a: not probed yet, b: not probed yet)"),
            "registered leaves not probed yet do not make a replica ready"
        );
        h.leaf_probed("a", false);
        h.leaf_probed("b", false);
        assert_eq!(
            h.not_ready().as_deref(),
            Some("no leaf cluster reachable (a, b)")
        );
        h.leaf_probed("b", true);
        assert_eq!(h.not_ready(), None);
        h.leaf_gone("b");
        assert_eq!(
            h.not_ready().as_deref(),
            Some("no leaf cluster reachable (a)")
        );
        h.leaf_gone("a");
        assert_eq!(h.not_ready(), None, "every leaf gone: as a fresh install");
        stop.cancel();
        assert!(h.not_ready().unwrap().contains("shutting down"));
    }
}

//! The kube client relaylet makes ordinary API calls with, to the root cluster and to each leaf:
//! kube's own stack (connect, read and write timeouts, retries of server errors, auth, headers)
//! on a connector of relaylet's choosing, with a connection pool that gives connections back.
//! The leaf's stream client puts the same stack on an HTTP client of its own (`over`).
//! A leaf's API client reads its answers within `read_limits` (a leaf is not trusted); the
//! root's and the stream client's bodies pass unchanged.
//!
//! Each watch holds an HTTP/1.1 connection of its own, and a burst of concurrent calls (every
//! leaf writing its virtual Node at once when leaf pods come or go) opens one connection per call.
//! hyper's pool keeps every one of them idle for 90 s, each with its TLS state and buffers
//! (`relaylet-dev bench --only fleet`, 100 leaves: while 10,000 leaf pods came and went, the
//! root pool grew from 223 to 294 connections and kept them; the heap in use stayed 3.9 MB above
//! its start after the pods were deleted, 0.6 MB with this pool). The pool here keeps a few idle
//! connections per host and closes the rest as they come back; the next burst dials again.

use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use kube::Client;
use kube::client::ConfigExt;
use tower::Service;

use crate::ops::read_limits::{ReadLimitLayer, ReadLimits};

/// Idle connections kept per host; more are closed when they come back to the pool.
const MAX_IDLE_PER_HOST: usize = 4;
/// The most an HTTP/1.1 read buffer grows to. hyper's default lets it grow to ~400 KiB under a
/// burst of watch events and keeps it for the connection's life; one TLS record is 16 KiB
/// (`relaylet-dev bench --only fleet`: with 30 leaves, 1.2-2.4 KiB of RSS per leaf pod instead
/// of ~0.9).
const MAX_READ_BUFFER: usize = 16 * 1024;

/// A client for `config`'s cluster over `dialer` (TCP, or a leaf's proxy), reading answers
/// within `limits` if given. Proxies are the dialer's business: `config.proxy_url` is not read
/// here.
pub fn build<D>(
    config: &kube::Config,
    dialer: D,
    limits: Option<ReadLimits>,
) -> Result<Client, kube::Error>
where
    D: Service<http::Uri> + Clone + Send + Sync + 'static,
    D::Response: Connection + hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
    D::Future: Send + 'static,
    D::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut https =
        hyper_timeout::TimeoutConnector::new(config.rustls_https_connector_with_connector(dialer)?);
    https.set_connect_timeout(config.connect_timeout);
    https.set_read_timeout(config.read_timeout);
    https.set_write_timeout(config.write_timeout);
    https.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http1_max_buf_size(MAX_READ_BUFFER)
        .pool_max_idle_per_host(MAX_IDLE_PER_HOST)
        .build::<_, kube::client::Body>(https);
    over(config, hyper, limits)
}

/// kube's stack for `config` (its base URI, retries of server errors when `default_retry`,
/// auth, extra headers) on `hyper`, the HTTP client the caller built; answers are read within
/// `limits` if given.
pub fn over<C>(
    config: &kube::Config,
    hyper: hyper_util::client::legacy::Client<C, kube::client::Body>,
    limits: Option<ReadLimits>,
) -> Result<Client, kube::Error>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .layer(ReadLimitLayer(limits))
        .service(hyper);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// The root cluster's client, from `KUBECONFIG` or the in-cluster config. A proxy for the root
/// cluster (the kubeconfig's `proxy-url`, or `HTTPS_PROXY` beside a kubeconfig) is refused, as
/// kube's own client refuses it without its proxy features: relaylet runs inside the root
/// cluster.
pub async fn root() -> anyhow::Result<Client> {
    let config = kube::Config::infer().await.map_err(|e| {
        anyhow::anyhow!("reading the root cluster's config (KUBECONFIG or in-cluster): {e}")
    })?;
    root_from(&config)
}

fn root_from(config: &kube::Config) -> anyhow::Result<Client> {
    if config.proxy_url.is_some() {
        anyhow::bail!(
            "a proxy for the root cluster (proxy-url or HTTPS_PROXY) is not supported: relaylet \
             runs inside the root cluster and reaches its apiserver directly"
        );
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    // The root is trusted: its answers are not limited here.
    build(config, tcp, None).map_err(|e| anyhow::anyhow!("connecting to the root cluster: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> kube::Config {
        kube::Config::new("https://127.0.0.1:6443".parse().expect("url"))
    }

    #[tokio::test]
    async fn the_root_client_refuses_a_proxy() {
        assert!(root_from(&config()).is_ok());
        let mut proxied = config();
        proxied.proxy_url = Some("http://proxy.example:3128".parse().expect("url"));
        let err = root_from(&proxied).err().expect("refused").to_string();
        assert!(err.contains("proxy for the root cluster"), "{err}");
    }
}

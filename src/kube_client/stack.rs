//! The kube client relaylet makes ordinary API calls with, to the root cluster and to each leaf:
//! kube's own stack (connect, read and write timeouts, retries of server errors, auth, headers)
//! on a connector of relaylet's choosing, over a pool of connections that relaylet spreads its
//! HTTP/2 streams over itself (`kube_client::conn_pool`). The leaf's stream client puts the same stack
//! on an HTTP/1.1-only client of its own (`calls_over`, and `https_connector` with `Alpn::Http1`).
//! A leaf's API client reads its answers within `read_limits` (a leaf is not trusted); the
//! root's and the stream client's bodies pass unchanged. The root's client is a `kube::Client`
//! (`root_from`); a leaf's are [`Calls`] without one (`api_calls`, `calls_over`), one `Buffer` less per
//! leaf.
//!
//! The API clients offer h2 and http/1.1 by ALPN. Over h2 every watch and call is a stream on
//! one of a few connections, so the root connections no longer grow with the leaves (over
//! HTTP/1.1 each of the ~2 root watches per virtual node held a connection of its own).
//! Against a server that speaks HTTP/1.1 only, each watch holds a connection of its own, and a
//! burst of concurrent calls (every leaf writing its virtual Node at once when leaf pods come
//! or go) opens one connection per call. hyper's pool would keep every one of them idle for
//! 90 s, each with its TLS state and buffers, long after the burst. The pool here keeps a few
//! idle connections per host and closes the rest as they come back; the next burst dials
//! again.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use kube::Client;
use kube::client::ConfigExt;
use tower::{BoxError, Service};

use super::calls::Calls;
use super::conn_pool::{Budget, ConnPool};
use super::read_limits::{ReadLimitLayer, ReadLimits};

/// Idle connections kept per host; more are closed when they come back to the pool.
const MAX_IDLE_PER_HOST: usize = 4;
/// The most an HTTP/1.1 read buffer grows to. hyper's default lets it grow to ~400 KiB under a
/// burst of watch events and keeps it for the connection's life, which would more than double
/// the memory a leaf pod costs; one TLS record is 16 KiB.
const MAX_READ_BUFFER: usize = 16 * 1024;
/// TLS session tickets a client keeps for resuming: rustls keeps up to 8 per server, and this
/// many is room for exactly one server's.
const TLS_TICKETS_PER_CLIENT: usize = 8;
/// Streams per connection before the pool opens another. kube-apiserver allows 100 concurrent
/// streams per HTTP/2 connection unless `--http2-max-streams-per-connection` says otherwise
/// (k8s.io/apiserver v0.37.2, pkg/server/secure_serving.go: when the flag is 0 it sets
/// `MaxConcurrentStreams = 100` explicitly, not Go's default of 250); 20 are left free for
/// short calls on a connection full of watches.
pub const STREAMS_PER_CONNECTION: usize = 80;
/// The most HTTP/2 connections to the root apiserver: 1,280 streams, two watches for each of
/// 640 virtual nodes, before calls share the least busy connection.
pub const ROOT_CONNECTIONS: usize = 16;
/// The most HTTP/2 connections of a leaf's API client (about three watches per leaf).
pub const LEAF_CONNECTIONS: usize = 2;
/// HTTP/2 flow-control windows: how much a server may send on one stream, and on one
/// connection, before relaylet has read it. hyper's defaults (2 MiB and 5 MiB) would let a leaf
/// park 5 MiB per connection in relaylet's memory; every answer is read as it comes, so small
/// windows cost nothing but bound that (the HTTP/1.1 counterpart is `MAX_READ_BUFFER`).
const H2_STREAM_WINDOW: u32 = 256 * 1024;
const H2_CONNECTION_WINDOW: u32 = 1024 * 1024;
/// HTTP/2 PINGs on a quiet connection: a dead peer is found, and a healthy quiet connection is
/// not taken for dead by the read timeout.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(30);

/// The application protocols a client offers by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// HTTP/1.1 only: upgrades (exec, attach, port-forward) need it.
    Http1,
    /// h2 if the server takes it, else HTTP/1.1.
    H2OrHttp1,
}

/// The pool's budget of at most `connections` HTTP/2 connections, each carrying
/// [`STREAMS_PER_CONNECTION`] streams before the next is opened (a test gives a smaller one
/// against a server with a small stream limit).
pub fn budget(connections: usize) -> Budget {
    Budget {
        streams_per_connection: STREAMS_PER_CONNECTION,
        connections,
    }
}

/// A client for `config`'s cluster over `dialer` (TCP, or a leaf's proxy), reading answers
/// within `limits` if given, over the connections `budget` allows ([`budget`]). Proxies are the
/// dialer's business: `config.proxy_url` is not read here. As [`Calls`], without a
/// `kube::Client` around it (a leaf's: see `kube_client::calls`); the root's is one
/// ([`Calls::into_client`]).
pub fn api_calls<D>(
    config: &kube::Config,
    dialer: D,
    limits: Option<ReadLimits>,
    budget: Budget,
) -> Result<Calls, kube::Error>
where
    D: Service<http::Uri> + Clone + Send + Sync + 'static,
    D::Response: Connection + hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
    D::Future: Send + 'static,
    D::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut https =
        hyper_timeout::TimeoutConnector::new(https_connector(config, dialer, Alpn::H2OrHttp1)?);
    https.set_connect_timeout(config.connect_timeout);
    https.set_read_timeout(config.read_timeout);
    https.set_write_timeout(config.write_timeout);
    https.set_reset_reader_on_write(config.reset_reader_on_write);
    let mut builder =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .http1_max_buf_size(MAX_READ_BUFFER)
        .pool_max_idle_per_host(MAX_IDLE_PER_HOST)
        .http2_initial_stream_window_size(H2_STREAM_WINDOW)
        .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
        .http2_keep_alive_interval(H2_KEEP_ALIVE)
        .http2_keep_alive_while_idle(true);
    calls_over(config, ConnPool::new(builder, https, budget), limits)
}

/// kube's rustls connector for `config` (its CA, client certificate, `tls-server-name`,
/// `insecure-skip-tls-verify`) on `dialer`, offering `alpn` (kube's own offers none).
pub fn https_connector<D>(
    config: &kube::Config,
    dialer: D,
    alpn: Alpn,
) -> Result<hyper_rustls::HttpsConnector<D>, kube::Error> {
    let mut tls = config.rustls_client_config()?;
    // Each client talks to one server (a leaf's apiserver, or the root's). rustls' default
    // session cache has room for 32 servers, allocated up front (about 19 KiB), in every
    // client's settings, and every replica holds two clients for each leaf of the fleet.
    tls.resumption = rustls::client::Resumption::in_memory_sessions(TLS_TICKETS_PER_CLIENT);
    tls.alpn_protocols = match alpn {
        Alpn::Http1 => vec![b"http/1.1".to_vec()],
        Alpn::H2OrHttp1 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    };
    let resolver: Arc<dyn hyper_rustls::ResolveServerName + Send + Sync> =
        match config.tls_server_name.as_deref() {
            Some(name) => {
                let name =
                    rustls_pki_types::ServerName::try_from(name.to_string()).map_err(|e| {
                        kube::Error::Service(format!("tls-server-name {name:?}: {e}").into())
                    })?;
                Arc::new(hyper_rustls::FixedServerNameResolver::new(name))
            }
            None => Arc::new(hyper_rustls::DefaultServerNameResolver::default()),
        };
    Ok(hyper_rustls::HttpsConnector::new(
        dialer, tls, false, resolver,
    ))
}

/// kube's stack for `config` (its base URI, retries of server errors when `default_retry`,
/// auth, extra headers) on `http`, the HTTP client the caller built; answers are read within
/// `limits` if given.
pub fn calls_over<S, B>(
    config: &kube::Config,
    http: S,
    limits: Option<ReadLimits>,
) -> Result<Calls, kube::Error>
where
    S: Service<http::Request<kube::client::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
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
        .service(http);
    Ok(Calls::new(service))
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

/// The root cluster's client for `config` (what [`root`] builds from the inferred config).
pub fn root_from(config: &kube::Config) -> anyhow::Result<Client> {
    if config.proxy_url.is_some() {
        anyhow::bail!(
            "a proxy for the root cluster (proxy-url or HTTPS_PROXY) is not supported: relaylet \
             runs inside the root cluster and reaches its apiserver directly"
        );
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    // The root is trusted: its answers are not limited here.
    api_calls(config, tcp, None, budget(ROOT_CONNECTIONS))
        .map(|calls| calls.into_client(config.default_namespace.clone()))
        .map_err(|e| anyhow::anyhow!("connecting to the root cluster: {e}"))
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

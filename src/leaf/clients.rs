//! A leaf's two API clients, and when they are built. Both come from the leaf's kubeconfig,
//! so both carry its TLS settings and credentials, and neither is a `kube::Client` (see
//! `kube_client::calls`): one for ordinary API calls (`kube_client::stack`), and one for relayed streams,
//! with no read or write timeout (an interactive shell may be quiet for hours; relaylet
//! enforces its own idle timeout) and no retries (a retried exec would run a command twice).

use std::sync::Mutex;

use crate::kube_client::Calls;
use crate::leaf::dialer::LeafDialer;
use crate::leaf::warm_connector::{Sources, WarmConnector};
use crate::ops::Metrics;

/// How much of each answer leaf `leaf`'s API client reads: an answer past its limit fails its
/// call, is counted and logged (once per answer; the leaf's watches and probes retry with
/// backoff, so this is never a flood).
fn read_limits(leaf: &str, metrics: &Metrics) -> crate::kube_client::ReadLimits {
    let leaf = leaf.to_string();
    let metrics = metrics.clone();
    crate::kube_client::ReadLimits::new(move |limit| {
        metrics.leaf_limit_exceeded(&leaf, limit.label());
        tracing::warn!(
            leaf = %leaf,
            limit = limit.label(),
            bytes = limit.bytes(),
            "leaf answer over relaylet's limit: the call fails and is retried later"
        );
    })
}

/// What a leaf's API clients are built from, and the clients once built. Every replica
/// registers every leaf of the fleet (so it can take the leaf's Node over at once) but uses the
/// clients only of the leaves whose Nodes it serves, and of sessions that reach it while a Node
/// moves; built, the two hold about 12 KiB (`tests/it/leaf_memory.rs`), so they are built the first
/// time they are used. Whether they can be built was checked when the leaf was registered.
pub(super) struct LeafClients {
    leaf: String,
    config: kube::Config,
    dialer: LeafDialer,
    metrics: Metrics,
    spare: bool,
    /// Built on first use; dropped by [`LeafClients::release`].
    api: Mutex<Option<Calls>>,
    stream: Mutex<Option<Calls>>,
}

impl LeafClients {
    /// Leaf `leaf`'s clients from `config` on `dialer`, not built yet; their connections
    /// counted in `metrics`, and with `spare` one kept dialed ahead of the next session.
    pub(super) fn new(
        leaf: &str,
        config: kube::Config,
        dialer: LeafDialer,
        metrics: &Metrics,
        spare: bool,
    ) -> LeafClients {
        LeafClients {
            leaf: leaf.to_string(),
            config,
            dialer,
            metrics: metrics.clone(),
            spare,
            api: Mutex::new(None),
            stream: Mutex::new(None),
        }
    }

    /// The client for ordinary API calls, built on first use.
    pub(super) fn api(&self) -> Calls {
        get_or_build(&self.api, || {
            let built = self.build_api();
            self.or_failing(built)
        })
    }

    /// The client for relayed streams, built on first use.
    pub(super) fn stream(&self) -> Calls {
        get_or_build(&self.stream, || {
            let built = self.build_stream();
            self.or_failing(built)
        })
    }

    /// Drops both clients, their connections and TLS state; the next use builds them again.
    /// Calls in flight keep their own handle of the client until they end.
    pub(super) fn release(&self) {
        self.api.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.stream.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// A leaf's API client: without a `kube::Client` around it (see `kube_client::calls`).
    pub(super) fn build_api(&self) -> Result<Calls, kube::Error> {
        use crate::kube_client::{LEAF_CONNECTIONS, api_calls, budget};
        api_calls(
            &self.config,
            self.dialer.clone(),
            Some(read_limits(&self.leaf, &self.metrics)),
            budget(LEAF_CONNECTIONS),
        )
    }

    /// The client for relayed streams: the same TLS settings, credentials and headers as the
    /// API client, on the same dialer (`TCP_NODELAY`, read-ahead, the leaf's proxy), without
    /// timeouts or retries. Its connector keeps a spare connection dialed for the next session
    /// (see [`WarmConnector`]).
    fn build_stream(&self) -> Result<Calls, kube::Error> {
        use crate::kube_client::{Alpn, https_connector};
        let mut config = self.config.clone();
        config.read_timeout = None;
        config.write_timeout = None;
        config.default_retry = false;
        // HTTP/1.1 only, said by ALPN: exec, attach and port-forward are HTTP/1.1 upgrades, and
        // the spare connection must be one a session can upgrade.
        let https = WarmConnector::new(
            https_connector(&config, self.dialer.clone(), Alpn::Http1)?,
            Sources::of_leaf(&self.metrics, &self.leaf),
            self.spare,
        );
        let hyper =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build::<_, kube::client::Body>(https);
        // `default_retry` is off: the stack adds no retries. Stream bodies (logs) are relayed as
        // they come, never collected, so they are not limited here.
        crate::kube_client::calls_over(&config, hyper, None)
    }

    /// `built`, or, should building fail after all (it did not at registration), calls that
    /// each fail saying why.
    fn or_failing(&self, built: Result<Calls, kube::Error>) -> Calls {
        match built {
            Ok(built) => built,
            Err(err) => {
                let message = format!("leaf {}: building its API client: {err}", self.leaf);
                tracing::error!(leaf = %self.leaf, %err, "building the leaf's API client");
                Calls::new(tower::service_fn(
                    move |_: http::Request<kube::client::Body>| {
                        let message = message.clone();
                        async move {
                            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other(
                                message,
                            ))
                        }
                    },
                ))
            }
        }
    }
}

/// The client in `slot`, built by `build` if there is none yet.
fn get_or_build<C: Clone>(slot: &Mutex<Option<C>>, build: impl FnOnce() -> C) -> C {
    // A poisoned lock only means a build panicked: the slot is then still empty or whole.
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
    slot.get_or_insert_with(build).clone()
}

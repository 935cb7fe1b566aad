//! The leaf clusters relaylet knows, each with the clients that reach its apiserver. It offers
//! the [`Registry`] of [`Leaf`]s (filled by [`watch_secrets`] and [`load_static_leaf`]) to
//! everything that reaches a leaf.
//!
//! A leaf is a kubeconfig: from a Secret labelled `relaylet.io/leaf-cluster: <name>` (watched,
//! so adding, changing or deleting one takes effect without a restart) or from the
//! `LEAF_KUBECONFIG` file. Inside:
//! - `cluster`: one [`Leaf`] and its clients (`clients`: an API client and a stream client,
//!   both from the same kubeconfig, built on first use);
//! - `registry`: the [`Registry`], and the `LEAF_KUBECONFIG` leaf;
//! - `secret_watch`: the leaf Secrets, watched; what a Secret may hold (`kubeconfig`), which
//!   Secret gets a contested name (`names`), how a refusal is reported (`refusal`);
//! - `credential`: when a leaf's credential expires (a token's `exp`, a certificate's
//!   `notAfter`);
//! - `dialer` (the one way to open a TCP connection to a leaf), `proxy` (a leaf behind a
//!   proxy: HTTP CONNECT, konnectivity, SOCKS5), `warm_connector` (a spare connection dialled
//!   ahead of the next session).

mod clients;
mod cluster;
pub mod credential;
mod dialer;
pub mod kubeconfig;
mod names;
mod proxy;
mod refusal;
mod registry;
mod secret_watch;
mod warm_connector;

pub use cluster::{Leaf, LeafError, proxy_url};
pub use proxy::{
    LeafProxy, PROXY_CA_KEY, PROXY_CLIENT_CERT_KEY, PROXY_CLIENT_KEY_KEY, ProxyTls, error_chain,
};
pub use refusal::SecretRefusal;
pub use registry::{Refused, Registry, load_static_leaf};
pub use secret_watch::{
    HOST_ACCESS_ANNOTATION, KUBECONFIG_KEY, NODE_NAME_ANNOTATION, SecretSource, watch_secrets,
};

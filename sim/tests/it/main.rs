//! The stand-ins' tests, as one test binary: the apiserver and kubelet stand-ins against real
//! clients (kubectl, kube-rs, raw protocol clients) and the real wire captures in
//! `testdata/captures/`. The `*support` modules are the helpers the others share.

mod apiserver_kube;
mod apiserver_kubectl;
mod apiserver_props;
mod apiserver_proxy;
mod captures;
mod kubelet_attach;
mod kubelet_exec_ws;
mod kubelet_logs;
mod kubelet_portforward;
mod kubelet_proxy;
mod kubelet_proxy_e2e;
mod kubelet_proxy_kubectl;
mod kubelet_spdy;
// The modules that share it use some of its helpers, none uses all.
#[allow(dead_code)]
mod kubelet_support;
// The modules that share it use some of its helpers, none uses all.
#[allow(dead_code)]
mod proxy_support;
mod spdy_conn;
mod spdy_frames;
// The modules that share it use some of its helpers, none uses all.
#[allow(dead_code)]
mod support;

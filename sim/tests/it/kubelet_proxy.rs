//! The apiserver -> kubelet proxy against a small real kubelet-like server over TLS.
//!
//! The "kubelet" here is the upstream protocol on the wire (our SPDY server role, WebSocket v4
//! framing) with trivial behaviour, so each test can see exactly what reached it. Clients are
//! real where it matters: kube-rs' `AttachedProcess` (WebSocket v5, translated to SPDY by the
//! proxy), tungstenite (WebSocket v4 passthrough and the port-forward tunnel), and our SPDY
//! client for SPDY passthrough.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, Request, StatusCode, header};
use k8s_openapi::api::core::v1::{
    Container, DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeStatus, Pod, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use relaylet_sim::channel::{self, ChannelMessage, Protocol};
use relaylet_sim::kubelet_proxy::{KubeletClient, PodSubresource};
use relaylet_sim::serve::{Served, serve_tls};
use relaylet_sim::spdy;
use relaylet_sim::tls::{Ca, Identity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role as WsRole;

use crate::proxy_support as support;

const T: Duration = Duration::from_secs(10);

const KUBELET_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

// ---------------------------------------------------------------- node endpoint selection

fn node(addresses: &[(&str, &str)], port: Option<i32>, hostname_label: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            labels: hostname_label
                .map(|h| BTreeMap::from([("kubernetes.io/hostname".to_string(), h.to_string())])),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(
                addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.to_string(),
                        address: a.to_string(),
                    })
                    .collect(),
            ),
            daemon_endpoints: port.map(|p| NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint { port: p }),
            }),
            ..NodeStatus::default()
        }),
    }
}

fn client_with(tls: Arc<rustls::ClientConfig>, order: Option<&[&str]>) -> KubeletClient {
    let mut client = KubeletClient::new(tls);
    if let Some(order) = order {
        client.preferred_address_types = order.iter().map(|s| s.to_string()).collect();
    }
    client
}

fn any_tls() -> Arc<rustls::ClientConfig> {
    Ca::new("t")
        .expect("ca")
        .client_config(None)
        .expect("client config")
}

#[test]
fn endpoint_follows_the_upstream_default_order() {
    let client = client_with(any_tls(), None);
    assert_eq!(client.default_port, 10250);
    let n = node(&[("InternalDNS", "A"), ("InternalIP", "B")], None, None);
    assert_eq!(
        client.node_endpoint(&n).expect("endpoint"),
        ("A".to_string(), 10250)
    );
    // InternalIP listed first in the Node does not matter: the type order does.
    let n = node(
        &[("InternalIP", "B"), ("InternalDNS", "A")],
        Some(11250),
        None,
    );
    assert_eq!(
        client.node_endpoint(&n).expect("endpoint"),
        ("A".to_string(), 11250)
    );
}

#[test]
fn endpoint_follows_a_configured_order_and_port() {
    let client = client_with(any_tls(), Some(&["InternalIP", "InternalDNS", "Hostname"]));
    let n = node(&[("InternalDNS", "A"), ("InternalIP", "B")], Some(0), None);
    assert_eq!(
        client.node_endpoint(&n).expect("endpoint"),
        ("B".to_string(), 10250),
        "port 0 means the default"
    );
    let n = node(
        &[("InternalDNS", "A"), ("InternalIP", "B")],
        Some(10443),
        None,
    );
    assert_eq!(client.node_endpoint(&n).expect("endpoint").1, 10443);
}

#[test]
fn hostname_label_stands_in_for_a_missing_hostname_address() {
    let client = client_with(any_tls(), None);
    let n = node(
        &[("InternalDNS", "A"), ("InternalIP", "B")],
        None,
        Some("labelled-host"),
    );
    assert_eq!(
        client.node_endpoint(&n).expect("endpoint").0,
        "labelled-host",
        "upstream falls back to the kubernetes.io/hostname label before InternalDNS"
    );
    let n = node(
        &[("Hostname", "H"), ("InternalDNS", "A")],
        None,
        Some("label"),
    );
    assert_eq!(client.node_endpoint(&n).expect("endpoint").0, "H");
    let only_external = node(&[("ExternalIP", "E")], None, None);
    let err = client_with(any_tls(), Some(&["InternalIP"]))
        .node_endpoint(&only_external)
        .expect_err("no match");
    assert_eq!(
        err.to_string(),
        "no preferred addresses found; known addresses: [{ExternalIP E}]"
    );
}

// ---------------------------------------------------------------- the test kubelet

/// What the kubelet saw.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<(String, String, HeaderMap)>>,
    stream_types: Mutex<Vec<String>>,
    resizes: Mutex<Vec<String>>,
    log_client_gone: Mutex<Option<mpsc::Sender<()>>>,
    spdy_closed: Mutex<Option<mpsc::Sender<()>>>,
}

impl Seen {
    fn record(&self, req: &Request<Body>) {
        let uri = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default();
        if let Ok(mut requests) = self.requests.lock() {
            requests.push((req.method().to_string(), uri, req.headers().clone()));
        }
    }

    fn last(&self) -> (String, String, HeaderMap) {
        self.requests
            .lock()
            .expect("lock")
            .last()
            .cloned()
            .expect("a request reached the kubelet")
    }
}

type Shared = Arc<Seen>;

fn is_ws(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

fn flag(query: &str, key: &str) -> bool {
    query.split('&').any(|kv| kv == format!("{key}=1"))
}

/// `/exec` and `/attach`: SPDY (v4, like the kubelet) or WebSocket v4.
async fn kubelet_exec(State(seen): State<Shared>, mut req: Request<Body>) -> Response {
    seen.record(&req);
    if is_ws(req.headers()) {
        return kubelet_ws_exec(req);
    }
    let query = req.uri().query().unwrap_or("").to_string();
    let protocol = match spdy::negotiate(req.headers(), KUBELET_PROTOCOLS) {
        Ok(Some(p)) => p,
        Ok(None) => return spdy::missing_protocol_response(),
        Err(err) => return err.into_response(),
    };
    let (response, accepting) = match spdy::accept(&mut req, Some(&protocol)) {
        Ok(pair) => pair,
        Err(refusal) => return refusal,
    };
    tokio::spawn(async move {
        let Ok((conn, mut incoming)) = accepting.connection().await else {
            return;
        };
        let tty = flag(&query, "tty");
        let expected = 1
            + usize::from(flag(&query, "input"))
            + usize::from(flag(&query, "output"))
            + usize::from(flag(&query, "error") && !tty)
            + usize::from(tty);
        let mut streams = BTreeMap::new();
        while streams.len() < expected {
            let Some(stream) = incoming.next().await else {
                return;
            };
            let ty = stream.header("streamType").unwrap_or("").to_string();
            seen.stream_types.lock().expect("lock").push(ty.clone());
            if stream.reply().await.is_err() {
                return;
            }
            streams.insert(ty, stream);
        }
        let mut input = Vec::new();
        if let Some(mut stdin) = streams.remove("stdin") {
            let _ = stdin.read_to_end(&mut input).await;
        }
        if let Some(mut resize) = streams.remove("resize") {
            // Resize events arrive before stdin closes; collect what is there.
            let mut buf = vec![0u8; 1024];
            if let Ok(Ok(n)) = timeout(Duration::from_millis(300), resize.read(&mut buf)).await {
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                seen.resizes.lock().expect("lock").push(text);
            }
        }
        if let Some(mut stdout) = streams.remove("stdout") {
            let _ = stdout.write_all(b"out:").await;
            let _ = stdout.write_all(&input).await;
            let _ = stdout.shutdown().await;
        }
        if let Some(mut stderr) = streams.remove("stderr") {
            let _ = stderr.write_all(b"err\n").await;
            let _ = stderr.shutdown().await;
        }
        if let Some(mut error) = streams.remove("error") {
            let status = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
            let _ = error.write_all(status).await;
            let _ = error.reset().await;
        }
        // Hold the session open if nobody wrote stdin... the client decides when it ends.
        let closed = seen.spdy_closed.lock().expect("lock").clone();
        tokio::select! {
            _ = conn.closed() => {}
            _ = tokio::time::sleep(Duration::from_millis(200)) => conn.goaway().await,
        }
        if let Some(closed) = closed {
            let _ = closed.send(()).await;
        }
    });
    response
}

/// WebSocket v4 exec like the kubelet's: "connected" on stdout, output, exit 5, close.
fn kubelet_ws_exec(mut req: Request<Body>) -> Response {
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(upgraded),
            WsRole::Server,
            None,
        )
        .await;
        let status = br#"{"metadata":{},"status":"Failure","message":"exit code 5","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"5"}]}}"#;
        for (ch, data) in [
            (channel::STDOUT, &b""[..]),
            (channel::STDOUT, b"via-ws\n"),
            (channel::ERROR, status),
        ] {
            let msg = channel::data(Protocol::V4, ch, data).expect("encode");
            if ws.send(msg).await.is_err() {
                return;
            }
        }
        let _ = ws.close(None).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(
            header::SEC_WEBSOCKET_ACCEPT,
            derive_accept_key(key.as_bytes()),
        )
        .header(header::SEC_WEBSOCKET_PROTOCOL, "v4.channel.k8s.io")
        .body(Body::empty())
        .unwrap_or_default()
}

/// `/portForward`: SPDY `portforward.k8s.io`; data streams echo, error streams stay silent.
async fn kubelet_port_forward(State(seen): State<Shared>, mut req: Request<Body>) -> Response {
    seen.record(&req);
    let protocol = match spdy::negotiate(req.headers(), &["portforward.k8s.io"]) {
        Ok(Some(p)) => p,
        Ok(None) => return spdy::missing_protocol_response(),
        Err(err) => return err.into_response(),
    };
    let (response, accepting) = match spdy::accept(&mut req, Some(&protocol)) {
        Ok(pair) => pair,
        Err(refusal) => return refusal,
    };
    tokio::spawn(async move {
        let Ok((conn, mut incoming)) = accepting.connection().await else {
            return;
        };
        let mut held = Vec::new();
        while let Some(stream) = incoming.next().await {
            if stream.reply().await.is_err() {
                break;
            }
            seen.stream_types.lock().expect("lock").push(format!(
                "{} port={}",
                stream.header("streamType").unwrap_or(""),
                stream.header("port").unwrap_or("")
            ));
            if stream.header("streamType") == Some("data") {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            } else {
                held.push(stream);
            }
        }
        drop(conn);
    });
    response
}

/// A log body that can be followed; its drop tells the test that the client went away.
struct Gone(Option<mpsc::Sender<()>>);

impl Drop for Gone {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.try_send(());
        }
    }
}

async fn kubelet_logs(State(seen): State<Shared>, req: Request<Body>) -> Response {
    seen.record(&req);
    let query = req.uri().query().unwrap_or("").to_string();
    if req.uri().path().ends_with("/missing") {
        return (StatusCode::NOT_FOUND, "container \"missing\" not found").into_response();
    }
    let follow = query.contains("follow=true");
    let gone = Gone(seen.log_client_gone.lock().expect("lock").clone());
    let lines = futures::stream::unfold((0u32, gone), move |(i, gone)| async move {
        if !follow && i == 3 {
            return None;
        }
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let line = Bytes::from(format!("line {i}\n"));
        Some((Ok::<_, std::io::Error>(line), (i + 1, gone)))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from_stream(lines))
        .unwrap_or_default()
}

async fn kubelet_other(State(seen): State<Shared>, req: Request<Body>) -> Response {
    seen.record(&req);
    let auth = req.headers().contains_key(header::AUTHORIZATION);
    format!("kubelet saw {} auth={auth}", req.uri()).into_response()
}

// ---------------------------------------------------------------- the test apiserver

struct Cluster {
    seen: Shared,
    _kubelet: Served,
    apiserver: Served,
    ca: Ca,
    user: Identity,
}

fn test_pod(containers: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: containers
                .iter()
                .map(|n| Container {
                    name: n.to_string(),
                    ..Container::default()
                })
                .collect(),
            node_name: Some("n1".into()),
            ..PodSpec::default()
        }),
        status: None,
    }
}

#[derive(Clone)]
struct Api {
    client: KubeletClient,
    node: Node,
}

async fn api_pod(
    State(api): State<Api>,
    Path((_ns, name, sub)): Path<(String, String, String)>,
    req: Request<Body>,
) -> Response {
    let Some(sub) = PodSubresource::from_name(&sub) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let pod = match name.as_str() {
        "multi" => test_pod(&["a", "b"]),
        // The apiserver knows a container "missing" the kubelet has never heard of.
        "gone" => test_pod(&["main", "missing"]),
        _ => test_pod(&["main"]),
    };
    api.client.proxy_pod(req, &pod, &api.node, sub).await
}

async fn api_node(
    State(api): State<Api>,
    Path((_n, path)): Path<(String, String)>,
    req: Request<Body>,
) -> Response {
    api.client.proxy_node(req, &api.node, &path).await
}

async fn cluster() -> Cluster {
    cluster_with(&[], true).await
}

/// A cluster whose Node declares `features`, behind an apiserver with the
/// `ExtendWebSocketsToKubelet` gate set to `gate`.
async fn cluster_with(features: &[&str], gate: bool) -> Cluster {
    let ca = Ca::new("test-ca").expect("ca");
    let seen: Shared = Arc::new(Seen::default());
    let kubelet_id = ca.issue_server(&["127.0.0.1"]).expect("kubelet cert");
    let kubelet_app = Router::new()
        .route("/exec/{ns}/{pod}/{c}", any(kubelet_exec))
        .route("/attach/{ns}/{pod}/{c}", any(kubelet_exec))
        .route("/portForward/{ns}/{pod}", any(kubelet_port_forward))
        .route("/containerLogs/{ns}/{pod}/{c}", any(kubelet_logs))
        .fallback(kubelet_other)
        .with_state(seen.clone());
    let kubelet = serve_tls(
        TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        ca.server_config_requiring_clients(&kubelet_id)
            .expect("tls"),
        kubelet_app,
    );
    let apiserver_client = ca
        .issue_client("kube-apiserver-kubelet-client", &[])
        .expect("id");
    let mut client = KubeletClient::new(ca.client_config(Some(&apiserver_client)).expect("tls"));
    client.extend_websockets_to_kubelet = gate;
    let mut node = node(
        &[("InternalIP", "127.0.0.1"), ("ExternalIP", "192.0.2.1")],
        Some(i32::from(kubelet.addr.port())),
        None,
    );
    if let Some(status) = node.status.as_mut() {
        status.declared_features = Some(features.iter().map(|f| f.to_string()).collect());
    }
    let api = Api { client, node };
    let api_id = ca.issue_server(&["127.0.0.1"]).expect("api cert");
    let api_app = Router::new()
        .route("/api/v1/namespaces/{ns}/pods/{name}/{sub}", any(api_pod))
        .route("/api/v1/nodes/{name}/proxy/{*path}", any(api_node))
        .with_state(api);
    let apiserver = serve_tls(
        TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        ca.server_config_optional_clients(&api_id).expect("tls"),
        api_app,
    );
    let user = ca.issue_client("alice", &[]).expect("user");
    Cluster {
        seen,
        _kubelet: kubelet,
        apiserver,
        ca,
        user,
    }
}

impl Cluster {
    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.apiserver.addr.port())
    }

    fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.ca.client_config(Some(&self.user)).expect("tls")
    }

    async fn kube_client(&self) -> kube::Client {
        let mut config = kube::Config::new(self.url("").parse().expect("uri"));
        config.root_cert = Some(vec![self.ca.cert_der().to_vec()]);
        config.default_namespace = "ns1".into();
        kube::Client::try_from(config).expect("kube client")
    }

    /// A plain HTTPS GET through the apiserver; returns status, headers and the body.
    async fn get(&self, path_and_query: &str) -> (StatusCode, HeaderMap, Vec<u8>) {
        let (mut sender, _conn) = self.http1().await;
        let req = Request::get(path_and_query)
            .header(header::HOST, "127.0.0.1")
            .header(header::AUTHORIZATION, "Bearer secret-token")
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let response = timeout(T, sender.send_request(req))
            .await
            .expect("in time")
            .expect("response");
        let (parts, body) = response.into_parts();
        let bytes = timeout(T, http_body_util::BodyExt::collect(body))
            .await
            .expect("in time")
            .expect("body")
            .to_bytes();
        (parts.status, parts.headers, bytes.to_vec())
    }

    async fn http1(
        &self,
    ) -> (
        hyper::client::conn::http1::SendRequest<http_body_util::Empty<Bytes>>,
        tokio::task::JoinHandle<()>,
    ) {
        let tcp = tokio::net::TcpStream::connect(self.apiserver.addr)
            .await
            .expect("connect");
        let tls = tokio_rustls::TlsConnector::from(self.tls())
            .connect(
                rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name"),
                tcp,
            )
            .await
            .expect("tls");
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("handshake");
        let driver = tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        (sender, driver)
    }

    async fn websocket(
        &self,
        path_and_query: &str,
        protocols: &str,
    ) -> Result<
        (
            tokio_tungstenite::WebSocketStream<
                tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
            >,
            http::Response<Option<Vec<u8>>>,
        ),
        tokio_tungstenite::tungstenite::Error,
    > {
        let mut request = self
            .url(path_and_query)
            .replace("https://", "wss://")
            .into_client_request()
            .expect("request");
        request.headers_mut().insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            protocols.parse().expect("header"),
        );
        let tcp = tokio::net::TcpStream::connect(self.apiserver.addr)
            .await
            .expect("connect");
        let tls = tokio_rustls::TlsConnector::from(self.tls())
            .connect(
                rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name"),
                tcp,
            )
            .await
            .expect("tls");
        tokio_tungstenite::client_async(request, tls).await
    }
}

// ---------------------------------------------------------------- streaming through the proxy

#[tokio::test]
async fn kube_rs_v5_exec_is_translated_to_spdy() {
    let c = cluster().await;
    let pods: kube::Api<Pod> = kube::Api::namespaced(c.kube_client().await, "ns1");
    let params = kube::api::AttachParams::default()
        .stdin(true)
        .stdout(true)
        .stderr(true);
    let mut attached = timeout(
        T,
        pods.exec("web", vec!["sh", "-c", "cat; exit 3"], &params),
    )
    .await
    .expect("in time")
    .expect("exec");
    let mut stdin = attached.stdin().expect("stdin");
    let mut stdout = attached.stdout().expect("stdout");
    let mut stderr = attached.stderr().expect("stderr");
    let status = attached.take_status().expect("status");
    stdin.write_all(b"hello\n").await.expect("stdin");
    // v5 lets the client close stdin; the translator turns that into a SPDY FIN.
    stdin.shutdown().await.expect("close stdin");
    let mut out = Vec::new();
    timeout(T, stdout.read_to_end(&mut out))
        .await
        .expect("in time")
        .expect("stdout");
    let mut err = Vec::new();
    timeout(T, stderr.read_to_end(&mut err))
        .await
        .expect("in time")
        .expect("stderr");
    let status = timeout(T, status).await.expect("in time").expect("status");
    assert_eq!(out, b"out:hello\n");
    assert_eq!(err, b"err\n");
    assert_eq!(status.status.as_deref(), Some("Failure"));
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    assert_eq!(
        status.message.as_deref(),
        Some("command terminated with non-zero exit code: command terminated with exit code 3")
    );
    let cause = &status.details.expect("details").causes.expect("causes")[0];
    assert_eq!(cause.reason.as_deref(), Some("ExitCode"));
    assert_eq!(cause.message.as_deref(), Some("3"));
    let _ = timeout(T, attached.join()).await;

    let (method, uri, headers) = c.seen.last();
    assert_eq!(
        method, "POST",
        "client-go's executor POSTs the SPDY upgrade"
    );
    assert_eq!(
        uri,
        "/exec/ns1/web/main?command=sh&command=-c&command=cat%3B+exit+3&error=1&input=1&output=1"
    );
    let offered: Vec<&str> = headers
        .get_all("X-Stream-Protocol-Version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert_eq!(offered[0], "v5.channel.k8s.io");
    assert_eq!(offered.len(), 5);
    assert_eq!(
        *c.seen.stream_types.lock().expect("lock"),
        ["error", "stdin", "stdout", "stderr"]
    );
}

#[tokio::test]
async fn v5_tty_resize_reaches_the_spdy_resize_stream() {
    let c = cluster().await;
    let (mut ws, response) = timeout(
        T,
        c.websocket(
            "/api/v1/namespaces/ns1/pods/web/attach?container=main&stdout=true&tty=true",
            "v5.channel.k8s.io, v4.channel.k8s.io",
        ),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    assert_eq!(
        response
            .headers()
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .map(|v| v.as_bytes()),
        Some(&b"v5.channel.k8s.io"[..])
    );
    ws.send(
        channel::data(
            Protocol::V5,
            channel::RESIZE,
            br#"{"Width":132,"Height":50}"#,
        )
        .expect("enc"),
    )
    .await
    .expect("resize");
    let mut messages = Vec::new();
    while let Some(Ok(msg)) = timeout(T, ws.next()).await.expect("in time") {
        if let Some(m) = channel::decode(Protocol::V5, &msg).expect("v5 framing") {
            messages.push(m);
        }
    }
    assert_eq!(
        messages.first(),
        Some(&ChannelMessage::Data {
            channel: channel::STDOUT,
            data: Bytes::new()
        }),
        "the translator first says 'connected' on stdout"
    );
    assert!(messages.contains(&ChannelMessage::Data {
        channel: channel::STDOUT,
        data: Bytes::from_static(b"out:")
    }));
    let (_, uri, _) = c.seen.last();
    assert_eq!(uri, "/attach/ns1/web/main?output=1&tty=1");
    assert_eq!(
        *c.seen.stream_types.lock().expect("lock"),
        ["error", "stdout", "resize"]
    );
    assert_eq!(
        *c.seen.resizes.lock().expect("lock"),
        ["{\"Width\":132,\"Height\":50}\n"]
    );
}

#[tokio::test]
async fn spdy_exec_passes_through_byte_for_byte() {
    let c = cluster().await;
    let url = c
        .url("/api/v1/namespaces/ns1/pods/web/exec?command=cat&stdin=true&stdout=true&stderr=true");
    let (protocol, conn, _incoming) = timeout(
        T,
        spdy::upgrade_client(
            &url,
            c.tls(),
            &["v5.channel.k8s.io", "v4.channel.k8s.io"],
            &[("Authorization".into(), "Bearer secret".into())],
        ),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    assert_eq!(
        protocol, "v4.channel.k8s.io",
        "the kubelet's choice is relayed"
    );
    let open = |ty: &str| conn.open_stream(vec![("streamType".into(), ty.into())]);
    let mut error = open("error").await.expect("error");
    let mut stdin = open("stdin").await.expect("stdin");
    let mut stdout = open("stdout").await.expect("stdout");
    let mut stderr = open("stderr").await.expect("stderr");
    stdin.write_all(b"abc").await.expect("write");
    stdin.shutdown().await.expect("fin");
    let mut out = Vec::new();
    timeout(T, stdout.read_to_end(&mut out))
        .await
        .expect("in time")
        .expect("read");
    let mut err = Vec::new();
    timeout(T, stderr.read_to_end(&mut err))
        .await
        .expect("in time")
        .expect("read");
    let mut status = Vec::new();
    timeout(T, error.read_to_end(&mut status))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(out, b"out:abc");
    assert_eq!(err, b"err\n");
    // The kubelet's own Status, untouched (no translation on the SPDY path).
    assert!(status.starts_with(br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command"#));
    let (method, uri, headers) = c.seen.last();
    assert_eq!(method, "POST");
    assert_eq!(
        uri,
        "/exec/ns1/web/main?command=cat&error=1&input=1&output=1"
    );
    assert!(
        !headers.contains_key(header::AUTHORIZATION),
        "credentials stay at the apiserver"
    );
    assert_eq!(
        headers.get_all("X-Stream-Protocol-Version").iter().count(),
        2
    );
}

#[tokio::test]
async fn closing_the_client_closes_the_kubelet_side() {
    let c = cluster().await;
    let (tx, mut rx) = mpsc::channel(1);
    *c.seen.spdy_closed.lock().expect("lock") = Some(tx);
    let url = c.url("/api/v1/namespaces/ns1/pods/web/exec?command=cat&stdin=true&stdout=true");
    let (_, conn, _incoming) = timeout(
        T,
        spdy::upgrade_client(&url, c.tls(), &["v4.channel.k8s.io"], &[]),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    let _error = conn
        .open_stream(vec![("streamType".into(), "error".into())])
        .await
        .expect("open");
    let _stdin = conn
        .open_stream(vec![("streamType".into(), "stdin".into())])
        .await
        .expect("open");
    let _stdout = conn
        .open_stream(vec![("streamType".into(), "stdout".into())])
        .await
        .expect("open");
    // The kubelet now waits for stdin forever; cutting the client must end its session.
    conn.abort();
    timeout(T, rx.recv())
        .await
        .expect("kubelet saw the cut")
        .expect("signal");
}

#[tokio::test]
async fn refused_upgrades_are_relayed_with_status_and_headers() {
    let c = cluster().await;
    let url = c.url("/api/v1/namespaces/ns1/pods/web/exec?command=true&stdout=true");
    let err = timeout(
        T,
        spdy::upgrade_client(&url, c.tls(), &["v9.channel.k8s.io"], &[]),
    )
    .await
    .expect("in time")
    .expect_err("refused");
    let spdy::UpgradeError::Status {
        status,
        headers,
        body,
    } = err
    else {
        panic!("expected the kubelet's refusal, got {err}");
    };
    assert_eq!(status, StatusCode::FORBIDDEN);
    let accepted: Vec<&str> = headers
        .get_all("X-Accepted-Stream-Protocol-Versions")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert_eq!(accepted, KUBELET_PROTOCOLS);
    assert!(String::from_utf8_lossy(&body).contains("unable to negotiate protocol"));
}

#[tokio::test]
async fn websocket_v4_is_passed_through() {
    let c = cluster().await;
    let (mut ws, response) = timeout(
        T,
        c.websocket(
            "/api/v1/namespaces/ns1/pods/web/exec?command=echo&command=via-ws&stdout=true",
            "v4.channel.k8s.io",
        ),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    assert_eq!(
        response
            .headers()
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .map(|v| v.as_bytes()),
        Some(&b"v4.channel.k8s.io"[..])
    );
    let mut stdout = Vec::new();
    let mut status = Vec::new();
    while let Some(Ok(msg)) = timeout(T, ws.next()).await.expect("in time") {
        match channel::decode(Protocol::V4, &msg).expect("v4") {
            Some(ChannelMessage::Data { channel: 1, data }) => stdout.extend_from_slice(&data),
            Some(ChannelMessage::Data { channel: 3, data }) => status.extend_from_slice(&data),
            _ => {}
        }
    }
    assert_eq!(stdout, b"via-ws\n");
    let status: serde_json::Value = serde_json::from_slice(&status).expect("status");
    assert_eq!(status["details"]["causes"][0]["message"], "5");
    let (method, uri, headers) = c.seen.last();
    assert_eq!(method, "GET");
    assert_eq!(
        uri,
        "/exec/ns1/web/main?command=echo&command=via-ws&output=1"
    );
    assert_eq!(
        headers
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .map(|v| v.as_bytes()),
        Some(&b"v4.channel.k8s.io"[..])
    );
}

#[tokio::test]
async fn port_forward_tunnels_spdy_through_websocket() {
    let c = cluster().await;
    let (ws, response) = timeout(
        T,
        c.websocket(
            "/api/v1/namespaces/ns1/pods/web/portforward?ports=8080",
            "SPDY/3.1+portforward.k8s.io",
        ),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    // SPDY over the WebSocket's binary messages, as kubectl does.
    let tunnel = support::tunnelled_port_forward(ws, &response, 8080, 0).await;
    let mut data = tunnel.data;
    data.write_all(b"ping through the tunnel")
        .await
        .expect("write");
    data.shutdown().await.expect("fin");
    let mut back = Vec::new();
    timeout(T, data.read_to_end(&mut back))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(back, b"ping through the tunnel");
    let (method, uri, headers) = c.seen.last();
    assert_eq!(method, "POST");
    assert_eq!(uri, "/portForward/ns1/web?port=8080");
    assert_eq!(
        headers
            .get("X-Stream-Protocol-Version")
            .map(|v| v.as_bytes()),
        Some(&b"portforward.k8s.io"[..])
    );
    assert!(!headers.contains_key(header::SEC_WEBSOCKET_KEY));
    assert_eq!(
        *c.seen.stream_types.lock().expect("lock"),
        ["error port=8080", "data port=8080"]
    );
}

#[tokio::test]
async fn tunnel_requests_need_a_kubernetes_spdy_protocol() {
    let c = cluster().await;
    let refused = |err: tokio_tungstenite::tungstenite::Error| match err {
        tokio_tungstenite::tungstenite::Error::Http(response) => (
            response.status(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).to_string(),
        ),
        other => panic!("expected an HTTP refusal, got {other}"),
    };
    let err = timeout(
        T,
        c.websocket(
            "/api/v1/namespaces/ns1/pods/web/portforward",
            "SPDY/3.1+portforward.example.com",
        ),
    )
    .await
    .expect("in time")
    .expect_err("refused");
    assert_eq!(
        refused(err),
        (
            StatusCode::BAD_REQUEST,
            "unable to upgrade: no tunneling spdy protocols provided\n".to_string()
        )
    );
    assert!(c.seen.requests.lock().expect("lock").is_empty());
    // Without the tunnelling prefix the request is passed through; this kubelet only speaks
    // SPDY port-forward and answers the WebSocket with its own 400, which is relayed.
    let err = timeout(
        T,
        c.websocket(
            "/api/v1/namespaces/ns1/pods/web/portforward",
            "v4.channel.k8s.io",
        ),
    )
    .await
    .expect("in time")
    .expect_err("refused by the kubelet");
    let (status, body) = refused(err);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.contains("X-Stream-Protocol-Version is required"),
        "{body}"
    );
}

#[tokio::test]
async fn nodes_declaring_extend_websockets_get_websockets_untouched() {
    let c = cluster_with(&["ExtendWebSocketsToKubelet"], true).await;
    let (mut ws, response) = timeout(
        T,
        c.websocket(
            "/api/v1/namespaces/ns1/pods/web/exec?command=echo&stdout=true",
            "v5.channel.k8s.io, v4.channel.k8s.io",
        ),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    // The kubelet itself answered (this one picks v4), nothing was translated.
    assert_eq!(
        response
            .headers()
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .map(|v| v.as_bytes()),
        Some(&b"v4.channel.k8s.io"[..])
    );
    while let Some(Ok(_)) = timeout(T, ws.next()).await.expect("in time") {}
    let (method, uri, headers) = c.seen.last();
    assert_eq!(method, "GET");
    assert_eq!(uri, "/exec/ns1/web/main?command=echo&output=1");
    assert_eq!(
        headers
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .map(|v| v.as_bytes()),
        Some(&b"v5.channel.k8s.io, v4.channel.k8s.io"[..])
    );
    // The port-forward tunnel request also goes to the kubelet as the WebSocket it is.
    let _ = timeout(
        T,
        c.websocket(
            "/api/v1/namespaces/ns1/pods/web/portforward?ports=8080",
            "SPDY/3.1+portforward.k8s.io",
        ),
    )
    .await
    .expect("in time");
    let (method, uri, headers) = c.seen.last();
    assert_eq!(
        (method.as_str(), uri.as_str()),
        ("GET", "/portForward/ns1/web?port=8080")
    );
    assert_eq!(
        headers.get(header::UPGRADE).map(|v| v.as_bytes()),
        Some(&b"websocket"[..])
    );
}

#[tokio::test]
async fn without_the_gate_declared_websockets_are_still_translated() {
    let c = cluster_with(&["ExtendWebSocketsToKubelet"], false).await;
    let (mut ws, response) = timeout(
        T,
        c.websocket(
            "/api/v1/namespaces/ns1/pods/web/exec?command=echo&stdout=true",
            "v5.channel.k8s.io",
        ),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    assert_eq!(
        response
            .headers()
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .map(|v| v.as_bytes()),
        Some(&b"v5.channel.k8s.io"[..])
    );
    while let Some(Ok(_)) = timeout(T, ws.next()).await.expect("in time") {}
    let (method, _, headers) = c.seen.last();
    assert_eq!(method, "POST", "translated to a SPDY upgrade");
    assert!(headers.get(header::SEC_WEBSOCKET_PROTOCOL).is_none());
}

// ---------------------------------------------------------------- logs, errors, node proxy

#[tokio::test]
async fn logs_stream_chunk_by_chunk_and_stop_when_the_client_goes() {
    let c = cluster().await;
    let (tx, mut rx) = mpsc::channel(1);
    *c.seen.log_client_gone.lock().expect("lock") = Some(tx);
    let (mut sender, driver) = c.http1().await;
    let req = Request::get("/api/v1/namespaces/ns1/pods/web/log?follow=true&tailLines=10")
        .header(header::HOST, "127.0.0.1")
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("request");
    let response = timeout(T, sender.send_request(req))
        .await
        .expect("in time")
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.as_bytes()),
        Some(&b"text/plain"[..])
    );
    let mut body = response.into_body();
    let mut got = Vec::new();
    // Lines arrive while the kubelet is still writing: streamed, not buffered.
    while got.len() < 3 {
        let frame = timeout(T, http_body_util::BodyExt::frame(&mut body))
            .await
            .expect("chunk in time")
            .expect("more")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            got.push(String::from_utf8_lossy(&data).to_string());
        }
    }
    assert_eq!(got[..3].join(""), "line 0\nline 1\nline 2\n");
    let (_, uri, _) = c.seen.last();
    assert_eq!(uri, "/containerLogs/ns1/web/main?follow=true&tailLines=10");
    drop(body);
    drop(sender);
    driver.abort();
    timeout(T, rx.recv())
        .await
        .expect("the kubelet's log stream ends when the client goes")
        .expect("signal");
}

#[tokio::test]
async fn bad_requests_never_reach_the_kubelet() {
    let c = cluster().await;
    let (status, _, body) = c
        .get("/api/v1/namespaces/ns1/pods/web/log?tailLines=-1")
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let body: serde_json::Value = serde_json::from_slice(&body).expect("status");
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["details"]["causes"][0]["field"], "tailLines");

    let (status, _, body) = c
        .get("/api/v1/namespaces/ns1/pods/multi/exec?command=ls&stdout=true")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: serde_json::Value = serde_json::from_slice(&body).expect("status");
    assert_eq!(
        body["message"],
        "a container name must be specified for pod web, choose one of: [a b]"
    );

    let (status, _, body) = c
        .get("/api/v1/namespaces/ns1/pods/web/exec?container=nope&command=ls")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("container nope is not valid for pod web"));

    let (status, _, body) = c
        .get("/api/v1/namespaces/ns1/pods/web/exec?command=ls&stdout=true")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "exec needs an upgrade");
    assert!(String::from_utf8_lossy(&body).contains("Upgrade request required"));
    assert!(c.seen.requests.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn kubelet_log_errors_become_status_errors() {
    let c = cluster().await;
    // "missing" is not a container of pod "web": rejected before the kubelet.
    let (status, _, _) = c
        .get("/api/v1/namespaces/ns1/pods/web/log?container=missing")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(c.seen.requests.lock().expect("lock").is_empty());
    // Pod "gone" has a container "missing" that the kubelet does not know: its 404 text
    // becomes the apiserver's NotFound Status.
    let (status, _, body) = c
        .get("/api/v1/namespaces/ns1/pods/gone/log?container=missing")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let body: serde_json::Value = serde_json::from_slice(&body).expect("status");
    assert_eq!(body["reason"], "NotFound");
    assert_eq!(
        body["message"],
        "the server could not find the requested resource ( pods/log web)"
    );
    assert_eq!(body["details"]["kind"], "pods/log");
    let (status, headers, body) = c.get("/api/v1/namespaces/ns1/pods/web/log").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
        Some(&b"text/plain"[..])
    );
    assert_eq!(body, b"line 0\nline 1\nline 2\n");
}

#[tokio::test]
async fn node_proxy_relays_plain_requests_without_credentials() {
    let c = cluster().await;
    let (status, _, body) = c.get("/api/v1/nodes/n1/proxy/healthz?verbose=1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        String::from_utf8_lossy(&body),
        "kubelet saw /healthz?verbose=1 auth=false"
    );
}

#[tokio::test]
async fn unreachable_kubelets_are_reported() {
    let ca = Ca::new("x").expect("ca");
    let client = KubeletClient::new(ca.client_config(None).expect("tls"));
    // A port nobody listens on.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let dead = node(&[("InternalIP", "127.0.0.1")], Some(i32::from(port)), None);
    let req = Request::get("/api/v1/namespaces/ns1/pods/web/exec?command=ls&stdout=true")
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .body(Body::empty())
        .expect("req");
    let response = client
        .proxy_pod(req, &test_pod(&["main"]), &dead, PodSubresource::Exec)
        .await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("body")
        .to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).expect("status");
    assert!(
        body["message"]
            .as_str()
            .expect("message")
            .starts_with("error dialing backend: dial tcp 127.0.0.1:"),
        "{body}"
    );
}

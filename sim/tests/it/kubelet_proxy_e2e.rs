//! End to end: real clients -> a minimal apiserver route using `KubeletClient` -> the kubelet
//! stand-in running real processes.
//!
//! kube-rs (WebSocket v5 exec, translated to SPDY; WebSocket v4 port-forward, passed through),
//! our SPDY client (passthrough exec, and SPDY tunnelled in a WebSocket for port-forward) and a
//! plain HTTPS client (logs) all go through the proxy to `sh` processes and a TCP echo server.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Request, StatusCode, header};
use k8s_openapi::api::core::v1::{
    Container, DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeStatus, Pod, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use relaylet_sim::channel::{self, ChannelMessage, Protocol};
use relaylet_sim::kubelet::{ContainerRun, Kubelet, KubeletConfig, PodRun};
use relaylet_sim::kubelet_proxy::{KubeletClient, PodSubresource};
use relaylet_sim::serve::{Served, serve_tls};
use relaylet_sim::spdy;
use relaylet_sim::tls::{Ca, Identity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::proxy_support as support;

const T: Duration = Duration::from_secs(20);

struct Env {
    kubelet: Kubelet,
    apiserver: Served,
    ca: Ca,
    user: Identity,
    data_dir: std::path::PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.kubelet.stop();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

#[derive(Clone)]
struct Api {
    client: KubeletClient,
    node: Arc<Node>,
}

fn pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("uid-web".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            // "ghost" exists for the apiserver but not on the kubelet.
            containers: vec![
                Container {
                    name: "main".into(),
                    ..Container::default()
                },
                Container {
                    name: "ghost".into(),
                    ..Container::default()
                },
            ],
            node_name: Some("node-a".into()),
            ..PodSpec::default()
        }),
        status: None,
    }
}

async fn api_pod(
    State(api): State<Api>,
    Path((_ns, _name, sub)): Path<(String, String, String)>,
    req: Request<Body>,
) -> Response {
    let Some(sub) = PodSubresource::from_name(&sub) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    api.client.proxy_pod(req, &pod(), &api.node, sub).await
}

async fn env(test: &str) -> Env {
    env_with(test, &[]).await
}

/// An environment whose Node declares `features`.
async fn env_with(test: &str, features: &[&str]) -> Env {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = Ca::new("e2e-ca").expect("ca");
    let data_dir =
        std::env::temp_dir().join(format!("relaylet-proxy-e2e-{test}-{}", std::process::id()));
    let kubelet_id = ca.issue_server(&["127.0.0.1"]).expect("cert");
    let kubelet = Kubelet::start(KubeletConfig::new(
        "node-a",
        ca.server_config_requiring_clients(&kubelet_id)
            .expect("tls"),
        "127.0.0.1:0".parse().expect("addr"),
        &data_dir,
    ))
    .await
    .expect("kubelet");
    let echo = support::echo_server().await;
    kubelet
        .run_pod(PodRun {
            namespace: "default".into(),
            name: "web".into(),
            uid: "uid-web".into(),
            containers: vec![ContainerRun {
                name: "main".into(),
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done".into(),
                ],
                env: Vec::new(),
                stdin: false,
                tty: false,
                ports: vec![(8080, echo)],
            }],
        })
        .await
        .expect("pod");
    let node = Node {
        metadata: ObjectMeta {
            name: Some("node-a".into()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: "127.0.0.1".into(),
            }]),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(kubelet.addr.port()),
                }),
            }),
            declared_features: Some(features.iter().map(|f| f.to_string()).collect()),
            ..NodeStatus::default()
        }),
    };
    let apiserver_client = ca
        .issue_client("system:kube-apiserver", &["system:masters"])
        .expect("client cert");
    let api = Api {
        client: KubeletClient::new(ca.client_config(Some(&apiserver_client)).expect("tls")),
        node: Arc::new(node),
    };
    let api_id = ca.issue_server(&["127.0.0.1"]).expect("cert");
    let apiserver = serve_tls(
        TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        ca.server_config_optional_clients(&api_id).expect("tls"),
        Router::new()
            .route("/api/v1/namespaces/{ns}/pods/{name}/{sub}", any(api_pod))
            .with_state(api),
    );
    let user = ca.issue_client("alice", &[]).expect("user");
    Env {
        kubelet,
        apiserver,
        ca,
        user,
        data_dir,
    }
}

impl Env {
    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.apiserver.addr.port())
    }

    fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.ca.client_config(Some(&self.user)).expect("tls")
    }

    fn kube(&self) -> kube::Api<Pod> {
        let mut config = kube::Config::new(self.url("").parse().expect("uri"));
        config.root_cert = Some(vec![self.ca.cert_der().to_vec()]);
        let client = kube::Client::try_from(config).expect("client");
        kube::Api::namespaced(client, "default")
    }

    async fn websocket(
        &self,
        path: &str,
        protocols: &str,
    ) -> (
        tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
        http::Response<Option<Vec<u8>>>,
    ) {
        let mut request = self
            .url(path)
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
        timeout(T, tokio_tungstenite::client_async(request, tls))
            .await
            .expect("in time")
            .expect("upgrade")
    }
}

#[tokio::test]
async fn kube_rs_v5_exec_reaches_a_real_process_through_spdy() {
    let e = env("v5").await;
    let params = kube::api::AttachParams::default()
        .container("main")
        .stdin(true)
        .stdout(true)
        .stderr(true);
    let mut attached = timeout(
        T,
        e.kube().exec(
            "web",
            vec!["sh", "-c", "read x; echo got:$x; echo oops >&2; exit 7"],
            &params,
        ),
    )
    .await
    .expect("in time")
    .expect("exec");
    let mut stdin = attached.stdin().expect("stdin");
    let mut stdout = attached.stdout().expect("stdout");
    let mut stderr = attached.stderr().expect("stderr");
    let status = attached.take_status().expect("status");
    stdin.write_all(b"hi\n").await.expect("write");
    stdin.shutdown().await.expect("close stdin");
    let mut out = Vec::new();
    let mut err = Vec::new();
    timeout(T, stdout.read_to_end(&mut out))
        .await
        .expect("in time")
        .expect("stdout");
    timeout(T, stderr.read_to_end(&mut err))
        .await
        .expect("in time")
        .expect("stderr");
    let status = timeout(T, status).await.expect("in time").expect("status");
    assert_eq!(out, b"got:hi\n");
    assert_eq!(err, b"oops\n");
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    let causes = status.details.and_then(|d| d.causes).expect("causes");
    assert_eq!(causes[0].message.as_deref(), Some("7"));
}

#[tokio::test]
async fn v5_tty_resize_reaches_the_pty() {
    let e = env("tty").await;
    let (mut ws, _) = e
        .websocket(
            "/api/v1/namespaces/default/pods/web/exec?container=main&command=sh&command=-c&command=sleep+0.5%3B+stty+size&stdout=true&tty=true",
            "v5.channel.k8s.io",
        )
        .await;
    ws.send(
        channel::data(
            Protocol::V5,
            channel::RESIZE,
            br#"{"Width":132,"Height":50}"#,
        )
        .expect("encode"),
    )
    .await
    .expect("resize");
    let mut stdout = Vec::new();
    let mut status = Vec::new();
    while let Some(Ok(msg)) = timeout(T, ws.next()).await.expect("in time") {
        match channel::decode(Protocol::V5, &msg).expect("v5") {
            Some(ChannelMessage::Data { channel: 1, data }) => stdout.extend_from_slice(&data),
            Some(ChannelMessage::Data { channel: 3, data }) => status.extend_from_slice(&data),
            _ => {}
        }
    }
    assert_eq!(String::from_utf8_lossy(&stdout), "50 132\r\n");
    assert_eq!(status, br#"{"metadata":{},"status":"Success"}"#);
}

#[tokio::test]
async fn spdy_exec_passes_through_to_a_real_process() {
    let e = env("spdy").await;
    let url = e.url(
        "/api/v1/namespaces/default/pods/web/exec?container=main&command=sh&command=-c&command=echo+out%3B+exit+4&stdout=true&stderr=true",
    );
    let (protocol, conn, _incoming) = timeout(
        T,
        spdy::upgrade_client(
            &url,
            e.tls(),
            &[
                "v5.channel.k8s.io",
                "v4.channel.k8s.io",
                "v3.channel.k8s.io",
                "v2.channel.k8s.io",
                "channel.k8s.io",
            ],
            &[],
        ),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    assert!(protocol.starts_with('v'), "negotiated {protocol}");
    let open = |ty: &str| conn.open_stream(vec![("streamType".into(), ty.into())]);
    let mut error = timeout(T, open("error"))
        .await
        .expect("in time")
        .expect("error");
    let mut stdout = timeout(T, open("stdout"))
        .await
        .expect("in time")
        .expect("stdout");
    let mut stderr = timeout(T, open("stderr"))
        .await
        .expect("in time")
        .expect("stderr");
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
    assert_eq!(out, b"out\n");
    assert!(err.is_empty());
    let status: serde_json::Value = serde_json::from_slice(&status).expect("status");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "4");
}

#[tokio::test]
async fn kube_rs_port_forward_passes_through_websocket_v4() {
    let e = env("pf-v4").await;
    let mut pf = timeout(T, e.kube().portforward("web", &[8080]))
        .await
        .expect("in time")
        .expect("port-forward");
    let mut stream = pf.take_stream(8080).expect("stream");
    stream.write_all(b"hello port 8080").await.expect("write");
    let mut buf = vec![0u8; 15];
    timeout(T, stream.read_exact(&mut buf))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(buf, b"hello port 8080");
    drop(stream);
    pf.abort();
}

#[tokio::test]
async fn spdy_port_forward_tunnelled_in_websocket() {
    let e = env("pf-tunnel").await;
    let (ws, response) = e
        .websocket(
            "/api/v1/namespaces/default/pods/web/portforward",
            "SPDY/3.1+portforward.k8s.io",
        )
        .await;
    // SPDY over the WebSocket's binary messages, as kubectl does.
    let tunnel = support::tunnelled_port_forward(ws, &response, 8080, 1).await;
    let mut data = tunnel.data;
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let writer = async {
        data.write_all(&payload).await.expect("write");
        let mut back = vec![0u8; payload.len()];
        data.read_exact(&mut back).await.expect("read");
        back
    };
    let back = timeout(T, writer).await.expect("in time");
    assert!(back == payload, "echo through the tunnel");
}

#[tokio::test]
async fn logs_follow_through_the_proxy() {
    let e = env("logs").await;
    let tcp = tokio::net::TcpStream::connect(e.apiserver.addr)
        .await
        .expect("connect");
    let tls = tokio_rustls::TlsConnector::from(e.tls())
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name"),
            tcp,
        )
        .await
        .expect("tls");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("handshake");
    let driver = tokio::spawn(conn);
    let req = Request::get(
        "/api/v1/namespaces/default/pods/web/log?container=main&follow=true&timestamps=true",
    )
    .header(header::HOST, "127.0.0.1")
    .body(http_body_util::Empty::<Bytes>::new())
    .expect("request");
    let response = timeout(T, sender.send_request(req))
        .await
        .expect("in time")
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut text = String::new();
    // A followed log keeps growing: see at least three ticks arrive.
    while text.matches("tick ").count() < 3 {
        let frame = timeout(T, http_body_util::BodyExt::frame(&mut body))
            .await
            .expect("in time")
            .expect("more")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let first = text.lines().next().expect("a line");
    // timestamps=true reached the kubelet: RFC3339Nano, a space, then the line.
    let (stamp, line) = first.split_once(' ').expect("timestamped");
    assert!(stamp.ends_with('Z') && stamp.contains('T'), "{first}");
    assert!(line.starts_with("tick "), "{first}");
    drop(body);
    driver.abort();
}

#[tokio::test]
async fn v5_kubelet_refusal_arrives_as_a_status_after_the_websocket_opened() {
    let e = env("refused").await;
    let (mut ws, response) = e
        .websocket(
            "/api/v1/namespaces/default/pods/web/exec?container=ghost&command=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    let mut messages = Vec::new();
    let mut closed_normally = false;
    while let Some(Ok(msg)) = timeout(T, ws.next()).await.expect("in time") {
        if let Message::Close(frame) = &msg {
            closed_normally = frame.as_ref().map(|f| u16::from(f.code)) == Some(1000);
            continue;
        }
        if let Some(m) = channel::decode(Protocol::V5, &msg).expect("v5") {
            messages.push(m);
        }
    }
    assert!(closed_normally, "the translator closes with 1000");
    let status = messages
        .iter()
        .find_map(|m| match m {
            ChannelMessage::Data { channel: 3, data } => Some(data.clone()),
            _ => None,
        })
        .expect("a Status on the error channel");
    let status: serde_json::Value = serde_json::from_slice(&status).expect("json");
    assert_eq!(status["status"], "Failure", "{status}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("ghost")),
        "the kubelet's reason reaches the client: {status}"
    );
}

#[tokio::test]
async fn kube_rs_v5_exec_straight_to_a_kubelet_declaring_websockets() {
    let e = env_with("direct", &["ExtendWebSocketsToKubelet"]).await;
    let params = kube::api::AttachParams::default()
        .container("main")
        .stdin(true)
        .stdout(true)
        .stderr(false);
    let mut attached = timeout(
        T,
        e.kube().exec(
            "web",
            vec!["sh", "-c", "read x; echo direct:$x; exit 2"],
            &params,
        ),
    )
    .await
    .expect("in time")
    .expect("exec");
    let mut stdin = attached.stdin().expect("stdin");
    let mut stdout = attached.stdout().expect("stdout");
    let status = attached.take_status().expect("status");
    stdin.write_all(b"ws\n").await.expect("write");
    stdin.shutdown().await.expect("close stdin");
    let mut out = Vec::new();
    timeout(T, stdout.read_to_end(&mut out))
        .await
        .expect("in time")
        .expect("stdout");
    let status = timeout(T, status).await.expect("in time").expect("status");
    assert_eq!(out, b"direct:ws\n");
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    // The kubelet's own v5 Status, not the translator's rewording.
    assert_ne!(
        status.message.as_deref(),
        Some("command terminated with non-zero exit code: command terminated with exit code 2")
    );
}

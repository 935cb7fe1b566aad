//! A WebSocket exec through the root apiserver as a v4 client opens it (kube-rs before v5,
//! the python client): the apiserver passes `v4.channel.k8s.io` and its base64 variant through
//! to the kubelet (relaylet) unchanged, unlike v5, which it translates to SPDY.

use futures::StreamExt;
use relaylet_sim::channel::{self, ChannelMessage, Protocol};
use tokio_tungstenite::tungstenite::Message;

use super::Env;

pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// Opens `sh -c <script>` in container `main` of `pod` (stdout and stderr) with `protocol`.
pub async fn open(e: &Env, pod: &str, script: &str, protocol: Protocol) -> Socket {
    let addr = e
        .sandbox
        .root
        .api
        .url()
        .trim_start_matches("https://")
        .to_string();
    open_at(admin_tls(&e.sandbox.root.ca), &addr, pod, script, protocol).await
}

/// TLS settings of a `system:masters` user of the cluster whose CA is `ca`.
pub fn admin_tls(ca: &relaylet_sim::tls::Ca) -> std::sync::Arc<rustls::ClientConfig> {
    let identity = ca
        .issue_client("ws-user", &["system:masters"])
        .expect("client certificate");
    ca.client_config(Some(&identity)).expect("TLS settings")
}

/// [`open`] against the apiserver at `addr` (host:port) with `tls` (see [`admin_tls`]), e.g. a
/// real root apiserver.
pub async fn open_at(
    tls: std::sync::Arc<rustls::ClientConfig>,
    addr: &str,
    pod: &str,
    script: &str,
    protocol: Protocol,
) -> Socket {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .expect("TLS to the root apiserver");
    let script: String = form_urlencoded::byte_serialize(script.as_bytes()).collect();
    let url = format!(
        "wss://{addr}/api/v1/namespaces/default/pods/{pod}/exec?container=main&command=sh&command=-c&command={script}&stdout=true&stderr=true"
    );
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        url.as_str(),
    )
    .expect("request");
    req.headers_mut().insert(
        "sec-websocket-protocol",
        protocol.name().parse().expect("header"),
    );
    let (socket, resp) = tokio_tungstenite::client_async(req, stream)
        .await
        .expect("WebSocket exec through the root apiserver");
    assert_eq!(resp.headers()["sec-websocket-protocol"], protocol.name());
    socket
}

/// What a WebSocket client read until the connection ended.
#[derive(Debug, Default)]
pub struct Read {
    pub stdout: Vec<u8>,
    /// Channel 3: the exit Status.
    pub error: Vec<u8>,
    /// The server ended with a close frame (not just a closed connection).
    pub closed_cleanly: bool,
}

impl Read {
    /// Whether channel 3 carried a Failure Status saying `message`.
    pub fn failed_with(&self, message: &str) -> bool {
        serde_json::from_slice::<serde_json::Value>(&self.error)
            .is_ok_and(|status| status["status"] == "Failure" && status["message"] == message)
    }
}

/// Reads messages until the connection ends; `first_output` fires on the first stdout bytes.
pub async fn read_all(
    mut socket: Socket,
    protocol: Protocol,
    mut first_output: Option<tokio::sync::oneshot::Sender<()>>,
) -> Read {
    let mut read = Read::default();
    while let Some(message) = socket.next().await {
        let message = match message {
            Ok(Message::Close(_)) => {
                read.closed_cleanly = true;
                break;
            }
            Ok(message) => message,
            Err(_) => break,
        };
        match channel::decode(protocol, &message) {
            Ok(Some(ChannelMessage::Data { channel, data })) => match channel {
                channel::STDOUT => {
                    read.stdout.extend_from_slice(&data);
                    if !data.is_empty()
                        && let Some(tx) = first_output.take()
                    {
                        let _ = tx.send(());
                    }
                }
                channel::ERROR => read.error.extend_from_slice(&data),
                _ => {}
            },
            Ok(_) => {}
            Err(err) => panic!("undecodable message {message:?}: {err}"),
        }
    }
    read
}

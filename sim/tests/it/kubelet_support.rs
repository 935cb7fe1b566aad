//! Shared harness for the kubelet stand-in tests: a CA, a running kubelet with a scratch data
//! directory, a kube-rs client pointed at it, and raw HTTPS / WebSocket helpers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use relaylet_sim::kubelet::{ContainerRun, Kubelet, KubeletConfig, PodRun};
use relaylet_sim::tls::{Ca, Identity};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// A running kubelet stand-in and what a client needs to reach it.
pub struct Harness {
    pub kubelet: Kubelet,
    pub ca: Ca,
    pub client_id: Identity,
    pub data_dir: PathBuf,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.kubelet.stop();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// A container running `sh -c script`.
pub fn shell_container(name: &str, script: &str) -> ContainerRun {
    ContainerRun {
        name: name.into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: vec![("GREETING".into(), "hello-from-env".into())],
        stdin: false,
        tty: false,
        ports: Vec::new(),
    }
}

/// A pod `default/<name>` with uid `uid-<name>`.
pub fn pod(name: &str, containers: Vec<ContainerRun>) -> PodRun {
    PodRun {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        containers,
    }
}

impl Harness {
    /// Starts a kubelet that requires client certificates from its CA.
    pub async fn start(test: &str) -> Harness {
        Self::start_with(test, |_| {}).await
    }

    pub async fn start_with(test: &str, tweak: impl FnOnce(&mut KubeletConfig)) -> Harness {
        let ca = Ca::new("kubelet-test-ca").unwrap();
        let server_id = ca.issue_server(&["127.0.0.1"]).unwrap();
        let client_id = ca
            .issue_client("system:kube-apiserver", &["system:masters"])
            .unwrap();
        let data_dir = std::env::temp_dir().join(format!(
            "relaylet-kubelet-{test}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut cfg = KubeletConfig::new(
            "node-a",
            ca.server_config_requiring_clients(&server_id).unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            &data_dir,
        );
        tweak(&mut cfg);
        let kubelet = Kubelet::start(cfg).await.unwrap();
        Harness {
            kubelet,
            ca,
            client_id,
            data_dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.kubelet.addr
    }

    /// A kube-rs client whose "cluster" is this kubelet.
    pub async fn kube_client(&self) -> kube::Client {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let yaml = format!(
            r#"apiVersion: v1
kind: Config
clusters:
- name: kubelet
  cluster:
    server: https://{addr}
    certificate-authority-data: {ca}
users:
- name: apiserver
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: kubelet
  context: {{cluster: kubelet, user: apiserver}}
current-context: kubelet
"#,
            addr = self.addr(),
            ca = b64(&self.ca.cert_pem()),
            cert = b64(&self.client_id.cert_pem),
            key = b64(&self.client_id.key_pem),
        );
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// A TLS connection to the kubelet, presenting the client certificate.
    pub async fn tls(&self) -> TlsStream<TcpStream> {
        let connector =
            tokio_rustls::TlsConnector::from(self.ca.client_config(Some(&self.client_id)).unwrap());
        let tcp = TcpStream::connect(self.addr()).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        connector.connect(name, tcp).await.unwrap()
    }

    /// Sends one HTTP/1.1 request; returns the response head and a body stream.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> http::Response<hyper::body::Incoming> {
        let io = TokioIo::new(self.tls().await);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr().to_string());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(http_body_util::Empty::<Bytes>::new()).unwrap();
        sender.send_request(req).await.unwrap()
    }

    /// Sends a GET and collects the whole body (for short answers).
    pub async fn get(&self, path: &str) -> (http::StatusCode, String) {
        let resp = self.request("GET", path, &[]).await;
        let status = resp.status();
        let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
            .await
            .unwrap()
            .unwrap()
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Opens a raw WebSocket to `path` offering `protocols` (comma-joined, one header).
    pub async fn websocket(
        &self,
        path: &str,
        protocols: &str,
    ) -> Result<
        (
            WebSocketStream<TlsStream<TcpStream>>,
            http::Response<Option<Vec<u8>>>,
        ),
        tokio_tungstenite::tungstenite::Error,
    > {
        let mut req = format!("wss://{}{}", self.addr(), path)
            .into_client_request()
            .unwrap();
        if !protocols.is_empty() {
            req.headers_mut()
                .insert("sec-websocket-protocol", protocols.parse().unwrap());
        }
        tokio_tungstenite::client_async(req, self.tls().await).await
    }
}

/// Keeps the kube-rs TLS provider question out of every test: rustls needs a process default.
pub fn init_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Arc helper for readability in tests.
pub fn arc<T>(t: T) -> Arc<T> {
    Arc::new(t)
}

/// Whether `pid` is a live process. A zombie (killed, waiting to be reaped by whoever
/// inherited it) counts as gone: it runs nothing and holds nothing.
pub fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

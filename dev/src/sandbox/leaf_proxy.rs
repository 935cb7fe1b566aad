//! Small proxies a test (or the sandbox, or the benchmark) puts in front of a leaf that relaylet
//! cannot dial: HTTP CONNECT (plain, or over TLS that may require a client certificate) and
//! SOCKS5 (no authentication, or user and password). They reach only the names in their route
//! table (a leaf's `server` is a `.invalid` name that resolves nowhere else, so relaylet has no
//! way around the proxy), copy bytes untouched, and keep what a test asks about: how many
//! tunnels were opened, and the first bytes each tunnel carried from relaylet, to show that the
//! proxy only ever saw TLS. [`TestProxy::refuse`] makes it answer CONNECT with an error status
//! and cut the tunnels open now, as a konnectivity server without an agent does.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How many bytes of each tunnel's first data from the client are kept.
const SNIFF: usize = 512;

/// Which protocol the proxy speaks.
#[derive(Clone)]
pub enum ProxyKind {
    /// HTTP CONNECT on plain TCP (`http://`).
    Connect,
    /// HTTP CONNECT over TLS (`https://`) with this server configuration (which may require a
    /// client certificate).
    ConnectTls(Arc<rustls::ServerConfig>),
    /// SOCKS5, with user and password if given (`socks5://`).
    Socks5(Option<(String, String)>),
}

/// What a proxy saw.
#[derive(Default)]
struct Seen {
    tunnels: usize,
    /// The first bytes relaylet sent into each tunnel.
    first_bytes: Vec<Vec<u8>>,
    /// `Proxy-Authorization` values received.
    authorizations: Vec<String>,
}

/// A running proxy; it stops when dropped.
pub struct TestProxy {
    pub addr: SocketAddr,
    routes: Arc<Mutex<HashMap<String, SocketAddr>>>,
    seen: Arc<Mutex<Seen>>,
    refusal: Arc<Mutex<Option<(u16, String)>>>,
    /// Fires to cut the tunnels open now; replaced at each cut.
    generation: Arc<Mutex<CancellationToken>>,
    stop: CancellationToken,
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TestProxy {
    /// Listens on a free loopback port.
    pub async fn start(kind: ProxyKind) -> std::io::Result<TestProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let proxy = TestProxy {
            addr: listener.local_addr()?,
            routes: Arc::default(),
            seen: Arc::default(),
            refusal: Arc::default(),
            generation: Arc::new(Mutex::new(CancellationToken::new())),
            stop: CancellationToken::new(),
        };
        let shared = Shared {
            kind,
            routes: proxy.routes.clone(),
            seen: proxy.seen.clone(),
            refusal: proxy.refusal.clone(),
        };
        let generation = proxy.generation.clone();
        let stop = proxy.stop.clone();
        tokio::spawn(async move {
            loop {
                let (conn, _) = tokio::select! {
                    _ = stop.cancelled() => return,
                    conn = listener.accept() => match conn {
                        Ok(conn) => conn,
                        Err(_) => continue,
                    },
                };
                let _ = conn.set_nodelay(true);
                let cut = lock(&generation).clone();
                let shared = shared.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = shared.serve(conn) => {}
                        _ = cut.cancelled() => {}
                        _ = stop.cancelled() => {}
                    }
                });
            }
        });
        Ok(proxy)
    }

    /// Lets `host:port` reach `target` through this proxy.
    pub fn route(&self, host_port: &str, target: SocketAddr) {
        lock(&self.routes).insert(host_port.to_string(), target);
    }

    /// From now on, answers CONNECT with `status` and `body` (`None`: tunnels again); cuts the
    /// tunnels open now.
    pub fn refuse(&self, answer: Option<(u16, &str)>) {
        *lock(&self.refusal) = answer.map(|(status, body)| (status, body.to_string()));
        let old = std::mem::replace(&mut *lock(&self.generation), CancellationToken::new());
        old.cancel();
    }

    /// Tunnels opened so far.
    pub fn tunnels(&self) -> usize {
        lock(&self.seen).tunnels
    }

    /// The first bytes relaylet sent into each tunnel.
    pub fn first_bytes(&self) -> Vec<Vec<u8>> {
        lock(&self.seen).first_bytes.clone()
    }

    /// The `Proxy-Authorization` values received.
    pub fn authorizations(&self) -> Vec<String> {
        lock(&self.seen).authorizations.clone()
    }
}

#[derive(Clone)]
struct Shared {
    kind: ProxyKind,
    routes: Arc<Mutex<HashMap<String, SocketAddr>>>,
    seen: Arc<Mutex<Seen>>,
    refusal: Arc<Mutex<Option<(u16, String)>>>,
}

impl Shared {
    async fn serve(self, conn: TcpStream) {
        match self.kind.clone() {
            ProxyKind::Connect => self.connect(conn).await,
            ProxyKind::ConnectTls(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                if let Ok(conn) = acceptor.accept(conn).await {
                    self.connect(conn).await;
                }
            }
            ProxyKind::Socks5(auth) => self.socks5(conn, auth).await,
        }
    }

    /// HTTP CONNECT: one request head, one answer head, then the tunnel.
    async fn connect<S: AsyncRead + AsyncWrite + Unpin>(self, mut conn: S) {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match conn.read(&mut byte).await {
                Ok(1) if head.len() < 8192 => head.push(byte[0]),
                _ => return,
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let mut lines = head.lines();
        let request = lines.next().unwrap_or_default();
        for line in lines {
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("proxy-authorization")
            {
                lock(&self.seen)
                    .authorizations
                    .push(value.trim().to_string());
            }
        }
        let mut parts = request.split(' ');
        let (Some("CONNECT"), Some(target)) = (parts.next(), parts.next()) else {
            let _ = conn
                .write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\nonly CONNECT")
                .await;
            return;
        };
        let refusal = lock(&self.refusal).clone();
        if let Some((status, body)) = refusal {
            let _ = conn
                .write_all(format!("HTTP/1.1 {status} Refused\r\n\r\n{body}").as_bytes())
                .await;
            let _ = conn.shutdown().await;
            return;
        }
        let Some(leaf) = self.dial(target).await else {
            let _ = conn
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\nno route to that host")
                .await;
            let _ = conn.shutdown().await;
            return;
        };
        if conn
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        self.tunnel(conn, leaf).await;
    }

    /// SOCKS5 (RFC 1928, 1929): CONNECT by domain name or IPv4 address.
    async fn socks5(self, mut conn: TcpStream, auth: Option<(String, String)>) {
        let Some(target) = socks5_handshake(&mut conn, auth.as_ref()).await else {
            return;
        };
        if lock(&self.refusal).is_some() {
            // 0x02: connection not allowed by ruleset.
            let _ = conn.write_all(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]).await;
            return;
        }
        let Some(leaf) = self.dial(&target).await else {
            // 0x04: host unreachable.
            let _ = conn.write_all(&[5, 4, 0, 1, 0, 0, 0, 0, 0, 0]).await;
            return;
        };
        if conn
            .write_all(&[5, 0, 0, 1, 127, 0, 0, 1, 0, 0])
            .await
            .is_err()
        {
            return;
        }
        self.tunnel(conn, leaf).await;
    }

    async fn dial(&self, target: &str) -> Option<TcpStream> {
        let addr = *lock(&self.routes).get(target)?;
        let leaf = TcpStream::connect(addr).await.ok()?;
        let _ = leaf.set_nodelay(true);
        Some(leaf)
    }

    /// Copies both ways, keeping the first bytes from the client.
    async fn tunnel<S: AsyncRead + AsyncWrite + Unpin>(self, mut conn: S, mut leaf: TcpStream) {
        let mut first = vec![0u8; SNIFF];
        let n = match conn.read(&mut first).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        {
            let mut seen = lock(&self.seen);
            seen.tunnels += 1;
            seen.first_bytes.push(first[..n].to_vec());
        }
        if leaf.write_all(&first[..n]).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut conn, &mut leaf).await;
    }
}

/// Reads the greeting, authenticates, and reads the request; the target as `host:port`.
async fn socks5_handshake(conn: &mut TcpStream, auth: Option<&(String, String)>) -> Option<String> {
    let mut head = [0u8; 2];
    conn.read_exact(&mut head).await.ok()?;
    let mut methods = vec![0u8; head[1] as usize];
    conn.read_exact(&mut methods).await.ok()?;
    match auth {
        None if methods.contains(&0) => conn.write_all(&[5, 0]).await.ok()?,
        Some((user, password)) if methods.contains(&2) => {
            conn.write_all(&[5, 2]).await.ok()?;
            let mut version_len = [0u8; 2];
            conn.read_exact(&mut version_len).await.ok()?;
            let mut got_user = vec![0u8; version_len[1] as usize];
            conn.read_exact(&mut got_user).await.ok()?;
            let mut len = [0u8; 1];
            conn.read_exact(&mut len).await.ok()?;
            let mut got_password = vec![0u8; len[0] as usize];
            conn.read_exact(&mut got_password).await.ok()?;
            let ok = got_user == user.as_bytes() && got_password == password.as_bytes();
            conn.write_all(&[1, if ok { 0 } else { 1 }]).await.ok()?;
            if !ok {
                return None;
            }
        }
        _ => {
            conn.write_all(&[5, 0xff]).await.ok()?;
            return None;
        }
    }
    let mut request = [0u8; 4];
    conn.read_exact(&mut request).await.ok()?;
    if request[1] != 1 {
        return None;
    }
    let host = match request[3] {
        1 => {
            let mut ip = [0u8; 4];
            conn.read_exact(&mut ip).await.ok()?;
            std::net::Ipv4Addr::from(ip).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            conn.read_exact(&mut len).await.ok()?;
            let mut name = vec![0u8; len[0] as usize];
            conn.read_exact(&mut name).await.ok()?;
            String::from_utf8(name).ok()?
        }
        _ => return None,
    };
    let mut port = [0u8; 2];
    conn.read_exact(&mut port).await.ok()?;
    Some(format!("{host}:{}", u16::from_be_bytes(port)))
}

/// The proxy a sandbox leaf is reached through (`Settings::leaf_proxies`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafProxyKind {
    /// `http://relaylet:pa%40ss@…`: HTTP CONNECT with Basic credentials.
    Http,
    /// `https://…`: HTTP CONNECT over TLS that requires a client certificate, as a
    /// konnectivity server in mTLS mode does; the CA and the client certificate go in the
    /// leaf Secret's `proxy-ca.crt`, `proxy-client.crt` and `proxy-client.key`.
    Https,
    /// `socks5://relaylet:s0cks@…`: SOCKS5 with user and password.
    Socks5,
    /// A proxy the test runs itself (the real konnectivity server): the leaf keeps its
    /// `server`, and the Secret gets this `proxy-url` and these extra keys.
    External {
        url: String,
        keys: Vec<(String, Vec<u8>)>,
    },
}

/// The user and (decoded) password the HTTP proxy's URL carries.
pub const HTTP_PROXY_CREDENTIALS: (&str, &str) = ("relaylet", "pa@ss");
/// The user and password of the SOCKS5 proxy.
pub const SOCKS5_PROXY_CREDENTIALS: (&str, &str) = ("relaylet", "s0cks");

/// A leaf put behind a proxy: the proxy, and the leaf Secret's kubeconfig and extra keys.
pub struct BehindProxy {
    /// The test kit's proxy (`None` for [`LeafProxyKind::External`]).
    pub proxy: Option<TestProxy>,
    pub kubeconfig: String,
    /// Extra leaf Secret keys (the proxy's TLS material for `https://`).
    pub secret_keys: Vec<(String, Vec<u8>)>,
}

/// Starts a proxy of `kind` for leaf `leaf` whose apiserver listens at `apiserver`, and
/// rewrites the leaf's `kubeconfig` (as the sim writes it) so that its `server` is a name only
/// the proxy resolves (`<leaf>.behind-nat.invalid`), verified as `localhost` (a name in the
/// apiserver's certificate), with `proxy-url` naming the proxy.
pub async fn behind_proxy(
    kind: &LeafProxyKind,
    leaf: &str,
    kubeconfig: &str,
    apiserver: SocketAddr,
) -> anyhow::Result<BehindProxy> {
    let server_line = format!("    server: \"https://{apiserver}\"\n");
    anyhow::ensure!(
        kubeconfig.contains(&server_line),
        "the leaf kubeconfig has no line {server_line:?}"
    );
    if let LeafProxyKind::External { url, keys } = kind {
        return Ok(BehindProxy {
            proxy: None,
            kubeconfig: kubeconfig.replace(
                &server_line,
                &format!("{server_line}    proxy-url: \"{url}\"\n"),
            ),
            secret_keys: keys.clone(),
        });
    }
    let mut secret_keys = Vec::new();
    let (proxy_kind, url_prefix) = match kind {
        LeafProxyKind::Http => (ProxyKind::Connect, "http://relaylet:pa%40ss@".to_string()),
        LeafProxyKind::Socks5 => {
            let (user, password) = SOCKS5_PROXY_CREDENTIALS;
            (
                ProxyKind::Socks5(Some((user.to_string(), password.to_string()))),
                format!("socks5://{user}:{password}@"),
            )
        }
        LeafProxyKind::Https | LeafProxyKind::External { .. } => {
            let ca = relaylet_sim::tls::Ca::new("proxy-ca")?;
            let serving = ca.issue_server(&["127.0.0.1", "localhost"])?;
            let client = ca.issue_client("relaylet-proxy-client", &[])?;
            secret_keys.push(("proxy-ca.crt".to_string(), ca.cert_pem().into_bytes()));
            secret_keys.push(("proxy-client.crt".to_string(), client.cert_pem.into_bytes()));
            secret_keys.push(("proxy-client.key".to_string(), client.key_pem.into_bytes()));
            (
                ProxyKind::ConnectTls(ca.server_config_requiring_clients(&serving)?),
                "https://".to_string(),
            )
        }
    };
    let proxy = TestProxy::start(proxy_kind).await?;
    let host = format!("{leaf}.behind-nat.invalid");
    let port = apiserver.port();
    proxy.route(&format!("{host}:{port}"), apiserver);
    let proxy_url = format!("{url_prefix}{}", proxy.addr);
    let kubeconfig = kubeconfig.replace(
        &server_line,
        &format!(
            "    server: \"https://{host}:{port}\"\n    tls-server-name: \"localhost\"\n    proxy-url: \"{proxy_url}\"\n"
        ),
    );
    Ok(BehindProxy {
        proxy: Some(proxy),
        kubeconfig,
        secret_keys,
    })
}

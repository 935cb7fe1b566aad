//! Strangers cannot crowd out the callers that matter: idle TCP connections and certificate-less
//! TLS connections from other addresses never take the connections the root apiserver (a caller
//! with a client certificate) needs on the kubelet port, and the unauthenticated metrics port has
//! a small budget of its own and cuts clients that send nothing, so it can never hold the
//! descriptors the kubelet port needs nor lock out the kubelet's probes.

mod support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use relaylet::sandbox::Settings;
use relaylet_sim::tls::Identity;
use support::{Env, RT, env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;

fn settings() -> Settings {
    Settings {
        env: BTreeMap::from([
            ("MAX_CONNECTIONS".to_string(), "24".to_string()),
            ("MAX_CONNECTIONS_PER_CLIENT".to_string(), "16".to_string()),
            ("MAX_PENDING_HANDSHAKES".to_string(), "16".to_string()),
        ]),
        ..Settings::default()
    }
}

/// The tests count connections against shared caps: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A TCP connection to `to` from loopback address `from`.
async fn tcp_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))
        .unwrap();
    socket.connect(to).await.unwrap()
}

/// A TLS connection to the kubelet port from `from`, presenting `identity` if given.
async fn tls_from(e: &Env, from: &str, identity: Option<&Identity>) -> TlsStream<TcpStream> {
    let tcp = tcp_from(from, e.sandbox.relaylet.addr).await;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(e.kubelet_api_tls(identity))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// Sends a keep-alive GET of `path` and returns the status line.
async fn get<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    conn: &mut S,
    path: &str,
) -> String {
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: relaylet\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap_or(0);
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Waits until the server closes `conn` (a read returns EOF or fails); a guard deadline fails
/// the test.
async fn closed_by_server(conn: &mut TcpStream, within: Duration) {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(within, conn.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("expected a close, got {n} bytes"),
        Err(_) => panic!("the server kept an idle connection open for {within:?}"),
    }
}

#[test]
fn idle_strangers_do_not_take_the_apiservers_connections() {
    let _serial = serial();
    let e = env(settings);
    RT.block_on(async {
        let addr = e.sandbox.relaylet.addr;
        // Two strangers open 40 TCP connections each and never start TLS.
        let mut idle = Vec::new();
        for from in ["127.0.0.2", "127.0.0.3"] {
            for _ in 0..40 {
                idle.push(tcp_from(from, addr).await);
            }
        }
        // The apiserver (a client certificate) holds 10 connections at once, each served.
        let admin = e.kubelet_client_identity();
        let mut held = Vec::new();
        for i in 0..10 {
            let mut tls = tls_from(e, "127.0.0.1", Some(&admin)).await;
            let answer = get(&mut tls, "/containerLogs/default/demo-1/main?tailLines=1").await;
            assert_eq!(answer, "HTTP/1.1 200 OK", "connection {i}");
            held.push(tls);
        }
        drop(held);
        drop(idle);
    });
}

#[test]
fn certificate_less_connections_keep_half_the_budget_free() {
    let _serial = serial();
    let e = env(settings);
    RT.block_on(async {
        // A stranger completes TLS without a certificate on 20 connections and holds them.
        let mut strangers = Vec::new();
        let mut refused = 0;
        for _ in 0..20 {
            let mut tls = tls_from(e, "127.0.0.4", None).await;
            // Served (a stranger has no credentials: 401), or refused for the cap (503).
            let answer = get(&mut tls, "/healthz").await;
            if answer.starts_with("HTTP/1.1 503") {
                refused += 1;
            } else {
                assert_eq!(answer, "HTTP/1.1 401 Unauthorized");
                strangers.push(tls);
            }
        }
        assert_eq!(strangers.len(), 12, "half of MAX_CONNECTIONS=24");
        assert_eq!(refused, 8);
        // The apiserver still gets 10 connections at once.
        let admin = e.kubelet_client_identity();
        let mut held = Vec::new();
        for i in 0..10 {
            let mut tls = tls_from(e, "127.0.0.1", Some(&admin)).await;
            let answer = get(&mut tls, "/containerLogs/default/demo-1/main?tailLines=1").await;
            assert_eq!(answer, "HTTP/1.1 200 OK", "connection {i}");
            held.push(tls);
        }
    });
}

#[test]
fn the_metrics_port_has_its_own_small_budget_and_cuts_idle_clients() {
    let _serial = serial();
    let e = env(settings);
    RT.block_on(async {
        let metrics = e.sandbox.relaylet.metrics_addr;
        // 100 idle connections from one address: all but 16 are closed at once ...
        let mut idle = Vec::new();
        for _ in 0..100 {
            idle.push(tcp_from("127.0.0.5", metrics).await);
        }
        for conn in &mut idle[16..] {
            closed_by_server(conn, Duration::from_secs(5)).await;
        }
        // ... the kubelet's probe from another address is answered meanwhile ...
        let mut probe = tcp_from("127.0.0.1", metrics).await;
        assert_eq!(get(&mut probe, "/healthz").await, "HTTP/1.1 200 OK");
        // ... and the 16 that were let in are cut for sending no request in time, as is a
        // kept-alive connection that sends no next request.
        for conn in &mut idle[..16] {
            closed_by_server(conn, Duration::from_secs(30)).await;
        }
        closed_by_server(&mut probe, Duration::from_secs(30)).await;
    });
}

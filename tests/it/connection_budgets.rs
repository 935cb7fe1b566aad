//! Strangers cannot crowd out the callers that matter: idle TCP connections and certificate-less
//! TLS connections from other addresses never take the connections the root apiserver (a caller
//! with a client certificate) needs on the kubelet port, and the unauthenticated metrics port has
//! a small budget of its own and cuts clients that send nothing, so it can never hold the
//! descriptors the kubelet port needs nor lock out the kubelet's probes. Connections none of
//! whose requests has been authorized yet have a small budget of their own (total, per address,
//! per certificate user) and a small request head, whatever credential they carry: a worker's
//! kubelet certificate or a bearer token that the root accepts but allows nothing stays in it.

use relaylet_dev::testkit as support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::apiserver::{Rule, UserInfo};
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
            (
                "MAX_UNAUTHENTICATED_CONNECTIONS".to_string(),
                "12".to_string(),
            ),
            (
                "MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT".to_string(),
                "8".to_string(),
            ),
            (
                "MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER".to_string(),
                "4".to_string(),
            ),
        ]),
        // One token the root accepts but allows nothing here, one allowed the kubelet's
        // /healthz.
        root_rules: vec![
            Rule::user("prober")
                .verbs(&["get"])
                .api_groups(&[""])
                .resources(&["nodes/healthz"]),
        ],
        root_tokens: vec![
            ("idle-token".into(), UserInfo::new("idle", &[])),
            ("prober-token".into(), UserInfo::new("prober", &[])),
        ],
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

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

/// Sends a keep-alive GET of `path` and returns the status line.
async fn get<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    conn: &mut S,
    path: &str,
) -> String {
    support::raw_http::get(conn, path).await.0
}

/// The `(code, reason, message)` of a Status body.
fn status_of(body: &str) -> (u64, String, String) {
    let status: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|err| panic!("a Status: {err}: {body}"));
    (
        status["code"].as_u64().unwrap_or(0),
        status["reason"].as_str().unwrap_or("").to_string(),
        status["message"].as_str().unwrap_or("").to_string(),
    )
}

/// Waits until the server closes `conn` (a read returns EOF or fails); the bound only turns
/// a hang into a failure.
async fn closed_by_server(conn: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(HANG, conn.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("expected a close, got {n} bytes"),
        Err(_) => panic!("the server kept an idle connection open for {HANG:?}"),
    }
}

/// Whether `conn` is still open with nothing to read (the server has neither closed it nor
/// answered on it).
fn still_open(conn: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(conn.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
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

/// Holds certificate-less connections from `from` until one is refused; the held ones (each
/// answered 401: a stranger has no credentials) and the refusal's Status message.
async fn strangers_until_refused(e: &Env, from: &str) -> (Vec<TlsStream<TcpStream>>, String) {
    let (held, message) = until_refused(e, from, None, "", "HTTP/1.1 401 Unauthorized").await;
    for (_, body) in &held {
        assert_eq!(
            status_of(body),
            (
                401,
                "Unauthorized".to_string(),
                "no credentials: present a client certificate signed by the root cluster's client CA or a bearer token".to_string()
            )
        );
    }
    (held.into_iter().map(|(tls, _)| tls).collect(), message)
}

/// Holds connections from `from` (presenting `identity`, each sending one GET of `/healthz`
/// with `headers`) until one is refused with a 503; the held ones, each answered `answer`
/// (with its body), and the refusal's Status message.
async fn until_refused(
    e: &Env,
    from: &str,
    identity: Option<&Identity>,
    headers: &str,
    answer: &str,
) -> (Vec<(TlsStream<TcpStream>, String)>, String) {
    let mut held = Vec::new();
    loop {
        let mut tls = tls_from(e, from, identity).await;
        let (line, body) = support::raw_http::get_with(&mut tls, "/healthz", headers).await;
        if line == "HTTP/1.1 503 Service Unavailable" {
            let (code, reason, message) = status_of(&body);
            assert_eq!((code, reason.as_str()), (503, "ServiceUnavailable"));
            return (held, message);
        }
        assert_eq!(line, answer, "{body}");
        held.push((tls, body));
        assert!(held.len() <= 24, "never refused");
    }
}

#[test]
fn unauthenticated_connections_have_a_small_budget_of_their_own() {
    let _serial = serial();
    let e = env(settings);
    RT.block_on(async {
        // A stranger completes TLS without a certificate and holds what it can: its address
        // gets MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT, ...
        let (first, refusal) = strangers_until_refused(e, "127.0.0.4").await;
        assert_eq!(first.len(), 8);
        assert_eq!(
            refusal,
            "127.0.0.4 holds its maximum of 8 connections whose caller is not authorized yet (MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT)"
        );
        // ... and all strangers together MAX_UNAUTHENTICATED_CONNECTIONS.
        let (second, refusal) = strangers_until_refused(e, "127.0.0.5").await;
        assert_eq!(second.len(), 4);
        assert_eq!(
            refusal,
            "relaylet holds its maximum of 12 connections whose caller is not authorized yet (MAX_UNAUTHENTICATED_CONNECTIONS); try again later"
        );
        // The apiserver still gets its connections.
        let admin = e.kubelet_client_identity();
        let mut held = Vec::new();
        for i in 0..10 {
            let mut tls = tls_from(e, "127.0.0.1", Some(&admin)).await;
            let answer = get(&mut tls, "/containerLogs/default/demo-1/main?tailLines=1").await;
            assert_eq!(answer, "HTTP/1.1 200 OK", "connection {i}");
            held.push(tls);
        }
        // A stranger's head is small: a header past the unauthenticated limit is refused.
        drop(first);
        let mut tls = loop {
            let mut tls = tls_from(e, "127.0.0.4", None).await;
            let (line, _) = support::raw_http::get(&mut tls, "/healthz").await;
            if line == "HTTP/1.1 401 Unauthorized" {
                break tls;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let big = "x".repeat(20 * 1024);
        tls.write_all(format!("GET /healthz HTTP/1.1\r\nHost: relaylet\r\nX-Big: {big}\r\n\r\n").as_bytes())
            .await
            .expect("send");
        let mut got = Vec::new();
        let _ = tokio::time::timeout(HANG, tls.read_to_end(&mut got)).await;
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 431"), "{got}");
    });
}

/// A valid credential is not a pass: a certificate of the root client CA (a worker's kubelet
/// certificate) and a bearer token the root accepts, neither allowed anything here, keep the
/// small head and the small budget (per user for the certificate, wherever it connects from;
/// per address for the token) however many requests they authenticate; a token allowed
/// something leaves it with its first authorized request; the apiserver is served throughout.
#[test]
fn valid_credentials_allowed_nothing_stay_in_the_small_budget() {
    let _serial = serial();
    let e = env(settings);
    let admin = e.kubelet_client_identity();
    let worker = e
        .sandbox
        .root
        .ca
        .issue_client("system:node:worker-1", &["system:nodes"])
        .expect("certificate");
    RT.block_on(async {
        // The worker's certificate, from two addresses: each connection answered 403, until
        // the user's cap ...
        let mut held = Vec::new();
        for from in ["127.0.0.6", "127.0.0.7"] {
            for _ in 0..2 {
                let mut tls = tls_from(e, from, Some(&worker)).await;
                let (line, body) = support::raw_http::get(&mut tls, "/healthz").await;
                assert_eq!(line, "HTTP/1.1 403 Forbidden", "{body}");
                held.push(tls);
            }
        }
        // ... which a third address does not escape.
        let mut fifth = tls_from(e, "127.0.0.8", Some(&worker)).await;
        let (line, body) = support::raw_http::get(&mut fifth, "/healthz").await;
        assert_eq!(line, "HTTP/1.1 503 Service Unavailable", "{body}");
        assert_eq!(
            status_of(&body).2,
            "user \"system:node:worker-1\" holds its maximum of 4 connections not authorized yet (MAX_UNAUTHENTICATED_CONNECTIONS_PER_USER)"
        );
        // Its head is the small one: a 20 KiB header is refused, where the apiserver's is read.
        let big = format!("X-Big: {}\r\n", "x".repeat(20 * 1024));
        let mut apiserver = tls_from(e, "127.0.0.1", Some(&admin)).await;
        let (line, body) = support::raw_http::get_with(&mut apiserver, "/healthz", &big).await;
        assert_eq!(line, "HTTP/1.1 200 OK", "{body}");
        drop(held);
        let mut tls = loop {
            let mut tls = tls_from(e, "127.0.0.8", Some(&worker)).await;
            let (line, _) = support::raw_http::get(&mut tls, "/healthz").await;
            if line == "HTTP/1.1 403 Forbidden" {
                break tls;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        tls.write_all(format!("GET /healthz HTTP/1.1\r\nHost: relaylet\r\n{big}\r\n").as_bytes())
            .await
            .expect("send");
        let mut got = Vec::new();
        let _ = tokio::time::timeout(HANG, tls.read_to_end(&mut got)).await;
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 431"), "{got}");
        drop(tls);

        // A token the root accepts but allows nothing: authenticated on every request, yet
        // its address holds only its share of the small budget.
        let (idle, message) = until_refused(
            e,
            "127.0.0.9",
            None,
            "Authorization: Bearer idle-token\r\n",
            "HTTP/1.1 403 Forbidden",
        )
        .await;
        assert_eq!(idle.len(), 8);
        assert_eq!(
            message,
            "127.0.0.9 holds its maximum of 8 connections whose caller is not authorized yet (MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT)"
        );
        // A token allowed /healthz leaves the budget with its first answer: one address holds
        // more such connections than the budget has room for.
        let mut probers = Vec::new();
        for i in 0..12 {
            let mut tls = tls_from(e, "127.0.0.10", None).await;
            let (line, body) =
                support::raw_http::get_with(&mut tls, "/healthz", "Authorization: Bearer prober-token\r\n").await;
            assert_eq!(line, "HTTP/1.1 200 OK", "prober connection {i}: {body}");
            probers.push(tls);
        }
        // The apiserver is served meanwhile.
        let (line, _) = support::raw_http::get_with(
            &mut apiserver,
            "/containerLogs/default/demo-1/main?tailLines=1",
            "",
        )
        .await;
        assert_eq!(line, "HTTP/1.1 200 OK");
        drop(idle);
        drop(probers);
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
            closed_by_server(conn).await;
        }
        // (at once: before the 16 let in, which wait for the request timeout, are cut)
        for (i, conn) in idle[..16].iter().enumerate() {
            assert!(
                still_open(conn),
                "admitted connection {i} closed with the refused ones"
            );
        }
        // ... the kubelet's probe from another address is answered meanwhile ...
        let mut probe = tcp_from("127.0.0.1", metrics).await;
        assert_eq!(get(&mut probe, "/healthz").await, "HTTP/1.1 200 OK");
        // ... and the 16 that were let in are cut for sending no request in time, as is a
        // kept-alive connection that sends no next request.
        for conn in &mut idle[..16] {
            closed_by_server(conn).await;
        }
        closed_by_server(&mut probe).await;
    });
}

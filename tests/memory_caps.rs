//! What strangers and readers can make relaylet hold is bounded by its caps, and the chart's
//! memory limit is derived from all of them: with unauthenticated connections at their cap,
//! each holding a near-limit request head, and followed log streams at theirs, relaylet's peak
//! resident memory stays under the limit `helm template` renders for those caps, and an
//! authenticated exec is still served meanwhile.
//!
//! relaylet runs as its own process (the shipped binary) beside the sandbox's in-process
//! replica, so its memory is its own; the test calls its shared kubelet port directly.

use relaylet_dev::testkit as support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use relaylet_dev::sandbox::Settings;
use relaylet_sim::tls::Identity;
use support::{Env, RT, env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;

/// The caps under test, as chart values and as relaylet's env.
const CAPS: [(&str, &str, u32); 7] = [
    ("maxConnections", "MAX_CONNECTIONS", 1024),
    (
        "maxConnectionsPerClient",
        "MAX_CONNECTIONS_PER_CLIENT",
        1024,
    ),
    ("maxPendingHandshakes", "MAX_PENDING_HANDSHAKES", 128),
    (
        "maxUnauthenticatedConnections",
        "MAX_UNAUTHENTICATED_CONNECTIONS",
        256,
    ),
    (
        "maxUnauthenticatedConnectionsPerClient",
        "MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT",
        32,
    ),
    ("maxSessions", "MAX_SESSIONS", 64),
    ("maxLogStreams", "MAX_LOG_STREAMS", 256),
];

fn cap(env: &str) -> u32 {
    CAPS.iter()
        .find(|(_, e, _)| *e == env)
        .map(|(_, _, v)| *v)
        .expect("a cap")
}

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

/// The memory limit (MiB) the chart renders for [`CAPS`].
fn chart_limit_mib() -> u64 {
    let mut args = vec![
        "--show-only".to_string(),
        "templates/deployment.yaml".to_string(),
    ];
    for (value, _, v) in CAPS {
        args.push("--set".to_string());
        args.push(format!("limits.{value}={v}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rendered = support::realk8s::world::helm_template(&args);
    let line = rendered
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("memory:") && l.ends_with("Mi") && !l.contains("64Mi"))
        .unwrap_or_else(|| panic!("a derived memory limit in {rendered}"));
    line.trim_start_matches("memory:")
        .trim()
        .trim_end_matches("Mi")
        .parse()
        .expect("MiB")
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in {status}"))
}

async fn tls_from(
    e: &Env,
    from: IpAddr,
    to: SocketAddr,
    identity: Option<&Identity>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let tcp = socket.connect(to).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    tokio_rustls::TlsConnector::from(e.kubelet_api_tls(identity))
        .connect(name, tcp)
        .await
}

/// Reads until the response head has arrived; the head.
async fn head(tls: &mut TlsStream<TcpStream>) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(HANG, tls.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn strangers_and_log_readers_at_their_caps_stay_under_the_charts_memory_limit() {
    let e = env(Settings::default);
    let limit_mib = chart_limit_mib();
    let mut caps: Vec<(&str, String)> = CAPS
        .iter()
        .map(|(_, var, v)| (*var, v.to_string()))
        .collect();
    caps.push(("RUST_LOG", "error".to_string()));
    let replica = support::process::RelayletProcess::start(
        e,
        std::path::Path::new(env!("CARGO_BIN_EXE_relaylet")),
        "relaylet-memory",
        &caps,
    );
    let pid = replica.child.id();
    let port = replica.addr;
    let admin = e.kubelet_client_identity();
    let localhost: IpAddr = "127.0.0.1".parse().unwrap();
    const FOLLOW: &str =
        "GET /containerLogs/default/demo-1/main?follow=true HTTP/1.1\r\nHost: relaylet\r\n\r\n";

    RT.block_on(async {
        // Wait until the process serves (its leaves and pod index are up).
        let ready = async {
            loop {
                if let Ok(mut tls) = tls_from(e, localhost, port, Some(&admin)).await {
                    let logs = "GET /containerLogs/default/demo-1/main?tailLines=1 HTTP/1.1\r\nHost: relaylet\r\n\r\n";
                    if tls.write_all(logs.as_bytes()).await.is_ok()
                        && head(&mut tls).await.starts_with("HTTP/1.1 200")
                    {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        tokio::time::timeout(HANG, ready)
            .await
            .expect("the relaylet process serves");
        let idle = status_kib(pid, "VmRSS");

        // Followed logs at their cap, from the apiserver's identity.
        let mut follows = Vec::new();
        for i in 0..cap("MAX_LOG_STREAMS") {
            let mut tls = tls_from(e, localhost, port, Some(&admin))
                .await
                .expect("connect");
            tls.write_all(FOLLOW.as_bytes()).await.expect("send");
            let answer = head(&mut tls).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "log stream {i}: {answer}");
            follows.push(tls);
        }
        let mut over = tls_from(e, localhost, port, Some(&admin))
            .await
            .expect("connect");
        over.write_all(FOLLOW.as_bytes()).await.expect("send");
        assert!(head(&mut over).await.starts_with("HTTP/1.1 503"));

        // Strangers at their cap, from several addresses, each holding a request head just
        // under the unauthenticated limit, unfinished.
        let per_client = cap("MAX_UNAUTHENTICATED_CONNECTIONS_PER_CLIENT");
        let sources = cap("MAX_UNAUTHENTICATED_CONNECTIONS") / per_client;
        let pad = "a".repeat(15 * 1024);
        let mut strangers = Vec::new();
        for source in 0..sources {
            let from: IpAddr = format!("127.0.1.{}", source + 1).parse().unwrap();
            for _ in 0..per_client {
                let mut tls = tls_from(e, from, port, None).await.expect("TLS");
                tls.write_all(format!("GET /healthz HTTP/1.1\r\nX-Pad: {pad}").as_bytes())
                    .await
                    .expect("send a partial head");
                strangers.push(tls);
            }
        }
        // One more is refused (an answer, not a held head).
        let mut extra = tls_from(e, "127.0.1.250".parse().unwrap(), port, None)
            .await
            .expect("TLS");
        extra
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: relaylet\r\n\r\n")
            .await
            .expect("send");
        let refused = head(&mut extra).await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");

        // An authenticated exec is served meanwhile.
        let mut exec = tls_from(e, localhost, port, Some(&admin))
            .await
            .expect("connect");
        exec.write_all(
            b"GET /exec/default/demo-1/main?command=echo&command=served&output=1 HTTP/1.1\r\n\
              Host: relaylet\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
              Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n",
        )
        .await
        .expect("send");
        let mut got = Vec::new();
        let read = async {
            let mut buf = [0u8; 4096];
            while !got.windows(6).any(|w| w == b"served") {
                match exec.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        };
        let _ = tokio::time::timeout(HANG, read).await;
        let got = String::from_utf8_lossy(&got);
        assert!(
            got.starts_with("HTTP/1.1 101") && got.contains("served"),
            "{got}"
        );

        let rss = status_kib(pid, "VmRSS");
        let peak = status_kib(pid, "VmHWM");
        // Reported, not asserted: the design numbers the chart's coefficients come from.
        eprintln!(
            "relaylet with {} log streams and {} unauthenticated connections: RSS {} KiB (idle {} KiB, {} KiB more), peak {} KiB; chart limit {limit_mib} MiB",
            follows.len(),
            strangers.len(),
            rss,
            idle,
            rss.saturating_sub(idle),
            peak
        );
        assert!(
            peak < limit_mib * 1024,
            "peak RSS {peak} KiB is over the chart's derived limit of {limit_mib} MiB"
        );
        drop(strangers);
        drop(follows);
    });
    drop(replica);
}

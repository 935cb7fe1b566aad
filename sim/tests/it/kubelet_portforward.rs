//! portForward against the kubelet stand-in: kube-rs' WebSocket port-forwarder, raw v4
//! WebSocket framing, and SPDY `portforward.k8s.io` with many concurrent requests. Payload
//! integrity is checked with 1 MiB of pseudo-random data echoed by a real local TCP server.

use crate::kubelet_support as support;
use crate::proxy_support;

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kube::core::kubelet_debug::KubeletDebugParams;
use relaylet_sim::kubelet::{ContainerRun, WsByteStream};
use relaylet_sim::spdy::{Connection, Role, Stream, upgrade_client};
use support::{Harness, pod, shell_container};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(30);
const MIB: usize = 1024 * 1024;

/// An address nothing listens on.
async fn dead_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// Deterministic pseudo-random bytes (xorshift), different per seed.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// FNV-1a, a checksum to report instead of dumping a megabyte on failure.
fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes `data` and reads the same amount back concurrently; returns what came back.
async fn echo_through<S: AsyncRead + AsyncWrite + Unpin>(stream: S, data: &[u8]) -> Vec<u8> {
    let (mut r, mut w) = tokio::io::split(stream);
    let writer = async {
        for chunk in data.chunks(7919) {
            w.write_all(chunk).await.unwrap();
        }
        w
    };
    let reader = async {
        let mut back = vec![0u8; data.len()];
        r.read_exact(&mut back).await.unwrap();
        back
    };
    let (_w, back) = tokio::join!(writer, reader);
    back
}

async fn harness(test: &str) -> (Harness, SocketAddr) {
    support::init_crypto();
    let h = Harness::start(test).await;
    let echo = proxy_support::echo_server().await;
    let dead = dead_address().await;
    let web = ContainerRun {
        ports: vec![(8080, echo), (9090, dead)],
        ..shell_container("main", "sleep 1000")
    };
    h.kubelet.run_pod(pod("web", vec![web])).await.unwrap();
    (h, echo)
}

#[tokio::test]
async fn kube_rs_port_forward_echoes_a_mebibyte() {
    let (h, _) = harness("pf-kube").await;
    timeout(T, async {
        let client = h.kube_client().await;
        let params = KubeletDebugParams {
            name: "web",
            namespace: "default",
            pod_uid: Some("uid-web"),
        };
        let mut pf = client
            .kubelet_node_portforward(&params, &[8080, 9090])
            .await
            .unwrap();
        let stream = pf.take_stream(8080).unwrap();
        let data = payload(1, MIB);
        let back = echo_through(stream, &data).await;
        assert_eq!(checksum(&back), checksum(&data));
        assert!(back == data);
        // A port nothing listens on reports the kubelet's error text on its error channel.
        let _dead = pf.take_stream(9090).unwrap();
        let err = pf.take_error(9090).unwrap().await.unwrap();
        assert!(
            err.starts_with("error forwarding port 9090 to pod ") && err.contains("uid : "),
            "{err}"
        );
        assert!(
            err.contains("connection refused") || err.contains("Connection refused"),
            "{err}"
        );
        pf.abort();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn raw_websocket_framing_and_request_checks() {
    let (h, _) = harness("pf-raw").await;
    timeout(T, async {
        let (mut ws, resp) = h
            .websocket("/portForward/default/web?port=8080", "v4.channel.k8s.io")
            .await
            .unwrap();
        assert_eq!(
            resp.headers()["sec-websocket-protocol"],
            "v4.channel.k8s.io"
        );
        // Each channel opens with the port, little endian.
        let port = 8080u16.to_le_bytes();
        assert_eq!(
            ws.next().await.unwrap().unwrap(),
            Message::binary(vec![0, port[0], port[1]])
        );
        assert_eq!(
            ws.next().await.unwrap().unwrap(),
            Message::binary(vec![1, port[0], port[1]])
        );
        ws.send(Message::binary(b"\x00hello".to_vec()))
            .await
            .unwrap();
        let mut echoed = Vec::new();
        while echoed.len() < 5 {
            match ws.next().await.unwrap().unwrap() {
                Message::Binary(b) => {
                    assert_eq!(b[0], 0);
                    echoed.extend_from_slice(&b[1..]);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(echoed, b"hello");

        // The base64 flavour frames with ASCII channel digits.
        let (mut ws, _) = h
            .websocket(
                "/portForward/default/web?port=8080",
                "v4.base64.channel.k8s.io",
            )
            .await
            .unwrap();
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("0kB8="));

        let (code, body) = h.get("/portForward/default/web").await;
        assert_eq!(
            (code.as_u16(), body.as_str()),
            (500, "Upgrade request required\n")
        );
        // A WebSocket request must name its ports.
        match h
            .websocket("/portForward/default/web", "v4.channel.k8s.io")
            .await
        {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 400);
                let body = String::from_utf8(resp.body().clone().unwrap()).unwrap();
                assert_eq!(body, "query parameter \"port\" is required");
            }
            other => panic!("expected 400, got {other:?}"),
        }
        let (code, body) = h.get("/portForward/default/web/other-uid").await;
        assert_eq!((code.as_u16(), body.as_str()), (404, "pod not found"));
        let (code, body) = h.get("/portForward/default/nope").await;
        assert_eq!((code.as_u16(), body.as_str()), (404, "pod does not exist"));
    })
    .await
    .unwrap();
}

async fn spdy_session(h: &Harness) -> Connection {
    let url = format!("https://{}/portForward/default/web", h.addr());
    let tls = h.ca.client_config(Some(&h.client_id)).unwrap();
    let (proto, conn, _incoming) = upgrade_client(&url, tls, &["portforward.k8s.io"], &[])
        .await
        .unwrap();
    assert_eq!(proto, "portforward.k8s.io");
    conn
}

/// Opens the (error, data) stream pair client-go opens per forwarded connection.
async fn pair(conn: &Connection, port: u16, request_id: Option<&str>) -> (Stream, Stream) {
    let headers = |kind: &str| {
        let mut h = vec![
            ("streamType".to_string(), kind.to_string()),
            ("port".to_string(), port.to_string()),
        ];
        if let Some(id) = request_id {
            h.push(("requestID".to_string(), id.to_string()));
        }
        h
    };
    let error = conn.open_stream(headers("error")).await.unwrap();
    let data = conn.open_stream(headers("data")).await.unwrap();
    (error, data)
}

#[tokio::test]
async fn spdy_forwards_many_connections_per_session() {
    let (h, _) = harness("pf-spdy").await;
    timeout(T, async {
        let conn = spdy_session(&h).await;
        let mut sessions = Vec::new();
        for i in 0..3u64 {
            let (error, data) = pair(&conn, 8080, Some(&i.to_string())).await;
            sessions.push(tokio::spawn(async move {
                let sent = payload(10 + i, MIB);
                let (mut r, mut w) = tokio::io::split(data);
                let writer = async {
                    w.write_all(&sent).await.unwrap();
                    // Half-close: the echo server finishes and the kubelet FINs the stream.
                    w.shutdown().await.unwrap();
                };
                let reader = async {
                    let mut back = Vec::new();
                    r.read_to_end(&mut back).await.unwrap();
                    back
                };
                let ((), back) = tokio::join!(writer, reader);
                assert_eq!(checksum(&back), checksum(&sent));
                assert!(back == sent);
                let mut error = error;
                let mut err = String::new();
                error.read_to_string(&mut err).await.unwrap();
                assert_eq!(err, "", "no error for a good forward");
            }));
        }
        for s in sessions {
            s.await.unwrap();
        }

        // Old clients send no requestID: the kubelet pairs streams by id.
        let (_error, data) = pair(&conn, 8080, None).await;
        let back = echo_through(data, b"legacy pairing").await;
        assert_eq!(back, b"legacy pairing");

        // Failing ports: error text on the error stream.
        for (port, id) in [(9090u16, "dead"), (7777, "unmapped")] {
            let (mut error, _data) = pair(&conn, port, Some(id)).await;
            let mut err = String::new();
            error.read_to_string(&mut err).await.unwrap();
            assert!(
                err.starts_with(&format!("error forwarding port {port} to pod ")),
                "{err}"
            );
            assert!(err.contains(&format!("localhost:{port}")), "{err}");
        }
        // The session is still usable after failures.
        let (_e, data) = pair(&conn, 8080, Some("again")).await;
        assert_eq!(echo_through(data, b"still here").await, b"still here");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn spdy_incomplete_pairs_time_out_and_bad_streams_are_refused() {
    support::init_crypto();
    let h = Harness::start_with("pf-timeout", |cfg| {
        cfg.stream_creation_timeout = Duration::from_millis(300)
    })
    .await;
    h.kubelet
        .run_pod(pod("web", vec![shell_container("main", "sleep 1000")]))
        .await
        .unwrap();
    timeout(T, async {
        let conn = spdy_session(&h).await;
        let mut error = conn
            .open_stream(vec![
                ("streamType".into(), "error".into()),
                ("port".into(), "8080".into()),
                ("requestID".into(), "lonely".into()),
            ])
            .await
            .unwrap();
        let mut err = String::new();
        error.read_to_string(&mut err).await.unwrap();
        assert_eq!(err, "timed out waiting for streams");
        // A stream without a port is refused (reset) instead of accepted.
        let refused = conn
            .open_stream(vec![("streamType".into(), "data".into())])
            .await;
        assert!(refused.is_err(), "{refused:?}");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn spdy_tunneled_through_websocket() {
    let (h, _) = harness("pf-tunnel").await;
    timeout(T, async {
        // What kubectl >= 1.31 asks for; a kubelet with ExtendWebSocketsToKubelet serves it.
        let (ws, resp) = h
            .websocket("/portForward/default/web", "SPDY/3.1+portforward.k8s.io")
            .await
            .unwrap();
        assert_eq!(
            resp.headers()["sec-websocket-protocol"],
            "SPDY/3.1+portforward.k8s.io"
        );
        let (conn, _incoming) = Connection::new(WsByteStream::new(ws), Role::Client);
        let (_error, data) = pair(&conn, 8080, Some("0")).await;
        let sent = payload(42, MIB);
        let back = echo_through(data, &sent).await;
        assert_eq!(checksum(&back), checksum(&sent));
        let (mut error, _data) = pair(&conn, 9090, Some("1")).await;
        let mut err = String::new();
        error.read_to_string(&mut err).await.unwrap();
        assert!(
            err.starts_with("error forwarding port 9090 to pod "),
            "{err}"
        );

        // An unknown tunnelled protocol fails the SPDY negotiation, passed through as is.
        match h
            .websocket("/portForward/default/web", "SPDY/3.1+bogus.k8s.io")
            .await
        {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 403);
                assert_eq!(
                    resp.headers()["x-accepted-stream-protocol-versions"],
                    "portforward.k8s.io"
                );
            }
            other => panic!("expected 403, got {other:?}"),
        }
    })
    .await
    .unwrap();
}

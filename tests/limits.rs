//! Connection and session caps: past them a caller gets a 503 `metav1.Status` naming the cap,
//! and relaylet keeps serving everyone else.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use relaylet::sandbox::Settings;
use support::{RT, env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

fn settings() -> Settings {
    Settings {
        env: BTreeMap::from([
            ("MAX_CONNECTIONS_PER_CLIENT".to_string(), "6".to_string()),
            ("MAX_SESSIONS".to_string(), "2".to_string()),
        ]),
        ..Settings::default()
    }
}

async fn connect(e: &support::Env) -> TlsStream<TcpStream> {
    e.connect_kubelet_api(Some(&e.kubelet_client_identity()))
        .await
        .unwrap()
}

/// Sends `head` and returns the response head (and whatever body arrived with it).
async fn send(tls: &mut TlsStream<TcpStream>, head: &str) -> String {
    tls.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

const HEALTH: &str = "GET /healthz HTTP/1.1\r\nHost: relaylet\r\n\r\n";

fn ws_exec(command: &str) -> String {
    format!(
        "GET /exec/default/demo-1/main?command=sh&command=-c&command={command}&output=1 HTTP/1.1\r\n\
         Host: relaylet\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n"
    )
}

#[test]
fn caps_answer_503_and_relaylet_stays_up() {
    let e = env(settings);
    RT.block_on(async {
        // Connections from one client address.
        let mut held = Vec::new();
        for _ in 0..6 {
            let mut tls = connect(e).await;
            assert!(send(&mut tls, HEALTH).await.starts_with("HTTP/1.1 200"));
            held.push(tls);
        }
        let mut extra = connect(e).await;
        let answer = send(&mut extra, HEALTH).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("MAX_CONNECTIONS_PER_CLIENT"), "{answer}");
        drop(held);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut again = connect(e).await;
        assert!(send(&mut again, HEALTH).await.starts_with("HTTP/1.1 200"));
        drop(again);
        drop(extra);

        // Streaming sessions in total.
        let mut sessions = Vec::new();
        for _ in 0..2 {
            let mut tls = connect(e).await;
            let answer = send(&mut tls, &ws_exec("sleep%2030")).await;
            assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
            sessions.push(tls);
        }
        let mut third = connect(e).await;
        let answer = send(&mut third, &ws_exec("true")).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("MAX_SESSIONS"), "{answer}");
        // Closing a session frees its slot.
        drop(sessions.pop());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut tls = connect(e).await;
            let answer = send(&mut tls, &ws_exec("true")).await;
            if answer.starts_with("HTTP/1.1 101") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "slot never freed: {answer}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

//! Raw HTTP/1.1 requests on a connection the test holds, for what a client library would hide:
//! keep-alive behaviour, limits, what a server says on a connection it is about to close.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Only turns a hang into a failure; nothing is measured against it.
const HANG: Duration = Duration::from_secs(60);

/// The header lines a WebSocket `v4.channel.k8s.io` client (kube-rs before v5, the python
/// client) upgrades with.
pub const WS_V4_UPGRADE: &str = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
     Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n";

/// The head of a GET of `path` with the extra header lines `headers` (each ending in CRLF).
pub fn get_head(path: &str, headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: relaylet\r\n{headers}\r\n")
}

/// Sends a keep-alive GET of `path` on `conn`; the status line and the body (read to its
/// Content-Length, or to the server's close).
pub async fn get<S: AsyncRead + AsyncWrite + Unpin>(conn: &mut S, path: &str) -> (String, String) {
    get_with(conn, path, "").await
}

/// [`get`] with the extra header lines `headers` (each ending in CRLF).
pub async fn get_with<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut S,
    path: &str,
    headers: &str,
) -> (String, String) {
    conn.write_all(get_head(path, headers).as_bytes())
        .await
        .expect("send the request");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let n = tokio::time::timeout(HANG, conn.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap_or(0);
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() >= length || n == 0 {
                let status = head.lines().next().unwrap_or("").to_string();
                return (status, body.to_string());
            }
        }
        assert!(n > 0, "closed before a complete answer: {text:?}");
    }
}

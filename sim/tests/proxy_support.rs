//! Helpers shared by the `kubelet_proxy*` tests, included by each with `#[path]`: a TCP echo
//! server to port-forward to, and the byte pipe kubectl runs SPDY over inside a port-forward
//! WebSocket tunnel.

#![allow(dead_code)]

use std::net::SocketAddr;

use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// A TCP server on loopback that echoes every connection until its client half-closes.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// Carries a byte stream in the binary messages of `ws`, as kubectl does to speak SPDY through
/// a port-forward WebSocket tunnel; returns our end of the pipe.
pub fn websocket_pipe<W>(ws: W) -> DuplexStream
where
    W: Stream<Item = Result<Message, WsError>> + Sink<Message> + Send + 'static,
{
    let (ours, bridge) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (mut ws_tx, mut ws_rx) = ws.split();
        let (mut br, mut bw) = tokio::io::split(bridge);
        let up = async {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = br.read(&mut buf).await {
                if n == 0
                    || ws_tx
                        .send(Message::binary(buf[..n].to_vec()))
                        .await
                        .is_err()
                {
                    break;
                }
            }
        };
        let down = async {
            while let Some(Ok(msg)) = ws_rx.next().await {
                if let Message::Binary(data) = msg
                    && bw.write_all(&data).await.is_err()
                {
                    break;
                }
            }
        };
        tokio::select! { _ = up => {}, _ = down => {} }
    });
    ours
}

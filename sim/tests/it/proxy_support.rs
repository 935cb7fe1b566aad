//! Helpers shared by the `kubelet_proxy*` and `kubelet_portforward` tests: a TCP echo server
//! to port-forward to, and SPDY port-forward streams over a WebSocket tunnel, the way kubectl
//! 1.30+ does it.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{Sink, SinkExt, Stream, StreamExt};
use relaylet_sim::spdy::{Connection, Incoming, Role, Stream as SpdyStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpListener;
use tokio::time::timeout;
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

/// One port-forward request spoken as SPDY inside a WebSocket tunnel.
pub struct Tunnelled {
    pub conn: Connection,
    pub incoming: Incoming,
    pub error: SpdyStream,
    pub data: SpdyStream,
}

/// Checks that the server chose the tunnel protocol, then opens the `error` and `data` streams
/// of request `request_id` to `port` through it.
pub async fn tunnelled_port_forward<W>(
    ws: W,
    response: &http::Response<Option<Vec<u8>>>,
    port: u16,
    request_id: u32,
) -> Tunnelled
where
    W: Stream<Item = Result<Message, WsError>> + Sink<Message> + Send + 'static,
{
    const T: Duration = Duration::from_secs(10);
    assert_eq!(
        response
            .headers()
            .get(http::header::SEC_WEBSOCKET_PROTOCOL)
            .map(|v| v.as_bytes()),
        Some(&b"SPDY/3.1+portforward.k8s.io"[..])
    );
    let (conn, incoming) = Connection::new(websocket_pipe(ws), Role::Client);
    let headers = |ty: &str| {
        vec![
            ("streamType".to_string(), ty.to_string()),
            ("port".to_string(), port.to_string()),
            ("requestID".to_string(), request_id.to_string()),
        ]
    };
    let error = timeout(T, conn.open_stream(headers("error")))
        .await
        .expect("in time")
        .expect("error stream");
    let data = timeout(T, conn.open_stream(headers("data")))
        .await
        .expect("in time")
        .expect("data stream");
    Tunnelled {
        conn,
        incoming,
        error,
        data,
    }
}

//! portForward: connects client streams to ports of a pod.
//!
//! A container port maps to a real local address (the pod's "network namespace"). Each
//! forwarded connection copies bytes both ways like containerd's `PortForward`: when one
//! direction ends, the other gets a second to finish. Failures are reported as text on the
//! error stream, `error forwarding port P to pod ID, uid : reason`, as the kubelet does.
//!
//! Over SPDY every forwarded connection is a pair of client-opened streams (`data` and `error`)
//! sharing a `requestid`; one session carries any number of them.
//!
//! The WebSocket flavour (`?port=` in the query) uses two channels per port, data `2i` and
//! error `2i+1`, each starting with the port number as two little-endian bytes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::idle::Activity;
use super::query;
use super::websocket::{self, Codec, Incoming, Ws};
use crate::spdy::{Connection, Incoming as SpdyIncoming, Stream};

/// How long the second direction may run on after the first one ended.
const HALF_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Where a pod's ports lead.
#[derive(Clone)]
pub struct Target {
    /// The runtime's id for the pod sandbox (appears in error messages).
    pub sandbox_id: String,
    pub ports: Vec<(u16, SocketAddr)>,
}

impl Target {
    fn addr(&self, port: u16) -> Option<SocketAddr> {
        self.ports.iter().find(|(p, _)| *p == port).map(|(_, a)| *a)
    }

    /// Forwards one client stream to `port`; the error text for the error stream on failure.
    pub async fn forward<S>(&self, port: u16, client: S) -> Result<(), String>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin,
    {
        copy_to_port(self.addr(port), port, &self.sandbox_id, client)
            .await
            .map_err(|why| {
                format!(
                    "error forwarding port {port} to pod {}, uid : {why}",
                    self.sandbox_id
                )
            })
    }
}

async fn copy_to_port<S>(
    addr: Option<SocketAddr>,
    port: u16,
    sandbox_id: &str,
    client: S,
) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Send + Unpin,
{
    // An unmapped port behaves like a port nothing listens on inside the pod.
    let Some(addr) = addr else {
        return Err(format!(
            "failed to connect to localhost:{port} inside namespace \"{sandbox_id}\", IPv4: dial tcp4 127.0.0.1:{port}: connect: connection refused"
        ));
    };
    let tcp = TcpStream::connect(addr).await.map_err(|e| {
        format!(
            "failed to connect to localhost:{port} inside namespace \"{sandbox_id}\", IPv4: dial tcp4 {addr}: connect: {e}"
        )
    })?;
    let _ = tcp.set_nodelay(true);
    let (mut tcp_read, mut tcp_write) = tcp.into_split();
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let to_pod = async {
        let result = tokio::io::copy(&mut client_read, &mut tcp_write).await;
        // Pass the client's end of input on, so request/response servers can finish.
        let _ = tcp_write.shutdown().await;
        result
    };
    let from_pod = async {
        let result = tokio::io::copy(&mut tcp_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
        result
    };
    tokio::pin!(to_pod, from_pod);
    let (first, second) = tokio::select! {
        r = &mut to_pod => (r, tokio::time::timeout(HALF_CLOSE_GRACE, &mut from_pod).await),
        r = &mut from_pod => (r, tokio::time::timeout(HALF_CLOSE_GRACE, &mut to_pod).await),
    };
    first.map_err(|e| e.to_string())?;
    if let Ok(Err(e)) = second {
        return Err(e.to_string());
    }
    Ok(())
}

/// The ports of a WebSocket port-forward request, like upstream `NewV4Options`.
pub fn ws_ports(pairs: &[(String, String)]) -> Result<Vec<u16>, String> {
    let values = query::all(pairs, "port");
    if values.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    let mut ports = Vec::new();
    for value in values {
        if value.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in value.split(',') {
            let port: u16 = p
                .parse()
                .map_err(|e| format!("unable to parse {value:?} as a port: {e}"))?;
            if port < 1 {
                return Err(format!("port {value:?} must be > 0"));
            }
            ports.push(port);
        }
    }
    Ok(ports)
}

/// Runs a WebSocket port-forward session for `ports` until every port's connection ended
/// or the client left.
pub async fn run_websocket(
    ws: Ws,
    protocol: &str,
    ports: Vec<u16>,
    target: Target,
    idle_timeout: Duration,
    gone: CancellationToken,
) {
    let codec = Codec::for_protocol(protocol);
    let activity = Activity::start(idle_timeout, gone.clone());
    let (mut sink, mut stream) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(64);

    let mut inbound = Vec::new();
    let mut workers = Vec::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let data_channel = (2 * i) as u8;
        let error_channel = data_channel + 1;
        let prefix = port.to_le_bytes();
        for channel in [data_channel, error_channel] {
            if sink.send(codec.encode(channel, &prefix)).await.is_err() {
                gone.cancel();
                return;
            }
        }
        let (kube_side, pod_side) = tokio::io::duplex(64 * 1024);
        let (mut from_pod, to_pod) = tokio::io::split(kube_side);
        inbound.push(to_pod);
        let out = out_tx.clone();
        let target = target.clone();
        workers.push(tokio::spawn(async move {
            let pump_out = out.clone();
            let pump = tokio::spawn(async move {
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    match from_pod.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if pump_out
                                .send(codec.encode(data_channel, &buf[..n]))
                                .await
                                .is_err()
                            {
                                break;
                            }
                        }
                    }
                }
            });
            if let Err(msg) = target.forward(port, pod_side).await {
                let _ = out.send(codec.encode(error_channel, msg.as_bytes())).await;
            }
            let _ = pump.await;
        }));
    }
    drop(out_tx);

    let reader_gone = gone.clone();
    let reader_activity = activity.clone();
    let reader = tokio::spawn(async move {
        let mut inbound: Vec<Option<_>> = inbound.into_iter().map(Some).collect();
        loop {
            let msg = tokio::select! {
                _ = reader_gone.cancelled() => break,
                msg = stream.next() => msg,
            };
            let Some(Ok(msg)) = msg else { break };
            reader_activity.touch();
            if matches!(msg, Message::Close(_)) {
                break;
            }
            let Some(payload) = websocket::payload(&msg) else {
                continue;
            };
            let Incoming::Data(channel, data) = codec.decode(payload) else {
                continue;
            };
            // Only data channels are readable; the error channels are write-only.
            if channel % 2 != 0 {
                continue;
            }
            let Some(slot) = inbound.get_mut(usize::from(channel / 2)) else {
                continue;
            };
            if let Some(writer) = slot
                && writer.write_all(&data).await.is_err()
            {
                *slot = None;
            }
        }
        reader_gone.cancel();
    });

    let all_done = async {
        for worker in workers {
            let _ = worker.await;
        }
    };
    tokio::pin!(all_done);
    loop {
        tokio::select! {
            _ = gone.cancelled() => break,
            msg = out_rx.recv() => match msg {
                Some(msg) => {
                    activity.touch();
                    if sink.send(msg).await.is_err() {
                        break;
                    }
                }
                None => {
                    let _ = sink.send(websocket::normal_close()).await;
                    break;
                }
            },
        }
    }
    gone.cancel();
    reader.abort();
    // Workers end once their streams are dropped with the connection.
    let _ = tokio::time::timeout(HALF_CLOSE_GRACE * 2, &mut all_done).await;
}

/// The port-forward protocol the kubelet offers over SPDY.
pub const SPDY_PROTOCOLS: &[&str] = &["portforward.k8s.io"];

/// The streams of one forwarded connection, as they arrive.
struct Pending {
    deadline: tokio::time::Instant,
    data: Option<Stream>,
    error: Option<Stream>,
}

/// Runs a SPDY port-forward session: every request is a pair of streams (`streamtype` `data`
/// and `error`, same `requestid`, `port` header) forwarded on its own; many per connection.
pub async fn run_spdy(
    conn: Connection,
    mut incoming: SpdyIncoming,
    target: Target,
    creation_timeout: Duration,
    idle_timeout: Duration,
    gone: CancellationToken,
) {
    let activity = Activity::start(idle_timeout, gone.clone());
    let mut pending: HashMap<String, Pending> = HashMap::new();
    let mut forwards = tokio::task::JoinSet::new();
    loop {
        let next_deadline = pending.values().map(|p| p.deadline).min();
        let expiry = async {
            match next_deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let stream = tokio::select! {
            _ = gone.cancelled() => break,
            _ = conn.closed() => break,
            _ = expiry => {
                let now = tokio::time::Instant::now();
                let expired: Vec<String> = pending
                    .iter()
                    .filter(|(_, p)| p.deadline <= now)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in expired {
                    if let Some(p) = pending.remove(&id) {
                        print_error(p.error, "timed out waiting for streams").await;
                    }
                }
                continue;
            }
            stream = incoming.next() => stream,
        };
        let Some(stream) = stream else { break };
        activity.touch();
        let (port, kind) = match check_stream(&stream) {
            Ok(checked) => checked,
            Err(why) => {
                // The kubelet's stream handler refuses such a stream.
                tracing::debug!(%why, "refusing port-forward stream");
                let _ = stream.reset().await;
                continue;
            }
        };
        if stream.reply().await.is_err() {
            break;
        }
        let request_id = request_id(&stream, kind);
        let entry = pending
            .entry(request_id.clone())
            .or_insert_with(|| Pending {
                deadline: tokio::time::Instant::now() + creation_timeout,
                data: None,
                error: None,
            });
        let slot = match kind {
            StreamKind::Data => &mut entry.data,
            StreamKind::Error => &mut entry.error,
        };
        if slot.is_some() {
            let what = match kind {
                StreamKind::Data => "data",
                StreamKind::Error => "error",
            };
            let msg = format!(
                "error processing stream for request {request_id}: {what} stream already assigned"
            );
            let _ = stream.reset().await;
            if let Some(err) = entry.error.as_mut() {
                let _ = err.write_all(msg.as_bytes()).await;
            }
            continue;
        }
        *slot = Some(stream);
        if entry.data.is_some() && entry.error.is_some() {
            let Some(Pending {
                data: Some(data),
                error: Some(error),
                ..
            }) = pending.remove(&request_id)
            else {
                continue;
            };
            let target = target.clone();
            let activity = activity.clone();
            forwards.spawn(async move {
                let data = Touching {
                    inner: data,
                    activity,
                };
                let result = target.forward(port, data).await;
                if let Err(msg) = result {
                    let mut error = error;
                    let _ = error.write_all(msg.as_bytes()).await;
                    let _ = error.shutdown().await;
                }
            });
        }
    }
    forwards.abort_all();
    conn.abort();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamKind {
    Data,
    Error,
}

/// The kubelet's checks of a new port-forward stream: a valid `port` and a known type.
fn check_stream(stream: &Stream) -> Result<(u16, StreamKind), String> {
    let port_text = stream
        .header("port")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| "\"port\" header is required".to_string())?;
    let port: u16 = port_text
        .parse()
        .map_err(|e| format!("unable to parse {port_text:?} as a port: {e}"))?;
    if port < 1 {
        return Err(format!("port {port_text:?} must be > 0"));
    }
    let kind = match stream.header("streamtype") {
        Some("data") => StreamKind::Data,
        Some("error") => StreamKind::Error,
        None | Some("") => return Err("\"streamType\" header is required".into()),
        Some(other) => return Err(format!("invalid stream type {other:?}")),
    };
    Ok((port, kind))
}

/// The request id pairing data and error streams; old clients send none, and the kubelet
/// derives one from the stream ids (error = id, data = id - 2).
fn request_id(stream: &Stream, kind: StreamKind) -> String {
    match stream.header("requestid").filter(|id| !id.is_empty()) {
        Some(id) => id.to_string(),
        None => match kind {
            StreamKind::Error => stream.id().to_string(),
            StreamKind::Data => (i64::from(stream.id()) - 2).to_string(),
        },
    }
}

async fn print_error(error: Option<Stream>, msg: &str) {
    if let Some(mut error) = error {
        let _ = error.write_all(msg.as_bytes()).await;
        let _ = error.shutdown().await;
    }
}

/// A stream that counts its traffic as connection activity (for the idle timeout).
struct Touching<S> {
    inner: S,
    activity: Activity,
}

impl<S: AsyncRead + Unpin> AsyncRead for Touching<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if result.is_ready() {
            self.activity.touch();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Touching<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if result.is_ready() {
            self.activity.touch();
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ws_ports_follow_upstream() {
        let q = |s: &str| query::parse(Some(s)).unwrap();
        assert_eq!(
            ws_ports(&q("port=80&port=443,8080")).unwrap(),
            vec![80, 443, 8080]
        );
        assert!(ws_ports(&q("")).is_err());
        assert!(ws_ports(&q("port=")).is_err());
        assert!(ws_ports(&q("port=0")).is_err());
        assert!(ws_ports(&q("port=70000")).is_err());
    }
}

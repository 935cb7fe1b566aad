//! Accepting connections until shutdown, for both of relaylet's listeners (the kubelet port and
//! the operations port).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long to wait after a failed accept before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The next connection on `listener`, or `None` once `stop` fires. A failed accept (out of file
/// descriptors and the like) is logged, naming `port`, and retried after a pause instead of
/// spinning.
pub async fn next(
    listener: &TcpListener,
    stop: &CancellationToken,
    port: &str,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok(conn) => return Some(conn),
                Err(err) => {
                    tracing::warn!(%err, port, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}

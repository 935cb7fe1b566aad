//! A TCP forwarder a test puts between relaylet and a leaf apiserver, so it can abort relaylet's
//! connections to that leaf in the middle of a session: what a leaf apiserver that dies, or a
//! network that drops the connection, does to relaylet. It forwards bytes untouched (TLS passes
//! through end to end); [`Forwarder::abort_all`] resets relaylet's side of every open connection,
//! and [`Forwarder::black_hole`] stops every byte both ways while the connections stay open (a
//! network partition: no error, no answer), until it is lifted and the bytes held flow again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A running forwarder; it stops when dropped.
pub struct Forwarder {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// Fires to abort the connections open now; replaced by a fresh token at each abort.
    generation: Arc<Mutex<CancellationToken>>,
    /// `true` while no byte moves.
    hole: watch::Sender<bool>,
    stop: CancellationToken,
}

impl Forwarder {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> Forwarder {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("forwarder listens");
        let addr = listener.local_addr().expect("forwarder address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let generation = Arc::new(Mutex::new(CancellationToken::new()));
        let stop = CancellationToken::new();
        let hole = watch::Sender::new(false);
        tokio::spawn({
            let hole = hole.clone();
            let accepted = accepted.clone();
            let generation = generation.clone();
            let stop = stop.clone();
            async move {
                loop {
                    let (caller, _) = tokio::select! {
                        _ = stop.cancelled() => return,
                        conn = listener.accept() => match conn {
                            Ok(conn) => conn,
                            Err(_) => continue,
                        },
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let abort = generation.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    let stop = stop.clone();
                    let hole = hole.subscribe();
                    tokio::spawn(async move {
                        let Ok(leaf) = TcpStream::connect(target).await else {
                            return;
                        };
                        let _ = caller.set_nodelay(true);
                        let _ = leaf.set_nodelay(true);
                        let (mut caller_in, mut caller_out) = caller.into_split();
                        let (mut leaf_in, mut leaf_out) = leaf.into_split();
                        let both = async {
                            tokio::join!(
                                pump(&mut caller_in, &mut leaf_out, hole.clone()),
                                pump(&mut leaf_in, &mut caller_out, hole),
                            )
                        };
                        tokio::select! {
                            _ = both => {}
                            _ = abort.cancelled() => {
                                // RST towards relaylet: an abort, not an orderly close.
                                if let Ok(caller) = caller_in.reunite(caller_out) {
                                    let _ = caller.set_zero_linger();
                                }
                            }
                            _ = stop.cancelled() => {}
                        }
                    });
                }
            }
        });
        Forwarder {
            addr,
            accepted,
            generation,
            hole,
            stop,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Resets relaylet's side of every connection open now (later ones are forwarded again).
    pub fn abort_all(&self) {
        let mut current = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::replace(&mut *current, CancellationToken::new());
        old.cancel();
    }
}

impl Forwarder {
    /// While `on`, no byte moves either way, on open connections and new ones alike; the
    /// connections stay open and what was held flows once it is lifted.
    pub fn black_hole(&self, on: bool) {
        self.hole.send_replace(on);
    }
}

/// Copies `from` to `to`, holding every byte while the hole is on.
async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    mut hole: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if hole.wait_for(|on| !*on).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Read just as the hole opened: held until it closes.
        if hole.wait_for(|on| !*on).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

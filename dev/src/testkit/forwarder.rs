//! A TCP forwarder a test puts between relaylet and a leaf apiserver, so it can abort relaylet's
//! connections to that leaf in the middle of a session: what a leaf apiserver that dies, or a
//! network that drops the connection, does to relaylet. It forwards bytes untouched (TLS passes
//! through end to end); [`Forwarder::abort_all`] resets relaylet's side of every open connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A running forwarder; it stops when dropped.
pub struct Forwarder {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// Fires to abort the connections open now; replaced by a fresh token at each abort.
    generation: Arc<Mutex<CancellationToken>>,
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
        tokio::spawn({
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
                    tokio::spawn(async move {
                        let Ok(mut leaf) = TcpStream::connect(target).await else {
                            return;
                        };
                        let mut caller = caller;
                        let _ = caller.set_nodelay(true);
                        let _ = leaf.set_nodelay(true);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut caller, &mut leaf) => {}
                            _ = abort.cancelled() => {
                                // RST towards relaylet: an abort, not an orderly close.
                                let _ = caller.set_zero_linger();
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

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

//! attach: connects a client to a container's running main process.
//!
//! The client sees the process's output from the moment it attached; its stdin goes into the
//! process if the container keeps stdin open; resize events resize the container's terminal.
//! Like containerd's attach for a container without `stdinOnce`, the session ends (Success)
//! when the process exits or when the client closes its stdin; the process keeps running in
//! the latter case.

use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;

use super::container::Instance;
use super::status::Outcome;
use super::streams::{OutStream, Streams};

/// Streams `instance` to and from the client until one of them ends.
pub async fn run(instance: Arc<Instance>, mut streams: Streams) {
    let opts = streams.opts;
    let mut output = instance.subscribe();
    let mut running = instance.running();
    let process_stdin = instance.stdin();
    let mut client_stdin = streams.stdin.take();
    let mut resize = streams.resize.take();
    // It may have exited between the route's check and our subscription.
    if !*running.borrow_and_update() {
        streams.output.finish(Outcome::Success).await;
        return;
    }
    let outcome = loop {
        tokio::select! {
            _ = streams.gone.cancelled() => return,
            chunk = output.recv() => match chunk {
                Ok((stream, data)) => {
                    let wanted = match stream {
                        OutStream::Stdout => opts.stdout,
                        OutStream::Stderr => opts.stderr,
                    };
                    if wanted && streams.output.write(stream, data).await.is_err() {
                        return;
                    }
                }
                // A slow client misses output rather than stalling the container.
                Err(RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "attached client fell behind");
                }
                Err(RecvError::Closed) => break Outcome::Success,
            },
            changed = running.changed() => {
                if changed.is_err() || !*running.borrow() {
                    // The process exited and all its output was published: send what is
                    // still queued for us, then end.
                    while let Ok((stream, data)) = output.try_recv() {
                        let wanted = match stream {
                            OutStream::Stdout => opts.stdout,
                            OutStream::Stderr => opts.stderr,
                        };
                        if wanted && streams.output.write(stream, data).await.is_err() {
                            return;
                        }
                    }
                    break Outcome::Success;
                }
            }
            data = recv_opt(&mut client_stdin) => match data {
                Some(data) => {
                    if let Some(tx) = &process_stdin {
                        let _ = tx.send(data).await;
                    }
                }
                None => break Outcome::Success,
            },
            size = recv_opt(&mut resize) => match size {
                Some(size) => instance.resize(size),
                None => resize = None,
            },
        }
    };
    if opts.stdout {
        streams.output.close(OutStream::Stdout).await;
    }
    if opts.stderr {
        streams.output.close(OutStream::Stderr).await;
    }
    streams.output.finish(outcome).await;
}

/// Receives from an optional channel; pends forever when there is none.
async fn recv_opt<T>(rx: &mut Option<tokio::sync::mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

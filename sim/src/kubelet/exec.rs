//! exec: runs a new process in a container and connects it to the client's streams.
//!
//! Like a container runtime's exec: the real argv runs with the container's environment and
//! working directory; `tty` gives it a terminal sized by the client's resize events, otherwise
//! stdout and stderr stay apart; client stdin EOF closes the process's stdin; the exit code is
//! the process's (128 + signal if killed). If the client goes away, the process keeps running,
//! as with containerd and CRI-O (kubernetes/kubernetes#89031, kubernetes/kubectl#1076): only its
//! stdin ends; it is killed when it outlives its container.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::pods::Container;
use super::process::{self, OutputSource, ProcessIo, SpawnSpec, StdinSink};
use super::status::Outcome;
use super::streams::{OutStream, Streams, TermSize};

/// How long to wait for a tty client's first terminal size before starting the process.
/// Clients send it right after the streams are up; starting with it applied makes the very
/// first `stty size` or prompt see the real size instead of racing the resize.
const FIRST_SIZE_WAIT: Duration = Duration::from_millis(500);

/// How long output may keep flowing after the process exited.
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// Runs `argv` in `container` and reports its outcome on `streams` (unless the client left).
pub async fn run(
    container: Arc<Container>,
    pod_name: String,
    argv: Vec<String>,
    mut streams: Streams,
) {
    let opts = streams.opts;
    let mut first_size = None;
    if opts.tty
        && let Some(resize) = streams.resize.as_mut()
    {
        tokio::select! {
            _ = streams.gone.cancelled() => return,
            size = tokio::time::timeout(FIRST_SIZE_WAIT, resize.recv()) => {
                first_size = size.ok().flatten();
            }
        }
    }
    let mut env = container.spec.env.clone();
    env.push(("HOSTNAME".into(), pod_name));
    let spawned = match process::spawn(&SpawnSpec {
        argv: &argv,
        env: &env,
        cwd: &container.cwd,
        stdin: opts.stdin,
        tty: opts.tty,
        size: first_size,
    }) {
        Ok(s) => s,
        Err(e) => {
            let outcome = Outcome::Failed(format!("error executing command in container: {e}"));
            streams.output.finish(outcome).await;
            return;
        }
    };
    let mut child = spawned.child;
    let group = spawned.group;

    let (sources, stdin_sink, pty) = match spawned.io {
        ProcessIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => (
            vec![
                (OutStream::Stdout, OutputSource::Pipe(Box::new(stdout))),
                (OutStream::Stderr, OutputSource::Pipe(Box::new(stderr))),
            ],
            stdin.map(StdinSink::Pipe),
            None,
        ),
        ProcessIo::Tty(pty) => {
            let pty = Arc::new(pty);
            (
                vec![(OutStream::Stdout, OutputSource::Tty(pty.clone()))],
                opts.stdin.then(|| StdinSink::Tty(pty.clone())),
                Some(pty),
            )
        }
    };

    let mut helpers: Vec<JoinHandle<()>> = Vec::new();
    if let (Some(mut rx), Some(mut sink)) = (streams.stdin.take(), stdin_sink) {
        helpers.push(tokio::spawn(async move {
            while let Some(data) = rx.recv().await {
                if sink.write_all(&data).await.is_err() {
                    return;
                }
            }
            sink.close().await;
        }));
    }
    if let (Some(mut resize), Some(pty)) = (streams.resize.take(), pty) {
        helpers.push(tokio::spawn(async move {
            while let Some(size) = resize.recv().await {
                apply_size(&pty, size);
            }
        }));
    }
    let pumps: Vec<JoinHandle<()>> = sources
        .into_iter()
        .map(|(stream, mut source)| {
            let output = streams.output.clone();
            tokio::spawn(async move {
                let mut client_gone = false;
                while let Some(chunk) = source.next_chunk().await {
                    // Keep draining after the client left so the process never blocks on a
                    // full pipe before it is killed.
                    if !client_gone && output.write(stream, chunk).await.is_err() {
                        client_gone = true;
                    }
                }
                output.close(stream).await;
            })
        })
        .collect();

    let finished = async {
        let status = child.wait().await;
        // Output ends when the last holder of the pipes or terminal closes it; a background
        // process the command left behind may hold it forever, so it gets a short grace.
        let drained = async {
            for pump in pumps {
                let _ = pump.await;
            }
        };
        tokio::pin!(drained);
        if tokio::time::timeout(OUTPUT_GRACE, &mut drained)
            .await
            .is_err()
        {
            group.kill();
            drained.await;
        }
        status
    };
    tokio::pin!(finished);
    // The container is going away: its exec processes die with it (and say so, if the client
    // is still there).
    let stopping = async {
        container.stopped.cancelled().await;
        group.kill();
    };
    tokio::pin!(stopping);
    let status = tokio::select! {
        _ = streams.gone.cancelled() => {
            // A runtime does not end an exec whose client left: wait for the process (or its
            // container's end) without anyone to tell.
            tokio::select! {
                _ = &mut finished => {}
                _ = &mut stopping => { let _ = (&mut finished).await; }
            }
            None
        }
        status = &mut finished => Some(status),
        _ = &mut stopping => {
            tokio::select! {
                _ = streams.gone.cancelled() => None,
                status = &mut finished => Some(status),
            }
        }
    };
    let outcome = status.map(|status| match status {
        Ok(status) => match process::exit_code(status) {
            0 => Outcome::Success,
            code => Outcome::Exited { code, argv },
        },
        Err(e) => Outcome::Failed(format!("error executing command in container: {e}")),
    });
    // Whatever happened, nothing this exec started may outlive it.
    group.kill();
    for helper in helpers {
        helper.abort();
    }
    if let Some(outcome) = outcome {
        streams.output.finish(outcome).await;
    }
}

fn apply_size(pty: &process::Pty, size: TermSize) {
    if let Err(e) = pty.resize(size) {
        tracing::debug!(error = %e, "resizing terminal failed");
    }
}

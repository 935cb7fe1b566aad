//! The SPDY/3.1 transport of a remote command session (upstream `remotecommand/httpstream.go`).
//!
//! After the 101 the client opens one stream per channel, each named by its `streamtype`
//! header (`error`, `stdin`, `stdout`, `stderr`, `resize`). Every stream is replied to; the
//! session starts once the expected set is there (error + requested streams + resize for a
//! tty on v3 and later) or fails after the creation timeout. When the command is done the
//! exit status is written on the error stream per protocol version, the remaining streams are
//! reset and the connection goes away — the frame sequence the kubelet produces.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::idle::Activity;
use super::status::StatusFormat;
use super::streams::{self, OutMsg, OutStream, ResizeDecoder, StreamOptions, Streams};
use crate::spdy::{Connection, Incoming, Stream};

/// The remote command protocols the kubelet offers over SPDY, newest first.
pub const REMOTE_COMMAND_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

/// What a negotiated version means for the session.
#[derive(Debug, Clone, Copy)]
struct Version {
    resize: bool,
    format: StatusFormat,
    /// The 1.0-era protocol: the kubelet resets the error stream as soon as the streams are
    /// there (so no status ever arrives) and half-closes stdin, as upstream still does.
    v1: bool,
}

impl Version {
    fn of(protocol: Option<&str>) -> Self {
        match protocol {
            // v5 only adds stream close, which SPDY has natively (FIN): the kubelet serves it
            // with the v4 handler.
            Some("v5.channel.k8s.io") | Some("v4.channel.k8s.io") => Version {
                resize: true,
                format: StatusFormat::Json,
                v1: false,
            },
            Some("v3.channel.k8s.io") => Version {
                resize: true,
                format: StatusFormat::Text,
                v1: false,
            },
            Some("v2.channel.k8s.io") => Version {
                resize: false,
                format: StatusFormat::Text,
                v1: false,
            },
            _ => Version {
                resize: false,
                format: StatusFormat::Text,
                v1: true,
            },
        }
    }
}

/// The client's streams, by type.
#[derive(Default)]
struct ClientStreams {
    error: Option<Stream>,
    stdin: Option<Stream>,
    stdout: Option<Stream>,
    stderr: Option<Stream>,
    resize: Option<Stream>,
}

/// Accepts the client's streams and, once they are all there, returns the command's
/// [`Streams`] with the transport running behind them. `None` if the client did not open its
/// streams in time or went away (the connection is closed then).
#[allow(clippy::too_many_arguments)]
pub async fn start(
    conn: Connection,
    mut incoming: Incoming,
    protocol: Option<String>,
    opts: StreamOptions,
    creation_timeout: Duration,
    idle_timeout: Duration,
    gone: CancellationToken,
) -> Option<(Streams, tokio::task::JoinHandle<()>)> {
    let version = Version::of(protocol.as_deref());
    let expected = 1
        + usize::from(opts.stdin)
        + usize::from(opts.stdout)
        + usize::from(opts.stderr)
        + usize::from(opts.tty && version.resize);
    let mut got = ClientStreams::default();
    let mut received = 0;
    let deadline = tokio::time::sleep(creation_timeout);
    tokio::pin!(deadline);
    while received < expected {
        let stream = tokio::select! {
            _ = &mut deadline => {
                tracing::debug!("timed out waiting for client to create streams");
                conn.goaway().await;
                return None;
            }
            _ = gone.cancelled() => {
                conn.abort();
                return None;
            }
            stream = incoming.next() => stream,
        };
        let stream = stream?;
        // Every stream is accepted; only the known types count towards the expected set.
        if stream.reply().await.is_err() {
            return None;
        }
        let slot = match stream.header("streamtype") {
            Some("error") => &mut got.error,
            Some("stdin") => &mut got.stdin,
            Some("stdout") => &mut got.stdout,
            Some("stderr") => &mut got.stderr,
            Some("resize") if version.resize => &mut got.resize,
            other => {
                tracing::debug!(stream_type = ?other, "unexpected stream type");
                continue;
            }
        };
        *slot = Some(stream);
        received += 1;
    }
    if version.v1
        && let Some(error) = got.error.take()
    {
        let _ = error.reset().await;
    }
    let resize_stream = got.resize.take().filter(|_| opts.tty);
    let (streams, ends) = streams::pair(opts, resize_stream.is_some(), gone.clone());
    let activity = Activity::start(idle_timeout, gone.clone());
    let transport = tokio::spawn(run(conn, got, resize_stream, ends, version, activity));
    Some((streams, transport))
}

async fn run(
    conn: Connection,
    got: ClientStreams,
    resize_stream: Option<Stream>,
    ends: streams::TransportEnds,
    version: Version,
    activity: Activity,
) {
    let streams::TransportEnds {
        stdin,
        resize,
        mut output,
        gone,
    } = ends;
    let mut resets = Vec::new();
    let mut helpers = Vec::new();

    // Client stdin: its FIN is the end of input.
    if let (Some(stream), Some(tx)) = (got.stdin, stdin) {
        let (mut reader, mut writer) = stream.into_split();
        if version.v1 {
            let _ = writer.shutdown().await;
        } else {
            resets.push(writer);
        }
        let activity = activity.clone();
        helpers.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        activity.touch();
                        if tx
                            .send(bytes::Bytes::copy_from_slice(&buf[..n]))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
        }));
    }
    if let (Some(stream), Some(tx)) = (resize_stream, resize) {
        let (mut reader, writer) = stream.into_split();
        resets.push(writer);
        helpers.push(tokio::spawn(async move {
            let mut decoder = ResizeDecoder::default();
            let mut buf = vec![0u8; 1024];
            loop {
                let n = match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                match decoder.feed(&buf[..n]) {
                    Ok(sizes) => {
                        for size in sizes {
                            let _ = tx.send(size).await;
                        }
                    }
                    Err(why) => {
                        tracing::debug!(%why, "ignoring further resize events");
                        break;
                    }
                }
            }
        }));
    }
    let mut stdout = got.stdout.map(|s| s.into_split().1);
    let mut stderr = got.stderr.map(|s| s.into_split().1);
    let mut error = got.error.map(|s| s.into_split().1);

    // The connection dying is the client going away.
    let watch_conn = conn.clone();
    let watch_gone = gone.clone();
    helpers.push(tokio::spawn(async move {
        watch_conn.closed().await;
        watch_gone.cancel();
    }));

    loop {
        let msg = tokio::select! {
            _ = gone.cancelled() => {
                conn.abort();
                break;
            }
            msg = output.recv() => msg,
        };
        match msg {
            Some(OutMsg::Data(which, data)) => {
                let writer = match which {
                    OutStream::Stdout => stdout.as_mut(),
                    OutStream::Stderr => stderr.as_mut(),
                };
                if let Some(w) = writer {
                    activity.touch();
                    if w.write_all(&data).await.is_err() {
                        gone.cancel();
                    }
                }
            }
            Some(OutMsg::Close(which)) => {
                let slot = match which {
                    OutStream::Stdout => &mut stdout,
                    OutStream::Stderr => &mut stderr,
                };
                // FIN; a stream we closed is not reset at the end.
                if let Some(mut w) = slot.take() {
                    let _ = w.shutdown().await;
                }
            }
            Some(OutMsg::Finish(outcome)) => {
                if let (Some(w), Some(status)) = (error.as_mut(), outcome.encode(version.format)) {
                    let _ = w.write_all(&status).await;
                }
                // Like spdystream's Close: streams we have not closed are reset, then GOAWAY.
                for w in error.iter().chain(stdout.iter()).chain(stderr.iter()) {
                    let _ = w.reset().await;
                }
                for w in &resets {
                    let _ = w.reset().await;
                }
                conn.goaway().await;
                break;
            }
            None => {
                conn.goaway().await;
                break;
            }
        }
    }
    gone.cancel();
    for helper in helpers {
        helper.abort();
    }
}

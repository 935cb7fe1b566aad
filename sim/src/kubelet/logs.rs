//! `GET /containerLogs/{ns}/{pod}/{container}`: container logs from the CRI log files.
//!
//! Reading follows upstream `kuberuntime/logs.ReadLogs`: seek to the start of the last
//! `tailLines` lines, decode records, drop those older than `since*`, prefix timestamps in the
//! fixed-width RFC 3339 form, cut at `limitBytes`, and with `follow` wait for new records until
//! the container's process has exited and everything it wrote was sent. The body is streamed
//! in chunks as records are read; a whole log is never held in memory.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use k8s_openapi::jiff::{Timestamp, tz::TimeZone};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, BufReader};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::container::Instance;
use super::cri_log::{self, MAX_LINE};
use super::log_options::{LogOptions, OptionsError, StreamSelect};
use super::shared::Shared;
use super::streams::OutStream;
use super::text::text;

/// Send output in chunks of about this size when more is ready at once.
const CHUNK: usize = 32 * 1024;

/// How often a follower re-checks the file even without a write notification (the kubelet's
/// `logForceCheckPeriod`).
const FORCE_CHECK: Duration = Duration::from_secs(1);

/// Serves one `containerLogs` request.
pub async fn serve(
    shared: Arc<Shared>,
    namespace: &str,
    pod_name: &str,
    container: &str,
    raw_query: Option<&str>,
) -> Response {
    let pairs = match super::query::parse(raw_query) {
        Ok(p) => p,
        Err(_) => {
            return text(
                StatusCode::BAD_REQUEST,
                r#"{"message": "Unable to decode query."}"#,
            );
        }
    };
    let opts = match LogOptions::from_query(&pairs) {
        Ok(o) => o,
        Err(OptionsError::Decode(why)) => {
            tracing::debug!(%why, "undecodable log options");
            return text(
                StatusCode::BAD_REQUEST,
                r#"{"message": "Unable to decode query."}"#,
            );
        }
        Err(OptionsError::Invalid(why)) => {
            tracing::debug!(?why, "invalid log options");
            return text(
                StatusCode::UNPROCESSABLE_ENTITY,
                r#"{"message": "Invalid request."}"#,
            );
        }
    };
    let Some(pod) = shared.pods.get(namespace, pod_name) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    };
    let Some(c) = pod.container(container) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    };
    let instance = if opts.previous {
        c.previous()
    } else {
        c.current()
    };
    let Some(instance) = instance else {
        let msg = if opts.previous {
            format!("previous terminated container {container:?} in pod {pod_name:?} not found")
        } else {
            format!("container {container:?} in pod {pod_name:?} is waiting to start")
        };
        return text(StatusCode::BAD_REQUEST, msg);
    };
    let file = match tokio::fs::File::open(&instance.log_path).await {
        Ok(f) => f,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!(
                    "failed to open log file {:?}: {e}",
                    instance.log_path.display().to_string()
                ),
            );
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let span = tracing::info_span!(
        "container_logs",
        node = %shared.node_name,
        %namespace,
        pod = %pod_name,
        %container
    );
    let open = OpenStream::new(shared.open_log_streams.clone());
    tokio::spawn(
        async move {
            let _open = open;
            if let Err(e) = read_logs(file, instance, opts, tx).await {
                tracing::debug!(error = %e, "log stream ended with error");
            }
        }
        .instrument(span),
    );
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::io::Error>(chunk), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "building response"))
}

/// Counts a containerLogs response as open until its reader ends.
struct OpenStream(Arc<std::sync::atomic::AtomicUsize>);

impl OpenStream {
    fn new(counter: Arc<std::sync::atomic::AtomicUsize>) -> OpenStream {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        OpenStream(counter)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Why reading stopped early.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("reading log file: {0}")]
    Io(#[from] std::io::Error),
    #[error("client went away")]
    Gone,
}

/// Collects output and sends it in chunks.
struct Sink {
    tx: mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl Sink {
    async fn push(&mut self, data: &[u8]) -> Result<(), ReadError> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ReadError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        self.tx.send(chunk).await.map_err(|_| ReadError::Gone)
    }
}

async fn read_logs(
    mut file: tokio::fs::File,
    instance: Arc<Instance>,
    opts: LogOptions,
    tx: mpsc::Sender<Bytes>,
) -> Result<(), ReadError> {
    let tail = opts.tail_lines.unwrap_or(-1);
    let start = cri_log::tail_start(&mut file, tail).await?;
    file.seek(std::io::SeekFrom::Start(start)).await?;
    let mut reader = BufReader::new(file);
    let limited_mode = tail >= 0 && !opts.follow;
    let mut limited_left = tail;
    let since = opts.since(cri_log::now());
    let mut remain = opts.limit_bytes.unwrap_or(i64::MAX);
    let mut sink = Sink {
        tx: tx.clone(),
        buf: Vec::new(),
    };
    let mut written = instance.log_written();
    let mut running = instance.running();
    let mut line = Vec::new();
    // Set while dropping the rest of a line too long to be one of our records.
    let mut skipping = false;
    loop {
        if limited_mode && limited_left == 0 {
            break;
        }
        // Sample before reading: if the process had already exited, reaching the end of the
        // file means everything it wrote has been read.
        let was_running = *running.borrow_and_update();
        let room = (MAX_LINE - line.len()) as u64;
        let n = (&mut reader)
            .take(room)
            .read_until(b'\n', &mut line)
            .await?;
        let complete = line.last() == Some(&b'\n');
        if !complete && line.len() >= MAX_LINE {
            line.clear();
            skipping = true;
            continue;
        }
        if complete && skipping {
            line.clear();
            skipping = false;
            continue;
        }
        if !complete {
            debug_assert!(n == 0 || line.len() < MAX_LINE);
            if opts.follow {
                if !was_running {
                    break;
                }
                sink.flush().await?;
                tokio::select! {
                    _ = written.changed() => {}
                    _ = running.changed() => {}
                    _ = tokio::time::sleep(FORCE_CHECK) => {}
                    _ = tx.closed() => return Err(ReadError::Gone),
                }
                continue;
            }
            // Without follow, an unterminated last line is still returned, then we stop.
            if line.is_empty() || skipping {
                break;
            }
        }
        let record = match cri_log::parse(&line) {
            Ok(r) => r,
            Err(why) => {
                tracing::debug!(%why, "skipping malformed log line");
                line.clear();
                if !complete {
                    break;
                }
                continue;
            }
        };
        line.clear();
        let wanted = match opts.stream {
            StreamSelect::All => true,
            StreamSelect::Stdout => record.stream == OutStream::Stdout,
            StreamSelect::Stderr => record.stream == OutStream::Stderr,
        };
        if wanted && since.is_none_or(|s| record.time >= s) {
            let mut out = Vec::with_capacity(record.content.len() + 32);
            if opts.timestamps {
                out.extend_from_slice(fixed_rfc3339(record.time).as_bytes());
                out.push(b' ');
            }
            out.extend_from_slice(&record.content);
            let take = out.len().min(usize::try_from(remain).unwrap_or(usize::MAX));
            sink.push(&out[..take]).await?;
            remain -= take as i64;
            if remain <= 0 {
                break;
            }
        }
        if limited_mode {
            limited_left -= 1;
        }
        if !complete {
            break;
        }
    }
    sink.flush().await
}

/// RFC 3339 in UTC with exactly nine fraction digits (the kubelet's `RFC3339NanoFixed`).
pub fn fixed_rfc3339(ts: Timestamp) -> String {
    let dt = ts.to_zoned(TimeZone::UTC).datetime();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        dt.subsec_nanosecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_timestamps_keep_nine_digits() {
        let t: Timestamp = "2026-11-21T19:55:01.5Z".parse().unwrap();
        assert_eq!(fixed_rfc3339(t), "2026-11-21T19:55:01.500000000Z");
        let t: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        assert_eq!(fixed_rfc3339(t), "2026-01-02T03:04:05.000000000Z");
    }
}

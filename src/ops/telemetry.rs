//! Log output: text or JSON lines (`LOG_FORMAT`), filtered by `RUST_LOG` (default `info`).
//!
//! Each relayed session logs one `session_start` and one `session_end` line (target
//! `relaylet::session`, see `relay::session`). Nothing relaylet logs carries a secret: tokens,
//! Authorization headers and kubeconfig contents are never put in a field.

use tracing::Dispatch;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::LogFormat;

/// Installs the global subscriber once; later calls are ignored (tests start several).
pub fn init(format: LogFormat) {
    use std::io::IsTerminal;
    // Colour only for a person at a terminal, never into a file or a log collector.
    let colour = std::io::stderr().is_terminal();
    // Also routes the `log` records of dependencies (rustls) into it.
    let _ = dispatch_with_colour(format, std::io::stderr, colour).try_init();
}

/// relaylet's log lines in `format`, written to `writer`, as a subscriber not installed
/// anywhere (a test scopes it to the threads of one relaylet).
pub fn dispatch<W>(format: LogFormat, writer: W) -> Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    dispatch_with_colour(format, writer, false)
}

fn dispatch_with_colour<W>(format: LogFormat, writer: W, colour: bool) -> Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(writer);
    match format {
        LogFormat::Text => Dispatch::new(builder.finish()),
        LogFormat::Json => Dispatch::new(builder.json().flatten_event(true).finish()),
    }
}

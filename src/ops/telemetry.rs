//! Log output: text or JSON lines (`LOG_FORMAT`), filtered by `RUST_LOG` (default `info`).
//!
//! Each relayed session logs one `session_start` and one `session_end` line (target
//! `relaylet::session`, see `relay::session`). Nothing relaylet logs carries a secret: tokens,
//! Authorization headers and kubeconfig contents are never put in a field.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogFormat;

/// Installs the global subscriber once; later calls are ignored (tests start several).
pub fn init(format: LogFormat) {
    use std::io::IsTerminal;
    // Colour only for a person at a terminal, never into a file or a log collector.
    init_with_writer_and_colour(format, std::io::stderr, std::io::stderr().is_terminal());
}

/// Like [`init`], writing lines to `writer` (tests capture the log this way).
pub fn init_with_writer<W>(format: LogFormat, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    init_with_writer_and_colour(format, writer, false);
}

fn init_with_writer_and_colour<W>(format: LogFormat, writer: W, colour: bool)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

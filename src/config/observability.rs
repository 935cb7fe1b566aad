//! What operators read: `METRICS_ADDR`, `LOG_FORMAT`.

use std::net::SocketAddr;

use super::vars::Vars;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// `METRICS_ADDR`.
pub(super) fn metrics_addr(vars: &mut Vars<'_>) -> SocketAddr {
    match vars.get("METRICS_ADDR") {
        None => SocketAddr::from(([0, 0, 0, 0], 9090)),
        Some(raw) => vars.parse(
            "METRICS_ADDR",
            &raw,
            SocketAddr::from(([0, 0, 0, 0], 9090)),
            |v| {
                v.parse::<SocketAddr>()
                    .map_err(|_| format!("{v:?} is not an address like 0.0.0.0:9090"))
            },
        ),
    }
}

/// `LOG_FORMAT`.
pub(super) fn log_format(vars: &mut Vars<'_>) -> LogFormat {
    match vars.get("LOG_FORMAT") {
        None => LogFormat::Text,
        Some(raw) => vars.parse("LOG_FORMAT", &raw, LogFormat::Text, |v| match v {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("{v:?} is not text or json")),
        }),
    }
}

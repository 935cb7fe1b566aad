//! `PodLogOptions` from a `containerLogs` query, decoded and validated like the kubelet does.
//!
//! Decoding follows apimachinery's query conversion: booleans are false only when absent,
//! `0` or `false` (any other value, even empty, is true); integers must parse as base-10
//! int64; `sinceTime` is RFC 3339. A value that does not decode is a 400. Validation is
//! upstream `ValidatePodLogOptions` (with stream selection enabled): negative `tailLines`,
//! `limitBytes` < 1, `sinceSeconds` < 1, both `since*` fields, an unknown `stream`, or a
//! specific stream together with `tailLines` are a 422.

use k8s_openapi::jiff::Timestamp;

use super::query;

/// Which output streams to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamSelect {
    All,
    Stdout,
    Stderr,
}

/// Decoded, validated log options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub since_seconds: Option<i64>,
    pub since_time: Option<Timestamp>,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
    pub stream: StreamSelect,
}

/// Why options were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionsError {
    /// A value does not decode (HTTP 400).
    Decode(String),
    /// The options decode but are not valid together (HTTP 422).
    Invalid(Vec<String>),
}

impl LogOptions {
    /// Decodes and validates the query pairs of a `containerLogs` request.
    pub fn from_query(pairs: &[(String, String)]) -> Result<Self, OptionsError> {
        // The legacy `tail` parameter overrides `tailLines`; `tail=all` means no limit.
        let mut tail_lines = query::first(pairs, "tailLines").map(str::to_string);
        if let Some(tail) = query::first(pairs, "tail").filter(|t| !t.is_empty()) {
            tail_lines = (tail != "all").then(|| tail.to_string());
        }
        let opts = LogOptions {
            follow: boolean(pairs, "follow"),
            previous: boolean(pairs, "previous"),
            timestamps: boolean(pairs, "timestamps"),
            since_seconds: int(query::first(pairs, "sinceSeconds"), "sinceSeconds")?,
            since_time: time(query::first(pairs, "sinceTime"))?,
            tail_lines: int(tail_lines.as_deref(), "tailLines")?,
            limit_bytes: int(query::first(pairs, "limitBytes"), "limitBytes")?,
            stream: match query::first(pairs, "stream") {
                None | Some("All") => StreamSelect::All,
                Some("Stdout") => StreamSelect::Stdout,
                Some("Stderr") => StreamSelect::Stderr,
                Some(other) => {
                    return Err(OptionsError::Invalid(vec![format!(
                        "stream: Unsupported value: {other:?}: supported values: \"Stdout\", \"Stderr\", \"All\""
                    )]));
                }
            },
        };
        let errors = opts.validate();
        if errors.is_empty() {
            Ok(opts)
        } else {
            Err(OptionsError::Invalid(errors))
        }
    }

    fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if let Some(n) = self.tail_lines.filter(|n| *n < 0) {
            errors.push(format!(
                "tailLines: Invalid value: {n}: must be greater than or equal to 0"
            ));
        }
        if let Some(n) = self.limit_bytes.filter(|n| *n < 1) {
            errors.push(format!(
                "limitBytes: Invalid value: {n}: must be greater than 0"
            ));
        }
        match (self.since_seconds, self.since_time) {
            (Some(_), Some(_)) => errors.push(
                "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
            ),
            (Some(n), None) if n < 1 => errors.push(format!(
                "sinceSeconds: Invalid value: {n}: must be greater than 0"
            )),
            _ => {}
        }
        if self.stream != StreamSelect::All && self.tail_lines.is_some() {
            errors.push(
                "Forbidden: `tailLines` and specific `stream` are mutually exclusive for now"
                    .into(),
            );
        }
        errors
    }

    /// The earliest record time to return, if any (`sinceTime`, or now − `sinceSeconds`).
    pub fn since(&self, now: Timestamp) -> Option<Timestamp> {
        let from_seconds = self.since_seconds.and_then(|s| {
            now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                .ok()
        });
        match (from_seconds, self.since_time) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

fn boolean(pairs: &[(String, String)], key: &str) -> bool {
    match query::first(pairs, key) {
        None => false,
        Some(v) => !(v == "0" || v.eq_ignore_ascii_case("false")),
    }
}

fn int(value: Option<&str>, key: &str) -> Result<Option<i64>, OptionsError> {
    value
        .map(|v| {
            v.parse::<i64>()
                .map_err(|_| OptionsError::Decode(format!("{key}: invalid integer {v:?}")))
        })
        .transpose()
}

fn time(value: Option<&str>) -> Result<Option<Timestamp>, OptionsError> {
    match value {
        None | Some("") | Some("null") => Ok(None),
        Some(v) => v.parse::<Timestamp>().map(Some).map_err(|e| {
            OptionsError::Decode(format!("sinceTime: invalid RFC 3339 time {v:?}: {e}"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Vec<(String, String)> {
        query::parse(Some(s)).unwrap()
    }

    #[test]
    fn decodes_like_apimachinery() {
        let o =
            LogOptions::from_query(&q("follow=&previous=0&timestamps=yes&tailLines=3")).unwrap();
        assert!(o.follow && !o.previous && o.timestamps);
        assert_eq!(o.tail_lines, Some(3));
        let o = LogOptions::from_query(&q("tailLines=3&tail=all")).unwrap();
        assert_eq!(o.tail_lines, None);
        let o = LogOptions::from_query(&q("tail=7")).unwrap();
        assert_eq!(o.tail_lines, Some(7));
        assert!(matches!(
            LogOptions::from_query(&q("tailLines=x")),
            Err(OptionsError::Decode(_))
        ));
        assert!(matches!(
            LogOptions::from_query(&q("sinceTime=yesterday")),
            Err(OptionsError::Decode(_))
        ));
    }

    #[test]
    fn validates_like_upstream() {
        for bad in [
            "tailLines=-1",
            "limitBytes=0",
            "sinceSeconds=0",
            "sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z",
            "stream=Both",
            "stream=Stdout&tailLines=1",
        ] {
            assert!(
                matches!(
                    LogOptions::from_query(&q(bad)),
                    Err(OptionsError::Invalid(_))
                ),
                "{bad}"
            );
        }
        assert_eq!(
            LogOptions::from_query(&q("stream=Stderr")).unwrap().stream,
            StreamSelect::Stderr
        );
    }
}

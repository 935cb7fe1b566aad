//! The final status of a remote command, byte for byte as the kubelet writes it.
//!
//! Protocol v4 and v5 (SPDY and WebSocket) carry a JSON `metav1.Status` on the error stream;
//! older protocols carry only the error text, and nothing on success. The JSON follows Go's
//! `encoding/json`: struct field order, omitted empty fields, and `<`, `>`, `&` escaped as
//! `\u003c`, `\u003e`, `\u0026` (client-go decodes either way; the bytes are checked against
//! real kubelet captures).

use serde::Serialize;

/// How a remote command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Exit code 0 (or an attach that ended normally).
    Success,
    /// The command exited with a non-zero code.
    Exited { code: i32, argv: Vec<String> },
    /// The command could not run; the text becomes an InternalError status.
    Failed(String),
}

/// How a protocol version writes the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFormat {
    /// v4/v5: a JSON `metav1.Status`, success included.
    Json,
    /// v1–v3 and pre-v4 WebSocket: the error message only; nothing on success.
    Text,
}

#[derive(Serialize)]
struct Status<'a> {
    metadata: Empty,
    status: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details<'a>>,
    #[serde(skip_serializing_if = "is_zero")]
    code: u16,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct Details<'a> {
    causes: Vec<Cause<'a>>,
}

#[derive(Serialize)]
struct Cause<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
}

fn is_zero(code: &u16) -> bool {
    *code == 0
}

impl Outcome {
    /// The error text (`StatusError.Error()`), or `None` on success.
    pub fn message(&self) -> Option<String> {
        match self {
            Outcome::Success => None,
            Outcome::Exited { code, argv } => Some(format!(
                "command terminated with non-zero exit code: error executing command [{}], exit code {code}",
                argv.join(" ")
            )),
            Outcome::Failed(text) => Some(format!("Internal error occurred: {text}")),
        }
    }

    /// The bytes to write on the error stream, if any.
    pub fn encode(&self, format: StatusFormat) -> Option<Vec<u8>> {
        match format {
            StatusFormat::Text => self.message().map(String::into_bytes),
            StatusFormat::Json => Some(go_json_escape(&self.json()).into_bytes()),
        }
    }

    fn json(&self) -> String {
        let message = self.message().unwrap_or_default();
        let code_text;
        let status = match self {
            Outcome::Success => Status {
                metadata: Empty {},
                status: "Success",
                message: "",
                reason: "",
                details: None,
                code: 0,
            },
            Outcome::Exited { code, .. } => {
                code_text = code.to_string();
                Status {
                    metadata: Empty {},
                    status: "Failure",
                    message: &message,
                    reason: "NonZeroExitCode",
                    details: Some(Details {
                        causes: vec![Cause {
                            reason: "ExitCode",
                            message: &code_text,
                        }],
                    }),
                    code: 0,
                }
            }
            Outcome::Failed(text) => Status {
                metadata: Empty {},
                status: "Failure",
                message: &message,
                reason: "InternalError",
                details: Some(Details {
                    causes: vec![Cause {
                        reason: "",
                        message: text,
                    }],
                }),
                code: 500,
            },
        };
        // Serializing plain strings and numbers cannot fail.
        serde_json::to_string(&status).unwrap_or_default()
    }
}

/// Applies Go's HTML-safe escaping to serialized JSON. The characters only occur inside
/// string literals, so replacing them anywhere in the text is exact.
fn go_json_escape(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exit_status_matches_kubelet_bytes() {
        // From spdy-v4-exec-stdin-stderr-exit3.jsonl (upstream kubelet streaming server).
        let outcome = Outcome::Exited {
            code: 3,
            argv: argv(&["sh", "-c", "cat; echo err >&2; exit 3"]),
        };
        let expected = r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c cat; echo err \u003e\u00262; exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        assert_eq!(
            String::from_utf8(outcome.encode(StatusFormat::Json).unwrap()).unwrap(),
            expected
        );
        assert_eq!(
            Outcome::Success.encode(StatusFormat::Json).unwrap(),
            br#"{"metadata":{},"status":"Success"}"#
        );
    }

    #[test]
    fn text_status_is_only_the_message() {
        assert_eq!(Outcome::Success.encode(StatusFormat::Text), None);
        let outcome = Outcome::Exited {
            code: 2,
            argv: argv(&["false"]),
        };
        assert_eq!(
            outcome.encode(StatusFormat::Text).unwrap(),
            b"command terminated with non-zero exit code: error executing command [false], exit code 2"
        );
    }

    #[test]
    fn internal_error_has_code_500() {
        let json = String::from_utf8(
            Outcome::Failed("boom".into())
                .encode(StatusFormat::Json)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            json,
            r#"{"metadata":{},"status":"Failure","message":"Internal error occurred: boom","reason":"InternalError","details":{"causes":[{"message":"boom"}]},"code":500}"#
        );
    }
}

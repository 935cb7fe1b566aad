//! The exit status relaylet writes on the error stream when it ends a session itself, in the
//! form the negotiated protocol version carries (what the kubelet writes in that version):
//! - v4 and v5: a JSON `metav1.Status`. client-go's v4 decoder turns a Failure whose reason is
//!   not `NonZeroExitCode` into an error carrying `message` verbatim, so kubectl prints
//!   `error: <message>` and exits 1 (through the apiserver's WebSocket translator:
//!   `Internal error occurred: <message>`);
//! - v1 to v3: the message as plain text (client-go prints `error executing remote command:
//!   <message>`).

use serde::Serialize;

/// How the negotiated protocol carries an exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFormat {
    Json,
    Text,
}

/// A Failure `metav1.Status` in Go's field order, like kubelet's `NewInternalError`.
#[derive(Serialize)]
struct Status<'a> {
    metadata: Empty,
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    code: u16,
}

#[derive(Serialize)]
struct Empty {}

/// The bytes of a failure saying `message`.
pub fn failure(format: StatusFormat, message: &str) -> Vec<u8> {
    match format {
        StatusFormat::Text => message.as_bytes().to_vec(),
        StatusFormat::Json => serde_json::to_vec(&Status {
            metadata: Empty {},
            status: "Failure",
            message,
            reason: "InternalError",
            code: 500,
        })
        // Serialising strings and numbers cannot fail; the text is still an error if it did.
        .unwrap_or_else(|_| message.as_bytes().to_vec()),
    }
}

/// What to write to the caller to end the session: `pad` filler bytes (`pad_byte`) that
/// complete a frame the leaf left unfinished, then `tail` (the Status and the close).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub pad: usize,
    pub pad_byte: u8,
    pub tail: Vec<u8>,
}

/// Why no ending can be written (the caller's connection is reset instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CannotEnd(pub String);

impl std::fmt::Display for CannotEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_like_the_kubelets_internal_errors() {
        assert_eq!(
            String::from_utf8(failure(
                StatusFormat::Json,
                "relaylet: shutting down \"now\""
            ))
            .unwrap(),
            r#"{"metadata":{},"status":"Failure","message":"relaylet: shutting down \"now\"","reason":"InternalError","code":500}"#
        );
        assert_eq!(failure(StatusFormat::Text, "gone"), b"gone");
    }
}

//! Text that comes from a leaf cluster (an apiserver's error body, a Status message, a marker's
//! value), made fit to quote wherever relaylet writes it: a Node condition, an Event, a log line,
//! an error returned to a caller.
//!
//! A leaf is not trusted, and neither is whoever points a leaf Secret at a server of their own:
//! its text may be a megabyte long (a Node that carries it twice, rewritten every minute, is then
//! megabytes sent to every Node watcher), may hold newlines and control characters that forge
//! log lines or terminal output, and may be the error page of an internal URL that the Secret's
//! writer wants to read back through the Node. So leaf text is quoted short: at most
//! [`MAX_QUOTED`] bytes, cut at a character boundary, every control character (newlines
//! included) replaced by a space, and a marker saying how much was left out.

use std::fmt::Write;

/// The most bytes of leaf text a quote keeps: enough for any real error message's gist.
pub const MAX_QUOTED: usize = 256;

/// `text` quoted short: at most [`MAX_QUOTED`] bytes of it, cut at a character boundary,
/// control characters replaced by spaces, and `… (N more bytes)` when something was cut.
pub fn quote(text: &str) -> String {
    let text = text.trim();
    let mut end = text.len().min(MAX_QUOTED);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 24);
    for c in text[..end].chars() {
        out.push(if c.is_control() { ' ' } else { c });
    }
    let cut = text.len() - end;
    if cut > 0 {
        // Writing to a String cannot fail.
        let _ = write!(out, "… ({cut} more bytes)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_stays_as_it_is() {
        assert_eq!(quote("connection refused"), "connection refused");
        assert_eq!(quote("  padded \n"), "padded");
        assert_eq!(quote(""), "");
    }

    #[test]
    fn long_text_is_cut_with_a_marker_saying_how_much() {
        let long = "x".repeat(1024 * 1024);
        let quoted = quote(&long);
        assert!(quoted.len() <= MAX_QUOTED + 32, "{} bytes", quoted.len());
        assert!(quoted.starts_with(&"x".repeat(MAX_QUOTED)));
        assert!(
            quoted.ends_with(&format!("… ({} more bytes)", 1024 * 1024 - MAX_QUOTED)),
            "{quoted}"
        );
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        // 'é' is two bytes: 255 bytes of 'a' then 'é' straddles the limit.
        let text = format!("{}é and more", "a".repeat(MAX_QUOTED - 1));
        let quoted = quote(&text);
        assert!(quoted.starts_with(&"a".repeat(MAX_QUOTED - 1)));
        assert!(!quoted.contains('é'), "{quoted}");
        assert!(quoted.ends_with("more bytes)"), "{quoted}");
    }

    #[test]
    fn control_characters_and_newlines_cannot_forge_lines() {
        let forged = "bad\nlevel=error msg=\"forged\"\r\x1b[2Jend\ttab";
        let quoted = quote(forged);
        assert!(!quoted.chars().any(char::is_control), "{quoted:?}");
        assert_eq!(quoted, "bad level=error msg=\"forged\"  [2Jend tab");
    }
}

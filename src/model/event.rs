//! An events.k8s.io/v1 Event as relaylet writes one: named like the kubelet's (the object's
//! name and a unique suffix), timed now, reported by `relaylet`, and within every limit upstream
//! validation sets (reason and action 128 bytes, note 1 KiB, instance 128 characters), so no
//! text relaylet passes on can make the write fail.
//!
//! Written with a plain create rather than kube's `Recorder`: that one folds repeats into a
//! series by reason alone (a repeat with a new message would keep showing the old one), and it
//! needs `patch` too.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

/// Every Event's `reportingController`.
pub const REPORTING_CONTROLLER: &str = "relaylet";
/// Upstream's limits on an Event's fields.
const REASON_LIMIT: usize = 128;
const NOTE_LIMIT: usize = 1024;
const INSTANCE_LIMIT: usize = 128;

/// What one Event says.
pub struct Said<'a> {
    /// `Normal` or `Warning` (anything else is `Normal`).
    pub type_: &'a str,
    pub reason: &'a str,
    pub action: &'a str,
    pub note: &'a str,
}

/// An Event regarding `regarding` (in its namespace), by reporting instance `instance`.
pub fn event(regarding: ObjectReference, said: &Said<'_>, instance: &str, now: Timestamp) -> Event {
    let name = regarding.name.clone().unwrap_or_default();
    let prefix: String = name.chars().take(200).collect();
    let prefix = prefix.trim_end_matches(['-', '.']);
    let type_ = if said.type_ == "Warning" {
        "Warning"
    } else {
        "Normal"
    };
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}.{:x}", now.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(type_.to_string()),
        reason: Some(truncate(said.reason, REASON_LIMIT)),
        action: Some(truncate(said.action, REASON_LIMIT)),
        note: Some(truncate(said.note, NOTE_LIMIT)),
        reporting_controller: Some(REPORTING_CONTROLLER.to_string()),
        reporting_instance: Some(instance.chars().take(INSTANCE_LIMIT).collect()),
        regarding: Some(regarding),
        ..Event::default()
    }
}

/// At most `limit` bytes of `text`, cut at a character boundary.
pub fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("abcdef", 3), "abc");
        assert_eq!(truncate("aé", 2), "a");
    }

    #[test]
    fn an_event_keeps_within_upstreams_limits_and_is_named_after_its_object() {
        let regarding = ObjectReference {
            name: Some(format!("{}-", "p".repeat(300))),
            namespace: Some("team".into()),
            ..ObjectReference::default()
        };
        let long = "x".repeat(5000);
        let said = Said {
            type_: "Alarming",
            reason: &long,
            action: &long,
            note: &long,
        };
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let e = event(regarding, &said, &long, now);
        let name = e.metadata.name.unwrap();
        assert!(
            name.starts_with(&"p".repeat(200)) && name.len() <= 253,
            "{name}"
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.reason.unwrap().len(), 128);
        assert_eq!(e.action.unwrap().len(), 128);
        assert_eq!(e.note.unwrap().len(), 1024);
        assert_eq!(e.reporting_instance.unwrap().len(), 128);
        assert_eq!(e.reporting_controller.as_deref(), Some("relaylet"));
    }
}

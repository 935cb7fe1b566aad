//! Kubernetes name rules relaylet checks in its own configuration (leaf names, namespaces),
//! kept apart so configuration and the leaf registry share one definition.

/// A leaf name becomes part of a Node name and a label value: keep it a DNS-1123 label.
pub fn check_dns_label(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must be a DNS label: lowercase letters, digits and '-', at most 63 characters, starting and ending with a letter or digit"
        ))
    }
}

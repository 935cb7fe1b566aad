//! Kubernetes' rules for names, label keys and label values, as the apiserver checks them: one
//! definition for the configuration, the leaf Secrets (leaf and node names, node labels and
//! taints) and the markers relaylet writes.

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

/// A Node name (a leaf Secret's `relaylet.io/node-name`) must be a DNS-1123 subdomain, as the
/// apiserver requires: dot-separated DNS labels, at most 253 characters in all.
pub fn check_dns_subdomain(name: &str) -> Result<(), String> {
    let label_ok = |label: &str| check_dns_label(label).is_ok();
    if name.len() <= 253 && name.split('.').all(label_ok) {
        Ok(())
    } else {
        // The name is shown only when short: it may be anything a Secret writer typed.
        let shown = if name.len() <= 253 {
            format!("{name:?}")
        } else {
            format!("a name of {} characters", name.len())
        };
        Err(format!(
            "{shown} must be a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 characters, each dot-separated part starting and ending with a letter or digit"
        ))
    }
}

/// The virtual node name of a leaf without `relaylet.io/node-name`: `NODE_NAME_PREFIX` followed
/// by the leaf name.
pub fn virtual_node_name(prefix: &str, leaf: &str) -> String {
    format!("{prefix}{leaf}")
}

/// A virtual node name a leaf Secret chooses (`relaylet.io/node-name`): `NODE_NAME_PREFIX`
/// followed by a DNS label, the whole a DNS subdomain. Node names go into the serving
/// certificate relaylet asks the cluster's kubelet-serving signer for (often the cluster CA
/// itself), so a Secret writer may choose only names of relaylet's own: never
/// `kubernetes.default.svc`, `*.example.com` or another service's name.
pub fn check_node_name(name: &str, prefix: &str) -> Result<(), String> {
    check_dns_subdomain(name)?;
    match name.strip_prefix(prefix) {
        Some(rest) if check_dns_label(rest).is_ok() => Ok(()),
        _ => Err(format!(
            "{name:?} must be NODE_NAME_PREFIX {prefix:?} followed by a DNS label: a node name goes into relaylet's serving certificate, so a Secret may choose only names of relaylet's own"
        )),
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            check_dns_subdomain(prefix)?;
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err("the name part is empty".into());
    }
    check_label_value(name)
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_` or `.`, starting and ending
/// alphanumeric.
pub fn check_label_value(value: &str) -> Result<(), String> {
    let ok_end = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    if value.len() > 63 {
        Err("longer than 63 characters".into())
    } else if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        Err("only letters, digits, '-', '_' and '.' are allowed".into())
    } else if !ok_end(value.chars().next()) || !ok_end(value.chars().last()) {
        Err("must start and end with a letter or digit".into())
    } else {
        Ok(())
    }
}

/// `NODE_NAME_PREFIX`: the start of a DNS subdomain (a leaf name follows it).
pub fn check_dns_subdomain_prefix(prefix: &str) -> Result<(), String> {
    let ok = prefix.len() <= 200
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !prefix.starts_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{prefix:?} must be the start of a DNS subdomain: lowercase letters, digits, '-' and '.'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains() {
        for ok in ["a", "relaylet-leaf-1", "node.example.com", "0.a-b.c"] {
            assert_eq!(check_dns_subdomain(ok), Ok(()), "{ok}");
        }
        let long = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(long.len(), 253);
        assert_eq!(check_dns_subdomain(&long), Ok(()));
        for bad in [
            "", ".", "a..b", "-a", "a-", "a.-b", "A", "a_b", "a/b", "a b", "a.", ".a",
        ] {
            assert!(check_dns_subdomain(bad).is_err(), "{bad:?}");
        }
        let too_long = format!("{long}a");
        let err = check_dns_subdomain(&too_long).unwrap_err();
        assert!(err.starts_with("a name of 254 characters"), "{err}");
    }

    #[test]
    fn node_names_are_the_prefix_and_a_label() {
        for ok in ["relaylet-a", "relaylet-leaf-1", "relaylet-0"] {
            assert_eq!(check_node_name(ok, "relaylet-"), Ok(()), "{ok}");
        }
        assert_eq!(check_node_name("vk.leaf-1", "vk."), Ok(()));
        assert_eq!(check_node_name("anything", ""), Ok(()));
        for bad in [
            "",
            "relaylet-",
            "relaylet-a.example.com",
            "kubernetes.default.svc",
            "*.example.com",
            "Relaylet-a",
            "relaylet_a",
            "kubernetes",
        ] {
            assert!(check_node_name(bad, "relaylet-").is_err(), "{bad:?}");
        }
        let err = check_node_name("kubernetes", "relaylet-").unwrap_err();
        assert!(err.contains("must be NODE_NAME_PREFIX"), "{err}");
    }
}

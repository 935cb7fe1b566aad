//! How callers of the kubelet API are authenticated: `AUTH_MODE`, `X509_ALLOWED_USERS`.

use super::vars::Vars;

/// The second switch `AUTH_MODE=none` needs.
pub const INSECURE_NONE_SWITCH: &str = "INSECURE_ALLOW_UNAUTHENTICATED_EXEC";

/// How callers of the kubelet API are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Client certificates from the root client CA, or bearer tokens via TokenReview; every
    /// request authorized with SubjectAccessReview.
    Webhook,
    /// Client certificates from the root client CA only.
    X509,
    /// Anyone may call. For local sandboxes only.
    None,
}

/// `AUTH_MODE`, and the second switch `none` needs.
pub(super) fn auth_mode(vars: &mut Vars<'_>) -> AuthMode {
    let auth_mode = match vars.get("AUTH_MODE") {
        None => AuthMode::Webhook,
        Some(raw) => vars.parse("AUTH_MODE", &raw, AuthMode::Webhook, |v| match v {
            "webhook" => Ok(AuthMode::Webhook),
            "x509" => Ok(AuthMode::X509),
            "none" => Ok(AuthMode::None),
            _ => Err(format!("{v:?} is not one of webhook, x509, none")),
        }),
    };

    // AUTH_MODE=none opens exec into every leaf pod to whoever reaches the port: a setting
    // that must not be one typo away, so it needs a second, loudly named switch.
    let anonymous_ok = vars.flag(INSECURE_NONE_SWITCH, false);
    if auth_mode == AuthMode::None && !anonymous_ok {
        vars.error(
            "AUTH_MODE",
            &format!(
                "\"none\" lets anyone who reaches the kubelet port exec into every leaf pod; it is for local sandboxes only, and needs {INSECURE_NONE_SWITCH}=true as well"
            ),
        );
    }
    auth_mode
}

/// `X509_ALLOWED_USERS`: required, and only meaningful, with `AUTH_MODE=x509`. That mode asks
/// the root cluster nothing, so the root client CA is all it checks, and that CA signs every real
/// node's kubelet client certificate too: without a list, any of them could exec into every leaf
/// pod.
pub(super) fn x509_allowed_users(vars: &mut Vars<'_>, mode: AuthMode) -> Vec<String> {
    let users: Vec<String> = vars
        .get("X509_ALLOWED_USERS")
        .map(|raw| {
            raw.split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    match (mode, users.is_empty()) {
        (AuthMode::X509, true) => vars.error(
            "AUTH_MODE",
            "\"x509\" authorizes nothing: every certificate of the root client CA (every node's kubelet client certificate among them) could exec into every leaf pod; list the certificate CNs that may call in X509_ALLOWED_USERS (the root apiserver's kubelet client, e.g. kube-apiserver-kubelet-client), or use webhook",
        ),
        (AuthMode::X509, false) | (_, true) => {}
        (_, false) => vars.error(
            "X509_ALLOWED_USERS",
            "means nothing unless AUTH_MODE=x509 (webhook mode authorizes each caller with a SubjectAccessReview)",
        ),
    }
    users
}

//! What a leaf Secret's kubeconfig may contain, and why.
//!
//! Whoever may write Secrets in relaylet's leaf-Secret namespace is not necessarily a cluster
//! administrator, yet relaylet acts on every leaf Secret with its own process and its own
//! files. kube-rs trusts a kubeconfig completely: it runs `exec` plugins, asks auth providers,
//! and reads `tokenFile` and certificate *paths* from relaylet's filesystem (its root
//! ServiceAccount token among them) to send them to whatever `server` says. So a leaf Secret's
//! kubeconfig is data: only inline credentials, checked here on the parsed kubeconfig before
//! `kube::Config::from_custom_kubeconfig` (which already reads files) ever sees it. Every user
//! and cluster entry is checked, not only the current context's: what is not used today is one
//! `current-context` edit away.
//!
//! The administrator's own `LEAF_KUBECONFIG` file is not checked for that: it comes from whoever
//! deploys relaylet, who can run anything in its pod anyway.
//!
//! One rule holds for every kubeconfig, the file's too ([`check_plaintext`]): credentials never
//! go to a server that is not `https://`. Over `http://` a bearer token, a password or a client
//! certificate's handshake would cross the network (and any proxy) in clear; a leaf without
//! credentials may still be reached that way.
//!
//! The structs are destructured exhaustively, so a field a future kube adds breaks the build
//! here and someone decides whether a Secret may set it.

use kube::config::{AuthInfo, Cluster, Kubeconfig, NamedAuthInfo, NamedCluster};

use crate::leaf::proxy::{ProxyUrl, UrlProblem};

/// A kubeconfig entry: `users[].name` or `clusters[].name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    User(String),
    Cluster(String),
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::User(name) => write!(f, "user {name:?}"),
            Entry::Cluster(name) => write!(f, "cluster {name:?}"),
        }
    }
}

/// A field a leaf Secret's kubeconfig may not set, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Runs a command in relaylet's process.
    Exec,
    /// Runs provider code (and, for some, commands) in relaylet's process.
    AuthProvider,
    /// Reads a file of relaylet's (its own root ServiceAccount token, say) and sends it.
    TokenFile,
    ClientCertificate,
    ClientKey,
    CertificateAuthority,
    /// Basic auth: a password sent in the clear to whatever `server` says, and deprecated.
    Username,
    Password,
    /// Impersonation needs the `impersonate` verb granted to the leaf identity; a Secret
    /// writer has no business choosing who relaylet acts as.
    Impersonate(&'static str),
    /// A `proxy-url` outside relaylet's rules (`proxy`): only `http://`, `https://` and
    /// `socks5://` with inline credentials, nothing that names a file or a program.
    ProxyUrl(UrlProblem),
}

impl Field {
    /// The kubeconfig key.
    pub fn key(self) -> &'static str {
        match self {
            Field::Exec => "exec",
            Field::AuthProvider => "auth-provider",
            Field::TokenFile => "tokenFile",
            Field::ClientCertificate => "client-certificate",
            Field::ClientKey => "client-key",
            Field::CertificateAuthority => "certificate-authority",
            Field::Username => "username",
            Field::Password => "password",
            Field::Impersonate(key) => key,
            Field::ProxyUrl(_) => "proxy-url",
        }
    }

    /// The metric label of a refusal for this field.
    pub fn reason(self) -> &'static str {
        match self {
            Field::Exec => "exec_plugin",
            Field::AuthProvider => "auth_provider",
            Field::TokenFile => "token_file",
            Field::ClientCertificate | Field::ClientKey | Field::CertificateAuthority => {
                "certificate_file"
            }
            Field::Username | Field::Password => "basic_auth",
            Field::Impersonate(_) => "impersonation",
            Field::ProxyUrl(_) => "proxy_url",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Field::Exec => "relaylet never runs commands named by a Secret",
            Field::AuthProvider => "relaylet never runs auth providers named by a Secret",
            Field::TokenFile => "use the inline token",
            Field::ClientCertificate => "use the inline client-certificate-data",
            Field::ClientKey => "use the inline client-key-data",
            Field::CertificateAuthority => "use the inline certificate-authority-data",
            Field::Username | Field::Password => {
                "basic auth is not supported; use a token or a client certificate"
            }
            Field::Impersonate(_) => "impersonation is not allowed",
            Field::ProxyUrl(UrlProblem::Scheme) => {
                "only http://, https:// and socks5:// proxies are supported"
            }
            Field::ProxyUrl(UrlProblem::NoHost) => "the proxy URL has no host",
            Field::ProxyUrl(UrlProblem::Port) => "the proxy URL's port is not 1 to 65535",
            Field::ProxyUrl(UrlProblem::Path) => "the proxy URL may have no path or query",
            Field::ProxyUrl(UrlProblem::Malformed) => "the proxy URL is malformed",
        }
    }
}

/// Why a leaf Secret's kubeconfig was refused. Names the entry and the field, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "kubeconfig {entry}: {key} is not allowed in a leaf Secret ({why}); leaf Secrets carry inline credentials only",
    key = field.key(),
    why = field.why()
)]
pub struct Refused {
    pub entry: Entry,
    pub field: Field,
}

/// What a checked kubeconfig still deserves a warning for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Warnings {
    /// Cluster entries with `insecure-skip-tls-verify: true`: allowed (a Secret writer could
    /// as well name a server they control), but the leaf's identity is then unverified.
    pub insecure_clusters: Vec<String>,
}

/// Checks every user and cluster entry of a leaf Secret's kubeconfig; the first forbidden
/// field refuses it.
pub fn check(kubeconfig: &Kubeconfig) -> Result<Warnings, Refused> {
    for NamedAuthInfo {
        name,
        auth_info,
        other: _,
    } in &kubeconfig.auth_infos
    {
        if let Some(info) = auth_info {
            check_user(info).map_err(|field| Refused {
                entry: Entry::User(name.clone()),
                field,
            })?;
        }
    }
    let mut warnings = Warnings::default();
    for NamedCluster {
        name,
        cluster,
        other: _,
    } in &kubeconfig.clusters
    {
        if let Some(cluster) = cluster {
            let insecure = check_cluster(cluster).map_err(|field| Refused {
                entry: Entry::Cluster(name.clone()),
                field,
            })?;
            if insecure {
                warnings.insecure_clusters.push(name.clone());
            }
        }
    }
    Ok(warnings)
}

/// Allowed: `token`, `client-certificate-data`, `client-key-data` (and extensions, which kube
/// ignores).
fn check_user(info: &AuthInfo) -> Result<(), Field> {
    let AuthInfo {
        username,
        password,
        token: _,
        token_file,
        client_certificate,
        client_certificate_data: _,
        client_key,
        client_key_data: _,
        impersonate,
        impersonate_uid,
        impersonate_groups,
        impersonate_user_extra,
        extensions: _,
        auth_provider,
        exec,
        other: _,
    } = info;
    let forbidden = [
        (exec.is_some(), Field::Exec),
        (auth_provider.is_some(), Field::AuthProvider),
        (token_file.is_some(), Field::TokenFile),
        (client_certificate.is_some(), Field::ClientCertificate),
        (client_key.is_some(), Field::ClientKey),
        (username.is_some(), Field::Username),
        (password.is_some(), Field::Password),
        (impersonate.is_some(), Field::Impersonate("as")),
        (impersonate_uid.is_some(), Field::Impersonate("as-uid")),
        (
            impersonate_groups.is_some(),
            Field::Impersonate("as-groups"),
        ),
        (
            impersonate_user_extra.is_some(),
            Field::Impersonate("as-user-extra"),
        ),
    ];
    first_set(&forbidden)
}

/// Allowed: `server`, `tls-server-name`, `certificate-authority-data`,
/// `insecure-skip-tls-verify` (reported back as a warning), `disable-compression`, and a
/// `proxy-url` by `proxy`'s rules. Whether the entry skips TLS verification.
fn check_cluster(cluster: &Cluster) -> Result<bool, Field> {
    let Cluster {
        server: _,
        insecure_skip_tls_verify,
        certificate_authority,
        certificate_authority_data: _,
        proxy_url,
        disable_compression: _,
        tls_server_name: _,
        extensions: _,
        other: _,
    } = cluster;
    first_set(&[(certificate_authority.is_some(), Field::CertificateAuthority)])?;
    if let Some(url) = proxy_url {
        ProxyUrl::parse(url).map_err(Field::ProxyUrl)?;
    }
    Ok(*insecure_skip_tls_verify == Some(true))
}

/// A kubeconfig whose credentials would cross the network in clear. Names the cluster entry and
/// the kind of credential, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "kubeconfig cluster {cluster:?}: its server is not https:// and the kubeconfig carries {credential}, which would cross the network unencrypted; use an https:// server (plain http:// is allowed only without credentials)"
)]
pub struct Plaintext {
    pub cluster: String,
    pub credential: &'static str,
}

/// Refuses a kubeconfig that has a cluster entry whose `server` is not `https://` while any
/// user entry carries a credential. Every entry counts, as in [`check`]: the current context is
/// one edit away from another pairing.
pub fn check_plaintext(kubeconfig: &Kubeconfig) -> Result<(), Plaintext> {
    let Some(credential) = kubeconfig
        .auth_infos
        .iter()
        .filter_map(|named| named.auth_info.as_ref())
        .find_map(credential_of)
    else {
        return Ok(());
    };
    let plain = kubeconfig.clusters.iter().find(|named| {
        named
            .cluster
            .as_ref()
            .and_then(|c| c.server.as_deref())
            .is_some_and(|server| !is_https(server))
    });
    match plain {
        Some(named) => Err(Plaintext {
            cluster: named.name.clone(),
            credential,
        }),
        None => Ok(()),
    }
}

/// Whether `server` is an `https://` URL (the scheme in any case).
fn is_https(server: &str) -> bool {
    server
        .trim()
        .get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
}

/// The kind of credential a user entry carries, if any: inline, from a file, or from code
/// (the last two only in the administrator's `LEAF_KUBECONFIG`; a Secret's are refused first).
fn credential_of(info: &AuthInfo) -> Option<&'static str> {
    let present = |set: bool, what: &'static str| set.then_some(what);
    present(info.token.is_some(), "a bearer token")
        .or_else(|| present(info.token_file.is_some(), "a bearer token file"))
        .or_else(|| {
            present(
                info.username.is_some() || info.password.is_some(),
                "basic auth credentials",
            )
        })
        .or_else(|| {
            present(
                info.client_certificate_data.is_some()
                    || info.client_key_data.is_some()
                    || info.client_certificate.is_some()
                    || info.client_key.is_some(),
                "a client certificate",
            )
        })
        .or_else(|| present(info.exec.is_some(), "an exec credential plugin"))
        .or_else(|| present(info.auth_provider.is_some(), "an auth provider"))
}

fn first_set(fields: &[(bool, Field)]) -> Result<(), Field> {
    match fields.iter().find(|(set, _)| *set) {
        Some((_, field)) => Err(*field),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubeconfig whose user entry `u` and cluster entry `c` have the given extra lines.
    fn kubeconfig(user: &str, cluster: &str) -> Kubeconfig {
        let yaml = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://leaf.example:6443
    certificate-authority-data: Q0E=
{cluster}
users:
- name: u
  user:
    token: abc
{user}
contexts:
- name: ctx
  context: {{cluster: c, user: u}}
current-context: ctx
"
        );
        Kubeconfig::from_yaml(&yaml).unwrap()
    }

    fn refused(user: &str, cluster: &str) -> Refused {
        check(&kubeconfig(user, cluster)).unwrap_err()
    }

    fn refused_user(line: &str, field: Field) {
        let err = refused(line, "");
        assert_eq!(err.entry, Entry::User("u".into()), "{line}");
        assert_eq!(err.field, field, "{line}");
        assert!(err.to_string().contains(field.key()), "{err}");
    }

    fn refused_cluster(line: &str, field: Field) {
        let err = refused("", line);
        assert_eq!(err.entry, Entry::Cluster("c".into()), "{line}");
        assert_eq!(err.field, field, "{line}");
    }

    #[test]
    fn inline_credentials_pass() {
        assert_eq!(check(&kubeconfig("", "")).unwrap(), Warnings::default());
        let cert = "    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ";
        let cluster = "    tls-server-name: leaf\n    disable-compression: true";
        assert_eq!(
            check(&kubeconfig(cert, cluster)).unwrap(),
            Warnings::default()
        );
    }

    #[test]
    fn insecure_skip_tls_verify_passes_with_a_warning() {
        let warnings = check(&kubeconfig("", "    insecure-skip-tls-verify: true")).unwrap();
        assert_eq!(warnings.insecure_clusters, vec!["c".to_string()]);
        let off = check(&kubeconfig("", "    insecure-skip-tls-verify: false")).unwrap();
        assert!(off.insecure_clusters.is_empty());
    }

    #[test]
    fn exec_plugins_are_refused() {
        refused_user(
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: sh\n      args: [-c, touch /tmp/x]",
            Field::Exec,
        );
        let err = refused(
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: sh",
            "",
        );
        assert_eq!(
            err.to_string(),
            "kubeconfig user \"u\": exec is not allowed in a leaf Secret (relaylet never runs commands named by a Secret); leaf Secrets carry inline credentials only"
        );
        assert_eq!(err.field.reason(), "exec_plugin");
    }

    #[test]
    fn auth_providers_are_refused() {
        refused_user(
            "    auth-provider:\n      name: gcp\n      config: {}",
            Field::AuthProvider,
        );
    }

    #[test]
    fn file_paths_are_refused() {
        refused_user(
            "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
            Field::TokenFile,
        );
        refused_user(
            "    client-certificate: /etc/tls.crt",
            Field::ClientCertificate,
        );
        refused_user("    client-key: /etc/tls.key", Field::ClientKey);
        refused_cluster(
            "    certificate-authority: /etc/ca.crt",
            Field::CertificateAuthority,
        );
        assert_eq!(Field::TokenFile.reason(), "token_file");
        assert_eq!(Field::ClientKey.reason(), "certificate_file");
    }

    #[test]
    fn basic_auth_is_refused() {
        refused_user("    username: admin", Field::Username);
        refused_user("    password: hunter2", Field::Password);
    }

    #[test]
    fn impersonation_is_refused() {
        refused_user("    as: admin", Field::Impersonate("as"));
        refused_user("    as-uid: \"0\"", Field::Impersonate("as-uid"));
        refused_user(
            "    as-groups: [system:masters]",
            Field::Impersonate("as-groups"),
        );
        refused_user(
            "    as-user-extra: {scopes: [all]}",
            Field::Impersonate("as-user-extra"),
        );
    }

    #[test]
    fn http_https_and_socks5_proxies_pass() {
        for url in [
            "http://konnectivity.relaylet.svc:8090",
            "https://u:p@proxy:3128",
            "socks5://p:1080",
        ] {
            assert_eq!(
                check(&kubeconfig("", &format!("    proxy-url: {url}"))).unwrap(),
                Warnings::default(),
                "{url}"
            );
        }
    }

    #[test]
    fn proxies_naming_files_or_other_schemes_are_refused() {
        refused_cluster(
            "    proxy-url: file:///var/run/secrets/proxy",
            Field::ProxyUrl(UrlProblem::Scheme),
        );
        refused_cluster(
            "    proxy-url: socks4://p:1080",
            Field::ProxyUrl(UrlProblem::Scheme),
        );
        refused_cluster(
            "    proxy-url: http://p:3128/pac.js",
            Field::ProxyUrl(UrlProblem::Path),
        );
        let err = refused("", "    proxy-url: ftp://user:canary@p:21");
        assert_eq!(
            err.to_string(),
            "kubeconfig cluster \"c\": proxy-url is not allowed in a leaf Secret (only http://, https:// and socks5:// proxies are supported); leaf Secrets carry inline credentials only"
        );
        assert!(!err.to_string().contains("canary"));
        assert_eq!(err.field.reason(), "proxy_url");
    }

    #[test]
    fn every_entry_is_checked_not_only_the_current_context() {
        let yaml = "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: 'https://leaf.example:6443'}
- name: unused
  cluster: {server: 'https://other.example', certificate-authority: /etc/ca.crt}
users:
- name: u
  user: {token: abc}
- name: spare
  user: {tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
";
        let err = check(&Kubeconfig::from_yaml(yaml).unwrap()).unwrap_err();
        assert_eq!(err.entry, Entry::User("spare".into()));
        assert_eq!(err.field, Field::TokenFile);
    }

    /// A kubeconfig for `server` whose user entry has `user` (YAML lines, 4 spaces in).
    fn plain(server: &str, user: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: {server}
users:
- name: u
  user:
{user}
contexts:
- name: ctx
  context: {{cluster: c, user: u}}
current-context: ctx
"
        ))
        .unwrap()
    }

    #[test]
    fn credentials_are_never_sent_to_a_plain_http_server() {
        for (user, credential) in [
            ("    token: canary", "a bearer token"),
            ("    tokenFile: /var/run/token", "a bearer token file"),
            ("    username: admin", "basic auth credentials"),
            ("    password: canary", "basic auth credentials"),
            (
                "    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ",
                "a client certificate",
            ),
            ("    client-key: /etc/tls.key", "a client certificate"),
            (
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: sh",
                "an exec credential plugin",
            ),
        ] {
            for server in [
                "http://leaf.example:8080",
                "HTTP://leaf.example",
                "leaf.example:6443",
            ] {
                let err = check_plaintext(&plain(server, user)).unwrap_err();
                assert_eq!(
                    err,
                    Plaintext {
                        cluster: "c".into(),
                        credential
                    },
                    "{server} {user}"
                );
                assert!(!err.to_string().contains("canary"), "{err}");
            }
            assert_eq!(
                check_plaintext(&plain("https://leaf.example", user)),
                Ok(())
            );
            assert_eq!(
                check_plaintext(&plain("HTTPS://leaf.example", user)),
                Ok(())
            );
        }
    }

    #[test]
    fn plain_http_without_credentials_passes() {
        assert_eq!(
            check_plaintext(&plain("http://leaf.example:8080", "    as: nobody")),
            Ok(())
        );
        let yaml = "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: 'http://leaf.example:8080'}
contexts:
- name: ctx
  context: {cluster: c}
current-context: ctx
";
        assert_eq!(
            check_plaintext(&Kubeconfig::from_yaml(yaml).unwrap()),
            Ok(())
        );
    }

    #[test]
    fn a_plain_cluster_beside_any_credentialed_user_is_refused() {
        // The current context pairs https with the token; the other cluster is one edit away.
        let yaml = "apiVersion: v1
kind: Config
clusters:
- name: safe
  cluster: {server: 'https://leaf.example'}
- name: plain
  cluster: {server: 'http://leaf.example'}
users:
- name: u
  user: {token: abc}
contexts:
- name: ctx
  context: {cluster: safe, user: u}
current-context: ctx
";
        let err = check_plaintext(&Kubeconfig::from_yaml(yaml).unwrap()).unwrap_err();
        assert_eq!(err.cluster, "plain");
        assert_eq!(
            err.to_string(),
            "kubeconfig cluster \"plain\": its server is not https:// and the kubeconfig carries a bearer token, which would cross the network unencrypted; use an https:// server (plain http:// is allowed only without credentials)"
        );
    }

    #[test]
    fn the_refusal_never_quotes_a_value() {
        let err = refused("    tokenFile: /secret/path/canary", "");
        assert!(!err.to_string().contains("canary"), "{err}");
    }
}

//! What the root apiserver asks of a kubelet, and how the same request reads to a leaf apiserver.
//!
//! The root kube-apiserver calls the kubelet routes (`/exec/{ns}/{pod}/{container}?command=..&input=1`,
//! upstream `pkg/kubelet/server/server.go`); the leaf kube-apiserver wants the pod subresources
//! (`/api/v1/namespaces/{ns}/pods/{pod}/exec?container=..&command=..&stdin=true`). Parsing is
//! strict (percent-decoding once, no empty or dot segments, names checked, bounded arguments)
//! because this is the edge where untrusted input enters.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// Characters escaped in a path segment: all but the unreserved ones (RFC 3986).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The most bytes the raw query may have (the HTTP layer already caps whole URIs at 64 KiB).
pub const MAX_QUERY_BYTES: usize = 64 * 1024;

/// The kubelet call kinds relaylet relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Exec,
    Attach,
    PortForward,
    ContainerLogs,
}

impl Kind {
    /// The pod subresource on the leaf apiserver.
    pub fn subresource(self) -> &'static str {
        match self {
            Kind::Exec => "exec",
            Kind::Attach => "attach",
            Kind::PortForward => "portforward",
            Kind::ContainerLogs => "log",
        }
    }

    /// Whether the call upgrades to a streaming protocol (all but logs).
    pub fn is_streaming(self) -> bool {
        !matches!(self, Kind::ContainerLogs)
    }

    /// The methods the kubelet serves this call with (`pkg/kubelet/server/server.go`): GET and
    /// POST for the streaming calls, GET for logs. Anything else is a 405, never relayed.
    pub fn methods(self) -> &'static [http::Method] {
        if self.is_streaming() {
            &[http::Method::GET, http::Method::POST]
        } else {
            &[http::Method::GET]
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Exec => "exec",
            Kind::Attach => "attach",
            Kind::PortForward => "portForward",
            Kind::ContainerLogs => "containerLogs",
        })
    }
}

/// A parsed kubelet request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletRequest {
    pub kind: Kind,
    pub namespace: String,
    pub pod: String,
    /// The pod UID when the caller named one (`/exec/{ns}/{pod}/{uid}/{container}`).
    pub uid: Option<String>,
    /// Empty for port-forward.
    pub container: String,
    /// The leaf apiserver's query for the same request, already encoded.
    leaf_query: String,
}

/// Why a request could not be parsed; always the caller's fault (400/404).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(
        "no kubelet route {0:?}; relaylet serves /exec, /attach, /portForward, /containerLogs, /healthz, /pods, /metrics, /metrics/resource and /stats/summary"
    )]
    UnknownRoute(String),
    #[error("bad path: {0}")]
    BadPath(String),
    #[error("bad query: {0}")]
    BadQuery(String),
}

impl KubeletRequest {
    /// Parses a kubelet path and its raw (still encoded) query.
    pub fn parse(path: &str, query: Option<&str>) -> Result<KubeletRequest, RequestError> {
        let raw_segments: Vec<&str> = path
            .strip_prefix('/')
            .ok_or_else(|| RequestError::UnknownRoute(path.to_string()))?
            .split('/')
            .collect();
        let kind = match raw_segments.first().copied() {
            Some("exec") => Kind::Exec,
            Some("attach") => Kind::Attach,
            Some("portForward") => Kind::PortForward,
            Some("containerLogs") => Kind::ContainerLogs,
            _ => return Err(RequestError::UnknownRoute(path.to_string())),
        };
        let segments = raw_segments[1..]
            .iter()
            .map(|s| decode_segment(s))
            .collect::<Result<Vec<_>, _>>()?;
        let (namespace, pod, uid, container) = match (kind, segments.as_slice()) {
            (Kind::Exec | Kind::Attach, [ns, pod, container]) => (ns, pod, None, container.clone()),
            (Kind::Exec | Kind::Attach, [ns, pod, uid, container]) => {
                (ns, pod, Some(uid.clone()), container.clone())
            }
            (Kind::PortForward, [ns, pod]) => (ns, pod, None, String::new()),
            (Kind::PortForward, [ns, pod, uid]) => (ns, pod, Some(uid.clone()), String::new()),
            (Kind::ContainerLogs, [ns, pod, container]) => (ns, pod, None, container.clone()),
            _ => {
                return Err(RequestError::BadPath(format!(
                    "{path:?} does not match /{kind}/{{namespace}}/{{pod}}{}",
                    match kind {
                        Kind::PortForward => "",
                        _ => "/{container}",
                    }
                )));
            }
        };
        check_name("namespace", namespace, 63, false)?;
        check_name("pod", pod, 253, true)?;
        if let Some(uid) = &uid {
            check_name("pod UID", uid, 128, false)?;
        }
        if kind != Kind::PortForward {
            check_name("container", &container, 63, false)?;
        }

        let query = query.unwrap_or("");
        if query.len() > MAX_QUERY_BYTES {
            return Err(RequestError::BadQuery(format!(
                "query is {} bytes; at most {MAX_QUERY_BYTES} allowed",
                query.len()
            )));
        }
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let leaf_query = match kind {
            Kind::Exec | Kind::Attach => remote_command_query(kind, &container, &pairs)?,
            Kind::PortForward => port_forward_query(&pairs)?,
            Kind::ContainerLogs => logs_query(&container, &pairs)?,
        };
        Ok(KubeletRequest {
            kind,
            namespace: namespace.clone(),
            pod: pod.clone(),
            uid,
            container,
            leaf_query,
        })
    }

    /// The leaf apiserver path and query for this request against leaf pod `namespace/pod`.
    pub fn leaf_path(&self, namespace: &str, pod: &str) -> String {
        let mut path = format!(
            "/api/v1/namespaces/{}/pods/{}/{}",
            encode_segment(namespace),
            encode_segment(pod),
            self.kind.subresource()
        );
        if !self.leaf_query.is_empty() {
            path.push('?');
            path.push_str(&self.leaf_query);
        }
        path
    }
}

fn decode_segment(raw: &str) -> Result<String, RequestError> {
    let decoded = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| RequestError::BadPath(format!("segment {raw:?} is not UTF-8")))?;
    if decoded.is_empty() || decoded == "." || decoded == ".." || decoded.contains('/') {
        return Err(RequestError::BadPath(format!(
            "segment {raw:?} is empty, a dot segment or contains '/'"
        )));
    }
    Ok(decoded.into_owned())
}

fn encode_segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// Kubernetes object names: lowercase alphanumerics, '-' (and '.' for DNS subdomains).
fn check_name(what: &str, name: &str, max: usize, dots: bool) -> Result<(), RequestError> {
    let ok = name.len() <= max
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
        });
    if ok {
        Ok(())
    } else {
        Err(RequestError::BadPath(format!(
            "{what} {name:?} is not a valid Kubernetes name"
        )))
    }
}

/// The kubelet reads stream flags as `== "1"` (upstream remotecommand NewOptions); anything
/// else means false.
fn flag(pairs: &[(String, String)], name: &str) -> bool {
    pairs.iter().any(|(k, v)| k == name && v == "1")
}

fn remote_command_query(
    kind: Kind,
    container: &str,
    pairs: &[(String, String)],
) -> Result<String, RequestError> {
    let mut out = form_urlencoded::Serializer::new(String::new());
    out.append_pair("container", container);
    let commands: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.as_str())
        .collect();
    if kind == Kind::Exec {
        if commands.is_empty() {
            return Err(RequestError::BadQuery(
                "exec needs at least one command argument".into(),
            ));
        }
        // No count limit, like the kubelet's: the query's size (MAX_QUERY_BYTES) bounds it.
        // Argument order is the argv order: keep it exactly.
        for arg in &commands {
            out.append_pair("command", arg);
        }
    }
    for (kubelet, leaf) in [
        ("input", "stdin"),
        ("output", "stdout"),
        ("error", "stderr"),
        ("tty", "tty"),
    ] {
        if flag(pairs, kubelet) {
            out.append_pair(leaf, "true");
        }
    }
    Ok(out.finish())
}

fn port_forward_query(pairs: &[(String, String)]) -> Result<String, RequestError> {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (_, value) in pairs.iter().filter(|(k, _)| k == "port") {
        // Accept repeated `port=` (what kube-apiserver sends) and comma lists.
        for port in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match port.parse::<u16>() {
                Ok(p) if p > 0 => {
                    out.append_pair("ports", port);
                }
                _ => {
                    return Err(RequestError::BadQuery(format!(
                        "port {port:?} is not a port number 1-65535"
                    )));
                }
            }
        }
    }
    Ok(out.finish())
}

/// PodLogOptions fields the kubelet reads, passed on to the leaf apiserver's `log` subresource.
const LOG_OPTIONS: [&str; 8] = [
    "follow",
    "previous",
    "timestamps",
    "sinceSeconds",
    "sinceTime",
    "tailLines",
    "limitBytes",
    "stream",
];

fn logs_query(container: &str, pairs: &[(String, String)]) -> Result<String, RequestError> {
    let mut out = form_urlencoded::Serializer::new(String::new());
    out.append_pair("container", container);
    // The kubelet still honours the legacy `tail` (with `all` meaning no limit) when
    // `tailLines` is absent.
    let has_tail_lines = pairs.iter().any(|(k, _)| k == "tailLines");
    for (key, value) in pairs {
        if LOG_OPTIONS.contains(&key.as_str()) {
            out.append_pair(key, value);
        } else if key == "tail" && !has_tail_lines && value != "all" {
            out.append_pair("tailLines", value);
        }
    }
    Ok(out.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(path_and_query: &str) -> Result<KubeletRequest, RequestError> {
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        KubeletRequest::parse(path, query)
    }

    #[test]
    fn exec_keeps_argv_order_and_maps_stream_flags() {
        let r = parse("/exec/default/web-0/main?command=sh&command=-c&command=echo+a%26b%3Bexit+3&input=1&output=1&tty=1&error=0").unwrap();
        assert_eq!(
            (r.kind, r.namespace.as_str(), r.pod.as_str()),
            (Kind::Exec, "default", "web-0")
        );
        assert_eq!(r.container, "main");
        assert_eq!(
            r.leaf_path("default", "web-0"),
            "/api/v1/namespaces/default/pods/web-0/exec?container=main&command=sh&command=-c&command=echo+a%26b%3Bexit+3&stdin=true&stdout=true&tty=true"
        );
    }

    #[test]
    fn uid_variants() {
        let r = parse("/exec/ns/p/0b7e-11/c?command=ls&output=1").unwrap();
        assert_eq!(r.uid.as_deref(), Some("0b7e-11"));
        assert_eq!(r.container, "c");
        let r = parse("/portForward/ns/p/0b7e-11").unwrap();
        assert_eq!(r.uid.as_deref(), Some("0b7e-11"));
    }

    #[test]
    fn attach_has_no_command() {
        let r = parse("/attach/ns/p/c?input=1&output=1&error=1&command=ignored").unwrap();
        assert_eq!(
            r.leaf_path("ns", "p"),
            "/api/v1/namespaces/ns/pods/p/attach?container=c&stdin=true&stdout=true&stderr=true"
        );
    }

    #[test]
    fn port_forward_ports_repeated_or_comma_joined() {
        let r = parse("/portForward/ns/p?port=80&port=443,8080").unwrap();
        assert_eq!(
            r.leaf_path("ns", "p"),
            "/api/v1/namespaces/ns/pods/p/portforward?ports=80&ports=443&ports=8080"
        );
        assert!(matches!(
            parse("/portForward/ns/p?port=0"),
            Err(RequestError::BadQuery(_))
        ));
        assert!(matches!(
            parse("/portForward/ns/p?port=http"),
            Err(RequestError::BadQuery(_))
        ));
    }

    #[test]
    fn logs_pass_options_and_translate_legacy_tail() {
        let r = parse("/containerLogs/ns/p/c?follow=true&tail=5&timestamps=true&sinceTime=2026-11-21T10%3A00%3A00Z&limitBytes=10&bogus=1").unwrap();
        assert_eq!(
            r.leaf_path("leafns", "leafpod"),
            "/api/v1/namespaces/leafns/pods/leafpod/log?container=c&follow=true&tailLines=5&timestamps=true&sinceTime=2026-11-21T10%3A00%3A00Z&limitBytes=10"
        );
        let r = parse("/containerLogs/ns/p/c?tail=all").unwrap();
        assert_eq!(
            r.leaf_path("ns", "p"),
            "/api/v1/namespaces/ns/pods/p/log?container=c"
        );
        let r = parse("/containerLogs/ns/p/c?tail=3&tailLines=7").unwrap();
        assert_eq!(
            r.leaf_path("ns", "p"),
            "/api/v1/namespaces/ns/pods/p/log?container=c&tailLines=7"
        );
    }

    #[test]
    fn hostile_paths_are_rejected() {
        for bad in [
            "/exec/ns/p",
            "/exec/ns/p/c/extra/more",
            "/exec/ns//c?command=ls",
            "/exec/ns/%2e%2e/c?command=ls",
            "/exec/ns/a%2Fb/c?command=ls",
            "/exec/NS/p/c?command=ls",
            "/exec/ns/p/c%00?command=ls",
            "/exec/ns/p/%ff?command=ls",
            "/containerLogs/ns/p",
        ] {
            assert!(
                matches!(parse(bad), Err(RequestError::BadPath(_))),
                "{bad} should be a bad path"
            );
        }
        assert!(matches!(
            parse("/stats/summary"),
            Err(RequestError::UnknownRoute(_))
        ));
        assert!(matches!(
            parse("exec/ns/p/c"),
            Err(RequestError::UnknownRoute(_))
        ));
    }

    #[test]
    fn exec_needs_a_command_of_any_length_the_query_holds() {
        assert!(matches!(
            parse("/exec/ns/p/c?output=1"),
            Err(RequestError::BadQuery(_))
        ));
        // Like the kubelet: no count limit; 6,000 arguments fit in the query bound.
        let many = "command=x&".repeat(6_000);
        let r = parse(&format!("/exec/ns/p/c?{many}")).unwrap();
        assert_eq!(r.leaf_query.matches("command=x").count(), 6_000);
    }

    #[test]
    fn leaf_names_are_encoded() {
        let r = parse("/exec/ns/p/c?command=ls").unwrap();
        assert_eq!(
            r.leaf_path("ns", "p.v1"),
            "/api/v1/namespaces/ns/pods/p.v1/exec?container=c&command=ls"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any path and query: an answer (parsed or a clear error), never a panic; and what
        /// parses yields names that are safe to put back into a leaf path.
        #[test]
        fn parse_never_panics(
            path in "(/(exec|attach|portForward|containerLogs|[a-zA-Z0-9%._~-]{0,12}|%2[eEfF]|\\.\\.)){0,6}",
            query in proptest::option::of("([a-zA-Z]{0,10}=[a-zA-Z0-9%+&=._-]{0,20}&?){0,8}"),
        ) {
            if let Ok(r) = KubeletRequest::parse(&path, query.as_deref()) {
                let leaf = r.leaf_path(&r.namespace, &r.pod);
                proptest::prop_assert!(leaf.starts_with("/api/v1/namespaces/"));
                proptest::prop_assert!(!leaf.split(['/', '?']).any(|seg| seg == ".." || seg == "."));
                proptest::prop_assert!(!r.pod.contains('/') && !r.namespace.contains('/'));
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(path in ".{0,200}", query in ".{0,200}") {
            let _ = KubeletRequest::parse(&path, Some(&query));
        }
    }
}

//! Where kube-apiserver sends a pod subresource call on the kubelet: container defaulting and
//! validation, option parsing, and the kubelet path and query.
//!
//! Mirrors `pkg/registry/core/pod/strategy.go` (`ExecLocation`, `AttachLocation`,
//! `PortForwardLocation`, `LogLocation`, `validateContainer`) and `ValidatePodLogOptions`. The
//! kubelet query is encoded like Go's `url.Values.Encode`: keys sorted, values in order,
//! `QueryEscape`d, so a command's argv order survives and the bytes match what a real
//! apiserver sends.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::error::ProxyError;

/// A request's query as decoded `(key, value)` pairs in order.
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(raw: Option<&str>) -> Query {
        let pairs = raw
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (unescape(k), unescape(v))
            })
            .collect();
        Query(pairs)
    }

    pub(crate) fn all<'a>(&'a self, key: &str) -> impl Iterator<Item = &'a str> + use<'a> {
        let key = key.to_string();
        self.0
            .iter()
            .filter(move |(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn first(&self, key: &str) -> Option<&str> {
        self.all(key).next()
    }

    /// Kubernetes' query-parameter boolean (`Convert_Slice_string_To_bool`): absent, `false` (any
    /// case) and `0` are false; anything else, the empty string included, is true.
    pub(crate) fn flag(&self, key: &str) -> bool {
        match self.first(key) {
            None => false,
            Some(v) => !(v.eq_ignore_ascii_case("false") || v == "0"),
        }
    }

    fn int(&self, key: &str) -> Result<Option<i64>, ProxyError> {
        match self.first(key) {
            None => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|_| {
                ProxyError::BadRequest(format!(
                    "strconv.ParseInt: parsing {v:?}: invalid syntax (query parameter {key})"
                ))
            }),
        }
    }
}

/// Decodes `application/x-www-form-urlencoded` text; malformed escapes are kept literally, as
/// Go's lenient parsing would reject the whole query instead (we only need to be safe here).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Go's `url.QueryEscape`.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Go's `url.Values.Encode`: keys sorted (stable for repeated keys), `k=v` joined by `&`.
pub(crate) fn encode(mut pairs: Vec<(&str, String)>) -> String {
    pairs.sort_by(|a, b| a.0.cmp(b.0));
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// Every container name in `VisitContainers` order: init, regular, ephemeral.
fn all_container_names(pod: &Pod) -> Vec<&str> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str());
    let regular = spec.containers.iter().map(|c| c.name.as_str());
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str());
    init.chain(regular).chain(ephemeral).collect()
}

/// `validateContainer`: an empty name defaults to the only container; otherwise the name must be
/// one of the pod's (init, regular or ephemeral) containers.
pub(crate) fn validate_container(pod: &Pod, requested: Option<&str>) -> Result<String, ProxyError> {
    let name = pod_name(pod);
    match requested.filter(|c| !c.is_empty()) {
        Some(container) => {
            if all_container_names(pod).contains(&container) {
                Ok(container.to_string())
            } else {
                Err(ProxyError::BadRequest(format!(
                    "container {container} is not valid for pod {name}"
                )))
            }
        }
        None => {
            let containers = pod
                .spec
                .as_ref()
                .map(|s| s.containers.as_slice())
                .unwrap_or(&[]);
            match containers {
                [only] => Ok(only.name.clone()),
                [] => Err(ProxyError::BadRequest(format!(
                    "a container name must be specified for pod {name}"
                ))),
                _ => Err(ProxyError::BadRequest(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    all_container_names(pod).join(" ")
                ))),
            }
        }
    }
}

/// The stdin/stdout/stderr/tty choice of an exec or attach call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl StreamOptions {
    pub(crate) fn from_query(query: &Query) -> StreamOptions {
        StreamOptions {
            stdin: query.flag("stdin"),
            stdout: query.flag("stdout"),
            stderr: query.flag("stderr"),
            tty: query.flag("tty"),
        }
    }

    /// The kubelet's names for the flags, only when true, value `1`.
    fn kubelet_params(self) -> Vec<(&'static str, String)> {
        let mut params = Vec::new();
        for (on, key) in [
            (self.stdin, "input"),
            (self.stdout, "output"),
            (self.stderr, "error"),
            (self.tty, "tty"),
        ] {
            if on {
                params.push((key, "1".to_string()));
            }
        }
        params
    }
}

/// A kubelet path with its encoded query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KubeletTarget {
    pub path: String,
    pub query: String,
}

impl KubeletTarget {
    pub(crate) fn path_and_query(&self) -> String {
        if self.query.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{}", self.path, self.query)
        }
    }
}

fn require_host(pod: &Pod) -> Result<(), ProxyError> {
    let has_host = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    if has_host {
        Ok(())
    } else {
        Err(ProxyError::BadRequest(format!(
            "pod {} does not have a host assigned",
            pod_name(pod)
        )))
    }
}

/// `ExecLocation` / `AttachLocation`: `/{exec|attach}/{ns}/{pod}/{container}?...`.
pub(crate) fn stream_target(
    pod: &Pod,
    query: &Query,
    verb: &str,
) -> Result<(KubeletTarget, StreamOptions), ProxyError> {
    let container = validate_container(pod, query.first("container"))?;
    require_host(pod)?;
    let options = StreamOptions::from_query(query);
    let mut params = options.kubelet_params();
    if verb == "exec" {
        params.extend(query.all("command").map(|c| ("command", c.to_string())));
    }
    Ok((
        KubeletTarget {
            path: format!(
                "/{verb}/{}/{}/{container}",
                pod_namespace(pod),
                pod_name(pod)
            ),
            query: encode(params),
        },
        options,
    ))
}

/// `PortForwardLocation`: `/portForward/{ns}/{pod}` with the ports comma-joined in one `port`.
pub(crate) fn port_forward_target(pod: &Pod, query: &Query) -> Result<KubeletTarget, ProxyError> {
    require_host(pod)?;
    let mut ports = Vec::new();
    for value in query.all("ports") {
        let port = value.parse::<i32>().map_err(|_| {
            ProxyError::BadRequest(format!(
                "strconv.ParseInt: parsing {value:?}: invalid syntax (query parameter ports)"
            ))
        })?;
        ports.push(port.to_string());
    }
    let params = if ports.is_empty() {
        Vec::new()
    } else {
        vec![("port", ports.join(","))]
    };
    Ok(KubeletTarget {
        path: format!("/portForward/{}/{}", pod_namespace(pod), pod_name(pod)),
        query: encode(params),
    })
}

/// One `field.Error` of `ValidatePodLogOptions`.
struct FieldError {
    field: &'static str,
    kind: &'static str,
    /// The reason string in the Status cause.
    reason: &'static str,
    detail: String,
}

/// `LogLocation` after `ValidatePodLogOptions`: `/containerLogs/{ns}/{pod}/{container}?...`.
/// Returns `None` when the pod has no node yet (the apiserver then answers an empty log).
pub(crate) fn log_target(pod: &Pod, query: &Query) -> Result<Option<KubeletTarget>, ProxyError> {
    let tail_lines = query.int("tailLines")?;
    let limit_bytes = query.int("limitBytes")?;
    let since_seconds = query.int("sinceSeconds")?;
    let since_time = match query.first("sinceTime") {
        None => None,
        Some(text) => Some(text.parse::<Timestamp>().map_err(|e| {
            ProxyError::BadRequest(format!(
                "parsing time {text:?} as RFC3339 (query parameter sinceTime): {e}"
            ))
        })?),
    };
    let stream = query.first("stream");

    let mut errors = Vec::new();
    if let Some(n) = tail_lines.filter(|n| *n < 0) {
        errors.push(FieldError {
            field: "tailLines",
            kind: "Invalid value",
            reason: "FieldValueInvalid",
            detail: format!("{n}: must be greater than or equal to 0"),
        });
    }
    if let Some(n) = limit_bytes.filter(|n| *n < 1) {
        errors.push(FieldError {
            field: "limitBytes",
            kind: "Invalid value",
            reason: "FieldValueInvalid",
            detail: format!("{n}: must be greater than 0"),
        });
    }
    match (since_seconds, since_time) {
        (Some(_), Some(_)) => errors.push(FieldError {
            field: "",
            kind: "Forbidden",
            reason: "FieldValueForbidden",
            detail: "at most one of `sinceTime` or `sinceSeconds` may be specified".to_string(),
        }),
        (Some(n), None) if n < 1 => errors.push(FieldError {
            field: "sinceSeconds",
            kind: "Invalid value",
            reason: "FieldValueInvalid",
            detail: format!("{n}: must be greater than 0"),
        }),
        _ => {}
    }
    if let Some(s) = stream {
        if !matches!(s, "All" | "Stdout" | "Stderr") {
            errors.push(FieldError {
                field: "stream",
                kind: "Unsupported value",
                reason: "FieldValueNotSupported",
                detail: format!("{s:?}: supported values: \"All\", \"Stderr\", \"Stdout\""),
            });
        } else if s != "All" && tail_lines.is_some() {
            errors.push(FieldError {
                field: "",
                kind: "Forbidden",
                reason: "FieldValueForbidden",
                detail: "`tailLines` and specific `stream` are mutually exclusive for now"
                    .to_string(),
            });
        }
    }
    if !errors.is_empty() {
        return Err(invalid_log_options(pod_name(pod), &errors));
    }

    let container = validate_container(pod, query.first("container"))?;
    let has_host = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    if !has_host {
        return Ok(None);
    }
    let mut params: Vec<(&str, String)> = Vec::new();
    if query.flag("follow") {
        params.push(("follow", "true".into()));
    }
    if query.flag("previous") {
        params.push(("previous", "true".into()));
    }
    if query.flag("timestamps") {
        params.push(("timestamps", "true".into()));
    }
    if let Some(n) = since_seconds {
        params.push(("sinceSeconds", n.to_string()));
    }
    if let Some(t) = since_time {
        // metav1.Time round-trips through RFC3339 at second precision, in UTC here.
        params.push(("sinceTime", t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()));
    }
    if let Some(n) = tail_lines {
        params.push(("tailLines", n.to_string()));
    }
    if let Some(n) = limit_bytes {
        params.push(("limitBytes", n.to_string()));
    }
    if let Some(s) = stream {
        params.push(("stream", s.to_string()));
    }
    Ok(Some(KubeletTarget {
        path: format!(
            "/containerLogs/{}/{}/{container}",
            pod_namespace(pod),
            pod_name(pod)
        ),
        query: encode(params),
    }))
}

/// `errors.NewInvalid(Kind("PodLogOptions"), name, errs)`: 422 with one cause per field error.
fn invalid_log_options(name: &str, errors: &[FieldError]) -> ProxyError {
    let rendered: Vec<String> = errors
        .iter()
        .map(|e| format!("{}: {}: {}", e.field, e.kind, e.detail))
        .collect();
    let aggregate = if rendered.len() == 1 {
        rendered[0].clone()
    } else {
        format!("[{}]", rendered.join(", "))
    };
    let causes: Vec<serde_json::Value> = errors
        .iter()
        .map(|e| {
            json!({
                "reason": e.reason,
                "message": format!("{}: {}", e.kind, e.detail),
                "field": e.field,
            })
        })
        .collect();
    ProxyError::Invalid(json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("PodLogOptions {name:?} is invalid: {aggregate}"),
        "reason": "Invalid",
        "details": {"name": name, "kind": "PodLogOptions", "causes": causes},
        "code": 422,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod(containers: &[&str], init: &[&str], node: Option<&str>) -> Pod {
        let c = |n: &&str| Container {
            name: n.to_string(),
            ..Container::default()
        };
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: containers.iter().map(c).collect(),
                init_containers: (!init.is_empty()).then(|| init.iter().map(c).collect()),
                node_name: node.map(String::from),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn exec_query_keeps_argv_order_and_sorts_keys_like_go() {
        let q = Query::parse(Some(
            "command=sh&command=-c&command=echo+a%3B+exit+3&container=main&stdin=true&stdout=true&stderr=1&tty=false",
        ));
        let (t, opts) = stream_target(&pod(&["main"], &[], Some("n1")), &q, "exec").expect("ok");
        assert_eq!(t.path, "/exec/ns1/web/main");
        assert_eq!(
            t.query,
            "command=sh&command=-c&command=echo+a%3B+exit+3&error=1&input=1&output=1"
        );
        assert!(opts.stdin && opts.stdout && opts.stderr && !opts.tty);
    }

    #[test]
    fn bool_params_follow_kubernetes_conversion() {
        let q = Query::parse(Some("a=&b=FALSE&c=0&d=yes"));
        assert!(q.flag("a") && !q.flag("b") && !q.flag("c") && q.flag("d") && !q.flag("e"));
    }

    #[test]
    fn container_defaulting_and_validation() {
        let one = pod(&["main"], &[], Some("n"));
        assert_eq!(validate_container(&one, None).expect("default"), "main");
        let many = pod(&["a", "b"], &["init"], Some("n"));
        let err = validate_container(&many, Some("")).expect_err("ambiguous");
        assert_eq!(
            err.to_string(),
            "a container name must be specified for pod web, choose one of: [init a b]"
        );
        assert_eq!(
            validate_container(&many, Some("init")).expect("init ok"),
            "init"
        );
        let err = validate_container(&many, Some("zzz")).expect_err("unknown");
        assert_eq!(err.to_string(), "container zzz is not valid for pod web");
        assert!(matches!(
            stream_target(&pod(&["a"], &[], None), &Query::parse(None), "attach"),
            Err(ProxyError::BadRequest(m)) if m == "pod web does not have a host assigned"
        ));
    }

    #[test]
    fn port_forward_ports_are_comma_joined() {
        let q = Query::parse(Some("ports=8080&ports=443"));
        let t = port_forward_target(&pod(&["a"], &[], Some("n")), &q).expect("ok");
        assert_eq!(t.path_and_query(), "/portForward/ns1/web?port=8080%2C443");
        assert!(
            port_forward_target(&pod(&["a"], &[], Some("n")), &Query::parse(Some("ports=x")))
                .is_err()
        );
    }

    #[test]
    fn log_options_translate_and_validate() {
        let p = pod(&["main"], &[], Some("n"));
        let q = Query::parse(Some(
            "container=main&follow=true&tailLines=2&sinceTime=2026-11-21T20%3A00%3A00%2B01%3A00&timestamps=1",
        ));
        let t = log_target(&p, &q).expect("valid").expect("has node");
        assert_eq!(
            t.path_and_query(),
            "/containerLogs/ns1/web/main?follow=true&sinceTime=2026-11-21T19%3A00%3A00Z&tailLines=2&timestamps=true"
        );
        let err = log_target(&p, &Query::parse(Some("tailLines=-1"))).expect_err("invalid");
        let ProxyError::Invalid(status) = err else {
            panic!("not 422")
        };
        assert_eq!(status["code"], 422);
        assert_eq!(
            status["message"],
            "PodLogOptions \"web\" is invalid: tailLines: Invalid value: -1: must be greater than or equal to 0"
        );
        assert!(
            log_target(
                &p,
                &Query::parse(Some("sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z"))
            )
            .is_err()
        );
        assert!(matches!(
            log_target(&p, &Query::parse(Some("tailLines=x"))),
            Err(ProxyError::BadRequest(_))
        ));
        assert_eq!(
            log_target(&pod(&["a"], &[], None), &Query::parse(None)).expect("ok"),
            None
        );
    }

    #[test]
    fn escaping_matches_go() {
        assert_eq!(escape("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
        assert_eq!(unescape("a+b%26c%3dd%2F%C3%A9%zz%"), "a b&c=d/é%zz%");
    }
}

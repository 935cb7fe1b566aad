//! Label and field selectors (`?labelSelector=`, `?fieldSelector=`), parsed and matched the way
//! kube-apiserver does.
//!
//! Label selectors support equality (`=`, `==`, `!=`), sets (`in`, `notin`), existence (`key`,
//! `!key`) and numeric `>`/`<`; `!=` and `notin` also match objects without the label, as
//! upstream's do. Field selectors support `=`, `==`, `!=` on the fields each kind indexes;
//! other fields are a 400 like upstream's "field label not supported".

use serde_json::Value;

use super::failure::Failure;
use super::kinds::Kind;

/// One label requirement.
#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, Failure> {
        let mut reqs = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            let (req, after) = parse_label_req(rest)?;
            reqs.push(req);
            rest = after.trim_start();
            if let Some(after_comma) = rest.strip_prefix(',') {
                rest = after_comma.trim_start();
                if rest.is_empty() {
                    return Err(bad_label(text, "found '', expected: identifier"));
                }
            } else if !rest.is_empty() {
                return Err(bad_label(text, "expected ',' between requirements"));
            }
        }
        Ok(Self(reqs))
    }

    /// True when `labels` (an object's `metadata.labels`, possibly absent) satisfy every
    /// requirement.
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|w| w == v)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|v| vs.iter().all(|w| w != v)),
            LabelReq::Gt(k, n) => get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            LabelReq::Lt(k, n) => get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }
}

fn bad_label(text: &str, why: &str) -> Failure {
    Failure::bad_request(format!(
        "unable to parse requirement: {why} (in \"{text}\")"
    ))
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

/// Splits off a key or value made of label characters.
fn take_ident(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !is_label_char(c)).unwrap_or(s.len());
    s.split_at(end)
}

fn parse_label_req(s: &str) -> Result<(LabelReq, &str), Failure> {
    if let Some(rest) = s.strip_prefix('!') {
        let (key, rest) = take_ident(rest.trim_start());
        check_key(key, s)?;
        return Ok((LabelReq::NotExists(key.to_string()), rest));
    }
    let (key, rest) = take_ident(s);
    check_key(key, s)?;
    let rest = rest.trim_start();
    let (op, after) = if let Some(r) = rest.strip_prefix("==") {
        ("=", r)
    } else if let Some(r) = rest.strip_prefix("!=") {
        ("!=", r)
    } else if let Some(r) = rest.strip_prefix('=') {
        ("=", r)
    } else if let Some(r) = rest.strip_prefix('>') {
        (">", r)
    } else if let Some(r) = rest.strip_prefix('<') {
        ("<", r)
    } else if let Some(r) = strip_word(rest, "notin") {
        ("notin", r)
    } else if let Some(r) = strip_word(rest, "in") {
        ("in", r)
    } else {
        return Ok((LabelReq::Exists(key.to_string()), rest));
    };
    let after = after.trim_start();
    let key = key.to_string();
    match op {
        "in" | "notin" => {
            let Some(inner) = after.strip_prefix('(') else {
                return Err(bad_label(s, "found '', expected: '('"));
            };
            let Some(close) = inner.find(')') else {
                return Err(bad_label(s, "found '', expected: ')'"));
            };
            let values: Vec<String> = inner[..close]
                .split(',')
                .map(|v| v.trim().to_string())
                .collect();
            if let Some(bad) = values.iter().find(|v| !v.chars().all(is_label_char)) {
                return Err(bad_label(s, &format!("invalid label value: {bad:?}")));
            }
            let rest = &inner[close + 1..];
            if op == "in" {
                Ok((LabelReq::In(key, values), rest))
            } else {
                Ok((LabelReq::NotIn(key, values), rest))
            }
        }
        ">" | "<" => {
            let (value, rest) = take_ident(after);
            let n = value.parse::<i64>().map_err(|_| {
                bad_label(
                    s,
                    &format!("for 'Gt', 'Lt' operators, the value must be an integer: {value:?}"),
                )
            })?;
            if op == ">" {
                Ok((LabelReq::Gt(key, n), rest))
            } else {
                Ok((LabelReq::Lt(key, n), rest))
            }
        }
        _ => {
            let (value, rest) = take_ident(after);
            let values = vec![value.to_string()];
            if op == "=" {
                Ok((LabelReq::In(key, values), rest))
            } else {
                Ok((LabelReq::NotIn(key, values), rest))
            }
        }
    }
}

/// `word` at the start of `s` followed by a non-identifier character.
fn strip_word<'a>(s: &'a str, word: &str) -> Option<&'a str> {
    let rest = s.strip_prefix(word)?;
    match rest.chars().next() {
        Some(c) if is_label_char(c) => None,
        _ => Some(rest),
    }
}

fn check_key(key: &str, text: &str) -> Result<(), Failure> {
    if key.is_empty() {
        return Err(bad_label(text, "found '', expected: identifier"));
    }
    Ok(())
}

/// One field requirement: `field == value` or `field != value`.
#[derive(Debug, Clone, PartialEq)]
struct FieldReq {
    field: String,
    value: String,
    equal: bool,
}

/// A parsed field selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<FieldReq>);

impl FieldSelector {
    /// Parses `text` and checks every field is one `kind` supports.
    pub fn parse(text: &str, kind: &Kind) -> Result<Self, Failure> {
        let mut reqs = Vec::new();
        for term in split_unescaped(text, ',') {
            if term.trim().is_empty() {
                continue;
            }
            let (field, value, equal) = if let Some((f, v)) = split_op(&term, "!=") {
                (f, v, false)
            } else if let Some((f, v)) = split_op(&term, "==") {
                (f, v, true)
            } else if let Some((f, v)) = split_op(&term, "=") {
                (f, v, true)
            } else {
                return Err(Failure::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let field = field.trim().to_string();
            if !supported_fields(kind).contains(&field.as_str()) {
                return Err(Failure::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push(FieldReq {
                field,
                value: unescape(&value),
                equal,
            });
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|req| (field_value(obj, &req.field) == req.value) == req.equal)
    }

    /// The value required for `field` by an equality term, if any (to narrow a listing).
    pub fn required(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.equal && r.field == field)
            .map(|r| r.value.as_str())
    }
}

/// Fields upstream indexes for field selectors, per kind.
fn supported_fields(kind: &Kind) -> &'static [&'static str] {
    match (kind.group, kind.kind) {
        ("", "Pod") => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "Node") => &["metadata.name", "spec.unschedulable"],
        ("", "Namespace") => &["metadata.name", "status.phase"],
        ("", "Secret") => &["metadata.name", "metadata.namespace", "type"],
        ("", "Event") => &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "Event") => &[
            "metadata.name",
            "metadata.namespace",
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "regarding.resourceVersion",
            "regarding.fieldPath",
            "reason",
            "reportingController",
            "type",
        ],
        _ => &["metadata.name", "metadata.namespace"],
    }
}

/// The string form of a selectable field; missing fields read as "" like upstream's.
fn field_value(obj: &Value, field: &str) -> String {
    let path = match field {
        "source" => "source.component",
        other => other,
    };
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(next) => cur = next,
            None => {
                return match field {
                    "spec.hostNetwork" | "spec.unschedulable" => "false".to_string(),
                    _ => String::new(),
                };
            }
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

fn split_op(term: &str, op: &str) -> Option<(String, String)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
            continue;
        }
        if term[i..].starts_with(op) {
            return Some((term[..i].to_string(), term[i + op.len()..].to_string()));
        }
        if op == "=" && c == '!' {
            return None;
        }
    }
    None
}

fn split_unescaped(text: &str, sep: char) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            if let Some(s) = out.last_mut() {
                s.push('\\');
                s.push(c);
            }
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(String::new());
        } else if let Some(s) = out.last_mut() {
            s.push(c);
        }
    }
    out
}

fn unescape(value: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in value.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kind(k: &str) -> &'static Kind {
        super::super::kinds::KINDS
            .iter()
            .find(|x| x.kind == k)
            .unwrap()
    }

    #[test]
    fn label_operators() {
        let labels = json!({"app": "web", "tier": "front", "n": "7"});
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&labels));
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app=db"));
        assert!(m("app!=db"));
        assert!(m("missing!=x"), "!= matches absent labels");
        assert!(m("app in (web, db)"));
        assert!(!m("app in (db)"));
        assert!(m("app notin (db,cache)"));
        assert!(m("missing notin (db)"), "notin matches absent labels");
        assert!(!m("missing in (db)"));
        assert!(m("tier"));
        assert!(!m("!tier"));
        assert!(m("!missing"));
        assert!(m("app=web,tier in (front),!missing"));
        assert!(!m("app=web,tier=back"));
        assert!(m("n>5") && !m("n<5"));
        assert!(LabelSelector::parse("app=web,").is_err());
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("n>x").is_err());
        assert!(!LabelSelector::parse("app").unwrap().matches(None));
        assert!(LabelSelector::parse("!app").unwrap().matches(None));
    }

    #[test]
    fn field_selectors() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running"}
        });
        let m = |s: &str| FieldSelector::parse(s, kind("Pod")).unwrap().matches(&pod);
        assert!(m("spec.nodeName=n1"));
        assert!(m("spec.nodeName==n1,status.phase=Running"));
        assert!(!m("spec.nodeName=n2"));
        assert!(m("spec.nodeName!=n2"));
        assert!(m("metadata.name=p,metadata.namespace=ns"));
        assert!(m("status.podIP="), "missing fields read as empty");
        assert!(m("spec.hostNetwork=false"));
        let err = FieldSelector::parse("spec.foo=1", kind("Pod")).unwrap_err();
        assert_eq!(err.message, "field label not supported: spec.foo");
        assert!(FieldSelector::parse("spec.nodeName", kind("Pod")).is_err());
        assert!(FieldSelector::parse("spec.nodeName=a", kind("ConfigMap")).is_err());
        let sel = FieldSelector::parse("metadata.name=a\\,b", kind("ConfigMap")).unwrap();
        assert!(sel.matches(&json!({"metadata": {"name": "a,b"}})));
        assert_eq!(sel.required("metadata.name"), Some("a,b"));
    }

    #[test]
    fn event_fields_for_describe() {
        let ev =
            json!({"involvedObject": {"name": "p", "namespace": "ns", "uid": "u", "kind": "Pod"}});
        let sel = FieldSelector::parse(
            "involvedObject.name=p,involvedObject.namespace=ns,involvedObject.uid=u",
            kind("Event"),
        )
        .unwrap();
        assert!(sel.matches(&ev));
    }
}

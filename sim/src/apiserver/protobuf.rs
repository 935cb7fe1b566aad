//! Decoding the protobuf requests kubectl's typed clients send.
//!
//! kubectl posts SelfSubjectAccessReview (`kubectl auth can-i`) and, from 1.32, the objects
//! its `create configmap|secret|namespace` generators make as
//! `application/vnd.kubernetes.protobuf`: the `k8s\0` magic, then a `runtime.Unknown` envelope
//! whose `raw` field holds the object. Those kinds are decoded (metadata name, namespace,
//! labels, annotations and the kind's own fields); answers go back as JSON, which those
//! clients accept. Field numbers are the ones in upstream's `generated.proto` files.

use base64::Engine;
use serde_json::{Map, Value, json};

use super::failure::Failure;

const MAGIC: &[u8] = b"k8s\0";

/// One decoded field's payload.
enum Field<'a> {
    Number(u64),
    Bytes(&'a [u8]),
}

fn bad(why: &str) -> Failure {
    Failure::bad_request(format!("error decoding protobuf body: {why}"))
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, Failure> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos).ok_or_else(|| bad("truncated varint"))?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(bad("varint too long"))
}

/// The fields of one message, in order.
fn fields(buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, Failure> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (number, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                let value = varint(buf, &mut pos)?;
                out.push((number, Field::Number(value)));
            }
            2 => {
                let len =
                    usize::try_from(varint(buf, &mut pos)?).map_err(|_| bad("length overflow"))?;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| bad("truncated field"))?;
                out.push((number, Field::Bytes(&buf[pos..end])));
                pos = end;
            }
            1 => {
                pos = pos
                    .checked_add(8)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| bad("truncated fixed64"))?
            }
            5 => {
                pos = pos
                    .checked_add(4)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| bad("truncated fixed32"))?
            }
            _ => return Err(bad("unsupported wire type")),
        }
    }
    Ok(out)
}

fn text(bytes: &[u8]) -> Result<String, Failure> {
    String::from_utf8(bytes.to_vec()).map_err(|_| bad("string is not UTF-8"))
}

/// A message of string fields, named by number (`names[i]` is field i+1); repeated fields
/// listed in `lists` become arrays; `nested` names sub-messages decoded the same way.
fn strings_message(
    buf: &[u8],
    names: &[&str],
    lists: &[&str],
    nested: &[(&str, &[&str])],
) -> Result<Value, Failure> {
    let mut out = Map::new();
    for (number, field) in fields(buf)? {
        let Some(name) = usize::try_from(number)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| names.get(i))
        else {
            continue;
        };
        let Field::Bytes(bytes) = field else {
            continue;
        };
        if let Some((_, sub)) = nested.iter().find(|(n, _)| n == name) {
            out.insert(name.to_string(), strings_message(bytes, sub, &[], &[])?);
        } else if lists.contains(name) {
            let entry = out.entry(name.to_string()).or_insert_with(|| json!([]));
            if let Some(list) = entry.as_array_mut() {
                list.push(json!(text(bytes)?));
            }
        } else {
            out.insert(name.to_string(), json!(text(bytes)?));
        }
    }
    Ok(Value::Object(out))
}

const RESOURCE_ATTRIBUTES: &[&str] = &[
    "namespace",
    "verb",
    "group",
    "version",
    "resource",
    "subresource",
    "name",
];
const NON_RESOURCE_ATTRIBUTES: &[&str] = &["path", "verb"];

/// The object bytes inside the `k8s\0` + `runtime.Unknown` envelope.
fn unwrap_envelope(body: &[u8]) -> Result<&[u8], Failure> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("missing k8s magic"))?;
    fields(envelope)?
        .into_iter()
        .find_map(|(n, f)| match (n, f) {
            (2, Field::Bytes(b)) => Some(b),
            _ => None,
        })
        .ok_or_else(|| bad("envelope without raw object"))
}

/// One entry of a protobuf `map<string, string>` (or of bytes, base64-encoded as JSON carries
/// them): `{1: key, 2: value}`.
fn map_entry(bytes: &[u8], binary: bool) -> Result<(String, Value), Failure> {
    let mut key = String::new();
    let mut value = json!("");
    for (n, f) in fields(bytes)? {
        match (n, f) {
            (1, Field::Bytes(b)) => key = text(b)?,
            (2, Field::Bytes(b)) if binary => {
                value = json!(base64::engine::general_purpose::STANDARD.encode(b));
            }
            (2, Field::Bytes(b)) => value = json!(text(b)?),
            _ => {}
        }
    }
    Ok((key, value))
}

fn insert_entry(
    out: &mut Map<String, Value>,
    field: &str,
    bytes: &[u8],
    binary: bool,
) -> Result<(), Failure> {
    let (k, v) = map_entry(bytes, binary)?;
    let map = out.entry(field.to_string()).or_insert_with(|| json!({}));
    if let Some(map) = map.as_object_mut() {
        map.insert(k, v);
    }
    Ok(())
}

/// ObjectMeta: the fields a client sets when creating (name, generateName, namespace,
/// labels, annotations, finalizers).
fn object_meta(bytes: &[u8]) -> Result<Value, Failure> {
    let mut meta = Map::new();
    for (n, f) in fields(bytes)? {
        let Field::Bytes(b) = f else {
            continue;
        };
        match n {
            1 => {
                meta.insert("name".into(), json!(text(b)?));
            }
            2 => {
                meta.insert("generateName".into(), json!(text(b)?));
            }
            3 => {
                meta.insert("namespace".into(), json!(text(b)?));
            }
            11 => insert_entry(&mut meta, "labels", b, false)?,
            12 => insert_entry(&mut meta, "annotations", b, false)?,
            14 => {
                let list = meta.entry("finalizers").or_insert_with(|| json!([]));
                if let Some(list) = list.as_array_mut() {
                    list.push(json!(text(b)?));
                }
            }
            _ => {}
        }
    }
    Ok(Value::Object(meta))
}

/// Decodes a protobuf-encoded ConfigMap, Secret or Namespace into its JSON form; other kinds
/// are 415 Unsupported Media Type.
pub fn decode_object(body: &[u8], kind: &str) -> Result<Value, Failure> {
    if !matches!(kind, "ConfigMap" | "Secret" | "Namespace") {
        return Err(Failure::unsupported_media_type(&format!(
            "application/vnd.kubernetes.protobuf ({kind})"
        )));
    }
    let raw = unwrap_envelope(body)?;
    let mut out = Map::new();
    out.insert("kind".into(), json!(kind));
    for (n, f) in fields(raw)? {
        match (kind, n, f) {
            (_, 1, Field::Bytes(b)) => {
                out.insert("metadata".into(), object_meta(b)?);
            }
            ("ConfigMap", 2, Field::Bytes(b)) => insert_entry(&mut out, "data", b, false)?,
            ("ConfigMap", 3, Field::Bytes(b)) => insert_entry(&mut out, "binaryData", b, true)?,
            ("ConfigMap", 4, Field::Number(v)) | ("Secret", 5, Field::Number(v)) => {
                out.insert("immutable".into(), json!(v != 0));
            }
            ("Secret", 2, Field::Bytes(b)) => insert_entry(&mut out, "data", b, true)?,
            ("Secret", 3, Field::Bytes(b)) => {
                out.insert("type".into(), json!(text(b)?));
            }
            ("Secret", 4, Field::Bytes(b)) => insert_entry(&mut out, "stringData", b, false)?,
            _ => {}
        }
    }
    // stringData is write-only: upstream folds it into data.
    super::defaults::fold_string_data(&mut out);
    Ok(Value::Object(out))
}

/// Decodes a protobuf-encoded review of kind `kind` into its JSON form.
pub fn decode_review(body: &[u8], kind: &str) -> Result<Value, Failure> {
    let raw = unwrap_envelope(body)?;

    let spec_bytes = fields(raw)?
        .into_iter()
        .find_map(|(n, f)| match (n, f) {
            (2, Field::Bytes(b)) => Some(b),
            _ => None,
        })
        .unwrap_or_default();
    let attributes: &[(&str, &[&str])] = &[
        ("resourceAttributes", RESOURCE_ATTRIBUTES),
        ("nonResourceAttributes", NON_RESOURCE_ATTRIBUTES),
    ];
    let spec = match kind {
        "SelfSubjectAccessReview" => strings_message(
            spec_bytes,
            &["resourceAttributes", "nonResourceAttributes"],
            &[],
            attributes,
        )?,
        "SubjectAccessReview" => strings_message(
            spec_bytes,
            &[
                "resourceAttributes",
                "nonResourceAttributes",
                "user",
                "groups",
                "extra",
                "uid",
            ],
            &["groups"],
            attributes,
        )?,
        "TokenReview" => strings_message(spec_bytes, &["token", "audiences"], &["audiences"], &[])?,
        "SelfSubjectReview" => json!({}),
        other => {
            return Err(Failure::unsupported_media_type(&format!(
                "application/vnd.kubernetes.protobuf ({other})"
            )));
        }
    };
    Ok(json!({ "kind": kind, "metadata": {}, "spec": spec }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn self_subject_access_review_decodes() {
        let attrs = [
            field(1, b"default"),
            field(2, b"create"),
            field(5, b"pods"),
            field(6, b"exec"),
        ]
        .concat();
        let spec = field(1, &attrs);
        let raw = [field(1, b""), field(2, &spec)].concat();
        let type_meta = [
            field(1, b"authorization.k8s.io/v1"),
            field(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let envelope = [field(1, &type_meta), field(2, &raw)].concat();
        let body = [MAGIC, &envelope].concat();
        let review = decode_review(&body, "SelfSubjectAccessReview").unwrap();
        assert_eq!(
            review["spec"]["resourceAttributes"],
            json!({"namespace": "default", "verb": "create", "resource": "pods", "subresource": "exec"})
        );
        assert!(decode_review(b"k8s\0\x12\x7f", "SelfSubjectAccessReview").is_err());
        assert!(decode_review(b"nope", "TokenReview").is_err());
    }

    #[test]
    fn secrets_and_configmaps_decode() {
        let entry = |k: &[u8], v: &[u8]| [field(1, k), field(2, v)].concat();
        let meta = [
            field(1, b"leaf"),
            field(3, b"relaylet"),
            field(11, &entry(b"relaylet.io/leaf-cluster", b"east")),
        ]
        .concat();
        let secret = [
            field(1, &meta),
            field(2, &entry(b"kubeconfig", b"\x00bin")),
            field(3, b"Opaque"),
            field(4, &entry(b"s", b"plain")),
        ]
        .concat();
        let body = [MAGIC, &field(2, &secret)].concat();
        let obj = decode_object(&body, "Secret").unwrap();
        assert_eq!(obj["metadata"]["name"], "leaf");
        assert_eq!(
            obj["metadata"]["labels"]["relaylet.io/leaf-cluster"],
            "east"
        );
        assert_eq!(obj["data"]["kubeconfig"], "AGJpbg==");
        assert_eq!(obj["data"]["s"], "cGxhaW4=");
        assert_eq!(obj["type"], "Opaque");
        let cm = [
            field(1, &field(1, b"c")),
            field(2, &entry(b"k", b"v")),
            vec![0x20, 1],
        ]
        .concat();
        let obj = decode_object(&[MAGIC, &field(2, &cm)].concat(), "ConfigMap").unwrap();
        assert_eq!(
            (obj["data"]["k"].as_str(), obj["immutable"].as_bool()),
            (Some("v"), Some(true))
        );
        assert_eq!(decode_object(&body, "Pod").unwrap_err().code, 415);
    }
}

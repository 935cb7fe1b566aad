//! Decoding the protobuf requests kubectl sends for review objects.
//!
//! kubectl's typed clients post SelfSubjectAccessReview (`kubectl auth can-i`) and friends as
//! `application/vnd.kubernetes.protobuf`: the `k8s\0` magic, then a `runtime.Unknown` envelope
//! whose `raw` field holds the object. Only the review kinds are decoded (their specs are a
//! few strings); answers go back as JSON, which those clients accept. Field numbers are the
//! ones in upstream's `generated.proto` files.

use serde_json::{Map, Value, json};

use super::failure::Failure;

const MAGIC: &[u8] = b"k8s\0";

/// One decoded field's payload. Review specs carry only strings and messages, so numeric
/// fields are skipped rather than kept.
enum Field<'a> {
    Number,
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
                varint(buf, &mut pos)?;
                out.push((number, Field::Number));
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

/// Decodes a protobuf-encoded review of kind `kind` into its JSON form.
pub fn decode_review(body: &[u8], kind: &str) -> Result<Value, Failure> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("missing k8s magic"))?;
    let raw = fields(envelope)?
        .into_iter()
        .find_map(|(n, f)| match (n, f) {
            (2, Field::Bytes(b)) => Some(b),
            _ => None,
        })
        .ok_or_else(|| bad("envelope without raw object"))?;
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
}

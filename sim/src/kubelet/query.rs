//! Query strings as Go's `url.ParseQuery` reads them: repeated keys kept in order, `+` as a
//! space, percent escapes decoded. The kubelet API needs repeated keys (`command=` per argv
//! element, `port=` per forwarded port), which map-based extractors lose.

/// Decodes a raw query string into `(key, value)` pairs in order.
pub fn parse(raw: Option<&str>) -> Result<Vec<(String, String)>, String> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    let mut pairs = Vec::new();
    for part in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        pairs.push((unescape(k)?, unescape(v)?));
    }
    Ok(pairs)
}

/// All values of `key`, in order.
pub fn all<'a>(pairs: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    pairs
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The first value of `key`, like Go's `Values.Get` (`None` when absent).
pub fn first<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn unescape(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("invalid URL escape in {s:?}"))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("query value {s:?} is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_repeats_and_decodes() {
        let q = parse(Some(
            "command=sh&command=-c&command=echo+out%3B+exit+4&output=1&flag",
        ))
        .unwrap();
        assert_eq!(all(&q, "command"), vec!["sh", "-c", "echo out; exit 4"]);
        assert_eq!(first(&q, "output"), Some("1"));
        assert_eq!(first(&q, "flag"), Some(""));
        assert_eq!(first(&q, "nope"), None);
        assert!(parse(Some("a=%zz")).is_err());
        assert!(parse(Some("a=%4")).is_err());
    }
}

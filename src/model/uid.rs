//! An object UID as relaylet keeps it in its per-pod records: the 16 bytes of a UUID when the
//! text is one in the canonical lowercase form (what every apiserver writes:
//! `k8s.io/apimachinery/pkg/util/uuid`), the text itself otherwise. A String would cost a heap
//! allocation per UID (48 bytes with the allocator's header), and a synced pod keeps several
//! (its root pod's, its copy's, the copy its restart counts are of).

use std::fmt;

/// A UID; shown as the text it was made from.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Uid {
    Uuid([u8; 16]),
    Text(Box<str>),
}

/// Where the dashes of a canonical UUID stand.
const DASHES: [usize; 4] = [8, 13, 18, 23];

impl Uid {
    pub fn new(text: &str) -> Uid {
        parse_uuid(text).map_or_else(|| Uid::Text(text.into()), Uid::Uuid)
    }

    /// Whether this is the UID `text` names, without allocating.
    pub fn is(&self, text: &str) -> bool {
        match self {
            Uid::Uuid(bytes) => parse_uuid(text).as_ref() == Some(bytes),
            Uid::Text(own) => **own == *text,
        }
    }
}

/// Whether a kept UID and one read are the same, both absent included.
pub fn same(kept: Option<&Uid>, read: Option<&str>) -> bool {
    match (kept, read) {
        (Some(kept), Some(read)) => kept.is(read),
        (None, None) => true,
        _ => false,
    }
}

/// The bytes of `text` if it is a UUID in canonical lowercase form (and so shown back the same).
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let text = text.as_bytes();
    if text.len() != 36 || DASHES.iter().any(|&i| text[i] != b'-') {
        return None;
    }
    let mut digits = text
        .iter()
        .enumerate()
        .filter(|(i, _)| !DASHES.contains(i))
        .map(|(_, &c)| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        });
    let mut bytes = [0u8; 16];
    for byte in &mut bytes {
        *byte = (digits.next()?? << 4) | digits.next()??;
    }
    Some(bytes)
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uid::Uuid(bytes) => {
                for (i, byte) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
            Uid::Text(text) => f.write_str(text),
        }
    }
}

impl fmt::Debug for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_shows_the_text_it_was_made_from() {
        for text in [
            "3f8a2c1e-9b7d-4e5f-a6b1-0c2d3e4f5a6b",
            "00000000-0000-0000-0000-000000000000",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            // Not canonical lowercase: kept as text, so shown back exactly.
            "3F8A2C1E-9B7D-4E5F-A6B1-0C2D3E4F5A6B",
            "3f8a2c1e9b7d4e5fa6b10c2d3e4f5a6b",
            "3f8a2c1e-9b7d-4e5f-a6b1-0c2d3e4f5a6",
            "3f8a2c1e-9b7d-4e5f-a6b1-0c2d3e4f5a6bb",
            "3f8a2c1e-9b7d-4e5f-a6b1_0c2d3e4f5a6b",
            "3f8a2c1e-9b7d-4e5f-a6b1-0c2d3e4f5a6g",
            "uid-1",
            "",
            "éééééééééééééééééé",
        ] {
            let uid = Uid::new(text);
            assert_eq!(uid.to_string(), text);
            assert!(uid.is(text), "{text}");
        }
        assert!(matches!(
            Uid::new("3f8a2c1e-9b7d-4e5f-a6b1-0c2d3e4f5a6b"),
            Uid::Uuid(_)
        ));
        assert!(matches!(
            Uid::new("3F8A2C1E-9B7D-4E5F-A6B1-0C2D3E4F5A6B"),
            Uid::Text(_)
        ));
    }

    #[test]
    fn uids_that_differ_in_any_way_are_not_the_same() {
        let a = "3f8a2c1e-9b7d-4e5f-a6b1-0c2d3e4f5a6b";
        let uid = Uid::new(a);
        assert!(!uid.is("3f8a2c1e-9b7d-4e5f-a6b1-0c2d3e4f5a6c"));
        assert!(!uid.is("3F8A2C1E-9B7D-4E5F-A6B1-0C2D3E4F5A6B"));
        assert!(!uid.is("uid-1"));
        assert!(!Uid::new("uid-1").is(a));
        assert_ne!(
            Uid::new(a),
            Uid::new("3F8A2C1E-9B7D-4E5F-A6B1-0C2D3E4F5A6B")
        );
        assert!(same(Some(&uid), Some(a)));
        assert!(same(None, None));
        assert!(!same(Some(&uid), None));
        assert!(!same(None, Some(a)));
    }

    #[test]
    fn a_kept_uid_takes_no_more_room_than_a_string() {
        assert!(std::mem::size_of::<Option<Uid>>() <= std::mem::size_of::<Option<String>>());
    }
}

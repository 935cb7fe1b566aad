//! SPDY/3 header blocks: the name/value block format and its zlib compression.
//!
//! A header block is `count:u32` then `count` times `len:u32 name len:u32 value`, all big-endian.
//! Several values of one name travel as one value joined with NUL. The block is compressed with
//! zlib primed with the fixed SPDY/3 dictionary, and the zlib stream is *connection-wide*: one
//! compressor for everything we send and one decompressor for everything we receive, each block
//! ending with a sync flush. Losing a single block therefore desynchronises every later one, so any
//! error here is fatal for the connection.

use std::sync::LazyLock;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::error::FrameError;

/// A decoded header list: lowercase names, one entry per value, wire order kept.
pub type HeaderList = Vec<(String, String)>;

/// Largest decompressed header block we accept. Kubernetes peers send a few dozen bytes; the cap
/// keeps a zlib bomb from costing more than this.
pub const MAX_HEADER_BLOCK: usize = 256 * 1024;

/// Largest number of name/value pairs (after splitting NUL-joined values) in one block.
pub const MAX_HEADERS: usize = 1024;

/// The words of the SPDY/3 dictionary that are stored length-prefixed (draft 3, section 2.6.10.1).
const DICTIONARY_WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The raw tail of the SPDY/3 dictionary: status codes, reason phrases, dates and common values.
const DICTIONARY_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// The SPDY/3 zlib dictionary (1423 bytes, Adler-32 `0xe3c6a7c2`, the DICTID peers put in the
/// zlib header of their first block).
pub static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut dict = Vec::with_capacity(1423);
    for word in DICTIONARY_WORDS {
        // The words are short constants, so the length always fits in u32.
        dict.extend_from_slice(&(word.len() as u32).to_be_bytes());
        dict.extend_from_slice(word.as_bytes());
    }
    dict.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    dict
});

/// Serialises `headers` into an uncompressed name/value block. Names are lowercased (SPDY/3
/// requires it) and repeated names are joined with NUL in first-appearance order.
pub fn encode_block(headers: &[(String, String)]) -> Result<Vec<u8>, FrameError> {
    let mut grouped: Vec<(String, String)> = Vec::new();
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        if name.is_empty() {
            return Err(FrameError::BadHeaderBlock("empty header name"));
        }
        if name.contains('\0') || value.contains('\0') {
            return Err(FrameError::BadHeaderBlock(
                "NUL inside a header name or value",
            ));
        }
        match grouped.iter_mut().find(|(n, _)| *n == name) {
            Some((_, joined)) => {
                joined.push('\0');
                joined.push_str(value);
            }
            None => grouped.push((name, value.clone())),
        }
    }
    let mut out = Vec::new();
    out.extend_from_slice(&len_u32(grouped.len())?.to_be_bytes());
    for (name, value) in &grouped {
        out.extend_from_slice(&len_u32(name.len())?.to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&len_u32(value.len())?.to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    if out.len() > MAX_HEADER_BLOCK {
        return Err(FrameError::HeaderBlockTooLarge(MAX_HEADER_BLOCK));
    }
    Ok(out)
}

fn len_u32(len: usize) -> Result<u32, FrameError> {
    u32::try_from(len).map_err(|_| FrameError::HeaderBlockTooLarge(MAX_HEADER_BLOCK))
}

/// Parses an uncompressed name/value block, rejecting what Go's SPDY framer rejects (uppercase or
/// duplicate names) and anything truncated, oversized or not UTF-8.
pub fn decode_block(block: &[u8]) -> Result<HeaderList, FrameError> {
    let mut rest = block;
    let count = take_u32(&mut rest)?;
    let mut headers = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for _ in 0..count {
        let name = take_string(&mut rest)?;
        let value = take_string(&mut rest)?;
        if name.is_empty() {
            return Err(FrameError::BadHeaderBlock("empty header name"));
        }
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(FrameError::BadHeaderBlock("header name is not lowercase"));
        }
        if names.contains(&name) {
            return Err(FrameError::BadHeaderBlock("duplicate header name"));
        }
        for part in value.split('\0') {
            if headers.len() >= MAX_HEADERS {
                return Err(FrameError::TooManyHeaders(MAX_HEADERS));
            }
            headers.push((name.clone(), part.to_string()));
        }
        names.push(name);
    }
    if !rest.is_empty() {
        return Err(FrameError::BadHeaderBlock(
            "trailing bytes after the last header",
        ));
    }
    Ok(headers)
}

fn take_u32(rest: &mut &[u8]) -> Result<u32, FrameError> {
    let Some((head, tail)) = rest.split_first_chunk::<4>() else {
        return Err(FrameError::BadHeaderBlock("truncated length field"));
    };
    *rest = tail;
    Ok(u32::from_be_bytes(*head))
}

fn take_string(rest: &mut &[u8]) -> Result<String, FrameError> {
    let len = take_u32(rest)? as usize;
    if len > rest.len() {
        return Err(FrameError::BadHeaderBlock(
            "string runs past the end of the block",
        ));
    }
    let (bytes, tail) = rest.split_at(len);
    *rest = tail;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| FrameError::BadHeaderBlock("header is not valid UTF-8"))
}

/// The sending side's connection-wide zlib stream.
pub struct HeaderCompressor {
    zlib: Compress,
    primed: bool,
}

impl Default for HeaderCompressor {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderCompressor {
    pub fn new() -> Self {
        HeaderCompressor {
            zlib: Compress::new(Compression::default(), true),
            primed: false,
        }
    }

    /// Encodes and compresses one header block, ending it with a sync flush so the peer can
    /// decode it without waiting for more.
    pub fn compress(&mut self, headers: &[(String, String)]) -> Result<Vec<u8>, FrameError> {
        let plain = encode_block(headers)?;
        if !self.primed {
            self.zlib
                .set_dictionary(&DICTIONARY)
                .map_err(|e| FrameError::Compress(e.to_string()))?;
            self.primed = true;
        }
        let mut out = Vec::with_capacity(plain.len() / 2 + 64);
        let mut consumed = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            let before_in = self.zlib.total_in();
            self.zlib
                .compress_vec(&plain[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| FrameError::Compress(e.to_string()))?;
            consumed += (self.zlib.total_in() - before_in) as usize;
            // Done once all input went in and zlib left spare room (it had nothing more to say).
            if consumed == plain.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// The receiving side's connection-wide zlib stream.
pub struct HeaderDecompressor {
    zlib: Decompress,
}

impl Default for HeaderDecompressor {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderDecompressor {
    pub fn new() -> Self {
        HeaderDecompressor {
            zlib: Decompress::new(true),
        }
    }

    /// Decompresses and parses one header block. An empty block (some peers send none at all
    /// for an empty SYN_REPLY) is an empty list and leaves the zlib stream untouched.
    pub fn decompress(&mut self, compressed: &[u8]) -> Result<HeaderList, FrameError> {
        if compressed.is_empty() {
            return Ok(Vec::new());
        }
        let mut out: Vec<u8> = Vec::new();
        let mut consumed = 0;
        loop {
            // Grow in steps, never past the cap: a zlib bomb stops here.
            let room = (out.len().max(256)).min(MAX_HEADER_BLOCK - out.len());
            if room == 0 {
                return Err(FrameError::HeaderBlockTooLarge(MAX_HEADER_BLOCK));
            }
            let start = out.len();
            out.resize(start + room, 0);
            let before_in = self.zlib.total_in();
            let before_out = self.zlib.total_out();
            let result = self.zlib.decompress(
                &compressed[consumed..],
                &mut out[start..],
                FlushDecompress::Sync,
            );
            let produced = (self.zlib.total_out() - before_out) as usize;
            let taken = (self.zlib.total_in() - before_in) as usize;
            out.truncate(start + produced);
            consumed += taken;
            match result {
                Ok(Status::StreamEnd) => {
                    return Err(FrameError::Decompress(
                        "peer ended the connection's zlib stream".to_string(),
                    ));
                }
                Ok(_) => {}
                Err(err) => {
                    let Some(id) = err.needs_dictionary() else {
                        return Err(FrameError::Decompress(err.to_string()));
                    };
                    let ours = self
                        .zlib
                        .set_dictionary(&DICTIONARY)
                        .map_err(|e| FrameError::Decompress(e.to_string()))?;
                    if ours != id {
                        return Err(FrameError::Decompress(format!(
                            "peer wants zlib dictionary {id:#010x}, SPDY/3's is {ours:#010x}"
                        )));
                    }
                    continue;
                }
            }
            // Done once all input is in and zlib stopped short of filling the buffer.
            if consumed == compressed.len() && produced < room {
                break;
            }
            if produced == 0 && taken == 0 {
                return Err(FrameError::Decompress(
                    "header block ends inside a zlib block".to_string(),
                ));
            }
        }
        decode_block(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_matches_the_spdy3_dictid() {
        assert_eq!(DICTIONARY.len(), 1423);
        // Adler-32 computed by hand: flate2 only exposes CRC-32.
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in DICTIONARY.iter() {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }

    #[test]
    fn blocks_round_trip_through_one_stream_per_direction() {
        let mut tx = HeaderCompressor::new();
        let mut rx = HeaderDecompressor::new();
        let blocks: Vec<HeaderList> = vec![
            vec![("streamtype".into(), "error".into())],
            vec![],
            vec![
                ("streamType".into(), "data".into()),
                ("port".into(), "8080".into()),
                ("x-multi".into(), "a".into()),
                ("x-multi".into(), "b".into()),
            ],
        ];
        for block in &blocks {
            let wire = tx.compress(block).expect("compress");
            let back = rx.decompress(&wire).expect("decompress");
            let lowered: HeaderList = block
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
                .collect();
            assert_eq!(back, lowered);
        }
    }

    #[test]
    fn rejects_uppercase_and_duplicate_names() {
        let upper = [
            &1u32.to_be_bytes()[..],
            &1u32.to_be_bytes(),
            b"A",
            &0u32.to_be_bytes(),
        ]
        .concat();
        assert!(decode_block(&upper).is_err());
        let one = [&1u32.to_be_bytes()[..], b"a", &1u32.to_be_bytes(), b"x"].concat();
        let dup = [&2u32.to_be_bytes()[..], &one, &one].concat();
        assert!(decode_block(&dup).is_err());
    }

    #[test]
    fn zlib_bomb_is_capped() {
        let mut z = Compress::new(Compression::best(), true);
        z.set_dictionary(&DICTIONARY).expect("dict");
        let plain = vec![b'a'; MAX_HEADER_BLOCK * 4];
        let mut wire = Vec::with_capacity(64 * 1024);
        z.compress_vec(&plain, &mut wire, FlushCompress::Sync)
            .expect("compress");
        let mut rx = HeaderDecompressor::new();
        assert!(matches!(
            rx.decompress(&wire),
            Err(FrameError::HeaderBlockTooLarge(_))
        ));
    }
}

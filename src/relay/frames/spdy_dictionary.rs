//! The SPDY/3 zlib dictionary (draft 3, section 2.6.10.1). Every SPDY/3 peer primes the zlib
//! stream of its header blocks with it; relaylet needs it to read the caller's SYN_STREAM
//! headers (see `spdy_headers`). Built once, on first use, from the spec's word list.

use std::sync::LazyLock;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_matches_the_spdy3_dictid() {
        assert_eq!(DICTIONARY.len(), 1423);
        // Adler-32, the DICTID a peer puts in the zlib header of its first block.
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in DICTIONARY.iter() {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }
}

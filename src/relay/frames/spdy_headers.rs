//! Reads the caller's SPDY header blocks just far enough to learn one fact: which stream is the
//! error stream (`streamtype: error`), the one a Failure Status must go to when relaylet ends a
//! session itself.
//!
//! SPDY/3 compresses every header block (SYN_STREAM, SYN_REPLY, HEADERS) of one direction with
//! one connection-wide zlib stream primed with the SPDY dictionary, so a block can only be read
//! after every earlier block of that direction. relaylet inflates the caller's blocks in order,
//! from the first, until the error stream is known (client-go opens it first, so that is
//! normally the first block), and then drops the inflater: a session keeps none of this state
//! while it runs. The leaf's blocks are never inflated.

use flate2::{Decompress, FlushDecompress, Status};

use super::spdy_dictionary::DICTIONARY;

/// Largest decompressed header block read. Kubernetes clients send a few dozen bytes; the cap
/// keeps a zlib bomb from costing more.
const MAX_BLOCK: usize = 64 * 1024;

/// Why the caller's header blocks could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("a header block inflates past {MAX_BLOCK} bytes")]
    TooLarge,
    #[error("the header blocks are not a SPDY/3 zlib stream: {0}")]
    Zlib(String),
    #[error("a header block is truncated or malformed")]
    Malformed,
}

/// The caller's connection-wide header decompressor and the block being read.
pub struct HeaderBlocks {
    zlib: Decompress,
    block: Vec<u8>,
}

impl HeaderBlocks {
    pub fn new() -> HeaderBlocks {
        HeaderBlocks {
            zlib: Decompress::new(true),
            block: Vec::new(),
        }
    }

    /// Inflates the next compressed bytes of the block in progress (a block may arrive in any
    /// number of pieces).
    pub fn feed(&mut self, mut compressed: &[u8]) -> Result<(), BlockError> {
        loop {
            if self.block.len() == self.block.capacity() {
                let room = MAX_BLOCK - self.block.len();
                if room == 0 {
                    return Err(BlockError::TooLarge);
                }
                self.block
                    .reserve_exact(self.block.len().max(256).min(room));
            }
            let before_in = self.zlib.total_in();
            let before_out = self.zlib.total_out();
            let result =
                self.zlib
                    .decompress_vec(compressed, &mut self.block, FlushDecompress::Sync);
            let taken = usize::try_from(self.zlib.total_in() - before_in).unwrap_or(usize::MAX);
            let produced = self.zlib.total_out() - before_out;
            compressed = compressed.get(taken..).unwrap_or_default();
            match result {
                Ok(Status::StreamEnd) => {
                    return Err(BlockError::Zlib("the peer ended its zlib stream".into()));
                }
                Ok(_) => {}
                Err(err) => {
                    if err.needs_dictionary().is_none() {
                        return Err(BlockError::Zlib(err.to_string()));
                    }
                    self.zlib
                        .set_dictionary(&DICTIONARY)
                        .map_err(|e| BlockError::Zlib(e.to_string()))?;
                    continue;
                }
            }
            let room_left = self.block.len() < self.block.capacity();
            if compressed.is_empty() && room_left {
                return Ok(());
            }
            if taken == 0 && produced == 0 && room_left {
                return Err(BlockError::Zlib("no progress".into()));
            }
        }
    }

    /// Ends the block in progress: whether it names the stream an error stream.
    pub fn finish_block(&mut self) -> Result<bool, BlockError> {
        let found = declares_error_stream(&self.block);
        self.block.clear();
        found
    }
}

/// Whether a decompressed SPDY/3 name/value block holds `streamtype: error` (names are
/// lowercase on the wire, but compared without case; several values travel NUL-joined).
fn declares_error_stream(mut block: &[u8]) -> Result<bool, BlockError> {
    if block.is_empty() {
        // Some peers send an empty block for "no headers"; it leaves zlib untouched.
        return Ok(false);
    }
    let count = take_u32(&mut block)?;
    let mut found = false;
    for _ in 0..count {
        let name = take_string(&mut block)?;
        let value = take_string(&mut block)?;
        if name.eq_ignore_ascii_case(b"streamtype")
            && value
                .split(|&b| b == 0)
                .any(|v| v.eq_ignore_ascii_case(b"error"))
        {
            found = true;
        }
    }
    if block.is_empty() {
        Ok(found)
    } else {
        Err(BlockError::Malformed)
    }
}

fn take_u32(rest: &mut &[u8]) -> Result<u32, BlockError> {
    let (head, tail) = rest.split_first_chunk::<4>().ok_or(BlockError::Malformed)?;
    *rest = tail;
    Ok(u32::from_be_bytes(*head))
}

fn take_string<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], BlockError> {
    let len = usize::try_from(take_u32(rest)?).map_err(|_| BlockError::Malformed)?;
    if len > rest.len() {
        return Err(BlockError::Malformed);
    }
    let (text, tail) = rest.split_at(len);
    *rest = tail;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use relaylet_sim::spdy::headers::HeaderCompressor;

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn finds_the_error_stream_in_blocks_fed_in_pieces() {
        let mut tx = HeaderCompressor::new();
        let blocks = [
            tx.compress(&headers(&[("streamType", "stdout")])).unwrap(),
            tx.compress(&headers(&[("streamType", "error")])).unwrap(),
            tx.compress(&headers(&[("a", "b"), ("streamtype", "data")]))
                .unwrap(),
        ];
        for piece in [1, 2, 5, 1000] {
            let mut rx = HeaderBlocks::new();
            let mut found = Vec::new();
            for block in &blocks {
                for part in block.chunks(piece) {
                    rx.feed(part).unwrap();
                }
                found.push(rx.finish_block().unwrap());
            }
            assert_eq!(found, [false, true, false], "pieces of {piece}");
        }
    }

    #[test]
    fn a_zlib_bomb_stops_at_the_cap() {
        use flate2::{Compress, Compression, FlushCompress};
        let mut z = Compress::new(Compression::best(), true);
        z.set_dictionary(&DICTIONARY).unwrap();
        let mut plain = 1u32.to_be_bytes().to_vec();
        plain.extend_from_slice(&(MAX_BLOCK as u32 * 4).to_be_bytes());
        plain.extend(std::iter::repeat_n(b'a', MAX_BLOCK * 4));
        let mut wire = Vec::with_capacity(64 * 1024);
        z.compress_vec(&plain, &mut wire, FlushCompress::Sync)
            .unwrap();
        let mut rx = HeaderBlocks::new();
        let fed = wire.chunks(7).try_for_each(|piece| rx.feed(piece));
        assert_eq!(fed, Err(BlockError::TooLarge));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut rx = HeaderBlocks::new();
        assert!(rx.feed(b"not zlib at all").is_err());
        assert_eq!(
            declares_error_stream(&[0, 0, 0, 1, 0, 0, 0, 9]),
            Err(BlockError::Malformed)
        );
    }
}

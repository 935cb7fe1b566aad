//! SPDY/3.1 frame boundaries in the bytes relaylet splices, for exec and attach sessions.
//!
//! relaylet never reframes or buffers: each direction's bytes are looked at as they pass, and
//! only frame headers are read (8 bytes: a control frame's version, type, flags and length, or a
//! DATA frame's stream id, flags and length); payloads are skipped by count. Two small
//! trackers do this:
//! - [`ClientSpdy`] (caller → leaf) learns the error stream from the caller's SYN_STREAM
//!   headers (`spdy_headers`), then stops looking at anything;
//! - [`LeafSpdy`] (leaf → caller) knows where the next frame starts, and whether the leaf has
//!   already given its answer on the error stream (a Status, or the end of that stream).
//!
//! With both, relaylet can end a session it must cut with a DATA frame carrying a Status on the
//! error stream, written at a frame boundary, so that client-go reads an error instead of the
//! clean end of every stream that it takes for exit code 0.

use super::exit_status::{CannotEnd, Ending};
use super::spdy_headers::HeaderBlocks;

const HEADER_LEN: usize = 8;
const FLAG_FIN: u8 = 0x01;
const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const HEADERS: u16 = 8;
/// The most header blocks read while looking for the error stream; a caller that opened this
/// many streams without one is not a remote command client we know.
const MAX_BLOCKS: u8 = 16;
/// The largest DATA frame relaylet completes with filler when the leaf never sent its end.
const MAX_PAD: usize = 1 << 20;

/// One frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    Data {
        stream: u32,
        flags: u8,
        len: u32,
    },
    Control {
        version: u16,
        kind: u16,
        flags: u8,
        len: u32,
    },
}

impl Head {
    fn parse(b: &[u8; HEADER_LEN]) -> Head {
        let len = u32::from_be_bytes([0, b[5], b[6], b[7]]);
        let flags = b[4];
        if b[0] & 0x80 != 0 {
            Head::Control {
                version: u16::from_be_bytes([b[0] & 0x7f, b[1]]),
                kind: u16::from_be_bytes([b[2], b[3]]),
                flags,
                len,
            }
        } else {
            Head::Data {
                stream: u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff,
                flags,
                len,
            }
        }
    }

    fn len(self) -> u32 {
        match self {
            Head::Data { len, .. } | Head::Control { len, .. } => len,
        }
    }
}

/// One step of a walk over the frames.
enum Piece<'a> {
    /// A header is complete.
    Head(Head),
    /// Payload bytes of the current frame.
    Payload(&'a [u8]),
    /// The current frame is complete.
    End,
}

/// Where a byte stream stands relative to its frames.
#[derive(Debug, Clone, Copy)]
enum Cursor {
    /// `have` bytes of the next header seen (0: at a frame boundary).
    InHeader {
        have: u8,
        head: [u8; HEADER_LEN],
    },
    InPayload {
        head: Head,
        left: u32,
    },
    /// Every byte of `head`'s frame seen; [`Piece::End`] not yet reported.
    EndPending,
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor::InHeader {
            have: 0,
            head: [0; HEADER_LEN],
        }
    }
}

impl Cursor {
    /// Takes the next piece off `chunk`; `None` when `chunk` is used up.
    fn next<'a>(&mut self, chunk: &mut &'a [u8]) -> Option<Piece<'a>> {
        match self {
            Cursor::EndPending => {
                *self = Cursor::default();
                Some(Piece::End)
            }
            Cursor::InHeader { have, head } => {
                if chunk.is_empty() {
                    return None;
                }
                let at = usize::from(*have);
                let take = (HEADER_LEN - at).min(chunk.len());
                head[at..at + take].copy_from_slice(&chunk[..take]);
                *chunk = &chunk[take..];
                *have += take as u8;
                if usize::from(*have) < HEADER_LEN {
                    return None;
                }
                let parsed = Head::parse(head);
                *self = match parsed.len() {
                    0 => Cursor::EndPending,
                    left => Cursor::InPayload { head: parsed, left },
                };
                Some(Piece::Head(parsed))
            }
            Cursor::InPayload { left, .. } => {
                if chunk.is_empty() {
                    return None;
                }
                let take = chunk.len().min(*left as usize);
                let (payload, rest) = chunk.split_at(take);
                *chunk = rest;
                *left -= take as u32;
                if *left == 0 {
                    *self = Cursor::EndPending;
                }
                Some(Piece::Payload(payload))
            }
        }
    }

    fn at_boundary(&self) -> bool {
        matches!(self, Cursor::InHeader { have: 0, .. } | Cursor::EndPending)
    }

    /// How many bytes of `chunk` belong to the frame in progress (0 at a boundary).
    fn rest_of_frame(&self, chunk: &[u8]) -> usize {
        if self.at_boundary() {
            return 0;
        }
        let mut walk = *self;
        let mut rest = chunk;
        while let Some(piece) = walk.next(&mut rest) {
            if matches!(piece, Piece::End) {
                break;
            }
        }
        chunk.len() - rest.len()
    }
}

/// The caller's side: finds the error stream, then looks at nothing more.
pub struct ClientSpdy {
    cursor: Cursor,
    /// The frame whose payload is passing, if it carries a header block.
    block_frame: Option<BlockFrame>,
    blocks: Option<Box<HeaderBlocks>>,
    blocks_read: u8,
    done: bool,
}

/// A SYN_STREAM, SYN_REPLY or HEADERS frame: a fixed part (stream id first), then a header
/// block.
struct BlockFrame {
    kind: u16,
    fixed: [u8; 10],
    fixed_len: u8,
    fixed_have: u8,
}

/// What the caller's side learned from a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Learned {
    Nothing,
    ErrorStream(u32),
    /// Tracking stopped: the error stream cannot be known.
    GaveUp(String),
}

impl ClientSpdy {
    pub fn new() -> ClientSpdy {
        ClientSpdy {
            cursor: Cursor::default(),
            block_frame: None,
            blocks: None,
            blocks_read: 0,
            done: false,
        }
    }

    /// Looks at the next bytes the caller sent.
    pub fn observe(&mut self, mut chunk: &[u8]) -> Learned {
        if self.done {
            return Learned::Nothing;
        }
        while let Some(piece) = self.cursor.next(&mut chunk) {
            let learned = match self.step(piece) {
                Ok(learned) => learned,
                Err(why) => Learned::GaveUp(why),
            };
            if learned != Learned::Nothing {
                self.done = true;
                // The inflater (zlib state and window) is the one sizeable thing here.
                self.blocks = None;
                self.block_frame = None;
                return learned;
            }
        }
        Learned::Nothing
    }

    fn step(&mut self, piece: Piece<'_>) -> Result<Learned, String> {
        match piece {
            Piece::Head(Head::Control { version, .. }) if version != VERSION => {
                Err(format!("a control frame of SPDY version {version}"))
            }
            Piece::Head(Head::Control { kind, .. })
                if matches!(kind, SYN_STREAM | SYN_REPLY | HEADERS) =>
            {
                self.block_frame = Some(BlockFrame {
                    kind,
                    fixed: [0; 10],
                    fixed_len: if kind == SYN_STREAM { 10 } else { 4 },
                    fixed_have: 0,
                });
                Ok(Learned::Nothing)
            }
            Piece::Head(_) => Ok(Learned::Nothing),
            Piece::Payload(mut bytes) => {
                let Some(frame) = self.block_frame.as_mut() else {
                    return Ok(Learned::Nothing);
                };
                let want = usize::from(frame.fixed_len - frame.fixed_have);
                let take = want.min(bytes.len());
                let at = usize::from(frame.fixed_have);
                frame.fixed[at..at + take].copy_from_slice(&bytes[..take]);
                frame.fixed_have += take as u8;
                bytes = &bytes[take..];
                if !bytes.is_empty() {
                    self.blocks
                        .get_or_insert_with(|| Box::new(HeaderBlocks::new()))
                        .feed(bytes)
                        .map_err(|e| e.to_string())?;
                }
                Ok(Learned::Nothing)
            }
            Piece::End => {
                let Some(frame) = self.block_frame.take() else {
                    return Ok(Learned::Nothing);
                };
                if frame.fixed_have < frame.fixed_len {
                    return Err("a frame too short for its header block".into());
                }
                let is_error = match self.blocks.as_mut() {
                    Some(blocks) => blocks.finish_block().map_err(|e| e.to_string())?,
                    None => false,
                };
                self.blocks_read = self.blocks_read.saturating_add(1);
                if is_error && frame.kind == SYN_STREAM {
                    let id = u32::from_be_bytes([
                        frame.fixed[0],
                        frame.fixed[1],
                        frame.fixed[2],
                        frame.fixed[3],
                    ]) & 0x7fff_ffff;
                    return Ok(Learned::ErrorStream(id));
                }
                if self.blocks_read >= MAX_BLOCKS {
                    return Err(format!("no error stream in the first {MAX_BLOCKS} streams"));
                }
                Ok(Learned::Nothing)
            }
        }
    }
}

/// The leaf's side: frame boundaries, and whether the leaf answered on the error stream.
#[derive(Debug, Clone)]
pub struct LeafSpdy {
    cursor: Cursor,
    /// The header of the frame whose payload is passing.
    frame: Option<Head>,
    /// First 4 payload bytes (the stream id) of the current SYN_REPLY, RST_STREAM or HEADERS.
    prefix: [u8; 4],
    prefix_have: u8,
    error_replied: bool,
    finished: bool,
    broken: Option<String>,
}

impl LeafSpdy {
    pub fn new() -> LeafSpdy {
        LeafSpdy {
            cursor: Cursor::default(),
            frame: None,
            prefix: [0; 4],
            prefix_have: 0,
            error_replied: false,
            finished: false,
            broken: None,
        }
    }

    /// Looks at the next bytes the leaf sent; `error_stream` is 0 while it is not known.
    pub fn observe(&mut self, mut chunk: &[u8], error_stream: u32) {
        if self.broken.is_some() {
            return;
        }
        while let Some(piece) = self.cursor.next(&mut chunk) {
            match piece {
                Piece::Head(head) => {
                    self.frame = Some(head);
                    self.prefix_have = 0;
                    match head {
                        Head::Control { version, .. } if version != VERSION => {
                            self.broken =
                                Some(format!("a control frame of SPDY version {version}"));
                            return;
                        }
                        Head::Data { stream, flags, len } => {
                            if error_stream != 0
                                && stream == error_stream
                                && (len > 0 || flags & FLAG_FIN != 0)
                            {
                                self.finished = true;
                            }
                        }
                        Head::Control { .. } => {}
                    }
                }
                Piece::Payload(bytes) => {
                    if let Some(Head::Control { kind, flags, .. }) = self.frame
                        && matches!(kind, SYN_REPLY | RST_STREAM | HEADERS)
                        && self.prefix_have < 4
                    {
                        let at = usize::from(self.prefix_have);
                        let take = (4 - at).min(bytes.len());
                        self.prefix[at..at + take].copy_from_slice(&bytes[..take]);
                        self.prefix_have += take as u8;
                        if self.prefix_have == 4 {
                            let stream = u32::from_be_bytes(self.prefix) & 0x7fff_ffff;
                            if error_stream != 0 && stream == error_stream {
                                match kind {
                                    SYN_REPLY => {
                                        self.error_replied = true;
                                        self.finished |= flags & FLAG_FIN != 0;
                                    }
                                    RST_STREAM => self.finished = true,
                                    _ => self.finished |= flags & FLAG_FIN != 0,
                                }
                            }
                        }
                    }
                }
                Piece::End => self.frame = None,
            }
        }
    }

    /// The leaf has answered on the error stream (a Status, or the stream's end): the session's
    /// outcome is the leaf's, and relaylet adds nothing.
    pub fn finished(&self) -> bool {
        self.finished
    }

    pub fn at_boundary(&self) -> bool {
        self.cursor.at_boundary()
    }

    pub fn rest_of_frame(&self, chunk: &[u8]) -> usize {
        self.cursor.rest_of_frame(chunk)
    }

    /// The bytes that end the session from here: the rest of a DATA frame the leaf left
    /// unfinished (filler), then `status` on the error stream with FIN.
    pub fn ending(&self, error_stream: u32, status: &[u8]) -> Result<Ending, CannotEnd> {
        if let Some(why) = &self.broken {
            return Err(CannotEnd(format!(
                "the leaf's frames are unreadable: {why}"
            )));
        }
        if error_stream == 0 {
            return Err(CannotEnd("the error stream is not known".into()));
        }
        if !self.error_replied {
            return Err(CannotEnd(
                "the leaf has not accepted the error stream yet".into(),
            ));
        }
        let pad = match self.cursor {
            Cursor::InHeader { have: 0, .. } | Cursor::EndPending => 0,
            Cursor::InHeader { .. } => {
                return Err(CannotEnd("cut inside a frame header".into()));
            }
            Cursor::InPayload {
                head: Head::Data { .. },
                left,
            } if (left as usize) <= MAX_PAD => left as usize,
            Cursor::InPayload {
                head: Head::Data { .. },
                left,
            } => {
                return Err(CannotEnd(format!(
                    "cut {left} bytes before the end of a DATA frame"
                )));
            }
            Cursor::InPayload {
                head: Head::Control { .. },
                ..
            } => return Err(CannotEnd("cut inside a control frame".into())),
        };
        Ok(Ending {
            pad,
            pad_byte: 0,
            tail: data_frame(error_stream, true, status),
        })
    }
}

/// A DATA frame. `payload` is a Status, far below the 16 MiB a frame can carry.
pub fn data_frame(stream: u32, fin: bool, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len())
        .unwrap_or(u32::MAX)
        .min(0xff_ffff);
    let mut frame = Vec::with_capacity(HEADER_LEN + len as usize);
    frame.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    frame.push(if fin { FLAG_FIN } else { 0 });
    frame.extend_from_slice(&len.to_be_bytes()[1..]);
    frame.extend_from_slice(&payload[..len as usize]);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rest_of_frame_counts_header_and_payload() {
        let frame = data_frame(5, false, b"hello");
        let mut leaf = LeafSpdy::new();
        assert_eq!(leaf.rest_of_frame(&frame), 0, "at a boundary");
        leaf.observe(&frame[..3], 0);
        assert!(!leaf.at_boundary());
        let mut rest = frame[3..].to_vec();
        rest.extend_from_slice(&data_frame(7, false, b"next"));
        assert_eq!(leaf.rest_of_frame(&rest), frame.len() - 3);
        leaf.observe(&rest[..frame.len() - 3], 0);
        assert!(leaf.at_boundary());
    }

    #[test]
    fn an_unfinished_data_frame_is_padded_and_a_control_frame_is_not() {
        let mut leaf = LeafSpdy::new();
        leaf.error_replied = true;
        let frame = data_frame(3, false, b"0123456789");
        leaf.observe(&frame[..HEADER_LEN + 4], 1);
        let ending = leaf
            .ending(1, b"status")
            .expect("a DATA frame can be finished");
        assert_eq!(ending.pad, 6);
        assert_eq!(ending.tail, data_frame(1, true, b"status"));

        let mut leaf = LeafSpdy::new();
        leaf.error_replied = true;
        // A PING, cut after its header.
        leaf.observe(&[0x80, 3, 0, 6, 0, 0, 0, 4, 0], 1);
        assert!(leaf.ending(1, b"status").is_err());
        let mut leaf = LeafSpdy::new();
        leaf.error_replied = true;
        leaf.observe(&[0x80, 3], 1);
        assert!(leaf.ending(1, b"status").is_err(), "inside a header");
    }
}

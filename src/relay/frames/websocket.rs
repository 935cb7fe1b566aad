//! WebSocket frame boundaries in the leaf's bytes, for exec and attach sessions over the
//! `channel.k8s.io` protocol family (v1, v4, v5 and their base64 variants).
//!
//! The leaf → caller direction is what matters: the error channel is always channel 3, and
//! what relaylet must know is where the next frame (and message) starts and whether the leaf
//! already answered on channel 3. Of the caller's frames relaylet needs one fact: whether the
//! caller sent a close frame, ending the session itself (then the leaf's side ending without a
//! Status is the caller's doing, and nothing is written to a caller that has gone). Frame headers are 2 to 14 bytes (FIN, opcode, mask bit,
//! a 7, 16 or 64-bit length, a masking key if masked; servers do not mask); a message may be
//! fragmented into a first frame and continuations with control frames (ping, pong, close)
//! between them; the first payload byte of a message is its channel (`'0' + channel` in the
//! base64 protocols). Payloads are skipped by count, never copied.
//!
//! With that, relaylet can end a session it must cut with a Status message on channel 3 and a
//! close frame, so the caller reads an error instead of a connection that merely ended.

use super::exit_status::{CannotEnd, Ending};

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const FIN: u8 = 0x80;
const ERROR_CHANNEL: u8 = 3;
/// The largest frame remainder relaylet completes with filler when the leaf never sent it.
const MAX_PAD: u64 = 1 << 20;
/// A normal close (1000), as the kubelet ends its sessions.
const CLOSE_NORMAL: [u8; 4] = [FIN | OP_CLOSE, 2, 0x03, 0xe8];

/// The header of the frame whose payload is passing.
#[derive(Debug, Clone, Copy)]
struct Frame {
    opcode: u8,
    fin: bool,
    mask: Option<[u8; 4]>,
    /// Payload bytes seen so far.
    seen: u64,
    left: u64,
}

/// The leaf's side of a WebSocket session.
#[derive(Debug, Clone)]
pub struct LeafWebSocket {
    base64: bool,
    head: [u8; 14],
    have: u8,
    frame: Option<Frame>,
    /// A data message is open: its first frame had no FIN.
    fragmented: bool,
    /// The open message is text (its filler must be base64 text).
    text: bool,
    /// The channel of the data message passing, once its first payload byte was seen.
    channel: Option<u8>,
    finished: bool,
    broken: Option<String>,
}

impl LeafWebSocket {
    /// `base64`: the `*base64.channel.k8s.io` protocols (text frames, ASCII channel digits).
    pub fn new(base64: bool) -> LeafWebSocket {
        LeafWebSocket {
            base64,
            head: [0; 14],
            have: 0,
            frame: None,
            fragmented: false,
            text: false,
            channel: None,
            finished: false,
            broken: None,
        }
    }

    /// The header length `head[..have]` announces, once its first two bytes are in.
    fn header_len(&self) -> Option<usize> {
        header_len(&self.head[..usize::from(self.have)])
    }

    /// Looks at the next bytes the leaf sent.
    pub fn observe(&mut self, mut chunk: &[u8]) {
        while self.broken.is_none() {
            if let Some(frame) = self.frame.as_mut() {
                if frame.left == 0 {
                    self.end_frame();
                    continue;
                }
                if chunk.is_empty() {
                    return;
                }
                let take = chunk
                    .len()
                    .min(usize::try_from(frame.left).unwrap_or(usize::MAX));
                let (payload, rest) = chunk.split_at(take);
                chunk = rest;
                self.payload(payload);
                continue;
            }
            if chunk.is_empty() {
                return;
            }
            let at = usize::from(self.have);
            let need = self.header_len().unwrap_or(2);
            let take = (need - at).min(chunk.len());
            self.head[at..at + take].copy_from_slice(&chunk[..take]);
            self.have += take as u8;
            chunk = &chunk[take..];
            match self.header_len() {
                Some(need) if usize::from(self.have) == need => self.start_frame(need),
                _ => {}
            }
        }
    }

    fn start_frame(&mut self, need: usize) {
        let b0 = self.head[0];
        let b1 = self.head[1];
        let opcode = b0 & 0x0f;
        let fin = b0 & FIN != 0;
        if b0 & 0x70 != 0 {
            self.broken = Some("a frame with reserved bits (an extension) set".into());
            return;
        }
        let masked = b1 & 0x80 != 0;
        let len = payload_len(&self.head[..need]);
        let mask = masked.then(|| {
            let at = need - 4;
            [
                self.head[at],
                self.head[at + 1],
                self.head[at + 2],
                self.head[at + 3],
            ]
        });
        match opcode {
            OP_TEXT | OP_BINARY => {
                if self.fragmented {
                    self.broken = Some("a new message inside a fragmented one".into());
                    return;
                }
                self.fragmented = !fin;
                self.text = opcode == OP_TEXT;
                self.channel = None;
            }
            OP_CONTINUATION => {
                if !self.fragmented {
                    self.broken = Some("a continuation frame outside a message".into());
                    return;
                }
                if fin {
                    self.fragmented = false;
                }
            }
            OP_CLOSE => self.finished = true,
            // Ping, pong: may come between the frames of a fragmented message.
            _ => {}
        }
        self.have = 0;
        self.frame = Some(Frame {
            opcode,
            fin,
            mask,
            seen: 0,
            left: len,
        });
    }

    fn payload(&mut self, bytes: &[u8]) {
        let Some(frame) = self.frame.as_mut() else {
            return;
        };
        let seen = frame.seen;
        frame.seen += bytes.len() as u64;
        frame.left -= bytes.len() as u64;
        if !matches!(frame.opcode, OP_TEXT | OP_BINARY | OP_CONTINUATION) || bytes.is_empty() {
            return;
        }
        let mask = frame.mask;
        let mut rest = bytes;
        if self.channel.is_none() {
            let mut first = bytes[0];
            if let Some(mask) = mask {
                first ^= mask[(seen % 4) as usize];
            }
            let channel = if self.base64 {
                first.wrapping_sub(b'0')
            } else {
                first
            };
            self.channel = Some(channel);
            rest = &bytes[1..];
        }
        // Anything after the channel byte on channel 3 is the leaf's Status. (A message with
        // only the channel byte is the kubelet's "connected" signal, not an answer.)
        if self.channel == Some(ERROR_CHANNEL) && !rest.is_empty() {
            self.finished = true;
        }
    }

    fn end_frame(&mut self) {
        if let Some(frame) = self.frame.take()
            && matches!(frame.opcode, OP_TEXT | OP_BINARY | OP_CONTINUATION)
            && frame.fin
        {
            self.channel = None;
        }
    }

    /// The leaf has answered: a Status on channel 3, or a close frame.
    pub fn finished(&self) -> bool {
        self.finished
    }

    pub fn at_boundary(&self) -> bool {
        self.have == 0 && self.frame.is_none_or(|f| f.left == 0)
    }

    /// How many bytes of `chunk` belong to the frame in progress (0 at a boundary).
    pub fn rest_of_frame(&self, chunk: &[u8]) -> usize {
        if let Some(frame) = self.frame {
            return chunk
                .len()
                .min(usize::try_from(frame.left).unwrap_or(usize::MAX));
        }
        if self.have == 0 {
            return 0;
        }
        // Inside a header: complete it from `chunk`, then add its payload.
        let mut head = self.head;
        let mut have = usize::from(self.have);
        for &byte in chunk {
            if header_len(&head[..have]).is_some_and(|need| have == need) {
                break;
            }
            head[have] = byte;
            have += 1;
        }
        let taken = have - usize::from(self.have);
        match header_len(&head[..have]) {
            Some(need) if have == need => {
                // A copy, so the frame is judged in its message (a continuation is valid only
                // inside one).
                let mut walk = self.clone();
                walk.head = head;
                walk.have = have as u8;
                walk.start_frame(need);
                let left = walk.frame.map_or(0, |f| f.left);
                taken + (chunk.len() - taken).min(usize::try_from(left).unwrap_or(usize::MAX))
            }
            _ => taken,
        }
    }

    /// The bytes that end the session from here: the rest of a frame the leaf left unfinished
    /// (filler), the end of a fragmented message, `status` on channel 3, a close frame.
    pub fn ending(&self, status: &[u8]) -> Result<Ending, CannotEnd> {
        if let Some(why) = &self.broken {
            return Err(CannotEnd(format!(
                "the leaf's frames are unreadable: {why}"
            )));
        }
        if self.have != 0 {
            return Err(CannotEnd("cut inside a frame header".into()));
        }
        let (pad, pad_byte) = match self.frame {
            None => (0, 0),
            Some(frame) if frame.left > MAX_PAD => {
                return Err(CannotEnd(format!(
                    "cut {} bytes before the end of a frame",
                    frame.left
                )));
            }
            Some(frame) if frame.opcode == OP_CONTINUATION && self.text && self.base64 => {
                (frame.left as usize, b'A')
            }
            Some(frame) if frame.opcode == OP_TEXT => (frame.left as usize, b'A'),
            Some(frame) => (frame.left as usize, 0),
        };
        let mut tail = Vec::with_capacity(status.len() * 4 / 3 + 32);
        // The open fragmented message ends with an empty final continuation. (Once the frame
        // in progress is complete: it may itself be the final one.)
        let closes_message = match self.frame {
            Some(frame) if matches!(frame.opcode, OP_TEXT | OP_BINARY | OP_CONTINUATION) => {
                !frame.fin
            }
            _ => self.fragmented,
        };
        if closes_message {
            tail.extend_from_slice(&[FIN | OP_CONTINUATION, 0]);
        }
        let mut message = Vec::with_capacity(status.len() * 4 / 3 + 8);
        if self.base64 {
            use base64::Engine;
            message.push(b'0' + ERROR_CHANNEL);
            message.extend_from_slice(
                base64::engine::general_purpose::STANDARD
                    .encode(status)
                    .as_bytes(),
            );
        } else {
            message.push(ERROR_CHANNEL);
            message.extend_from_slice(status);
        }
        push_frame(
            &mut tail,
            if self.base64 { OP_TEXT } else { OP_BINARY },
            &message,
        );
        tail.extend_from_slice(&CLOSE_NORMAL);
        Ok(Ending {
            pad,
            pad_byte,
            tail,
        })
    }
}

/// The caller's side of a WebSocket session: only whether it sent a close frame. Its frames
/// are masked (clients mask); payloads are skipped by count.
#[derive(Debug, Clone, Default)]
pub struct ClientWebSocket {
    head: [u8; 14],
    have: u8,
    /// Payload bytes of the frame passing that are still to come.
    left: u64,
    closed: bool,
}

impl ClientWebSocket {
    /// Looks at the next bytes the caller sent.
    pub fn observe(&mut self, mut chunk: &[u8]) {
        while !self.closed && !chunk.is_empty() {
            if self.left > 0 {
                let take = chunk
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                self.left -= take as u64;
                chunk = &chunk[take..];
                continue;
            }
            let at = usize::from(self.have);
            let need = header_len(&self.head[..at]).unwrap_or(2);
            let take = (need - at).min(chunk.len());
            self.head[at..at + take].copy_from_slice(&chunk[..take]);
            self.have += take as u8;
            chunk = &chunk[take..];
            let have = usize::from(self.have);
            if header_len(&self.head[..have]) == Some(have) {
                self.closed = self.head[0] & 0x0f == OP_CLOSE;
                self.left = payload_len(&self.head[..have]);
                self.have = 0;
            }
        }
    }

    /// The caller sent a close frame: it ended the session.
    pub fn closed(&self) -> bool {
        self.closed
    }
}

/// The payload length a complete frame header `head` announces.
fn payload_len(head: &[u8]) -> u64 {
    match head[1] & 0x7f {
        126 => u64::from(u16::from_be_bytes([head[2], head[3]])),
        127 => u64::from_be_bytes(head[2..10].try_into().unwrap_or([0xff; 8])),
        short => u64::from(short),
    }
}

/// The full header length `head` announces (needs its first two bytes).
fn header_len(head: &[u8]) -> Option<usize> {
    let b1 = *head.get(1)?;
    let extended = match b1 & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
    Some(2 + extended + mask)
}

/// Appends an unmasked, unfragmented frame (servers do not mask).
fn push_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    out.push(FIN | opcode);
    match payload.len() {
        len @ 0..=125 => out.push(len as u8),
        len @ 126..=0xffff => {
            out.push(126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        len => {
            out.push(127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame, as clients send them.
    fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x12, 0x34, 0x56, 0x78];
        let mut out = vec![FIN | opcode];
        match payload.len() {
            len @ 0..=125 => out.push(0x80 | len as u8),
            len @ 126..=0xffff => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            len => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    #[test]
    fn the_callers_close_frame_is_seen_in_any_cut_and_not_in_payloads() {
        // A stdin message whose payload holds a close frame's bytes, a ping, a long message,
        // then the close: only the close counts, however the bytes are cut.
        let mut bytes = client_frame(OP_BINARY, &[0, FIN | OP_CLOSE, 0x80, 1, 2, 3, 4]);
        bytes.extend(client_frame(0x9, b"ping"));
        bytes.extend(client_frame(OP_BINARY, &vec![0x88; 70_000]));
        // Known once the close frame's header is in: 2 bytes and the 4-byte mask.
        let close_known = bytes.len() + 6;
        bytes.extend(client_frame(OP_CLOSE, &[0x03, 0xe8]));
        for cut in [1, 2, 3, 7, 13, 4096, bytes.len()] {
            let mut client = ClientWebSocket::default();
            for (i, piece) in bytes.chunks(cut).enumerate() {
                let end = (i + 1) * cut;
                client.observe(piece);
                let end = end.min(bytes.len());
                assert_eq!(client.closed(), end >= close_known, "cut {cut}, at {end}");
            }
        }
    }

    fn frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        push_frame(&mut out, opcode, payload);
        if !fin {
            out[0] &= !FIN;
        }
        out
    }

    #[test]
    fn the_connected_signal_is_not_an_answer_but_a_status_is() {
        let mut leaf = LeafWebSocket::new(false);
        leaf.observe(&frame(OP_BINARY, true, &[3]));
        assert!(!leaf.finished(), "an empty message on channel 3");
        leaf.observe(&frame(OP_BINARY, true, b"\x01out"));
        assert!(!leaf.finished());
        leaf.observe(&frame(OP_BINARY, true, b"\x03{}"));
        assert!(leaf.finished());

        let mut leaf = LeafWebSocket::new(true);
        leaf.observe(&frame(OP_TEXT, true, b"3e30="));
        assert!(leaf.finished(), "base64: '3' is channel 3");

        let mut leaf = LeafWebSocket::new(false);
        leaf.observe(&CLOSE_NORMAL);
        assert!(
            leaf.finished(),
            "a close frame ends the session the leaf's way"
        );
    }

    #[test]
    fn a_fragmented_message_is_closed_before_the_status() {
        let mut leaf = LeafWebSocket::new(false);
        leaf.observe(&frame(OP_BINARY, false, b"\x01part"));
        leaf.observe(&frame(0x9, true, b"ping"));
        let ending = leaf.ending(b"{}").expect("at a frame boundary");
        assert_eq!(ending.pad, 0);
        assert_eq!(
            &ending.tail[..2],
            &[FIN, 0],
            "an empty final continuation first"
        );
    }

    #[test]
    fn an_unfinished_frame_is_padded_and_a_split_header_is_not() {
        let mut leaf = LeafWebSocket::new(true);
        let text = frame(OP_TEXT, true, b"1aGVsbG8=");
        leaf.observe(&text[..5]);
        let ending = leaf.ending(b"{}").expect("a data frame can be finished");
        assert_eq!((ending.pad, ending.pad_byte), (text.len() - 5, b'A'));

        let big = frame(OP_BINARY, true, &[1; 300]);
        let mut leaf = LeafWebSocket::new(false);
        leaf.observe(&big[..3]);
        assert!(leaf.ending(b"{}").is_err());
        assert_eq!(leaf.rest_of_frame(&big[3..]), big.len() - 3);
    }
}

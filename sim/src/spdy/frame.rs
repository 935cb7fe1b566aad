//! SPDY/3.1 frames: the typed frames Kubernetes peers exchange, and their wire encoding.
//!
//! Every frame starts with 8 bytes. A control frame is `1 | version:15 | type:16 | flags:8 |
//! length:24`; a data frame is `0 | stream-id:31 | flags:8 | length:24`. Header blocks inside
//! SYN_STREAM, SYN_REPLY and HEADERS are compressed with a connection-wide zlib stream, so the
//! [`FrameDecoder`] and [`FrameEncoder`] each own one direction's zlib state and must see every
//! frame of that direction, in order.
//!
//! Decoding checks a frame's declared length before buffering its body, so a peer can never make
//! us hold more than [`MAX_CONTROL_FRAME`] for control frames (or the 24-bit maximum for data).

pub use super::error::FrameError;
use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::headers::{HeaderCompressor, HeaderDecompressor, HeaderList};

/// The only SPDY version Kubernetes speaks.
pub const VERSION: u16 = 3;

/// Length of the common frame header.
pub const FRAME_HEADER_LEN: usize = 8;

/// Largest control frame body we accept. Kubernetes control frames are tens of bytes.
pub const MAX_CONTROL_FRAME: usize = 1024 * 1024;

/// Largest data frame body the 24-bit length field can express.
pub const MAX_DATA_FRAME: usize = (1 << 24) - 1;

/// FLAG_FIN: the sender will send nothing more on this stream.
pub const FLAG_FIN: u8 = 0x01;
/// FLAG_UNIDIRECTIONAL on SYN_STREAM: the recipient must not send on this stream.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// FLAG_SETTINGS_CLEAR_SETTINGS on SETTINGS.
pub const FLAG_SETTINGS_CLEAR: u8 = 0x01;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes (SPDY/3.1 section 2.6.3).
pub mod rst {
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INVALID_STREAM: u32 = 2;
    pub const REFUSED_STREAM: u32 = 3;
    pub const UNSUPPORTED_VERSION: u32 = 4;
    pub const CANCEL: u32 = 5;
    pub const INTERNAL_ERROR: u32 = 6;
    pub const FLOW_CONTROL_ERROR: u32 = 7;
    pub const STREAM_IN_USE: u32 = 8;
    pub const STREAM_ALREADY_CLOSED: u32 = 9;
}

/// GOAWAY status codes.
pub mod goaway {
    pub const OK: u32 = 0;
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INTERNAL_ERROR: u32 = 2;
}

/// One SETTINGS entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub flags: u8,
    pub id: u32,
    pub value: u32,
}

/// A decoded SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        /// 3-bit priority, 0 highest.
        priority: u8,
        slot: u8,
        flags: u8,
        headers: HeaderList,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: HeaderList,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        entries: Vec<Setting>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: HeaderList,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Bytes,
    },
    /// A control frame type SPDY/3.1 does not define; the spec says to ignore it.
    Unknown {
        frame_type: u16,
        flags: u8,
        body: Bytes,
    },
}

impl Frame {
    /// Whether the FIN flag is set (only meaningful for frames that carry it).
    pub fn is_fin(&self) -> bool {
        match self {
            Frame::SynStream { flags, .. }
            | Frame::SynReply { flags, .. }
            | Frame::Headers { flags, .. }
            | Frame::Data { flags, .. } => flags & FLAG_FIN != 0,
            _ => false,
        }
    }

    /// A short name for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::SynStream { .. } => "SYN_STREAM",
            Frame::SynReply { .. } => "SYN_REPLY",
            Frame::RstStream { .. } => "RST_STREAM",
            Frame::Settings { .. } => "SETTINGS",
            Frame::Ping { .. } => "PING",
            Frame::GoAway { .. } => "GOAWAY",
            Frame::Headers { .. } => "HEADERS",
            Frame::WindowUpdate { .. } => "WINDOW_UPDATE",
            Frame::Data { .. } => "DATA",
            Frame::Unknown { .. } => "unknown control",
        }
    }
}

/// The fixed 8-byte prefix of a frame, parsed without looking at the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramePrefix {
    Control {
        version: u16,
        frame_type: u16,
        flags: u8,
        length: usize,
    },
    Data {
        stream_id: u32,
        flags: u8,
        length: usize,
    },
}

impl FramePrefix {
    pub fn parse(bytes: [u8; 8]) -> FramePrefix {
        let word = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let flags = bytes[4];
        let length = u32::from_be_bytes([0, bytes[5], bytes[6], bytes[7]]) as usize;
        if word & 0x8000_0000 != 0 {
            FramePrefix::Control {
                version: ((word >> 16) & 0x7fff) as u16,
                frame_type: (word & 0xffff) as u16,
                flags,
                length,
            }
        } else {
            FramePrefix::Data {
                stream_id: word,
                flags,
                length,
            }
        }
    }

    pub fn body_len(&self) -> usize {
        match self {
            FramePrefix::Control { length, .. } | FramePrefix::Data { length, .. } => *length,
        }
    }
}

/// Decodes one direction of a connection.
#[derive(Default)]
pub struct FrameDecoder {
    headers: HeaderDecompressor,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one complete frame off the front of `buf`, or returns `Ok(None)` if more bytes are
    /// needed. The declared length is checked against the caps as soon as the 8-byte prefix is
    /// there, so callers never need to buffer more than a cap's worth.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(prefix) = buf.first_chunk::<8>() else {
            return Ok(None);
        };
        let prefix = FramePrefix::parse(*prefix);
        match prefix {
            FramePrefix::Control {
                version, length, ..
            } => {
                if version != VERSION {
                    return Err(FrameError::UnsupportedVersion(version));
                }
                if length > MAX_CONTROL_FRAME {
                    return Err(FrameError::TooLarge {
                        kind: "control",
                        len: length,
                        cap: MAX_CONTROL_FRAME,
                    });
                }
            }
            FramePrefix::Data { length, .. } if length > MAX_DATA_FRAME => {
                // Unreachable with a 24-bit field; kept so the cap is stated in one place.
                return Err(FrameError::DataTooLarge(length));
            }
            FramePrefix::Data { .. } => {}
        }
        if buf.len() < FRAME_HEADER_LEN + prefix.body_len() {
            buf.reserve(FRAME_HEADER_LEN + prefix.body_len() - buf.len());
            return Ok(None);
        }
        buf.advance(FRAME_HEADER_LEN);
        let body = buf.split_to(prefix.body_len()).freeze();
        self.decode_body(prefix, body).map(Some)
    }

    fn decode_body(&mut self, prefix: FramePrefix, mut body: Bytes) -> Result<Frame, FrameError> {
        let (frame_type, flags) = match prefix {
            FramePrefix::Data {
                stream_id, flags, ..
            } => {
                if stream_id == 0 {
                    return Err(FrameError::ZeroStreamId { kind: "DATA" });
                }
                return Ok(Frame::Data {
                    stream_id,
                    flags,
                    data: body,
                });
            }
            FramePrefix::Control {
                frame_type, flags, ..
            } => (frame_type, flags),
        };
        let need = |kind: &'static str, need: usize, body: &Bytes| {
            if body.len() < need {
                Err(FrameError::Truncated {
                    kind,
                    len: body.len(),
                    need,
                })
            } else {
                Ok(())
            }
        };
        let frame = match frame_type {
            TYPE_SYN_STREAM => {
                need("SYN_STREAM", 10, &body)?;
                let stream_id = body.get_u32() & 0x7fff_ffff;
                let associated_to = body.get_u32() & 0x7fff_ffff;
                let priority = body.get_u8() >> 5;
                let slot = body.get_u8();
                if stream_id == 0 {
                    return Err(FrameError::ZeroStreamId { kind: "SYN_STREAM" });
                }
                Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority,
                    slot,
                    flags,
                    headers: self.headers.decompress(&body)?,
                }
            }
            TYPE_SYN_REPLY => {
                need("SYN_REPLY", 4, &body)?;
                let stream_id = nonzero("SYN_REPLY", body.get_u32() & 0x7fff_ffff)?;
                Frame::SynReply {
                    stream_id,
                    flags,
                    headers: self.headers.decompress(&body)?,
                }
            }
            TYPE_HEADERS => {
                need("HEADERS", 4, &body)?;
                let stream_id = nonzero("HEADERS", body.get_u32() & 0x7fff_ffff)?;
                Frame::Headers {
                    stream_id,
                    flags,
                    headers: self.headers.decompress(&body)?,
                }
            }
            TYPE_RST_STREAM => {
                need("RST_STREAM", 8, &body)?;
                Frame::RstStream {
                    stream_id: nonzero("RST_STREAM", body.get_u32() & 0x7fff_ffff)?,
                    status: body.get_u32(),
                }
            }
            TYPE_SETTINGS => {
                need("SETTINGS", 4, &body)?;
                let declared = body.get_u32();
                if u64::from(declared) * 8 != body.len() as u64 {
                    return Err(FrameError::BadSettings {
                        declared,
                        len: body.len() + 4,
                    });
                }
                let mut entries = Vec::with_capacity(body.len() / 8);
                while body.has_remaining() {
                    let word = body.get_u32();
                    entries.push(Setting {
                        flags: (word >> 24) as u8,
                        id: word & 0x00ff_ffff,
                        value: body.get_u32(),
                    });
                }
                Frame::Settings { flags, entries }
            }
            TYPE_PING => {
                need("PING", 4, &body)?;
                Frame::Ping { id: body.get_u32() }
            }
            TYPE_GOAWAY => {
                // SPDY/3 added the status word; tolerate its absence like lenient peers do.
                need("GOAWAY", 4, &body)?;
                let last_good_stream_id = body.get_u32() & 0x7fff_ffff;
                let status = if body.remaining() >= 4 {
                    body.get_u32()
                } else {
                    goaway::OK
                };
                Frame::GoAway {
                    last_good_stream_id,
                    status,
                }
            }
            TYPE_WINDOW_UPDATE => {
                need("WINDOW_UPDATE", 8, &body)?;
                Frame::WindowUpdate {
                    stream_id: body.get_u32() & 0x7fff_ffff,
                    delta: body.get_u32() & 0x7fff_ffff,
                }
            }
            other => Frame::Unknown {
                frame_type: other,
                flags,
                body,
            },
        };
        Ok(frame)
    }
}

fn nonzero(kind: &'static str, stream_id: u32) -> Result<u32, FrameError> {
    if stream_id == 0 {
        Err(FrameError::ZeroStreamId { kind })
    } else {
        Ok(stream_id)
    }
}

/// Encodes one direction of a connection.
#[derive(Default)]
pub struct FrameEncoder {
    headers: HeaderCompressor,
}

impl FrameEncoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `frame`'s wire form to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), FrameError> {
        match frame {
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                if data.len() > MAX_DATA_FRAME {
                    return Err(FrameError::DataTooLarge(data.len()));
                }
                out.reserve(FRAME_HEADER_LEN + data.len());
                out.put_u32(stream_id & 0x7fff_ffff);
                put_flags_len(out, *flags, data.len());
                out.put_slice(data);
                Ok(())
            }
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                slot,
                flags,
                headers,
            } => {
                let block = self.headers.compress(headers)?;
                let mut body = BytesMut::with_capacity(10 + block.len());
                body.put_u32(stream_id & 0x7fff_ffff);
                body.put_u32(associated_to & 0x7fff_ffff);
                body.put_u8((priority & 0x07) << 5);
                body.put_u8(*slot);
                body.put_slice(&block);
                put_control(out, TYPE_SYN_STREAM, *flags, &body)
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            } => {
                let block = self.headers.compress(headers)?;
                let mut body = BytesMut::with_capacity(4 + block.len());
                body.put_u32(stream_id & 0x7fff_ffff);
                body.put_slice(&block);
                put_control(out, TYPE_SYN_REPLY, *flags, &body)
            }
            Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                let block = self.headers.compress(headers)?;
                let mut body = BytesMut::with_capacity(4 + block.len());
                body.put_u32(stream_id & 0x7fff_ffff);
                body.put_slice(&block);
                put_control(out, TYPE_HEADERS, *flags, &body)
            }
            Frame::RstStream { stream_id, status } => {
                let mut body = BytesMut::with_capacity(8);
                body.put_u32(stream_id & 0x7fff_ffff);
                body.put_u32(*status);
                put_control(out, TYPE_RST_STREAM, 0, &body)
            }
            Frame::Settings { flags, entries } => {
                let mut body = BytesMut::with_capacity(4 + 8 * entries.len());
                let count = u32::try_from(entries.len()).map_err(|_| FrameError::TooLarge {
                    kind: "SETTINGS",
                    len: entries.len(),
                    cap: MAX_CONTROL_FRAME,
                })?;
                body.put_u32(count);
                for entry in entries {
                    body.put_u32((u32::from(entry.flags) << 24) | (entry.id & 0x00ff_ffff));
                    body.put_u32(entry.value);
                }
                put_control(out, TYPE_SETTINGS, *flags, &body)
            }
            Frame::Ping { id } => put_control(out, TYPE_PING, 0, &id.to_be_bytes()),
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                let mut body = BytesMut::with_capacity(8);
                body.put_u32(last_good_stream_id & 0x7fff_ffff);
                body.put_u32(*status);
                put_control(out, TYPE_GOAWAY, 0, &body)
            }
            Frame::WindowUpdate { stream_id, delta } => {
                let mut body = BytesMut::with_capacity(8);
                body.put_u32(stream_id & 0x7fff_ffff);
                body.put_u32(delta & 0x7fff_ffff);
                put_control(out, TYPE_WINDOW_UPDATE, 0, &body)
            }
            Frame::Unknown {
                frame_type,
                flags,
                body,
            } => put_control(out, *frame_type, *flags, body),
        }
    }
}

fn put_flags_len(out: &mut BytesMut, flags: u8, len: usize) {
    // Callers have checked len against the 24-bit maximum.
    out.put_u8(flags);
    out.put_slice(&(len as u32).to_be_bytes()[1..]);
}

fn put_control(
    out: &mut BytesMut,
    frame_type: u16,
    flags: u8,
    body: &[u8],
) -> Result<(), FrameError> {
    if body.len() > MAX_CONTROL_FRAME {
        return Err(FrameError::TooLarge {
            kind: "control",
            len: body.len(),
            cap: MAX_CONTROL_FRAME,
        });
    }
    out.reserve(FRAME_HEADER_LEN + body.len());
    out.put_u16(0x8000 | VERSION);
    out.put_u16(frame_type);
    put_flags_len(out, flags, body.len());
    out.put_slice(body);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frames: &[Frame]) {
        let mut enc = FrameEncoder::new();
        let mut dec = FrameDecoder::new();
        let mut wire = BytesMut::new();
        for frame in frames {
            enc.encode(frame, &mut wire).expect("encode");
        }
        // Feed byte by byte to prove frames spanning reads are reassembled.
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for byte in wire {
            buf.put_u8(byte);
            while let Some(frame) = dec.decode(&mut buf).expect("decode") {
                got.push(frame);
            }
        }
        assert!(buf.is_empty());
        assert_eq!(got, frames);
    }

    #[test]
    fn every_frame_type_round_trips() {
        round_trip(&[
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                slot: 0,
                flags: 0,
                headers: vec![("streamtype".into(), "error".into())],
            },
            Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: vec![],
            },
            Frame::Data {
                stream_id: 1,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"hello"),
            },
            Frame::RstStream {
                stream_id: 3,
                status: rst::CANCEL,
            },
            Frame::Settings {
                flags: FLAG_SETTINGS_CLEAR,
                entries: vec![Setting {
                    flags: 1,
                    id: 7,
                    value: 65536,
                }],
            },
            Frame::Ping { id: 1 },
            Frame::GoAway {
                last_good_stream_id: 7,
                status: goaway::OK,
            },
            Frame::Headers {
                stream_id: 5,
                flags: FLAG_FIN,
                headers: vec![("a".into(), "b".into())],
            },
            Frame::WindowUpdate {
                stream_id: 5,
                delta: 1000,
            },
        ]);
    }

    #[test]
    fn oversized_control_frame_is_rejected_before_buffering() {
        let mut buf = BytesMut::from(&[0x80, 0x03, 0x00, 0x06, 0x00, 0x20, 0x00, 0x00][..]);
        let err = FrameDecoder::new().decode(&mut buf);
        assert!(matches!(err, Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn wrong_version_is_rejected() {
        let mut buf = BytesMut::from(&[0x80, 0x02, 0x00, 0x06, 0x00, 0, 0, 4, 0, 0, 0, 1][..]);
        assert_eq!(
            FrameDecoder::new().decode(&mut buf),
            Err(FrameError::UnsupportedVersion(2))
        );
    }
}

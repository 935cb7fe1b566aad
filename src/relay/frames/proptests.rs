//! Property tests of the frame trackers against independent encoders and decoders: the sim's
//! SPDY/3.1 codec (checked against real captures) and tungstenite's WebSocket client.
//!
//! Random sessions are cut into random reads (splitting frame headers, payloads and compressed
//! header blocks anywhere) and fed to the trackers. They must find the error stream no later
//! than the frame that opens it, know exactly where frames start, know whether the leaf has
//! answered, and produce endings that a real decoder reads as the original frames, then the
//! Status on the error stream or channel, then a close.

use std::io::{Cursor, Read, Write};

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use relaylet_sim::channel::{self, ChannelMessage};
use relaylet_sim::spdy::frame::{FLAG_FIN, Frame, FrameDecoder, FrameEncoder};
use tokio_tungstenite::tungstenite::{self, Message, protocol::Role};

use super::spdy::{ClientSpdy, LeafSpdy, Learned};
use super::websocket::LeafWebSocket;

const STATUS: &[u8] = br#"{"metadata":{},"status":"Failure","message":"relaylet: test","reason":"InternalError","code":500}"#;

/// Read sizes: tiny reads split every header; large ones carry several frames.
pub(crate) fn reads() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![1usize..12, 1usize..300, 1usize..20_000], 1..24)
}

/// Calls `feed` with consecutive pieces of `bytes`, sized by cycling through `sizes`.
fn in_reads(bytes: &[u8], sizes: &[usize], mut feed: impl FnMut(usize, &[u8])) {
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let n = sizes[i % sizes.len()].min(bytes.len() - at);
        feed(at, &bytes[at..at + n]);
        at += n;
        i += 1;
    }
}

fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// Encodes `frames` with one encoder (one zlib stream per direction, as on the wire); the
/// bytes and each frame's `(start, end)`.
pub(crate) fn encode(frames: &[Frame]) -> (Vec<u8>, Vec<(usize, usize)>) {
    let mut encoder = FrameEncoder::new();
    let mut out = BytesMut::new();
    let mut spans = Vec::new();
    for frame in frames {
        let start = out.len();
        encoder.encode(frame, &mut out).expect("encodable frame");
        spans.push((start, out.len()));
    }
    (out.to_vec(), spans)
}

/// Decodes every frame of `bytes`; all of it must be frames.
fn decode(bytes: &[u8]) -> Vec<Frame> {
    let mut decoder = FrameDecoder::new();
    let mut buf = BytesMut::from(bytes);
    let mut frames = Vec::new();
    while let Some(frame) = decoder.decode(&mut buf).expect("well-formed SPDY") {
        frames.push(frame);
    }
    assert!(
        buf.is_empty(),
        "{} bytes of an incomplete frame left",
        buf.len()
    );
    frames
}

// ---------------------------------------------------------------------------------------------
// SPDY, caller's side.

/// Something the caller sends between opening streams.
#[derive(Debug, Clone)]
enum Between {
    Stdin(usize),
    Ping,
    WindowUpdate,
    /// A HEADERS frame: a header block in the same zlib stream.
    Headers(String),
}

fn between() -> impl Strategy<Value = Between> {
    prop_oneof![
        (0usize..3000).prop_map(Between::Stdin),
        Just(Between::Ping),
        Just(Between::WindowUpdate),
        "[a-z0-9]{0,40}".prop_map(Between::Headers),
    ]
}

#[derive(Debug, Clone)]
struct CallerCase {
    /// Stream types in opening order; `error` may be anywhere, or missing.
    types: Vec<&'static str>,
    /// Values of an extra header per stream, so blocks differ in size and compression.
    noise: Vec<String>,
    between: Vec<Vec<Between>>,
}

fn caller_case() -> impl Strategy<Value = CallerCase> {
    let others = prop::sample::select(vec!["stdin", "stdout", "stderr", "resize", "data"]);
    (
        prop::collection::vec(others, 0..5),
        prop::option::weighted(0.9, any::<prop::sample::Index>()),
    )
        .prop_flat_map(|(mut types, error_at)| {
            if let Some(at) = error_at {
                types.insert(at.index(types.len() + 1), "error");
            }
            let n = types.len().max(1);
            (
                Just(types),
                prop::collection::vec("[ -~]{0,60}", n),
                prop::collection::vec(prop::collection::vec(between(), 0..3), n),
            )
        })
        .prop_map(|(types, noise, between)| CallerCase {
            types,
            noise,
            between,
        })
}

impl CallerCase {
    /// The frames, the error stream's id and the index of its SYN_STREAM.
    fn frames(&self) -> (Vec<Frame>, Option<(u32, usize)>) {
        let mut frames = Vec::new();
        let mut error = None;
        for (i, ty) in self.types.iter().enumerate() {
            let id = 2 * i as u32 + 1;
            if *ty == "error" {
                error = Some((id, frames.len()));
            }
            frames.push(Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                slot: 0,
                flags: 0,
                headers: headers(&[("streamType", ty), ("x-noise", &self.noise[i])]),
            });
            for extra in &self.between[i] {
                frames.push(match extra {
                    Between::Stdin(n) => Frame::Data {
                        stream_id: id,
                        flags: 0,
                        data: Bytes::from(vec![b'x'; *n]),
                    },
                    Between::Ping => Frame::Ping { id: id * 2 + 1 },
                    Between::WindowUpdate => Frame::WindowUpdate {
                        stream_id: id,
                        delta: 4096,
                    },
                    Between::Headers(value) => Frame::Headers {
                        stream_id: id,
                        flags: 0,
                        headers: headers(&[("x-later", value)]),
                    },
                });
            }
        }
        (frames, error)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The caller's side learns the error stream in the read that completes its SYN_STREAM,
    /// never earlier and never wrongly, whatever the reads and the streams around it.
    #[test]
    fn the_callers_side_finds_the_error_stream(case in caller_case(), sizes in reads()) {
        let (frames, error) = case.frames();
        let (bytes, spans) = encode(&frames);
        let mut client = ClientSpdy::new();
        let mut learned = Vec::new();
        in_reads(&bytes, &sizes, |at, chunk| {
            match client.observe(chunk) {
                Learned::Nothing => {}
                Learned::ErrorStream(id) => learned.push((id, at, at + chunk.len())),
                Learned::GaveUp(why) => panic!("gave up: {why}"),
            }
        });
        match error {
            None => prop_assert!(learned.is_empty(), "{learned:?}"),
            Some((id, index)) => {
                let end = spans[index].1;
                prop_assert_eq!(learned.len(), 1, "{:?}", learned);
                let (found, from, to) = learned[0];
                prop_assert_eq!(found, id);
                prop_assert!(from < end && end <= to, "learned in bytes {from}..{to}, frame ends at {end}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// SPDY, leaf's side.

/// What the leaf sends after accepting the streams.
#[derive(Debug, Clone)]
enum LeafSends {
    /// Output on stdout (false) or stderr (true).
    Output(bool, usize),
    Ping,
    WindowUpdate,
    Headers,
}

/// How the leaf ends (or does not).
#[derive(Debug, Clone, Copy)]
enum LeafEnd {
    /// Nothing: the connection is lost.
    Lost,
    /// A Status on the error stream, then RST_STREAMs and GOAWAY (the kubelet's v4 ending).
    Status,
    /// RST_STREAM on the error stream (a v1-v3 success).
    ResetOnly,
    /// An empty DATA frame with FIN on the error stream.
    Fin,
}

#[derive(Debug, Clone)]
struct LeafCase {
    /// Index of the error stream among the three streams 1, 3, 5.
    error: usize,
    sends: Vec<LeafSends>,
    end: LeafEnd,
}

fn leaf_case() -> impl Strategy<Value = LeafCase> {
    let send = prop_oneof![
        4 => (any::<bool>(), prop_oneof![0usize..64, 0usize..40_000])
            .prop_map(|(err, n)| LeafSends::Output(err, n)),
        1 => Just(LeafSends::Ping),
        1 => Just(LeafSends::WindowUpdate),
        1 => Just(LeafSends::Headers),
    ];
    let end = prop_oneof![
        Just(LeafEnd::Lost),
        Just(LeafEnd::Status),
        Just(LeafEnd::ResetOnly),
        Just(LeafEnd::Fin),
    ];
    (0usize..3, prop::collection::vec(send, 0..12), end).prop_map(|(error, sends, end)| LeafCase {
        error,
        sends,
        end,
    })
}

/// One frame of a leaf case and what it means to the tracker.
struct Sent {
    frame: Frame,
    /// How many of its bytes must have passed for the leaf to count as finished.
    finishes_after: Option<usize>,
    /// How many of its bytes must have passed for the error stream to count as accepted.
    accepts_error_after: Option<usize>,
}

impl LeafCase {
    fn sent(&self) -> (u32, Vec<Sent>) {
        let ids = [1u32, 3, 5];
        let error = ids[self.error];
        let outputs: Vec<u32> = ids.into_iter().filter(|&id| id != error).collect();
        let mut sent = Vec::new();
        for id in ids {
            sent.push(Sent {
                frame: Frame::SynReply {
                    stream_id: id,
                    flags: 0,
                    headers: Vec::new(),
                },
                finishes_after: None,
                accepts_error_after: (id == error).then_some(12),
            });
        }
        for (i, send) in self.sends.iter().enumerate() {
            let frame = match send {
                LeafSends::Output(stderr, n) => Frame::Data {
                    stream_id: outputs[usize::from(*stderr)],
                    flags: 0,
                    data: Bytes::from((0..*n).map(|b| (b * 7 + i) as u8).collect::<Vec<_>>()),
                },
                LeafSends::Ping => Frame::Ping {
                    id: 2 * i as u32 + 2,
                },
                LeafSends::WindowUpdate => Frame::WindowUpdate {
                    stream_id: outputs[0],
                    delta: 1000,
                },
                LeafSends::Headers => Frame::Headers {
                    stream_id: outputs[1],
                    flags: 0,
                    headers: headers(&[("x-trailer", "1")]),
                },
            };
            sent.push(Sent {
                frame,
                finishes_after: None,
                accepts_error_after: None,
            });
        }
        let plain = |frame| Sent {
            frame,
            finishes_after: None,
            accepts_error_after: None,
        };
        match self.end {
            LeafEnd::Lost => {}
            LeafEnd::Status => {
                sent.push(Sent {
                    frame: Frame::Data {
                        stream_id: error,
                        flags: 0,
                        data: Bytes::from_static(br#"{"metadata":{},"status":"Success"}"#),
                    },
                    finishes_after: Some(8),
                    accepts_error_after: None,
                });
                for id in ids {
                    sent.push(Sent {
                        frame: Frame::RstStream {
                            stream_id: id,
                            status: 5,
                        },
                        finishes_after: (id == error).then_some(12),
                        accepts_error_after: None,
                    });
                }
                sent.push(plain(Frame::GoAway {
                    last_good_stream_id: 0,
                    status: 0,
                }));
            }
            LeafEnd::ResetOnly => sent.push(Sent {
                frame: Frame::RstStream {
                    stream_id: error,
                    status: 5,
                },
                finishes_after: Some(12),
                accepts_error_after: None,
            }),
            LeafEnd::Fin => sent.push(Sent {
                frame: Frame::Data {
                    stream_id: error,
                    flags: FLAG_FIN,
                    data: Bytes::new(),
                },
                finishes_after: Some(8),
                accepts_error_after: None,
            }),
        }
        (error, sent)
    }
}

/// A whole leaf → caller SPDY session and its error stream's id, for tests of the splice.
pub(crate) fn leaf_spdy_session() -> impl Strategy<Value = (Vec<u8>, u32)> {
    leaf_case().prop_map(|case| {
        let (error, sent) = case.sent();
        let frames: Vec<Frame> = sent.into_iter().map(|s| s.frame).collect();
        (encode(&frames).0, error)
    })
}

/// The caller's SYN_STREAM that opens `error` as the error stream.
pub(crate) fn error_syn_stream(error: u32) -> Vec<u8> {
    encode(&[Frame::SynStream {
        stream_id: error,
        associated_to: 0,
        priority: 0,
        slot: 0,
        flags: 0,
        headers: headers(&[("streamtype", "error")]),
    }])
    .0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Cut anywhere and read in any pieces, the leaf's side knows the boundaries and the
    /// leaf's answer, and its ending decodes as the frames so far, the unfinished DATA frame
    /// completed, and the Status on the error stream with FIN.
    #[test]
    fn the_leafs_side_ends_spdy_sessions_at_frame_boundaries(
        case in leaf_case(),
        sizes in reads(),
        cut in any::<prop::sample::Index>(),
    ) {
        let (error, sent) = case.sent();
        let frames: Vec<Frame> = sent.iter().map(|s| s.frame.clone()).collect();
        let (bytes, spans) = encode(&frames);
        let cut = cut.index(bytes.len() + 1);
        let mut leaf = LeafSpdy::new();
        in_reads(&bytes[..cut], &sizes, |_, chunk| leaf.observe(chunk, error));

        let reached = |after: Option<usize>, (start, _): (usize, usize)| {
            after.is_some_and(|n| start + n <= cut)
        };
        let finished = sent.iter().zip(&spans).any(|(s, &span)| reached(s.finishes_after, span));
        let accepted = sent.iter().zip(&spans).any(|(s, &span)| reached(s.accepts_error_after, span));
        prop_assert_eq!(leaf.finished(), finished);
        let inside = spans.iter().position(|&(start, end)| start < cut && cut < end);
        prop_assert_eq!(leaf.at_boundary(), inside.is_none());
        let next_boundary = inside.map_or(cut, |i| spans[i].1);
        prop_assert_eq!(leaf.rest_of_frame(&bytes[cut..]), next_boundary - cut);
        if finished {
            return Ok(());
        }

        let ending = leaf.ending(error, STATUS);
        let expected_pad = match inside {
            None => Some(0),
            Some(i) => match frames[i] {
                Frame::Data { .. } if cut >= spans[i].0 + 8 => Some(spans[i].1 - cut),
                _ => None,
            },
        };
        match (accepted, expected_pad) {
            (true, Some(pad)) => {
                let ending = ending.map_err(|e| TestCaseError::fail(e.0))?;
                prop_assert_eq!(ending.pad, pad);
                let mut wire = bytes[..cut].to_vec();
                wire.extend(std::iter::repeat_n(ending.pad_byte, ending.pad));
                wire.extend_from_slice(&ending.tail);
                let decoded = decode(&wire);
                let whole = spans.iter().filter(|&&(_, end)| end <= cut).count();
                prop_assert_eq!(&decoded[..whole], &frames[..whole]);
                if let Some(i) = inside {
                    let Frame::Data { data, .. } = &frames[i] else { unreachable!() };
                    let Frame::Data { data: padded, .. } = &decoded[whole] else {
                        return Err(TestCaseError::fail("the completed frame is not DATA"));
                    };
                    let kept = cut - spans[i].0 - 8;
                    prop_assert_eq!(&padded[..kept], &data[..kept]);
                    prop_assert!(padded[kept..].iter().all(|&b| b == ending.pad_byte));
                }
                prop_assert_eq!(
                    decoded.last(),
                    Some(&Frame::Data { stream_id: error, flags: FLAG_FIN, data: Bytes::from_static(STATUS) })
                );
                prop_assert_eq!(decoded.len(), whole + usize::from(inside.is_some()) + 1);
            }
            _ => prop_assert!(ending.is_err(), "{ending:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// WebSocket, leaf's side.

#[derive(Debug, Clone)]
struct WsMessage {
    channel: u8,
    data: Vec<u8>,
    /// Split points of the wire payload into frames.
    splits: Vec<prop::sample::Index>,
    /// A ping between its fragments.
    ping: bool,
}

#[derive(Debug, Clone)]
struct WsCase {
    base64: bool,
    /// The kubelet's "connected" signal: an empty message on channel 3 first.
    connected: bool,
    messages: Vec<WsMessage>,
    /// 0: the connection is lost; 1: a Status on channel 3, then close; 2: close only.
    end: u8,
}

fn ws_case() -> impl Strategy<Value = WsCase> {
    let message = (
        1u8..3,
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            prop::collection::vec(any::<u8>(), 0..3000)
        ],
        prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(channel, data, splits, ping)| WsMessage {
            channel,
            data,
            splits,
            ping,
        });
    (
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(message, 0..6),
        0u8..3,
    )
        .prop_map(|(base64, connected, messages, end)| WsCase {
            base64,
            connected,
            messages,
            end,
        })
}

/// One frame of a WebSocket case.
struct WsFrame {
    start: usize,
    header: usize,
    end: usize,
    /// Index of its data message, or None for control frames.
    message: Option<usize>,
}

fn ws_header(out: &mut Vec<u8>, first: u8, len: usize) {
    out.push(first);
    match len {
        0..=125 => out.push(len as u8),
        126..=0xffff => {
            out.push(126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
}

impl WsCase {
    /// The wire payload of a message on `channel`.
    fn payload(&self, channel: u8, data: &[u8]) -> Vec<u8> {
        if self.base64 {
            use base64::Engine;
            let mut out = vec![b'0' + channel];
            out.extend_from_slice(
                base64::engine::general_purpose::STANDARD
                    .encode(data)
                    .as_bytes(),
            );
            out
        } else {
            let mut out = vec![channel];
            out.extend_from_slice(data);
            out
        }
    }

    /// The bytes, the frames, the messages' wire payloads, and the offset after which the
    /// leaf has answered (if it does).
    fn wire(&self) -> (Vec<u8>, Vec<WsFrame>, Vec<Vec<u8>>, Option<usize>) {
        let mut out = Vec::new();
        let mut frames = Vec::new();
        let mut payloads = Vec::new();
        let mut answered = None;
        let data_op = if self.base64 { 0x1 } else { 0x2 };
        let mut messages: Vec<(u8, Vec<u8>, Vec<prop::sample::Index>, bool)> = Vec::new();
        if self.connected {
            messages.push((3, Vec::new(), Vec::new(), false));
        }
        for m in &self.messages {
            messages.push((m.channel, m.data.clone(), m.splits.clone(), m.ping));
        }
        if self.end == 1 {
            messages.push((3, STATUS.to_vec(), Vec::new(), false));
        }
        for (index, (channel, data, splits, ping)) in messages.iter().enumerate() {
            let payload = self.payload(*channel, data);
            let mut cuts: Vec<usize> = splits.iter().map(|s| s.index(payload.len() + 1)).collect();
            cuts.push(0);
            cuts.push(payload.len());
            cuts.sort_unstable();
            cuts.dedup();
            let pieces: Vec<(usize, usize)> = if cuts.len() < 2 {
                vec![(0, 0)]
            } else {
                cuts.windows(2).map(|w| (w[0], w[1])).collect()
            };
            for (i, &(from, to)) in pieces.iter().enumerate() {
                let last = i + 1 == pieces.len();
                let opcode = if i == 0 { data_op } else { 0x0 };
                let start = out.len();
                ws_header(
                    &mut out,
                    if last { 0x80 | opcode } else { opcode },
                    to - from,
                );
                let header = out.len() - start;
                // The leaf has answered once a byte after the channel of a channel-3 message
                // passed.
                if *channel == 3 && answered.is_none() && payload.len() > 1 && from <= 1 && 1 < to {
                    answered = Some(start + header + (1 - from) + 1);
                }
                out.extend_from_slice(&payload[from..to]);
                frames.push(WsFrame {
                    start,
                    header,
                    end: out.len(),
                    message: Some(index),
                });
                if *ping && !last {
                    let start = out.len();
                    ws_header(&mut out, 0x89, 1);
                    out.push(b'p');
                    frames.push(WsFrame {
                        start,
                        header: 2,
                        end: out.len(),
                        message: None,
                    });
                }
            }
            payloads.push(payload);
        }
        if self.end >= 1 {
            let start = out.len();
            out.extend_from_slice(&[0x88, 2, 0x03, 0xe8]);
            frames.push(WsFrame {
                start,
                header: 2,
                end: out.len(),
                message: None,
            });
            answered = answered.or(Some(start + 2));
        }
        (out, frames, payloads, answered)
    }
}

/// A byte stream tungstenite reads from (its pongs and close replies go elsewhere).
struct Wire {
    input: Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every message a WebSocket client reads from `bytes` until the close frame: payloads of
/// data messages (pings left out), and whether the close came.
fn client_reads(bytes: Vec<u8>) -> Result<(Vec<Message>, bool), tungstenite::Error> {
    let wire = Wire {
        input: Cursor::new(bytes),
        output: Vec::new(),
    };
    let mut socket = tungstenite::WebSocket::from_raw_socket(wire, Role::Client, None);
    let mut messages = Vec::new();
    loop {
        match socket.read() {
            Ok(Message::Close(_)) => return Ok((messages, true)),
            Ok(Message::Ping(_) | Message::Pong(_)) => {}
            Ok(message) => messages.push(message),
            Err(tungstenite::Error::ConnectionClosed) => return Ok((messages, false)),
            Err(err) => return Err(err),
        }
    }
}

fn message_bytes(message: &Message) -> Vec<u8> {
    match message {
        Message::Binary(b) => b.to_vec(),
        Message::Text(t) => t.as_bytes().to_vec(),
        _ => Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Cut anywhere and read in any pieces, the leaf's side knows the frame boundaries and the
    /// leaf's answer, and tungstenite reads its ending as the messages so far (an unfinished
    /// one completed), the Status on channel 3, and a normal close.
    #[test]
    fn the_leafs_side_ends_websocket_sessions_at_frame_boundaries(
        case in ws_case(),
        sizes in reads(),
        cut in any::<prop::sample::Index>(),
    ) {
        let (bytes, frames, payloads, answered) = case.wire();
        let cut = cut.index(bytes.len() + 1);
        let mut leaf = LeafWebSocket::new(case.base64);
        in_reads(&bytes[..cut], &sizes, |_, chunk| leaf.observe(chunk));

        let finished = answered.is_some_and(|at| at <= cut);
        prop_assert_eq!(leaf.finished(), finished);
        let inside = frames.iter().position(|f| f.start < cut && cut < f.end);
        prop_assert_eq!(leaf.at_boundary(), inside.is_none());
        let next_boundary = inside.map_or(cut, |i| frames[i].end);
        prop_assert_eq!(leaf.rest_of_frame(&bytes[cut..]), next_boundary - cut);
        if finished {
            return Ok(());
        }
        let ending = leaf.ending(STATUS);
        if let Some(i) = inside && cut < frames[i].start + frames[i].header {
            prop_assert!(ending.is_err(), "cut inside a header: {ending:?}");
            return Ok(());
        }
        let ending = ending.map_err(|e| TestCaseError::fail(e.0))?;
        prop_assert_eq!(ending.pad, next_boundary - cut);
        let mut wire = bytes[..cut].to_vec();
        wire.extend(std::iter::repeat_n(ending.pad_byte, ending.pad));
        wire.extend_from_slice(&ending.tail);
        let (read, closed) = client_reads(wire).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(closed, "a close frame ends it");

        // Messages whose frames all passed arrive as sent; one cut short arrives with what
        // passed of it, completed with filler; then relaylet's Status.
        let complete = |m: usize| frames.iter().filter(|f| f.message == Some(m)).all(|f| f.end <= cut);
        let started = |m: usize| frames.iter().any(|f| f.message == Some(m) && f.start < cut);
        let mut expected: Vec<Vec<u8>> = Vec::new();
        for (m, payload) in payloads.iter().enumerate() {
            if complete(m) {
                expected.push(payload.clone());
            } else if started(m) {
                let passed: usize = frames
                    .iter()
                    .filter(|f| f.message == Some(m) && f.start < cut)
                    .map(|f| cut.min(f.end).saturating_sub(f.start + f.header))
                    .sum();
                let mut partial = payload[..passed].to_vec();
                if let Some(i) = inside && frames[i].message == Some(m) {
                    partial.extend(std::iter::repeat_n(ending.pad_byte, ending.pad));
                }
                expected.push(partial);
            }
        }
        let protocol = if case.base64 { channel::Protocol::V4Base64 } else { channel::Protocol::V4 };
        let status = read.last().map(|m| channel::decode(protocol, m));
        prop_assert_eq!(
            status.and_then(Result::ok).flatten(),
            Some(ChannelMessage::Data { channel: 3, data: Bytes::from_static(STATUS) })
        );
        let got: Vec<Vec<u8>> = read[..read.len() - 1].iter().map(message_bytes).collect();
        prop_assert_eq!(got, expected);
    }
}

// ---------------------------------------------------------------------------------------------
// Anything at all.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever bytes a peer sends, in whatever reads, no tracker panics, and asking for the
    /// rest of a frame or an ending gives an answer.
    #[test]
    fn garbage_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..4096),
        sizes in reads(),
        base64 in any::<bool>(),
        error in 0u32..8,
    ) {
        let mut client = ClientSpdy::new();
        let mut leaf = LeafSpdy::new();
        let mut ws = LeafWebSocket::new(base64);
        in_reads(&bytes, &sizes, |at, chunk| {
            let _ = client.observe(chunk);
            leaf.observe(chunk, error);
            ws.observe(chunk);
            let rest = &bytes[at + chunk.len()..];
            assert!(leaf.rest_of_frame(rest) <= rest.len());
            assert!(ws.rest_of_frame(rest) <= rest.len());
        });
        let _ = leaf.ending(error, STATUS);
        let _ = ws.ending(STATUS);
    }
}

//! Property tests of the SPDY frame and header-block codecs: valid frames round-trip however the
//! bytes are split, and arbitrary input never panics or makes the decoder hold more than its caps.

use bytes::{Bytes, BytesMut};
use flate2::{Compress, Compression, FlushCompress};
use proptest::prelude::*;
use relaylet_sim::spdy::frame::{
    FRAME_HEADER_LEN, Frame, FrameDecoder, FrameEncoder, FrameError, MAX_CONTROL_FRAME, Setting,
};
use relaylet_sim::spdy::headers::{
    DICTIONARY, HeaderDecompressor, MAX_HEADER_BLOCK, MAX_HEADERS, decode_block,
};

/// Counts the bytes each thread allocates, so a test can measure what one call allocates
/// (other tests of the binary run on other threads).
struct Counting;

thread_local! {
    static ALLOCATED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

// SAFETY: every call is passed straight to the system allocator; the counter is a
// thread-local `Cell` with a const initialiser and no destructor, which does not allocate.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from the system allocator.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + new_size));
        // SAFETY: `ptr` came from the system allocator with `layout`.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// What `f` returns and the bytes it allocated on this thread.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.with(|a| a.get());
    let out = f();
    (out, ALLOCATED.with(|a| a.get()) - before)
}

#[test]
fn the_allocation_counter_counts() {
    let (v, allocated) = allocated_by(|| Vec::<u8>::with_capacity(100_000));
    assert!(allocated >= 100_000, "{allocated}");
    drop(v);
}

fn stream_id() -> impl Strategy<Value = u32> {
    1u32..=0x7fff_ffff
}

fn header_list() -> impl Strategy<Value = Vec<(String, String)>> {
    // Unique names, each with one or more values: the wire joins a name's values with NUL.
    prop::collection::btree_map(
        "[a-z][a-z0-9-]{0,15}",
        prop::collection::vec("[ -~]{0,24}", 1..3),
        0..6,
    )
    .prop_map(|map| {
        map.into_iter()
            .flat_map(|(name, values)| values.into_iter().map(move |v| (name.clone(), v)))
            .collect()
    })
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (
            stream_id(),
            0u32..=0x7fff_ffff,
            0u8..8,
            any::<u8>(),
            any::<u8>(),
            header_list()
        )
            .prop_map(
                |(stream_id, associated_to, priority, slot, flags, headers)| {
                    Frame::SynStream {
                        stream_id,
                        associated_to,
                        priority,
                        slot,
                        flags,
                        headers,
                    }
                }
            ),
        (stream_id(), any::<u8>(), header_list()).prop_map(|(stream_id, flags, headers)| {
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            }
        }),
        (stream_id(), any::<u8>(), header_list()).prop_map(|(stream_id, flags, headers)| {
            Frame::Headers {
                stream_id,
                flags,
                headers,
            }
        }),
        (stream_id(), any::<u32>())
            .prop_map(|(stream_id, status)| Frame::RstStream { stream_id, status }),
        (
            any::<u8>(),
            prop::collection::vec((any::<u8>(), 0u32..0x0100_0000, any::<u32>()), 0..5)
        )
            .prop_map(|(flags, entries)| Frame::Settings {
                flags,
                entries: entries
                    .into_iter()
                    .map(|(flags, id, value)| Setting { flags, id, value })
                    .collect(),
            }),
        any::<u32>().prop_map(|id| Frame::Ping { id }),
        (0u32..=0x7fff_ffff, any::<u32>()).prop_map(|(last_good_stream_id, status)| {
            Frame::GoAway {
                last_good_stream_id,
                status,
            }
        }),
        (0u32..=0x7fff_ffff, 0u32..=0x7fff_ffff)
            .prop_map(|(stream_id, delta)| Frame::WindowUpdate { stream_id, delta }),
        (
            stream_id(),
            any::<u8>(),
            prop::collection::vec(any::<u8>(), 0..2048)
        )
            .prop_map(|(stream_id, flags, data)| Frame::Data {
                stream_id,
                flags,
                data: Bytes::from(data),
            }),
        (
            10u16..=0xffff,
            any::<u8>(),
            prop::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(frame_type, flags, body)| Frame::Unknown {
                frame_type,
                flags,
                body: Bytes::from(body),
            }),
    ]
}

/// Feeds `bytes` to a decoder in pieces of `step`, checking the buffer never exceeds one capped
/// frame plus one piece. Returns the frames and the first error.
fn feed(bytes: &[u8], step: usize) -> (Vec<Frame>, Option<FrameError>) {
    let mut decoder = FrameDecoder::new();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for piece in bytes.chunks(step.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(err) => return (frames, Some(err)),
            }
        }
    }
    (frames, None)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn valid_frames_round_trip_across_any_split(
        frames in prop::collection::vec(frame(), 1..12),
        step in 1usize..300,
    ) {
        let mut encoder = FrameEncoder::new();
        let mut wire = BytesMut::new();
        for f in &frames {
            encoder.encode(f, &mut wire).expect("valid frames encode");
        }
        let (decoded, err) = feed(&wire, step);
        prop_assert_eq!(err, None);
        prop_assert_eq!(decoded, frames);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096), step in 1usize..512) {
        let (frames, _) = feed(&bytes, step);
        for f in frames {
            if let Frame::Data { data, .. } = &f {
                prop_assert!(data.len() <= bytes.len());
            }
        }
    }

    #[test]
    fn arbitrary_header_block_bytes_never_panic(
        block in prop::collection::vec(any::<u8>(), 0..2048),
        kind in 1u16..=8,
    ) {
        // A well-formed control frame prefix around random "compressed" bytes, so the
        // decompressor itself sees garbage.
        let mut wire = BytesMut::new();
        wire.extend_from_slice(&[0x80, 0x03]);
        wire.extend_from_slice(&kind.to_be_bytes());
        // Flags byte 0, then the 24-bit length.
        let body_len = block.len() + 10;
        wire.extend_from_slice(&(body_len as u32).to_be_bytes());
        wire.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        wire.extend_from_slice(&block);
        let _ = feed(&wire, 64);
    }

    #[test]
    fn arbitrary_plain_blocks_decode_or_fail_cleanly(plain in prop::collection::vec(any::<u8>(), 0..1024)) {
        if let Ok(headers) = decode_block(&plain) {
            prop_assert!(headers.len() <= MAX_HEADERS);
        }
        // The same bytes behind a real zlib stream reach the parser through the decompressor.
        let mut z = Compress::new(Compression::default(), true);
        z.set_dictionary(&DICTIONARY).expect("dictionary");
        let mut compressed = Vec::with_capacity(plain.len() + 128);
        z.compress_vec(&plain, &mut compressed, FlushCompress::Sync).expect("compress");
        let via_zlib = HeaderDecompressor::new().decompress(&compressed);
        prop_assert_eq!(via_zlib, decode_block(&plain));
    }

    #[test]
    fn huge_declared_counts_do_not_allocate(count in any::<u32>(), tail in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut plain = count.to_be_bytes().to_vec();
        plain.extend_from_slice(&tail);
        // Must fail (or succeed) without reserving `count` entries: what it allocates is
        // bounded by the few bytes that follow the count, whatever the count says.
        let (_, allocated) = allocated_by(|| decode_block(&plain));
        prop_assert!(allocated <= 8 * 1024, "{allocated} bytes allocated for a {}-byte block declaring {count} headers", plain.len());
    }
}

#[test]
fn control_frames_over_the_cap_are_refused_from_the_prefix_alone() {
    let mut wire = vec![0x80, 0x03, 0x00, 0x01, 0x00];
    let len = (MAX_CONTROL_FRAME + 1) as u32;
    wire.extend_from_slice(&len.to_be_bytes()[1..]);
    assert_eq!(wire.len(), FRAME_HEADER_LEN);
    let (_, err) = feed(&wire, 8);
    assert!(matches!(err, Some(FrameError::TooLarge { .. })), "{err:?}");
}

#[test]
fn decompressed_header_blocks_are_capped() {
    // 64 KiB of headers compress to almost nothing; 8 of them exceed the cap.
    let name_len = 64 * 1024u32;
    let mut plain = 8u32.to_be_bytes().to_vec();
    for i in 0..8u8 {
        plain.extend_from_slice(&name_len.to_be_bytes());
        plain.extend(std::iter::repeat_n(b'a' + i, name_len as usize));
        plain.extend_from_slice(&0u32.to_be_bytes());
    }
    assert!(plain.len() > MAX_HEADER_BLOCK);
    let mut z = Compress::new(Compression::best(), true);
    z.set_dictionary(&DICTIONARY).expect("dictionary");
    let mut compressed = Vec::with_capacity(16 * 1024);
    z.compress_vec(&plain, &mut compressed, FlushCompress::Sync)
        .expect("compress");
    assert!(compressed.len() < 8 * 1024);
    let err = HeaderDecompressor::new().decompress(&compressed);
    assert_eq!(err, Err(FrameError::HeaderBlockTooLarge(MAX_HEADER_BLOCK)));
}

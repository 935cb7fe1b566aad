//! SPDY connections end to end over an in-memory pipe: streams, data both ways, FIN half-close,
//! RST, PING echo and GOAWAY, plus raw-frame checks of what our side puts on the wire.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use relaylet_sim::spdy::frame::{FLAG_FIN, Frame, FrameDecoder, FrameEncoder, rst};
use relaylet_sim::spdy::{Connection, Incoming, Role, SpdyError};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::timeout;

const T: Duration = Duration::from_secs(5);

fn pair() -> ((Connection, Incoming), (Connection, Incoming)) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    (
        Connection::new(a, Role::Client),
        Connection::new(b, Role::Server),
    )
}

fn hdr(name: &str, value: &str) -> Vec<(String, String)> {
    vec![(name.to_string(), value.to_string())]
}

/// Server side that accepts every stream and echoes its bytes back, then FINs.
fn spawn_echo_server(mut incoming: Incoming) {
    tokio::spawn(async move {
        while let Some(stream) = incoming.next().await {
            tokio::spawn(async move {
                stream.reply().await.expect("reply");
                let (mut r, mut w) = stream.into_split();
                tokio::io::copy(&mut r, &mut w).await.expect("copy");
                w.shutdown().await.expect("fin");
            });
        }
    });
}

#[tokio::test]
async fn streams_carry_data_both_ways_and_half_close() {
    let ((client, _cin), (_server, sin)) = pair();
    spawn_echo_server(sin);
    let mut first = timeout(T, client.open_stream(hdr("streamType", "stdin")))
        .await
        .expect("in time")
        .expect("open");
    let mut second = timeout(T, client.open_stream(hdr("streamType", "stdout")))
        .await
        .expect("in time")
        .expect("open");
    assert_eq!(first.id(), 1);
    assert_eq!(second.id(), 3);
    assert_eq!(first.header("streamtype"), Some("stdin"));
    assert_eq!(first.header("STREAMTYPE"), Some("stdin"));

    // A payload bigger than one DATA frame and than the pipe, to exercise chunking and backpressure.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let big = big.clone();
        async move {
            first.write_all(&big).await.expect("write");
            first.shutdown().await.expect("fin");
            let mut back = Vec::new();
            first.read_to_end(&mut back).await.expect("read");
            back
        }
    };
    let small = async move {
        second.write_all(b"ping").await.expect("write");
        second.shutdown().await.expect("fin");
        let mut back = Vec::new();
        second.read_to_end(&mut back).await.expect("read");
        back
    };
    let (back_big, back_small) = timeout(T, async { tokio::join!(writer, small) })
        .await
        .expect("in time");
    assert_eq!(back_big, big);
    assert_eq!(back_small, b"ping");
}

#[tokio::test]
async fn reset_ends_reads_and_fails_writes() {
    let ((client, _cin), (_server, mut sin)) = pair();
    let server = tokio::spawn(async move {
        let stream = sin.next().await.expect("stream");
        stream.reply().await.expect("reply");
        let (mut r, _w) = stream.into_split();
        let mut got = Vec::new();
        // The client resets: our reads end cleanly (spdystream semantics).
        r.read_to_end(&mut got).await.expect("read after reset");
        got
    });
    let mut stream = timeout(T, client.open_stream(hdr("streamtype", "data")))
        .await
        .expect("in time")
        .expect("open");
    stream.write_all(b"abc").await.expect("write");
    // Give the DATA a moment to be written before the RST overtakes nothing (same queue anyway).
    stream.reset().await.expect("reset");
    let got = timeout(T, server).await.expect("in time").expect("join");
    assert_eq!(got, b"abc");
    let err = stream
        .write_all(b"more")
        .await
        .expect_err("write after reset");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
}

#[tokio::test]
async fn refused_stream_fails_open() {
    let ((client, _cin), (_server, sin)) = pair();
    drop(sin); // nobody accepts streams: the server refuses them
    let err = timeout(T, client.open_stream(hdr("streamtype", "x")))
        .await
        .expect("in time")
        .expect_err("refused");
    assert!(
        matches!(err, SpdyError::StreamReset { id: 1, status } if status == rst::REFUSED_STREAM),
        "{err:?}"
    );
}

#[tokio::test]
async fn goaway_closes_both_ends_and_cuts_open_streams() {
    let ((client, _cin), (server, mut sin)) = pair();
    let accepted = tokio::spawn(async move {
        let stream = sin.next().await.expect("stream");
        stream.reply().await.expect("reply");
        stream
    });
    let mut stream = timeout(T, client.open_stream(hdr("streamtype", "data")))
        .await
        .expect("in time")
        .expect("open");
    let _server_stream = accepted.await.expect("join");
    timeout(T, server.goaway()).await.expect("goaway in time");
    timeout(T, client.closed())
        .await
        .expect("client sees close");
    assert!(client.is_closed());
    // The stream had neither FIN nor RST: like spdystream, reading ends as if it had (EOF).
    // client-go cannot tell a cut from a clean end this way, and the stand-in must not either.
    let mut buf = Vec::new();
    let read = stream
        .read_to_end(&mut buf)
        .await
        .expect("EOF, as spdystream reads it");
    assert_eq!(read, 0);
    assert!(matches!(
        client.open_stream(hdr("a", "b")).await,
        Err(SpdyError::ConnectionClosed | SpdyError::GoneAway)
    ));
}

/// Drives the server side of our connection with hand-made frames, as a Go client would.
struct RawPeer {
    io: DuplexStream,
    enc: FrameEncoder,
    dec: FrameDecoder,
    buf: BytesMut,
}

impl RawPeer {
    async fn send(&mut self, frame: Frame) {
        let mut out = BytesMut::new();
        self.enc.encode(&frame, &mut out).expect("encode");
        self.io.write_all(&out).await.expect("write");
    }

    async fn recv(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = self.dec.decode(&mut self.buf).expect("decode") {
                return Some(frame);
            }
            let n = timeout(T, self.io.read_buf(&mut self.buf))
                .await
                .expect("frame in time")
                .expect("read");
            if n == 0 {
                return None;
            }
        }
    }
}

fn raw_client_against_server() -> (RawPeer, Connection, Incoming) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (server, incoming) = Connection::new(b, Role::Server);
    (
        RawPeer {
            io: a,
            enc: FrameEncoder::new(),
            dec: FrameDecoder::new(),
            buf: BytesMut::new(),
        },
        server,
        incoming,
    )
}

#[tokio::test]
async fn server_echoes_pings_replies_empty_and_sends_fin_and_goaway() {
    let (mut peer, server, mut incoming) = raw_client_against_server();
    peer.send(Frame::Ping { id: 1 }).await;
    assert_eq!(peer.recv().await, Some(Frame::Ping { id: 1 }));

    // Ignored frames must not disturb anything.
    peer.send(Frame::Settings {
        flags: 0,
        entries: vec![],
    })
    .await;
    peer.send(Frame::WindowUpdate {
        stream_id: 0,
        delta: 1,
    })
    .await;

    peer.send(Frame::SynStream {
        stream_id: 1,
        associated_to: 0,
        priority: 0,
        slot: 0,
        flags: 0,
        headers: vec![("streamtype".into(), "error".into())],
    })
    .await;
    let stream = timeout(T, incoming.next())
        .await
        .expect("in time")
        .expect("stream");
    assert_eq!(stream.header("streamType"), Some("error"));
    stream.reply().await.expect("reply");
    assert_eq!(
        peer.recv().await,
        Some(Frame::SynReply {
            stream_id: 1,
            flags: 0,
            headers: vec![]
        })
    );
    let (mut r, mut w) = stream.into_split();
    w.write_all(b"{\"status\":\"Success\"}")
        .await
        .expect("write");
    w.shutdown().await.expect("fin");
    assert_eq!(
        peer.recv().await,
        Some(Frame::Data {
            stream_id: 1,
            flags: 0,
            data: Bytes::from_static(b"{\"status\":\"Success\"}")
        })
    );
    assert_eq!(
        peer.recv().await,
        Some(Frame::Data {
            stream_id: 1,
            flags: FLAG_FIN,
            data: Bytes::new()
        })
    );
    // Client data then FIN reaches our reader, then EOF.
    peer.send(Frame::Data {
        stream_id: 1,
        flags: FLAG_FIN,
        data: Bytes::from_static(b"bye"),
    })
    .await;
    let mut got = Vec::new();
    timeout(T, r.read_to_end(&mut got))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(got, b"bye");

    // A stream id going backwards is a protocol error.
    peer.send(Frame::SynStream {
        stream_id: 1,
        associated_to: 0,
        priority: 0,
        slot: 0,
        flags: 0,
        headers: vec![],
    })
    .await;
    assert_eq!(
        peer.recv().await,
        Some(Frame::RstStream {
            stream_id: 1,
            status: rst::PROTOCOL_ERROR
        })
    );

    let closing = tokio::spawn(async move { server.goaway().await });
    assert_eq!(
        peer.recv().await,
        Some(Frame::GoAway {
            last_good_stream_id: 1,
            status: 0
        })
    );
    assert_eq!(peer.recv().await, None, "server closes after GOAWAY");
    timeout(T, closing).await.expect("in time").expect("join");
}

#[tokio::test]
async fn malformed_input_closes_the_connection() {
    let (mut peer, server, _incoming) = raw_client_against_server();
    // A control frame claiming SPDY version 2.
    peer.io
        .write_all(&[0x80, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04, 0, 0, 0, 1])
        .await
        .expect("write");
    timeout(T, server.closed()).await.expect("closed in time");
    assert_eq!(peer.recv().await, None);
}

#[tokio::test]
async fn ping_round_trips_both_ways() {
    let ((client, _cin), (server, _sin)) = pair();
    timeout(T, client.ping())
        .await
        .expect("in time")
        .expect("client ping");
    timeout(T, server.ping())
        .await
        .expect("in time")
        .expect("server ping");
    timeout(T, client.ping())
        .await
        .expect("in time")
        .expect("second ping");
}

// Paused time: the connection is in memory, so time only moves once every task is idle, and
// the 50 ms below means "after everything that can run has run", not a guess at a delay.
#[tokio::test(start_paused = true)]
async fn dropping_every_handle_closes_the_connection_gracefully() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (server, mut incoming) = Connection::new(b, Role::Server);
    let (client, client_incoming) = Connection::new(a, Role::Client);
    let opened = tokio::spawn(async move {
        let mut stream = client
            .open_stream(hdr("streamtype", "stdout"))
            .await
            .expect("open");
        let mut got = Vec::new();
        // The server side writes, then forgets everything: FIN, then GOAWAY and close.
        stream.read_to_end(&mut got).await.expect("clean end");
        timeout(T, client.closed())
            .await
            .expect("closed after GOAWAY");
        drop(client_incoming);
        got
    });
    let stream = timeout(T, incoming.next())
        .await
        .expect("in time")
        .expect("stream");
    stream.reply().await.expect("reply");
    let (_r, mut w) = stream.into_split();
    w.write_all(b"last words").await.expect("write");
    drop(w);
    drop(_r);
    drop(incoming);
    assert!(!server.is_closed());
    let probe = server.clone();
    drop(server);
    // A clone still holds the connection open (every task has run until it waits).
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!probe.is_closed());
    drop(probe);
    let got = timeout(T, opened).await.expect("in time").expect("join");
    assert_eq!(got, b"last words");
}

// Paused time: the writer writes until backpressure stops it (time moves only when every task
// waits), so what it queued is measured exactly, not by how fast the machine writes in 500 ms.
#[tokio::test(start_paused = true)]
async fn a_stalled_reader_bounds_what_a_writer_can_queue() {
    let ((client, _cin), (_server, mut sin)) = pair();
    let accepted = tokio::spawn(async move {
        let stream = sin.next().await.expect("stream");
        stream.reply().await.expect("reply");
        // Never read.
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(stream);
    });
    let mut stream = timeout(T, client.open_stream(hdr("streamtype", "stdin")))
        .await
        .expect("in time")
        .expect("open");
    let chunk = vec![7u8; 64 * 1024];
    let mut written = 0usize;
    // Stream buffer + write queue + pipe: a few MiB at most. The loop stops at the limit, so
    // an unbounded queue fails the assertion instead of writing forever.
    const LIMIT: usize = 8 * 1024 * 1024;
    let filling = async {
        while written < LIMIT {
            stream.write_all(&chunk).await.expect("write");
            written += chunk.len();
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), filling).await;
    assert!(
        written < LIMIT,
        "wrote {written} bytes into a stalled stream"
    );
    assert!(written > 0);
    accepted.abort();
}

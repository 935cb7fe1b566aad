//! The remote command streams, independent of the wire protocol.
//!
//! exec and attach are written once against this: a stdin receiver, stdout/stderr senders, a
//! terminal resize receiver and a final status. The SPDY and WebSocket transports turn their
//! streams or channels into these and back (upstream keeps the same split between
//! `remotecommand.ServeExec` and its `createStreams` transports).

use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::status::Outcome;

/// Which streams the client asked for (`input`, `output`, `error`, `tty` query flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl StreamOptions {
    /// Reads the flags like upstream `remotecommand.NewOptions`: a flag is on when its value
    /// is exactly `1`; a tty has no separate stderr; at least one stream is required.
    pub fn from_query(query: &[(String, String)]) -> Result<Self, String> {
        let flag = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .is_some_and(|(_, v)| v == "1")
        };
        let tty = flag("tty");
        let opts = StreamOptions {
            stdin: flag("input"),
            stdout: flag("output"),
            // A terminal merges stderr into stdout; upstream silently drops the stderr request.
            stderr: flag("error") && !tty,
            tty,
        };
        if !opts.stdin && !opts.stdout && !opts.stderr {
            return Err("you must specify at least 1 of stdin, stdout, stderr".to_string());
        }
        Ok(opts)
    }
}

/// A terminal size as clients send it on the resize stream: `{"Width":W,"Height":H}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct TermSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

impl TermSize {
    pub fn to_winsize(self) -> nix::pty::Winsize {
        nix::pty::Winsize {
            ws_row: self.height,
            ws_col: self.width,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }
    }
}

/// Splits the resize stream, a sequence of JSON objects, into sizes, however the bytes were
/// chunked. Bounded: a client cannot make it buffer more than [`ResizeDecoder::MAX_BUFFER`].
#[derive(Default)]
pub struct ResizeDecoder {
    buf: Vec<u8>,
}

impl ResizeDecoder {
    pub const MAX_BUFFER: usize = 4096;

    /// Adds bytes and returns every complete size they finish. `Err` when the stream is not
    /// a sequence of size objects (upstream stops reading resize events then).
    pub fn feed(&mut self, data: &[u8]) -> Result<Vec<TermSize>, String> {
        self.buf.extend_from_slice(data);
        let mut sizes = Vec::new();
        let mut consumed = 0;
        let mut iter = serde_json::Deserializer::from_slice(&self.buf).into_iter::<TermSize>();
        loop {
            match iter.next() {
                Some(Ok(size)) => {
                    sizes.push(size);
                    consumed = iter.byte_offset();
                }
                Some(Err(err)) if err.is_eof() => break,
                Some(Err(err)) => return Err(format!("invalid resize event: {err}")),
                None => {
                    consumed = iter.byte_offset();
                    break;
                }
            }
        }
        self.buf.drain(..consumed);
        if self.buf.len() > Self::MAX_BUFFER {
            return Err("resize event too large".to_string());
        }
        Ok(sizes)
    }
}

/// The two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutStream {
    Stdout,
    Stderr,
}

/// What the command side hands to the transport.
#[derive(Debug)]
pub enum OutMsg {
    Data(OutStream, Bytes),
    /// No more data on this stream (SPDY sends FIN; WebSocket has nothing to send).
    Close(OutStream),
    /// The final status; the transport writes it and closes the connection.
    Finish(Outcome),
}

/// The sending side of the output streams; cheap to clone.
#[derive(Clone)]
pub struct Output {
    tx: mpsc::Sender<OutMsg>,
}

/// The client is gone; nothing more can be sent.
#[derive(Debug, thiserror::Error)]
#[error("the client connection is gone")]
pub struct Gone;

impl Output {
    pub async fn write(&self, stream: OutStream, data: Bytes) -> Result<(), Gone> {
        self.tx
            .send(OutMsg::Data(stream, data))
            .await
            .map_err(|_| Gone)
    }

    pub async fn close(&self, stream: OutStream) {
        let _ = self.tx.send(OutMsg::Close(stream)).await;
    }

    pub async fn finish(&self, outcome: Outcome) {
        let _ = self.tx.send(OutMsg::Finish(outcome)).await;
    }
}

/// Everything a remote command sees of its client.
pub struct Streams {
    pub opts: StreamOptions,
    /// Client stdin; the channel closes when the client closes stdin. `None` if not requested.
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    /// Terminal size changes; `None` if the protocol has no resize stream.
    pub resize: Option<mpsc::Receiver<TermSize>>,
    pub output: Output,
    /// Fires when the client disconnects or the kubelet stops.
    pub gone: CancellationToken,
}

/// The transport's ends of the channels [`Streams`] holds.
pub struct TransportEnds {
    pub stdin: Option<mpsc::Sender<Bytes>>,
    pub resize: Option<mpsc::Sender<TermSize>>,
    pub output: mpsc::Receiver<OutMsg>,
    pub gone: CancellationToken,
}

/// Creates a connected pair of [`Streams`] (for the command) and [`TransportEnds`].
pub fn pair(
    opts: StreamOptions,
    with_resize: bool,
    gone: CancellationToken,
) -> (Streams, TransportEnds) {
    let (out_tx, out_rx) = mpsc::channel(64);
    let (stdin_tx, stdin_rx) = if opts.stdin {
        let (tx, rx) = mpsc::channel(64);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let (resize_tx, resize_rx) = if with_resize {
        let (tx, rx) = mpsc::channel(16);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    (
        Streams {
            opts,
            stdin: stdin_rx,
            resize: resize_rx,
            output: Output { tx: out_tx },
            gone: gone.clone(),
        },
        TransportEnds {
            stdin: stdin_tx,
            resize: resize_tx,
            output: out_rx,
            gone,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn options_follow_upstream_rules() {
        let o = StreamOptions::from_query(&q(&[("output", "1"), ("error", "1"), ("tty", "1")]))
            .unwrap();
        assert!(o.stdout && o.tty && !o.stderr && !o.stdin);
        // Only the value "1" turns a flag on.
        assert!(StreamOptions::from_query(&q(&[("output", "true")])).is_err());
        assert!(StreamOptions::from_query(&q(&[])).is_err());
    }

    #[test]
    fn resize_decoder_handles_split_and_joined_objects() {
        let mut d = ResizeDecoder::default();
        assert!(d.feed(br#"{"Width":100,"#).unwrap().is_empty());
        let sizes = d
            .feed(
                br#""Height":40}
{"Width":132,"Height":50}{"Wid"#,
            )
            .unwrap();
        assert_eq!(
            sizes,
            vec![
                TermSize {
                    width: 100,
                    height: 40
                },
                TermSize {
                    width: 132,
                    height: 50
                }
            ]
        );
        // `{"Wid` waits for more; a stream that is not JSON objects is refused.
        assert!(ResizeDecoder::default().feed(b"garbage").is_err());
        assert!(
            ResizeDecoder::default()
                .feed(br#"{"Width":"wide"}"#)
                .is_err()
        );
    }

    #[test]
    fn resize_decoder_is_bounded() {
        let mut d = ResizeDecoder::default();
        let mut data = b"{\"Width\":".to_vec();
        data.extend(std::iter::repeat_n(b' ', ResizeDecoder::MAX_BUFFER + 1));
        assert!(d.feed(&data).is_err());
    }
}

//! The `channel.k8s.io` WebSocket protocol family: channel-prefixed frames for remote commands and
//! port-forward.
//!
//! Every WebSocket message carries one channel's bytes. Binary protocols put the channel number in
//! the first byte; the base64 protocols send text whose first character is `'0' + channel` and
//! whose rest is standard base64. Remote commands use channels 0 stdin, 1 stdout, 2 stderr,
//! 3 error (the exit `metav1.Status`), 4 resize. `v5.channel.k8s.io` adds a close message,
//! `[0xFF, channel]`, so a client can end stdin without ending the connection.
//!
//! Port-forward over WebSocket uses two channels per requested port, `2i` data and `2i+1` error,
//! and the server's first message on each is the port as two little-endian bytes.
//!
//! This module is pure framing over `tungstenite` messages, shared by the kubelet stand-in, the
//! API server's v5 translator and the tests.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use tokio_tungstenite::tungstenite::Message;

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
pub const RESIZE: u8 = 4;

/// The channel byte of a v5 close message.
pub const CLOSE_SIGNAL: u8 = 0xFF;

/// One protocol of the family, as named in `Sec-WebSocket-Protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// `channel.k8s.io` (also what a client that names no subprotocol gets).
    V1,
    /// `base64.channel.k8s.io`
    Base64,
    /// `v4.channel.k8s.io`
    V4,
    /// `v4.base64.channel.k8s.io`
    V4Base64,
    /// `v5.channel.k8s.io`
    V5,
}

impl Protocol {
    /// Every protocol, newest first (the order a modern client offers them in).
    pub const ALL: [Protocol; 5] = [
        Protocol::V5,
        Protocol::V4,
        Protocol::V4Base64,
        Protocol::Base64,
        Protocol::V1,
    ];

    pub fn from_name(name: &str) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Protocol::V1 => "channel.k8s.io",
            Protocol::Base64 => "base64.channel.k8s.io",
            Protocol::V4 => "v4.channel.k8s.io",
            Protocol::V4Base64 => "v4.base64.channel.k8s.io",
            Protocol::V5 => "v5.channel.k8s.io",
        }
    }

    /// Text messages with base64 payloads instead of binary messages.
    pub fn is_base64(self) -> bool {
        matches!(self, Protocol::Base64 | Protocol::V4Base64)
    }

    /// Whether `[0xFF, channel]` closes a channel.
    pub fn supports_close(self) -> bool {
        self == Protocol::V5
    }

    /// v4 and v5 write a JSON `metav1.Status` on the error channel; v1 and base64 write the
    /// error message as plain text (and nothing on success).
    pub fn status_is_json(self) -> bool {
        matches!(self, Protocol::V4 | Protocol::V4Base64 | Protocol::V5)
    }
}

/// A decoded channel message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelMessage {
    Data {
        channel: u8,
        data: Bytes,
    },
    /// v5 only: the sender will write nothing more on `channel`.
    Close {
        channel: u8,
    },
}

/// A WebSocket message that is not valid framing for the negotiated protocol.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChannelError {
    #[error("{protocol} expects {expected} messages, got {got}")]
    WrongMessageType {
        protocol: &'static str,
        expected: &'static str,
        got: &'static str,
    },
    #[error("base64 channel prefix {0:?} is not a digit")]
    BadChannelPrefix(char),
    #[error("payload is not valid base64: {0}")]
    BadBase64(String),
    #[error("close message without a channel")]
    ShortClose,
    #[error("channel {0} does not fit the base64 framing")]
    ChannelOutOfRange(u8),
}

/// Encodes a message for `protocol`. A close on a protocol without close support is an error,
/// as is a channel the base64 framing cannot name.
pub fn encode(protocol: Protocol, message: &ChannelMessage) -> Result<Message, ChannelError> {
    match message {
        ChannelMessage::Data { channel, data } => {
            if protocol.is_base64() {
                if *channel > 9 {
                    // '0' + channel must stay a digit for Go's decoder (it subtracts '0').
                    return Err(ChannelError::ChannelOutOfRange(*channel));
                }
                let mut text = String::with_capacity(1 + data.len().div_ceil(3) * 4);
                text.push(char::from(b'0' + channel));
                STANDARD.encode_string(data, &mut text);
                Ok(Message::text(text))
            } else {
                let mut bytes = Vec::with_capacity(1 + data.len());
                bytes.push(*channel);
                bytes.extend_from_slice(data);
                Ok(Message::binary(bytes))
            }
        }
        ChannelMessage::Close { channel } => {
            if !protocol.supports_close() {
                return Err(ChannelError::WrongMessageType {
                    protocol: protocol.name(),
                    expected: "data",
                    got: "close signal",
                });
            }
            Ok(Message::binary(vec![CLOSE_SIGNAL, *channel]))
        }
    }
}

/// Shorthand for a data message.
pub fn data(protocol: Protocol, channel: u8, data: &[u8]) -> Result<Message, ChannelError> {
    encode(
        protocol,
        &ChannelMessage::Data {
            channel,
            data: Bytes::copy_from_slice(data),
        },
    )
}

/// Decodes one WebSocket message. WebSocket control messages (ping, pong, close) and empty
/// messages carry no channel data and yield `Ok(None)`, as Go's `wsstream` skips them.
pub fn decode(
    protocol: Protocol,
    message: &Message,
) -> Result<Option<ChannelMessage>, ChannelError> {
    match message {
        Message::Binary(_) if protocol.is_base64() => Err(wrong(protocol, "binary")),
        Message::Binary(bytes) => decode_binary(protocol, bytes),
        Message::Text(_) if !protocol.is_base64() => Err(wrong(protocol, "text")),
        Message::Text(text) => decode_base64(text.as_str()),
        Message::Ping(_) | Message::Pong(_) | Message::Close(_) | Message::Frame(_) => Ok(None),
    }
}

fn wrong(protocol: Protocol, got: &'static str) -> ChannelError {
    ChannelError::WrongMessageType {
        protocol: protocol.name(),
        expected: if protocol.is_base64() {
            "text"
        } else {
            "binary"
        },
        got,
    }
}

fn decode_binary(
    protocol: Protocol,
    bytes: &Bytes,
) -> Result<Option<ChannelMessage>, ChannelError> {
    let Some(&channel) = bytes.first() else {
        return Ok(None);
    };
    if channel == CLOSE_SIGNAL && protocol.supports_close() {
        let Some(&closed) = bytes.get(1) else {
            return Err(ChannelError::ShortClose);
        };
        return Ok(Some(ChannelMessage::Close { channel: closed }));
    }
    Ok(Some(ChannelMessage::Data {
        channel,
        data: bytes.slice(1..),
    }))
}

fn decode_base64(text: &str) -> Result<Option<ChannelMessage>, ChannelError> {
    let Some(prefix) = text.chars().next() else {
        return Ok(None);
    };
    let channel = match prefix.to_digit(10) {
        Some(digit) => digit as u8,
        None => return Err(ChannelError::BadChannelPrefix(prefix)),
    };
    let data = STANDARD
        .decode(&text[prefix.len_utf8()..])
        .map_err(|e| ChannelError::BadBase64(e.to_string()))?;
    Ok(Some(ChannelMessage::Data {
        channel,
        data: Bytes::from(data),
    }))
}

/// Port-forward over WebSocket: the data and error channels of the `index`-th requested port.
pub fn port_forward_channels(index: u8) -> Option<(u8, u8)> {
    let data = index.checked_mul(2)?;
    Some((data, data.checked_add(1)?))
}

/// The first message a port-forward server writes on both of a port's channels.
pub fn port_prefix(port: u16) -> [u8; 2] {
    port.to_le_bytes()
}

/// Reads the port prefix from the start of a port-forward channel's first payload.
pub fn parse_port_prefix(data: &[u8]) -> Option<u16> {
    data.first_chunk::<2>().map(|b| u16::from_le_bytes(*b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for protocol in Protocol::ALL {
            assert_eq!(Protocol::from_name(protocol.name()), Some(protocol));
        }
        assert_eq!(Protocol::from_name("v6.channel.k8s.io"), None);
        assert!(Protocol::V5.supports_close() && !Protocol::V4.supports_close());
        assert!(Protocol::V4.status_is_json() && !Protocol::V1.status_is_json());
        assert!(Protocol::Base64.is_base64() && !Protocol::V5.is_base64());
    }

    #[test]
    fn binary_framing_puts_the_channel_first() {
        let msg = data(Protocol::V4, STDOUT, b"hi").expect("encode");
        assert_eq!(msg, Message::binary(vec![1, b'h', b'i']));
        assert_eq!(
            decode(Protocol::V4, &msg).expect("decode"),
            Some(ChannelMessage::Data {
                channel: STDOUT,
                data: Bytes::from_static(b"hi")
            })
        );
    }

    #[test]
    fn base64_framing_uses_a_digit_and_base64() {
        let msg = data(Protocol::Base64, STDERR, b"err\n").expect("encode");
        assert_eq!(msg, Message::text("2ZXJyCg=="));
        assert_eq!(
            decode(Protocol::Base64, &msg).expect("decode"),
            Some(ChannelMessage::Data {
                channel: STDERR,
                data: Bytes::from_static(b"err\n")
            })
        );
        assert!(decode(Protocol::Base64, &Message::text("x")).is_err());
        assert!(decode(Protocol::V4Base64, &Message::text("1***")).is_err());
        assert!(data(Protocol::Base64, 12, b"").is_err());
    }

    #[test]
    fn v5_close_is_only_v5() {
        let close = encode(Protocol::V5, &ChannelMessage::Close { channel: STDIN }).expect("enc");
        assert_eq!(close, Message::binary(vec![0xFF, 0]));
        assert_eq!(
            decode(Protocol::V5, &close).expect("decode"),
            Some(ChannelMessage::Close { channel: STDIN })
        );
        // Under v4, 0xFF is just channel 255's data.
        assert_eq!(
            decode(Protocol::V4, &close).expect("decode"),
            Some(ChannelMessage::Data {
                channel: 255,
                data: Bytes::from_static(&[0])
            })
        );
        assert!(encode(Protocol::V4, &ChannelMessage::Close { channel: 0 }).is_err());
        assert_eq!(
            decode(Protocol::V5, &Message::binary(vec![0xFF])),
            Err(ChannelError::ShortClose)
        );
    }

    #[test]
    fn wrong_message_kind_and_empties() {
        assert!(decode(Protocol::V4, &Message::text("1aGk=")).is_err());
        assert!(decode(Protocol::Base64, &Message::binary(vec![1])).is_err());
        assert_eq!(decode(Protocol::V4, &Message::binary(Vec::new())), Ok(None));
        assert_eq!(decode(Protocol::V4, &Message::Ping(Bytes::new())), Ok(None));
    }

    #[test]
    fn port_forward_channels_and_prefix() {
        assert_eq!(port_forward_channels(0), Some((0, 1)));
        assert_eq!(port_forward_channels(3), Some((6, 7)));
        assert_eq!(port_forward_channels(200), None);
        assert_eq!(port_prefix(8080), [0x90, 0x1f]);
        assert_eq!(parse_port_prefix(&[0x90, 0x1f, 9]), Some(8080));
        assert_eq!(parse_port_prefix(&[1]), None);
    }
}

//! [`Frames`]: the trackers of one session's two directions, reading frame headers in place,
//! and the ending written at a frame boundary when relaylet cuts the session.

use std::sync::atomic::{AtomicU32, Ordering};

use http::HeaderMap;

use super::exit_status::{self, CannotEnd, Ending, StatusFormat};
use super::spdy::{ClientSpdy, LeafSpdy, Learned};
use super::websocket::{ClientWebSocket, LeafWebSocket};
use crate::model::kubelet_request::Kind;

/// The streaming protocol of an exec or attach session that relaylet can end honestly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Spdy { status: StatusFormat },
    WebSocket { base64: bool, status: StatusFormat },
}

/// The protocol the leaf's `101 Switching Protocols` negotiated for a call of `kind`, or why
/// relaylet does not track it.
pub fn protocol(kind: Kind, leaf_101: &HeaderMap) -> Result<Protocol, String> {
    if !matches!(kind, Kind::Exec | Kind::Attach) {
        return Err(format!("{kind} carries no exit status"));
    }
    let header = |name: &str| {
        leaf_101
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
    };
    let upgrade = header("upgrade").unwrap_or_default();
    if upgrade.starts_with("spdy/3") {
        return match header("x-stream-protocol-version").as_deref() {
            Some("v5.channel.k8s.io" | "v4.channel.k8s.io") => Ok(Protocol::Spdy {
                status: StatusFormat::Json,
            }),
            Some("v3.channel.k8s.io" | "v2.channel.k8s.io") => Ok(Protocol::Spdy {
                status: StatusFormat::Text,
            }),
            other => Err(format!("unknown SPDY remote command protocol {other:?}")),
        };
    }
    if upgrade == "websocket" {
        return match header("sec-websocket-protocol").as_deref() {
            Some("v5.channel.k8s.io" | "v4.channel.k8s.io") => Ok(Protocol::WebSocket {
                base64: false,
                status: StatusFormat::Json,
            }),
            Some("v4.base64.channel.k8s.io") => Ok(Protocol::WebSocket {
                base64: true,
                status: StatusFormat::Json,
            }),
            Some("channel.k8s.io") => Ok(Protocol::WebSocket {
                base64: false,
                status: StatusFormat::Text,
            }),
            Some("base64.channel.k8s.io") => Ok(Protocol::WebSocket {
                base64: true,
                status: StatusFormat::Text,
            }),
            other => Err(format!("unknown WebSocket protocol {other:?}")),
        };
    }
    Err(format!("unknown upgrade {upgrade:?}"))
}

/// Looks at bytes as they pass, without changing them.
pub trait Observe {
    fn observe(&mut self, chunk: &[u8]);
}

/// The frame trackers of one session.
pub struct Frames {
    tracking: Tracking,
    /// The SPDY error stream's id once the caller's side found it (0 until then); the
    /// caller's SYN_STREAM passes relaylet before the leaf can answer on that stream.
    error_stream: AtomicU32,
}

enum Tracking {
    Off,
    Spdy {
        client: ClientSpdy,
        leaf: LeafSpdy,
        status: StatusFormat,
    },
    WebSocket {
        client: ClientWebSocket,
        leaf: LeafWebSocket,
        status: StatusFormat,
    },
}

impl Frames {
    /// Trackers for `protocol`; `None` tracks nothing.
    pub fn new(protocol: Option<Protocol>) -> Frames {
        let tracking = match protocol {
            None => Tracking::Off,
            Some(Protocol::Spdy { status }) => Tracking::Spdy {
                client: ClientSpdy::new(),
                leaf: LeafSpdy::new(),
                status,
            },
            Some(Protocol::WebSocket { base64, status }) => Tracking::WebSocket {
                client: ClientWebSocket::default(),
                leaf: LeafWebSocket::new(base64),
                status,
            },
        };
        Frames {
            tracking,
            error_stream: AtomicU32::new(0),
        }
    }

    /// Whether this session can be ended honestly at all.
    pub fn tracked(&self) -> bool {
        !matches!(self.tracking, Tracking::Off)
    }

    /// The two directions' observers, for the two halves of the splice.
    pub fn split(&mut self) -> (ClientFrames<'_>, LeafFrames<'_>) {
        let error_stream = &self.error_stream;
        match &mut self.tracking {
            Tracking::Spdy { client, leaf, .. } => (
                ClientFrames::Spdy(client, error_stream),
                LeafFrames::Spdy(leaf, error_stream),
            ),
            Tracking::WebSocket { client, leaf, .. } => {
                (ClientFrames::WebSocket(client), LeafFrames::WebSocket(leaf))
            }
            Tracking::Off => (ClientFrames::Off, LeafFrames::Off),
        }
    }

    /// The leaf's observer alone (to finish a frame after the splice stopped).
    pub fn leaf(&mut self) -> LeafFrames<'_> {
        self.split().1
    }

    /// The leaf has answered on the error stream (its Status, or that stream's end): the
    /// session ended the leaf's way, and relaylet must not add anything.
    pub fn leaf_finished(&self) -> bool {
        match &self.tracking {
            Tracking::Off => false,
            Tracking::Spdy { leaf, .. } => leaf.finished(),
            Tracking::WebSocket { leaf, .. } => leaf.finished(),
        }
    }

    /// The caller ended the session itself (a WebSocket close frame): the leaf's side ending
    /// after it is the caller's doing.
    pub fn client_closed(&self) -> bool {
        match &self.tracking {
            Tracking::WebSocket { client, .. } => client.closed(),
            Tracking::Off | Tracking::Spdy { .. } => false,
        }
    }

    /// The leaf's bytes so far end with a complete frame.
    pub fn at_boundary(&self) -> bool {
        match &self.tracking {
            Tracking::Off => true,
            Tracking::Spdy { leaf, .. } => leaf.at_boundary(),
            Tracking::WebSocket { leaf, .. } => leaf.at_boundary(),
        }
    }

    /// How many leading bytes of `chunk` (the leaf's next bytes) complete its frame in
    /// progress.
    pub fn rest_of_frame(&self, chunk: &[u8]) -> usize {
        match &self.tracking {
            Tracking::Off => 0,
            Tracking::Spdy { leaf, .. } => leaf.rest_of_frame(chunk),
            Tracking::WebSocket { leaf, .. } => leaf.rest_of_frame(chunk),
        }
    }

    /// The bytes that end the session with a Failure saying `message`.
    pub fn ending(&self, message: &str) -> Result<Ending, CannotEnd> {
        match &self.tracking {
            Tracking::Off => Err(CannotEnd("the protocol is not tracked".into())),
            Tracking::Spdy { leaf, status, .. } => leaf.ending(
                self.error_stream.load(Ordering::Acquire),
                &exit_status::failure(*status, message),
            ),
            Tracking::WebSocket { leaf, status, .. } => {
                leaf.ending(&exit_status::failure(*status, message))
            }
        }
    }
}

/// The caller → leaf observer.
pub enum ClientFrames<'a> {
    Off,
    Spdy(&'a mut ClientSpdy, &'a AtomicU32),
    WebSocket(&'a mut ClientWebSocket),
}

impl Observe for ClientFrames<'_> {
    fn observe(&mut self, chunk: &[u8]) {
        match self {
            ClientFrames::Off => {}
            ClientFrames::WebSocket(client) => client.observe(chunk),
            ClientFrames::Spdy(client, error_stream) => match client.observe(chunk) {
                Learned::Nothing => {}
                Learned::ErrorStream(id) => error_stream.store(id, Ordering::Release),
                Learned::GaveUp(why) => {
                    tracing::debug!(%why, "the SPDY error stream cannot be known; a cut will reset the connection");
                }
            },
        }
    }
}

/// The leaf → caller observer.
pub enum LeafFrames<'a> {
    Off,
    Spdy(&'a mut LeafSpdy, &'a AtomicU32),
    WebSocket(&'a mut LeafWebSocket),
}

impl Observe for LeafFrames<'_> {
    fn observe(&mut self, chunk: &[u8]) {
        match self {
            LeafFrames::Off => {}
            LeafFrames::Spdy(leaf, error_stream) => {
                leaf.observe(chunk, error_stream.load(Ordering::Acquire))
            }
            LeafFrames::WebSocket(leaf) => leaf.observe(chunk),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn the_protocol_comes_from_the_leafs_101() {
        let spdy = |v: &str| {
            protocol(
                Kind::Exec,
                &headers(&[("upgrade", "SPDY/3.1"), ("x-stream-protocol-version", v)]),
            )
        };
        assert_eq!(
            spdy("v4.channel.k8s.io"),
            Ok(Protocol::Spdy {
                status: StatusFormat::Json
            })
        );
        assert_eq!(
            spdy("v3.channel.k8s.io"),
            Ok(Protocol::Spdy {
                status: StatusFormat::Text
            })
        );
        assert!(
            spdy("channel.k8s.io").is_err(),
            "v1 resets its error stream"
        );
        assert!(spdy("v9.channel.k8s.io").is_err());
        let ws = |v: &str| {
            protocol(
                Kind::Attach,
                &headers(&[("upgrade", "websocket"), ("sec-websocket-protocol", v)]),
            )
        };
        assert_eq!(
            ws("v4.base64.channel.k8s.io"),
            Ok(Protocol::WebSocket {
                base64: true,
                status: StatusFormat::Json
            })
        );
        assert!(
            protocol(
                Kind::PortForward,
                &headers(&[
                    ("upgrade", "SPDY/3.1"),
                    ("x-stream-protocol-version", "portforward.k8s.io")
                ])
            )
            .is_err()
        );
    }
}

//! The relay: re-issues one kubelet call to the leaf apiserver and hands the answer back. It
//! offers [`Relay`] to the node server, which calls it once a call is authorized and its leaf pod
//! proven. Inside: `reissue` (re-issuing the call), `session` (one relayed call's logs, counters
//! and caps), `splice` (copying the two upgraded connections) and `frames` (just enough of SPDY
//! and WebSocket to end a session honestly).
//!
//! Streaming calls (exec, attach, port-forward) are upgrades: the caller's upgrade headers go to
//! the leaf unchanged, so the leaf's kubelet negotiates the protocol with the real client
//! (SPDY/3.1, any WebSocket `channel.k8s.io` version, port-forward); when the leaf answers 101,
//! relaylet answers 101 with the leaf's negotiated headers and splices the two connections.
//! Anything else the leaf answers (403 for a refused protocol, 404 for a missing container, a
//! `metav1.Status` body) is passed back as it is, so `kubectl` prints the leaf's real error.
//! Logs are a plain streamed body, relayed chunk by chunk with backpressure.

mod frames;
mod reissue;
mod session;
mod splice;

pub use reissue::Relay;
pub use session::SessionInfo;
pub use splice::{CallerStream, ServedIo};

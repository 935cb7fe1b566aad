//! Just enough of the streaming protocols to end a session honestly.
//!
//! relaylet splices bytes; it does not speak SPDY or WebSocket. But when it must end an exec or
//! attach session itself (idle timeout, shutdown grace over), or the leaf connection ends before
//! the leaf sent an exit status, closing or resetting the caller's connection is not enough:
//! the root apiserver's proxy turns either into a clean close, and client-go's SPDY executor
//! reads streams that end without a Status on the error stream as exit code 0 (the apiserver's
//! WebSocket translator then reports Success too). So while bytes pass, small trackers read
//! frame headers in place (never a copy, never a change): the caller's side learns the error
//! stream, the leaf's side knows where the next frame starts and whether the leaf already
//! answered. An ending can then be written at a frame boundary: a Failure Status on the error
//! stream or channel, and a clean end, so the caller prints relaylet's reason and fails.
//!
//! Inside: `tracker` (the two directions' trackers, [`Frames`]), `spdy` (SPDY/3.1 frames, their
//! header blocks inflated by `spdy_headers` with `spdy_dictionary`), `websocket` (the
//! `channel.k8s.io` frames), `exit_status` (the Status relaylet writes), and `proptests`
//! (generated sessions cut at every byte).
//!
//! Not tracked, and ended with a reset: port-forward (it has no exit status), and
//! protocols relaylet does not know, including the 1.0-era `channel.k8s.io` over SPDY (the
//! kubelet resets its error stream at once).

mod exit_status;
#[cfg(test)]
pub(crate) mod proptests;
mod spdy;
mod spdy_dictionary;
mod spdy_headers;
mod tracker;
mod websocket;

pub use exit_status::Ending;
#[cfg(test)]
pub use exit_status::StatusFormat;
pub use tracker::{Frames, Observe, Protocol, protocol};

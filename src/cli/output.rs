//! What a command tells its user while it works: on a terminal, one status line rewritten in
//! place and a line kept for each step done; otherwise (a log, CI, a pipe) plain lines only, so
//! nothing is lost to carriage returns.

use std::io::{IsTerminal, Write};

/// Where a command's progress goes (stderr, so stdout stays for the answer).
pub struct Output {
    terminal: bool,
    /// Whether a transient status line is on screen now.
    pending: bool,
}

impl Output {
    /// Progress on stderr, rewritten in place only if stderr is a terminal.
    pub fn stderr() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            pending: false,
        }
    }

    /// A step that is done: always kept.
    pub fn done(&mut self, line: &str) {
        let mut err = std::io::stderr().lock();
        if self.pending {
            let _ = write!(err, "\r\x1b[2K");
            self.pending = false;
        }
        let _ = writeln!(err, "{line}");
    }

    /// What is happening now: on a terminal it replaces the previous status line; otherwise it
    /// is printed once per change of text (the caller calls it on every tick).
    pub fn waiting(&mut self, line: &str, last: &mut String) {
        if last == line {
            return;
        }
        *last = line.to_string();
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
            self.pending = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
    }
}

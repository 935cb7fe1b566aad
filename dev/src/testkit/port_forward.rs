//! `kubectl port-forward` on a local port the kernel picks (`:8080`), and HTTP GETs through it.
//!
//! The local port is kubectl's own choice, read from its "Forwarding from 127.0.0.1:PORT" line:
//! a number picked by the test and handed to kubectl could be bound by another process first
//! (another test binary's pod on the same machine), and kubectl, still listening on `[::1]`,
//! would carry on while the test's GETs to 127.0.0.1 reached that other process (seen in CI as
//! "hello from demo-2" where `demo` was asked).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Stdio};
use std::time::Duration;

use super::Run;

/// A running `kubectl port-forward`; killed (and reaped) when dropped.
pub struct PortForward {
    child: Child,
    /// The loopback port kubectl listens on.
    pub port: u16,
}

impl PortForward {
    /// Starts `run` (a `port-forward` to `:REMOTE`) and waits until kubectl says where it
    /// listens. Panics with kubectl's stderr when it ends without listening on 127.0.0.1.
    pub fn start(run: Run) -> PortForward {
        let child = run
            .command()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("kubectl port-forward runs");
        // Owned from here, so a panic below kills it.
        let mut forward = PortForward { child, port: 0 };
        let stdout = forward.child.stdout.take().expect("kubectl's stdout");
        let mut lines = BufReader::new(stdout);
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            if lines.read_line(&mut line).unwrap_or(0) == 0 {
                let mut stderr = String::new();
                if let Some(mut e) = forward.child.stderr.take() {
                    let _ = e.read_to_string(&mut stderr);
                }
                panic!("kubectl port-forward did not listen on 127.0.0.1: {seen}{stderr}");
            }
            // "Forwarding from 127.0.0.1:41234 -> 8080"
            let port = line
                .strip_prefix("Forwarding from 127.0.0.1:")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|p| p.parse().ok());
            seen.push_str(&line);
            if let Some(port) = port {
                // kubectl writes a line per forwarded connection; nobody reads them, so they
                // go to a thread that drops them rather than fill the pipe.
                std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
                forward.port = port;
                return forward;
            }
        }
    }

    /// One HTTP GET of `/` through the forwarded port: the whole answer, head and body.
    /// HTTP/1.1 and Content-Length, as curl reads it: the answer's end is in the bytes, not in
    /// the remote's close (kubectl closes a forwarded connection only once the kubelet ends
    /// the stream pair).
    pub fn get(&self) -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut reader = BufReader::new(s);
        let mut head = String::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Err(std::io::Error::other("answer ended in its headers"));
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().map_err(std::io::Error::other)?;
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        Ok(head + &String::from_utf8_lossy(&body))
    }

    /// The body of one GET, if it answered.
    pub fn body(&self) -> Option<String> {
        let answer = self.get().ok()?;
        answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
    }

    /// The whole answer of the first GET that answers in `tries` tries 100 ms apart (the
    /// first exchange waits until the session to the pod is open), if any.
    pub fn first_answer(&self, tries: usize) -> Option<String> {
        for _ in 0..tries {
            if let Ok(answer) = self.get() {
                return Some(answer);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! A container: what to run (`ContainerRun`) and one running instance of its main process, as
//! the container runtime keeps it.
//!
//! The runtime owns the process's stdio: it copies stdout and stderr into the CRI log file the
//! kubelet serves `containerLogs` from, and to any attached clients; it holds stdin open (when
//! the container has `stdin: true`) so attached clients can type into it. Each restart is a new
//! instance with its own log file (`<restart>.log`), so the previous one stays readable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, broadcast, mpsc, watch};

use super::cri_log::{self, MAX_RECORD};
use super::error::KubeletError;
use super::process::{self, OutputSource, ProcessGroup, ProcessIo, Pty, SpawnSpec, StdinSink};
use super::streams::{OutStream, TermSize};

/// A container to run: its main process and what it looks like from outside.
#[derive(Debug, Clone)]
pub struct ContainerRun {
    pub name: String,
    /// The main process's argv.
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: bool,
    pub tty: bool,
    /// Container port → the real local address that serves it.
    pub ports: Vec<(u16, SocketAddr)>,
}

/// How many output chunks an attached client may fall behind before it loses some.
const ATTACH_BACKLOG: usize = 1024;

/// A live (or finished) main process of a container.
pub struct Instance {
    pub restart: u32,
    pub log_path: PathBuf,
    running: watch::Receiver<bool>,
    log_written: watch::Receiver<u64>,
    exit_code: watch::Receiver<Option<i32>>,
    attach: broadcast::Sender<(OutStream, Bytes)>,
    stdin: Option<mpsc::Sender<Bytes>>,
    pty: Option<Arc<Pty>>,
    group: ProcessGroup,
    /// When the main process started (`container_start_time_seconds`).
    pub started_at: std::time::SystemTime,
}

/// Where an instance lives on disk and what it is called in errors.
pub struct Placement {
    pub log_path: PathBuf,
    pub cwd: PathBuf,
    pub pod_name: String,
    pub restart: u32,
}

impl Instance {
    /// Starts the main process of `spec` and the tasks that copy its output.
    pub async fn start(spec: &ContainerRun, place: Placement) -> Result<Arc<Self>, KubeletError> {
        let io_err = |what: &str, path: &std::path::Path, e: std::io::Error| {
            KubeletError::Io(format!("{what} {}: {e}", path.display()))
        };
        tokio::fs::create_dir_all(&place.cwd)
            .await
            .map_err(|e| io_err("creating", &place.cwd, e))?;
        if let Some(dir) = place.log_path.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| io_err("creating", dir, e))?;
        }
        let file = tokio::fs::File::create(&place.log_path)
            .await
            .map_err(|e| io_err("creating", &place.log_path, e))?;
        let mut env = spec.env.clone();
        env.push(("HOSTNAME".into(), place.pod_name.clone()));
        let spawned = process::spawn(&SpawnSpec {
            argv: &spec.command,
            env: &env,
            cwd: &place.cwd,
            stdin: spec.stdin,
            tty: spec.tty,
            size: None,
        })
        .map_err(|e| KubeletError::Start(spec.name.clone(), e.to_string()))?;
        let mut child = spawned.child;

        let (running_tx, running) = watch::channel(true);
        let (written_tx, log_written) = watch::channel(0u64);
        let (exit_tx, exit_code) = watch::channel(None);
        let (attach, _) = broadcast::channel(ATTACH_BACKLOG);
        let log = Arc::new(LogFile {
            file: Mutex::new(file),
            written: written_tx,
        });

        let mut sources = Vec::new();
        let mut stdin_sink = None;
        let mut pty = None;
        match spawned.io {
            ProcessIo::Pipes {
                stdin,
                stdout,
                stderr,
            } => {
                sources.push((OutStream::Stdout, OutputSource::Pipe(Box::new(stdout))));
                sources.push((OutStream::Stderr, OutputSource::Pipe(Box::new(stderr))));
                stdin_sink = stdin.map(StdinSink::Pipe);
            }
            ProcessIo::Tty(master) => {
                let master = Arc::new(master);
                // A terminal has one output stream, which the runtime logs as stdout.
                sources.push((OutStream::Stdout, OutputSource::Tty(master.clone())));
                if spec.stdin {
                    stdin_sink = Some(StdinSink::Tty(master.clone()));
                }
                pty = Some(master);
            }
        }

        let stdin = stdin_sink.map(|mut sink| {
            let (tx, mut rx) = mpsc::channel::<Bytes>(64);
            tokio::spawn(async move {
                while let Some(data) = rx.recv().await {
                    if sink.write_all(&data).await.is_err() {
                        break;
                    }
                }
            });
            tx
        });

        let pumps: Vec<_> = sources
            .into_iter()
            .map(|(stream, source)| tokio::spawn(pump(stream, source, log.clone(), attach.clone())))
            .collect();
        tokio::spawn(async move {
            for pump in pumps {
                let _ = pump.await;
            }
            let code = child.wait().await.map(process::exit_code).unwrap_or(128);
            let _ = exit_tx.send(Some(code));
            log.written.send_modify(|n| *n += 1);
            let _ = running_tx.send(false);
        });

        Ok(Arc::new(Instance {
            restart: place.restart,
            log_path: place.log_path,
            running,
            log_written,
            exit_code,
            attach,
            stdin,
            pty,
            group: spawned.group,
            started_at: std::time::SystemTime::now(),
        }))
    }

    /// The process group of the main process and everything it started (the container).
    pub fn process_group(&self) -> Option<i32> {
        self.group.id()
    }

    pub fn is_running(&self) -> bool {
        *self.running.borrow()
    }

    /// Changes to `true` → `false` once the process exited and all its output is logged.
    pub fn running(&self) -> watch::Receiver<bool> {
        self.running.clone()
    }

    /// Bumped after every write to the log file.
    pub fn log_written(&self) -> watch::Receiver<u64> {
        self.log_written.clone()
    }

    pub fn exit_code(&self) -> Option<i32> {
        *self.exit_code.borrow()
    }

    /// Live output from now on, for attach.
    pub fn subscribe(&self) -> broadcast::Receiver<(OutStream, Bytes)> {
        self.attach.subscribe()
    }

    /// The main process's stdin, if the container keeps one open.
    pub fn stdin(&self) -> Option<mpsc::Sender<Bytes>> {
        self.stdin.clone()
    }

    /// Resizes the container's terminal (tty containers only).
    pub fn resize(&self, size: TermSize) {
        if let Some(pty) = &self.pty {
            let _ = pty.resize(size);
        }
    }

    /// Kills the process and everything it started.
    pub fn kill(&self) {
        self.group.kill();
    }

    /// Asks the process and everything it started to stop (SIGTERM).
    pub fn terminate(&self) {
        self.group.terminate();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.group.kill();
    }
}

/// The log file of one instance, shared by its output pumps.
struct LogFile {
    file: Mutex<tokio::fs::File>,
    written: watch::Sender<u64>,
}

impl LogFile {
    async fn append(&self, stream: OutStream, full: bool, content: &[u8]) {
        let record = cri_log::encode(cri_log::now(), stream, full, content);
        let mut file = self.file.lock().await;
        // A full disk loses log lines, as it does for a real runtime; the process runs on.
        if file.write_all(&record).await.is_ok() && file.flush().await.is_ok() {
            self.written.send_modify(|n| *n += 1);
        }
    }
}

/// Copies one output stream to the log and to attached clients until it ends.
async fn pump(
    stream: OutStream,
    mut source: OutputSource,
    log: Arc<LogFile>,
    attach: broadcast::Sender<(OutStream, Bytes)>,
) {
    let mut lines = LineSplitter::default();
    while let Some(chunk) = source.next_chunk().await {
        // Log first: whoever saw a line through attach can then find it in the log.
        for (full, content) in lines.push(&chunk) {
            log.append(stream, full, &content).await;
        }
        // No attached client is not an error.
        let _ = attach.send((stream, chunk));
    }
    if let Some(rest) = lines.finish() {
        log.append(stream, false, &rest).await;
    }
}

/// Splits output into log records the way containerd does: one `F` record per line, `P`
/// records for pieces of lines longer than [`MAX_RECORD`] and for an unterminated end.
#[derive(Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Adds output; returns the records it completes as `(full, content)`.
    pub fn push(&mut self, data: &[u8]) -> Vec<(bool, Vec<u8>)> {
        self.pending.extend_from_slice(data);
        let mut records = Vec::new();
        loop {
            match self.pending.iter().position(|b| *b == b'\n') {
                Some(pos) if pos <= MAX_RECORD => {
                    let line: Vec<u8> = self.pending.drain(..=pos).collect();
                    records.push((true, line[..pos].to_vec()));
                }
                _ if self.pending.len() > MAX_RECORD => {
                    records.push((false, self.pending.drain(..MAX_RECORD).collect()));
                }
                _ => break,
            }
        }
        records
    }

    /// The unterminated rest at the end of output, if any.
    pub fn finish(self) -> Option<Vec<u8>> {
        (!self.pending.is_empty()).then_some(self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitter_makes_full_and_partial_records() {
        let mut s = LineSplitter::default();
        assert!(s.push(b"ab").is_empty());
        assert_eq!(
            s.push(b"c\nde\nf"),
            vec![(true, b"abc".to_vec()), (true, b"de".to_vec())]
        );
        let long = vec![b'x'; MAX_RECORD + 10];
        let recs = s.push(&long);
        assert_eq!(recs.len(), 1);
        assert!(!recs[0].0);
        assert_eq!(recs[0].1.len(), MAX_RECORD);
        assert_eq!(s.finish().unwrap().len(), 11);
    }
}

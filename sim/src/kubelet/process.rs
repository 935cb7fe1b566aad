//! Real local processes standing in for container processes.
//!
//! Every process (a container's main process or an exec) runs in its own process group, so the
//! kubelet can kill it together with everything it started: a session whose client went away or
//! a stopped kubelet must leave no orphans behind. A `tty` process gets a pseudo-terminal as its
//! controlling terminal (so `stty size` and job control work like in a container started with
//! `tty: true`); otherwise stdout and stderr are separate pipes, as the container runtime keeps
//! them.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use bytes::Bytes;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};

use super::streams::TermSize;

/// Errors from starting or driving a local process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("empty command")]
    EmptyCommand,
    #[error("opening a pseudo-terminal: {0}")]
    Pty(#[source] nix::Error),
    #[error("starting {argv0:?}: {source}")]
    Spawn {
        argv0: String,
        #[source]
        source: std::io::Error,
    },
    #[error("pseudo-terminal I/O: {0}")]
    PtyIo(#[source] std::io::Error),
}

/// What a process should be started with.
pub struct SpawnSpec<'a> {
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    pub cwd: &'a Path,
    /// Give the process a stdin it can read (a pipe, or the terminal); otherwise `/dev/null`.
    pub stdin: bool,
    pub tty: bool,
    /// The terminal size to start with (tty only).
    pub size: Option<TermSize>,
}

/// A started process: its handle, its process group and its I/O.
pub struct Spawned {
    pub child: Child,
    pub group: ProcessGroup,
    pub io: ProcessIo,
}

/// How a process's standard streams are reached.
pub enum ProcessIo {
    Pipes {
        stdin: Option<ChildStdin>,
        stdout: tokio::process::ChildStdout,
        stderr: tokio::process::ChildStderr,
    },
    Tty(Pty),
}

/// Kills a whole process group (SIGKILL) when dropped or asked to.
#[derive(Debug)]
pub struct ProcessGroup {
    pgid: Option<Pid>,
}

/// Every process group a kubelet stand-in started and has not dropped yet. Clusters that live
/// in statics (a test binary's sandbox) are never dropped, so without this their processes
/// would outlive the test process: `kill_every_group_at_exit` kills them when it exits.
static LIVE_GROUPS: std::sync::Mutex<std::collections::BTreeSet<i32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Sends SIGKILL to every process group still registered as live.
fn kill_live_groups() {
    let groups = std::mem::take(&mut *LIVE_GROUPS.lock().unwrap_or_else(|e| e.into_inner()));
    for pgid in groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Makes the process kill every process group still live when it exits normally (once).
pub fn kill_every_group_at_exit() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    extern "C" fn kill_all() {
        kill_live_groups();
    }
    // SAFETY: `kill_all` only takes a lock and sends signals; it is registered once and runs
    // at normal process exit.
    REGISTERED.call_once(|| unsafe {
        nix::libc::atexit(kill_all);
    });
}

impl ProcessGroup {
    /// The group `child` leads (it was started as a group leader), registered as live.
    fn of(child: &Child) -> ProcessGroup {
        let pgid = child.id().map(|id| Pid::from_raw(id as i32));
        if let Some(pgid) = pgid {
            LIVE_GROUPS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(pgid.as_raw());
        }
        ProcessGroup { pgid }
    }

    /// The group's id (its leader's pid), if the process started.
    pub fn id(&self) -> Option<i32> {
        self.pgid.map(Pid::as_raw)
    }

    /// Sends SIGKILL to every process in the group. Harmless if they are gone already.
    pub fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // ESRCH (no such group) just means everything already exited.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }

    /// Asks the process and everything it started to stop (SIGTERM), as a runtime stops a
    /// container before its grace period runs out.
    pub fn terminate(&self) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(pgid, Signal::SIGTERM);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
        if let Some(pgid) = self.pgid {
            LIVE_GROUPS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&pgid.as_raw());
        }
    }
}

/// Starts `spec.argv` as a new process group leader.
pub fn spawn(spec: &SpawnSpec<'_>) -> Result<Spawned, ProcessError> {
    let (program, args) = spec.argv.split_first().ok_or(ProcessError::EmptyCommand)?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(spec.cwd)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .kill_on_drop(true);
    let spawn_err = |source| ProcessError::Spawn {
        argv0: program.clone(),
        source,
    };
    if spec.tty {
        let winsize = spec.size.map(TermSize::to_winsize);
        let pair = nix::pty::openpty(winsize.as_ref(), None).map_err(ProcessError::Pty)?;
        let slave = pair.slave;
        cmd.stdin(Stdio::from(slave.try_clone().map_err(spawn_err)?))
            .stdout(Stdio::from(slave.try_clone().map_err(spawn_err)?))
            .stderr(Stdio::from(slave));
        // SAFETY: the closure runs in the forked child before exec and only makes two
        // async-signal-safe system calls (setsid, ioctl) on file descriptor 0.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                // Make the terminal on stdin our controlling terminal, as a container runtime
                // does for a tty container, so job control and SIGWINCH reach the process.
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        // Our copies of the slave side were moved into `cmd`; drop it so that the master sees
        // EOF (EIO) once the process and its children have closed the terminal.
        drop(cmd);
        let group = ProcessGroup::of(&child);
        let pty = Pty::new(pair.master).map_err(ProcessError::PtyIo)?;
        Ok(Spawned {
            child,
            group,
            io: ProcessIo::Tty(pty),
        })
    } else {
        cmd.process_group(0)
            .stdin(if spec.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let group = ProcessGroup::of(&child);
        let stdin = child.stdin.take();
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(spawn_err(std::io::Error::other("missing output pipes")));
        };
        Ok(Spawned {
            child,
            group,
            io: ProcessIo::Pipes {
                stdin,
                stdout,
                stderr,
            },
        })
    }
}

/// The exit code the way a container runtime reports it: the code, or 128 + signal number.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 128,
    }
}

/// The master side of a pseudo-terminal, readable and writable from async code.
pub struct Pty {
    master: AsyncFd<OwnedFd>,
}

impl Pty {
    fn new(master: OwnedFd) -> std::io::Result<Self> {
        let flags = nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_SETFL(flags))?;
        // SAFETY: `master` is an open descriptor we own; the AsyncFd owns it from here on,
        // so it stays open and unchanged for the AsyncFd's whole lifetime.
        let master = unsafe { AsyncFd::register(master) }.map_err(|e| e.into_parts().1)?;
        Ok(Self { master })
    }

    /// Reads terminal output; `Ok(0)` once every process closed the terminal.
    pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.master.readable().await?;
            match guard
                .try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(std::io::Error::from))
            {
                Ok(Ok(n)) => return Ok(n),
                // Linux reports a hung-up terminal as EIO: that is the end of output.
                Ok(Err(err)) if err.raw_os_error() == Some(nix::libc::EIO) => return Ok(0),
                Ok(Err(err)) => return Err(err),
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `data` as terminal input.
    pub async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.master.writable().await?;
            match guard
                .try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from))
            {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(err)) => return Err(err),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Sets the terminal size (TIOCSWINSZ); the kernel sends SIGWINCH to the foreground group.
    pub fn resize(&self, size: TermSize) -> std::io::Result<()> {
        let winsize = size.to_winsize();
        // SAFETY: TIOCSWINSZ reads one `winsize` struct from the pointer, which outlives the call.
        let rc = unsafe {
            nix::libc::ioctl(
                self.master.get_ref().as_raw_fd(),
                nix::libc::TIOCSWINSZ as _,
                &winsize as *const nix::pty::Winsize,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Where process input goes: a pipe or the terminal.
pub enum StdinSink {
    Pipe(ChildStdin),
    Tty(std::sync::Arc<Pty>),
}

impl StdinSink {
    pub async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            StdinSink::Pipe(pipe) => {
                pipe.write_all(data).await?;
                pipe.flush().await
            }
            StdinSink::Tty(pty) => pty.write_all(data).await,
        }
    }

    /// Ends the input. A pipe is closed; a terminal gets the EOF character (^D), which is
    /// what a reader on a terminal in canonical mode sees as end of input.
    pub async fn close(self) {
        match self {
            StdinSink::Pipe(mut pipe) => {
                let _ = pipe.shutdown().await;
            }
            StdinSink::Tty(pty) => {
                let _ = pty.write_all(&[0x04]).await;
            }
        }
    }
}

/// A source of process output: a pipe or the terminal.
pub enum OutputSource {
    Pipe(Box<dyn AsyncRead + Send + Unpin>),
    Tty(std::sync::Arc<Pty>),
}

impl OutputSource {
    /// The next chunk of output, or `None` at the end.
    pub async fn next_chunk(&mut self) -> Option<Bytes> {
        let mut buf = vec![0u8; 32 * 1024];
        let n = match self {
            OutputSource::Pipe(pipe) => pipe.read(&mut buf).await.ok()?,
            OutputSource::Tty(pty) => pty.read(&mut buf).await.ok()?,
        };
        if n == 0 {
            return None;
        }
        buf.truncate(n);
        Some(Bytes::from(buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        })
    }

    #[tokio::test]
    async fn a_group_never_dropped_is_killed_by_the_exit_hook() {
        let argv = [
            "sh".to_string(),
            "-c".into(),
            "sleep 1000 & exec sleep 1000".into(),
        ];
        let spawned = spawn(&SpawnSpec {
            argv: &argv,
            env: &[],
            cwd: Path::new("/"),
            stdin: false,
            tty: false,
            size: None,
        })
        .expect("spawns");
        let pgid = spawned.group.id().expect("a group");
        // Like a cluster in a static: its handles are never dropped.
        let Spawned { child, group, io } = spawned;
        std::mem::forget(group);
        std::mem::forget(io);
        std::mem::forget(child);
        assert!(alive(pgid));
        kill_live_groups();
        // Wait for the kill to land (bounded against a hang).
        for _ in 0..500 {
            if !alive(pgid) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(!alive(pgid), "the group's leader is gone");
        assert!(!LIVE_GROUPS.lock().unwrap().contains(&pgid));
    }
}

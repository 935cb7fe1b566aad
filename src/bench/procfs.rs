//! Reads one process's resident memory, open file descriptors and CPU time from `/proc`.
//!
//! relaylet and the reference relay run as their own processes so that these numbers are
//! theirs alone, not the benchmark's (which also hosts the simulated clusters and the clients).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

fn proc_path(pid: u32, rest: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{rest}"))
}

/// Resident set size (`VmRSS` of `/proc/<pid>/status`), KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let path = proc_path(pid, "status");
    let status =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in {}", path.display()))
}

/// Number of open file descriptors (entries of `/proc/<pid>/fd`).
pub fn fd_count(pid: u32) -> anyhow::Result<u64> {
    let path = proc_path(pid, "fd");
    let entries =
        std::fs::read_dir(&path).with_context(|| format!("listing {}", path.display()))?;
    Ok(entries.filter(|e| e.is_ok()).count() as u64)
}

/// CPU time the process's live threads have used: the sum of the first field of every
/// `/proc/<pid>/task/<tid>/schedstat` (nanoseconds on CPU).
///
/// `utime + stime` of `/proc/<pid>/stat` counts in 10 ms ticks, too coarse for a sample that
/// lasts a fraction of a second; schedstat is exact. Threads that exited are not counted, which
/// is fine here: both relays do their work on long-lived Tokio worker threads.
pub fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let path = proc_path(pid, "task");
    let tasks = std::fs::read_dir(&path).with_context(|| format!("listing {}", path.display()))?;
    let mut total: u64 = 0;
    for task in tasks.flatten() {
        let file = task.path().join("schedstat");
        // A thread may exit between listing and reading: skip it.
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let ns: u64 = text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("unreadable {}", file.display()))?;
        total = total.saturating_add(ns);
    }
    Ok(Duration::from_nanos(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(rss_kib(pid).unwrap() > 0);
        assert!(fd_count(pid).unwrap() >= 3);
        let before = cpu_time(pid).unwrap();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_time(pid).unwrap() > before);
    }
}

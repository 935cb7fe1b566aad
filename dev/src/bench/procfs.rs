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

/// CPU time (user + system) of `pid` and every process below it: the whole system a benchmark
/// route runs on when everything is started from one process.
pub fn tree_cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            // Fields after the command's closing parenthesis: state, ppid, ...
            if let Some(ppid) = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|f| f.parse::<u32>().ok())
            {
                parents.push((p, ppid));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    let mut total = Duration::ZERO;
    for p in tree {
        // A process may end between listing and reading.
        if let Ok(t) = cpu_time(p) {
            total += t;
        }
    }
    Ok(total)
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

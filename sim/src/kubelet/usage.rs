//! What cAdvisor tells a kubelet about its containers, and the kubelet's `/metrics/resource`
//! built from it: the endpoint metrics-server scrapes.
//!
//! A container here is its main process's process group, so its CPU time and memory are the
//! sums over the processes in that group, read from `/proc`: CPU from every thread's
//! `schedstat` (nanoseconds on a CPU, as precise as a cgroup's `cpuacct`; the 10 ms ticks of
//! `stat` would show a sleeping container as 0, which metrics-server drops), memory the resident
//! set (standing in for the cgroup's working set). The node's figures are the sum of its
//! containers: this node runs nothing else. Each sample is stamped with the time it was read,
//! which is what metrics-server computes CPU rates from.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use super::pods::Pods;

/// The Content-Type kubelets answer `/metrics/resource` with.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// One process group's usage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Cumulative CPU time, user and system, in core-seconds.
    pub cpu_seconds: f64,
    /// Resident memory in bytes.
    pub memory_bytes: u64,
}

impl Usage {
    fn add(&mut self, other: Usage) {
        self.cpu_seconds += other.cpu_seconds;
        self.memory_bytes += other.memory_bytes;
    }
}

/// Nanoseconds on a CPU of every thread of `pid`, if the kernel keeps scheduler statistics.
fn schedstat_seconds(proc_dir: &std::path::Path) -> Option<f64> {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir(proc_dir.join("task")).ok()?.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

/// From one `/proc/<pid>/stat` line: (process group, CPU clock ticks, resident pages).
fn parse_stat(line: &str) -> Option<(i32, u64, u64)> {
    // The command name (field 2) may hold spaces and parentheses; what follows the last `)`
    // is fields 3.. (proc(5)).
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    let pgrp = field(5)?.parse().ok()?;
    let utime: u64 = field(14)?.parse().ok()?;
    let stime: u64 = field(15)?.parse().ok()?;
    let rss: u64 = field(24)?.parse().ok()?;
    Some((pgrp, utime + stime, rss))
}

/// Clock ticks per second and bytes per page, as the kernel reports them in `/proc`.
fn units() -> (f64, u64) {
    use nix::unistd::{SysconfVar, sysconf};
    let ticks = sysconf(SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100);
    let page = sysconf(SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096);
    (ticks.max(1) as f64, page.max(1) as u64)
}

/// The usage of every process group in `groups`, from one pass over `/proc`.
pub fn read_groups(groups: &[i32]) -> Vec<Usage> {
    let (ticks, page) = units();
    let mut usage = vec![Usage::default(); groups.len()];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return usage;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process may exit between listing and reading: it then counts for nothing.
        let Ok(line) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((pgrp, cpu_ticks, pages)) = parse_stat(&line) else {
            continue;
        };
        if let Some(i) = groups.iter().position(|g| *g == pgrp) {
            usage[i].add(Usage {
                cpu_seconds: schedstat_seconds(&entry.path()).unwrap_or(cpu_ticks as f64 / ticks),
                memory_bytes: pages * page,
            });
        }
    }
    usage
}

/// One container's row of `/metrics/resource`.
struct Row {
    namespace: String,
    pod: String,
    container: String,
    started: f64,
    usage: Usage,
}

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Escapes a label value for the Prometheus text format.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `/metrics/resource` for the running containers of `pods`, in the kubelet's format
/// (Prometheus text 0.0.4, every sample stamped with the time it was read).
pub fn resource_metrics(pods: &Pods) -> String {
    let mut rows = Vec::new();
    let mut groups = Vec::new();
    for ((namespace, name), pod) in pods.all() {
        for c in &pod.containers {
            let Some(instance) = c.current().filter(|i| i.is_running()) else {
                continue;
            };
            let Some(group) = instance.process_group() else {
                continue;
            };
            groups.push(group);
            rows.push(Row {
                namespace: namespace.clone(),
                pod: name.clone(),
                container: c.spec.name.clone(),
                started: seconds(instance.started_at),
                usage: Usage::default(),
            });
        }
    }
    for (row, usage) in rows.iter_mut().zip(read_groups(&groups)) {
        row.usage = usage;
    }
    rows.sort_by(|a, b| {
        (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container))
    });
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    encode(&rows, now)
}

fn encode(rows: &[Row], now_ms: u128) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, String)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value} {now_ms}");
        }
    };
    let container = |r: &Row| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(&r.container),
            escape(&r.namespace),
            escape(&r.pod)
        )
    };
    let per_container = |f: &dyn Fn(&Row) -> String| -> Vec<(String, String)> {
        rows.iter().map(|r| (container(r), f(r))).collect()
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        per_container(&|r| r.usage.cpu_seconds.to_string()),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        per_container(&|r| r.usage.memory_bytes.to_string()),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        per_container(&|r| r.started.to_string()),
    );
    let mut node = Usage::default();
    let mut pods: Vec<((String, String), Usage)> = Vec::new();
    for r in rows {
        node.add(r.usage);
        let key = (r.namespace.clone(), r.pod.clone());
        match pods.last_mut() {
            Some((k, u)) if *k == key => u.add(r.usage),
            _ => pods.push((key, r.usage)),
        }
    }
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        vec![(String::new(), node.cpu_seconds.to_string())],
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        vec![(String::new(), node.memory_bytes.to_string())],
    );
    let pod = |(ns, name): &(String, String)| {
        format!("{{namespace=\"{}\",pod=\"{}\"}}", escape(ns), escape(name))
    };
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        pods.iter()
            .map(|(k, u)| (pod(k), u.cpu_seconds.to_string()))
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        pods.iter()
            .map(|(k, u)| (pod(k), u.memory_bytes.to_string()))
            .collect(),
    );
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE resource_scrape_error gauge");
    let _ = writeln!(out, "resource_scrape_error 0");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// A child process killed and reaped when dropped, so a failing assertion never leaves it
    /// running (a spinning shell left by a failed run took half a core for an hour).
    struct Reaped(std::process::Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_stat_line_with_spaces_and_parentheses_in_the_name_parses() {
        let line = "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 123 10000000 321 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(line), Some((4242, 300, 321)));
    }

    #[test]
    fn a_sleeping_process_has_some_cpu_time_already() {
        let child = Reaped(
            std::process::Command::new("sleep")
                .arg("60")
                .process_group(0)
                .spawn()
                .expect("sleep starts"),
        );
        let group = child.0.id() as i32;
        let mut usage = Usage::default();
        // exec itself puts the process on a CPU; wait for it to have run.
        for _ in 0..500 {
            usage = read_groups(&[group])[0];
            if usage.cpu_seconds > 0.0 && usage.memory_bytes > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(child);
        assert!(
            usage.cpu_seconds > 0.0 && usage.cpu_seconds < 1.0,
            "{usage:?}"
        );
        assert!(usage.memory_bytes > 0, "{usage:?}");
    }

    #[test]
    fn a_busy_process_group_shows_cpu_time_and_memory() {
        // A shell that spins until killed: its group accrues CPU time; compare two reads.
        let child = Reaped(
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .process_group(0)
                .spawn()
                .expect("sh starts"),
        );
        let group = child.0.id() as i32;
        // A process just exec'd has no pages resident until it first runs, which on a busy
        // machine can be a while: wait for that too.
        let mut first = read_groups(&[group])[0];
        for _ in 0..500 {
            if first.memory_bytes > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            first = read_groups(&[group])[0];
        }
        assert!(first.memory_bytes > 0, "a live process has resident memory");
        let mut later = first;
        // Wait for the event (CPU time moving), bounded against a hang.
        for _ in 0..500 {
            later = read_groups(&[group])[0];
            if later.cpu_seconds > first.cpu_seconds {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(child);
        assert!(
            later.cpu_seconds > first.cpu_seconds,
            "{first:?} then {later:?}"
        );
        assert_eq!(read_groups(&[i32::MAX]), vec![Usage::default()]);
    }

    #[test]
    fn the_text_has_every_family_with_sample_timestamps() {
        let rows = vec![
            Row {
                namespace: "default".into(),
                pod: "a".into(),
                container: "main".into(),
                started: 1.5,
                usage: Usage {
                    cpu_seconds: 2.0,
                    memory_bytes: 100,
                },
            },
            Row {
                namespace: "default".into(),
                pod: "a".into(),
                container: "side\"car".into(),
                started: 1.5,
                usage: Usage {
                    cpu_seconds: 0.5,
                    memory_bytes: 20,
                },
            },
        ];
        let text = encode(&rows, 1_000);
        assert!(text.contains(
            "container_cpu_usage_seconds_total{container=\"main\",namespace=\"default\",pod=\"a\"} 2 1000\n"
        ));
        assert!(text.contains(
            "container_memory_working_set_bytes{container=\"side\\\"car\",namespace=\"default\",pod=\"a\"} 20 1000\n"
        ));
        assert!(text.contains("node_cpu_usage_seconds_total 2.5 1000\n"));
        assert!(text.contains("node_memory_working_set_bytes 120 1000\n"));
        assert!(
            text.contains(
                "pod_memory_working_set_bytes{namespace=\"default\",pod=\"a\"} 120 1000\n"
            )
        );
        assert!(text.contains("container_start_time_seconds{container=\"main\",namespace=\"default\",pod=\"a\"} 1.5 1000\n"));
        assert!(text.ends_with("resource_scrape_error 0\n"));
    }
}

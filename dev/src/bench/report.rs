//! One measured figure, the statistics that produce it, how it is printed (a table, or one
//! JSON object per line with `--json`), and the targets checked against the figures.

use serde_json::json;

/// Which way a figure's ratio points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Throughputs and rates: ratio = relayed / limit.
    Higher,
    /// Latencies and CPU cost: ratio = limit / relayed.
    Lower,
    /// Memory and descriptor counts: no ratio.
    NoRatio,
}

/// One row of the result.
#[derive(Debug, Clone)]
pub struct Figure {
    pub name: String,
    pub unit: &'static str,
    pub direct: Option<f64>,
    pub limit: Option<f64>,
    pub relayed: Option<f64>,
    pub ratio: Option<f64>,
    /// Samples behind each median.
    pub n: usize,
}

impl Figure {
    /// A figure from per-route samples; each value is the median of its samples, and `n` is
    /// the largest sample count of the three.
    pub fn from_samples(
        name: &str,
        unit: &'static str,
        better: Better,
        direct: &[f64],
        limit: &[f64],
        relayed: &[f64],
    ) -> Figure {
        let (d, l, r) = (median(direct), median(limit), median(relayed));
        let ratio = match (better, l, r) {
            (Better::Higher, Some(l), Some(r)) if l > 0.0 => Some(r / l),
            (Better::Lower, Some(l), Some(r)) if r > 0.0 => Some(l / r),
            _ => None,
        };
        Figure {
            name: name.to_string(),
            unit,
            direct: d,
            limit: l,
            relayed: r,
            ratio,
            n: direct.len().max(limit.len()).max(relayed.len()),
        }
    }

    /// The `--json` line.
    pub fn json(&self) -> String {
        json!({
            "name": self.name,
            "unit": self.unit,
            "direct": self.direct.map(round),
            "limit": self.limit.map(round),
            "relayed": self.relayed.map(round),
            "ratio": self.ratio.map(|r| (r * 1000.0).round() / 1000.0),
            "n": self.n,
        })
        .to_string()
    }
}

/// Two decimals are more than these measurements can tell apart.
fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The median (mean of the middle two for an even count); `None` without samples.
pub fn median(samples: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    })
}

/// The nearest-rank percentile `p` (0-100) of `samples`.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The figures as a Markdown table.
pub fn table(figures: &[Figure]) -> String {
    let cell = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
    let mut out = String::from(
        "| figure | unit | direct | limit | relayed | ratio | n |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for f in figures {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            f.name,
            f.unit,
            cell(f.direct),
            cell(f.limit),
            cell(f.relayed),
            f.ratio
                .map(|r| format!("{r:.3}"))
                .unwrap_or_else(|| "-".into()),
            f.n
        ));
    }
    out
}

/// How far relaylet's RSS may sit above its baseline after every session closed and still count
/// as back to baseline.
const RSS_NOISE_KIB: f64 = 4096.0;

/// The targets, each judged against the figures: one line per target.
pub fn targets(figures: &[Figure]) -> Vec<String> {
    let find = |name: &str| figures.iter().find(|f| f.name == name);
    let verdict = |ok: Option<bool>| match ok {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    };
    let mut lines = Vec::new();
    for name in [
        "exec_stdout_throughput",
        "portforward_throughput",
        "logs_follow_throughput",
        "exec_setup_rate",
    ] {
        let ratio = find(name).and_then(|f| f.ratio);
        lines.push(format!(
            "{name}: ratio {} >= 0.95: {}",
            ratio
                .map(|r| format!("{r:.3}"))
                .unwrap_or_else(|| "-".into()),
            verdict(ratio.map(|r| r >= 0.95))
        ));
    }
    if let Some(f) = find("exec_rtt_p99") {
        let vs_limit = f.relayed.zip(f.limit).map(|(r, l)| r - l);
        let vs_direct = f.relayed.zip(f.direct).map(|(r, d)| r - d);
        lines.push(format!(
            "exec_rtt_p99: relayed - limit = {} us <= 50: {}; relayed - direct = {} us <= 150: {}",
            fmt(vs_limit),
            verdict(vs_limit.map(|v| v <= 50.0)),
            fmt(vs_direct),
            verdict(vs_direct.map(|v| v <= 150.0)),
        ));
    }
    if let Some(f) = find("cpu_per_gib") {
        let factor = f.relayed.zip(f.limit).map(|(r, l)| r / l);
        lines.push(format!(
            "cpu_per_gib: relayed / limit = {} <= 1.10: {}",
            factor
                .map(|v| format!("{v:.3}"))
                .unwrap_or_else(|| "-".into()),
            verdict(factor.map(|v| v <= 1.10))
        ));
    }
    for f in figures
        .iter()
        .filter(|f| f.name.starts_with("idle_session_memory_"))
    {
        lines.push(format!(
            "{}: {} KiB/session <= 48: {}",
            f.name,
            fmt(f.relayed),
            verdict(f.relayed.map(|v| v <= 48.0))
        ));
    }
    if let Some(f) = find("after_close_fd_growth") {
        lines.push(format!(
            "after_close_fd_growth: {} fds (target: none): {}",
            fmt(f.relayed),
            verdict(f.relayed.map(|v| v <= 0.0))
        ));
    }
    if let Some(f) = find("after_close_rss_growth") {
        // RSS moves by a few pages on its own (thread stacks, timer wheels, log buffers).
        lines.push(format!(
            "after_close_rss_growth: {} KiB (target: back to baseline, within {RSS_NOISE_KIB} KiB): {}",
            fmt(f.relayed),
            verdict(f.relayed.map(|v| v <= RSS_NOISE_KIB))
        ));
    }
    if let Some(f) = find("second_cycle_rss_growth") {
        lines.push(format!(
            "second_cycle_rss_growth: {} KiB (diagnostic: a leak would grow by about the per-session figure times the sessions)",
            fmt(f.relayed)
        ));
    }
    lines
}

fn fmt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_percentiles_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        let f = Figure::from_samples("t", "MiB/s", Better::Higher, &[10.0], &[8.0], &[6.0]);
        assert_eq!(f.ratio, Some(0.75));
        let f = Figure::from_samples("l", "us", Better::Lower, &[], &[50.0], &[100.0]);
        assert_eq!(f.ratio, Some(0.5));
        assert_eq!(f.direct, None);
        let f = Figure::from_samples("m", "KiB", Better::NoRatio, &[], &[], &[40.0, 42.0]);
        assert_eq!((f.ratio, f.n), (None, 2));
        assert!(f.json().contains("\"ratio\":null"));
    }
}

//! Timestamps as Kubernetes writes them (RFC 3339, whole seconds, UTC) and the short ages
//! (`5m`, `3h12m`) that server-side tables print.

use jiff::Timestamp;

/// Now, as `metav1.Time` serializes it: `YYYY-MM-DDTHH:MM:SSZ`.
pub fn now() -> String {
    format(Timestamp::now())
}

/// `ts` in `metav1.Time` form.
pub fn format(ts: Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Age of an RFC 3339 timestamp, the way kubectl's AGE column shows it; `<unknown>` when absent
/// or unparsable, like upstream's printers.
pub fn age(timestamp: Option<&str>) -> String {
    let Some(ts) = timestamp.and_then(|t| t.parse::<Timestamp>().ok()) else {
        return "<unknown>".to_string();
    };
    let seconds = Timestamp::now().as_second() - ts.as_second();
    human(seconds)
}

/// Upstream's `duration.HumanDuration`: coarser units as durations grow, two units at most.
pub fn human(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let (d, h) = (hours / 24, hours % 24);
        return if h == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{h}h")
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    let years = hours / 24 / 365;
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{d}d")
        };
    }
    format!("{years}y")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_upstream_buckets() {
        assert_eq!(human(5), "5s");
        assert_eq!(human(119), "119s");
        assert_eq!(human(125), "2m5s");
        assert_eq!(human(600), "10m");
        assert_eq!(human(3 * 3600 + 60), "3h1m");
        assert_eq!(human(9 * 3600), "9h");
        assert_eq!(human(3 * 86400 + 3600), "3d1h");
        assert_eq!(human(30 * 86400), "30d");
        assert_eq!(human(3 * 365 * 86400 + 86400), "3y1d");
    }

    #[test]
    fn timestamps_round_trip() {
        let s = now();
        assert!(s.ends_with('Z') && s.len() == 20, "{s}");
        let age = age(Some(&s));
        assert!(age == "0s" || age == "1s", "{age}");
        assert_eq!(super::age(None), "<unknown>");
    }
}

//! Reading environment variables: every bad value is collected, so all of them are reported
//! at once, one line each naming its variable; and the Go-style durations Kubernetes users know.

use std::fmt;
use std::time::Duration;

/// One bad environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarError {
    pub var: &'static str,
    pub message: String,
}

impl fmt::Display for VarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.var, self.message)
    }
}

/// All the bad variables found, one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError(pub Vec<VarError>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, err) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "invalid configuration: {err}")?;
        }
        Ok(())
    }
}

/// Reads variables and collects what is wrong with them.
pub(super) struct Vars<'a> {
    pub(super) lookup: &'a dyn Fn(&str) -> Option<String>,
    pub(super) errors: Vec<VarError>,
}

impl Vars<'_> {
    /// The variable's value; empty counts as unset, as Kubernetes manifests often leave it.
    pub(super) fn get(&self, var: &str) -> Option<String> {
        (self.lookup)(var).filter(|v| !v.trim().is_empty())
    }

    pub(super) fn error(&mut self, var: &'static str, message: &str) {
        self.errors.push(VarError {
            var,
            message: message.to_string(),
        });
    }

    /// Parses a value; on failure records the error and yields `fallback` so that checking can
    /// go on and report every bad variable at once.
    pub(super) fn parse<T>(
        &mut self,
        var: &'static str,
        raw: &str,
        fallback: T,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> T {
        match parse(raw.trim()) {
            Ok(value) => value,
            Err(message) => {
                self.error(var, &message);
                fallback
            }
        }
    }

    /// A boolean: `true`/`1` or `false`/`0`.
    pub(super) fn flag(&mut self, var: &'static str, default: bool) -> bool {
        match self.get(var) {
            None => default,
            Some(raw) => self.parse(var, &raw, default, |v| match v {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(format!("{v:?} is not true or false")),
            }),
        }
    }

    pub(super) fn count(&mut self, var: &'static str, default: usize) -> usize {
        match self.get(var) {
            None => default,
            Some(raw) => self.parse(var, &raw, default, |v| match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("{v:?} is not a whole number greater than zero")),
            }),
        }
    }

    pub(super) fn duration(&mut self, var: &'static str, default: Duration) -> Duration {
        match self.get(var) {
            None => default,
            Some(raw) => self.parse(var, &raw, default, |v| {
                let d = parse_duration(v)?;
                if d.is_zero() {
                    Err("must be greater than zero".to_string())
                } else {
                    Ok(d)
                }
            }),
        }
    }
}

/// Parses a Go-style duration (`4h`, `30s`, `1h30m`, `500ms`), the form Kubernetes users know
/// from kubelet flags.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let bad = || format!("{v:?} is not a duration like 30s, 4h or 1h30m");
    if v.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = v;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        total = total
            .checked_add(Duration::try_from_secs_f64(number * seconds).map_err(|_| bad())?)
            .ok_or_else(bad)?;
    }
    Ok(total)
}

/// Writes a duration the way [`parse_duration`] reads it, shortest form: `4h`, `1h30m`, `2s`,
/// `1.5s`, `500ms` (for messages users compare with their settings).
pub fn format_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let total = d.as_secs();
    let (hours, minutes, seconds) = (total / 3600, total / 60 % 60, total % 60);
    let millis = d.subsec_millis();
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    if millis > 0 {
        let fraction = format!("{millis:03}");
        out.push_str(&format!("{seconds}.{}s", fraction.trim_end_matches('0')));
    } else if seconds > 0 {
        out.push_str(&format!("{seconds}s"));
    }
    out
}

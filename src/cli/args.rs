//! The flags of an operator's command: `--name value` or `--name=value`, and switches; each
//! command says which it takes, so a typo is an error naming the flag, never ignored.

use std::collections::BTreeMap;
use std::time::Duration;

/// A command's flags, parsed.
#[derive(Debug, Default)]
pub struct Flags {
    values: BTreeMap<String, String>,
}

/// What a command takes: flags with a value and switches (no value).
pub struct Takes<'a> {
    pub values: &'a [&'a str],
    pub switches: &'a [&'a str],
}

impl Flags {
    /// Parses `args` (after the command's name).
    pub fn parse(args: &[String], takes: &Takes<'_>) -> anyhow::Result<Flags> {
        let mut flags = Flags::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let Some(flag) = arg.strip_prefix("--") else {
                anyhow::bail!("unexpected argument {arg:?} (flags start with --)");
            };
            let (name, inline) = match flag.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (flag, None),
            };
            if takes.switches.contains(&name) {
                if inline.is_some() {
                    anyhow::bail!("--{name} takes no value");
                }
                flags.values.insert(name.to_string(), String::new());
            } else if takes.values.contains(&name) {
                let value = match inline {
                    Some(value) => value,
                    None => args
                        .next()
                        .cloned()
                        .ok_or_else(|| anyhow::anyhow!("--{name} needs a value"))?,
                };
                flags.values.insert(name.to_string(), value);
            } else {
                anyhow::bail!("unknown flag --{name}");
            }
        }
        Ok(flags)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn required(&self, name: &str) -> anyhow::Result<&str> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| anyhow::anyhow!("--{name} is required"))
    }

    pub fn switch(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// A duration flag (`90s`, `2m`, `24h`), or `default`.
    pub fn duration(&self, name: &str, default: Duration) -> anyhow::Result<Duration> {
        match self.get(name) {
            None => Ok(default),
            Some(text) => parse_duration(text).ok_or_else(|| {
                anyhow::anyhow!(
                    "--{name} {text:?}: a duration is a number and s, m or h (90s, 2m, 24h)"
                )
            }),
        }
    }
}

/// `90s`, `2m`, `24h` (one unit; what kubectl's `--duration` and `--timeout` users write).
fn parse_duration(text: &str) -> Option<Duration> {
    let unit = text.chars().last()?;
    let number: u64 = text[..text.len() - unit.len_utf8()].parse().ok()?;
    let seconds = match unit {
        's' => number,
        'm' => number.checked_mul(60)?,
        'h' => number.checked_mul(3600)?,
        _ => return None,
    };
    (seconds > 0).then(|| Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAKES: Takes<'static> = Takes {
        values: &["name", "timeout"],
        switches: &["no-wait"],
    };

    fn parse(args: &[&str]) -> anyhow::Result<Flags> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Flags::parse(&args, &TAKES)
    }

    #[test]
    fn values_switches_and_mistakes() {
        let flags = parse(&["--name", "a", "--timeout=2m", "--no-wait"]).unwrap();
        assert_eq!(flags.get("name"), Some("a"));
        assert!(flags.switch("no-wait"));
        assert_eq!(
            flags.duration("timeout", Duration::from_secs(1)).unwrap(),
            Duration::from_secs(120)
        );
        for (args, error) in [
            (&["--nmae", "a"][..], "unknown flag --nmae"),
            (&["--name"][..], "--name needs a value"),
            (&["--no-wait=yes"][..], "--no-wait takes no value"),
            (
                &["name"][..],
                "unexpected argument \"name\" (flags start with --)",
            ),
        ] {
            assert_eq!(parse(args).unwrap_err().to_string(), error);
        }
        assert_eq!(
            parse(&[])
                .unwrap()
                .required("name")
                .unwrap_err()
                .to_string(),
            "--name is required"
        );
    }

    #[test]
    fn durations() {
        for (text, secs) in [("90s", Some(90)), ("2m", Some(120)), ("24h", Some(86_400))] {
            assert_eq!(
                parse_duration(text),
                secs.map(Duration::from_secs),
                "{text}"
            );
        }
        for text in ["", "s", "10", "0s", "1d", "-1s", "1.5h"] {
            assert_eq!(parse_duration(text), None, "{text}");
        }
    }
}

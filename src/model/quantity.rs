//! Kubernetes resource quantities (`4`, `3800m`, `16Gi`, `1e3`) as exact integers, so leaf
//! capacity can be summed and pod requests subtracted without floating-point drift.

use std::fmt;

/// A quantity in thousandths of the base unit (1 CPU = 1000, 1 byte = 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Milli(pub i128);

/// A quantity string that is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a resource quantity")]
pub struct QuantityError(pub String);

impl Milli {
    /// Parses a quantity. Fractions below a thousandth round up, as Kubernetes rounds requests.
    pub fn parse(s: &str) -> Result<Milli, QuantityError> {
        let bad = || QuantityError(s.to_string());
        let s = s.trim();
        let (negative, body) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s.strip_prefix('+').unwrap_or(s)),
        };
        let number_end = body
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(body.len());
        let (number, suffix) = body.split_at(number_end);
        if number.is_empty() || number == "." {
            return Err(bad());
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        // The value as digits / 10^scale.
        let digits: String = format!("{int_part}{frac_part}");
        if digits.len() > 30 {
            return Err(bad());
        }
        let mantissa: i128 = digits.parse().map_err(|_| bad())?;
        let mut scale = frac_part.len() as i32;

        // Multiplier as (numerator, extra decimal exponent).
        let (binary, exponent): (i128, i32) = match suffix {
            "" => (1, 0),
            "n" => (1, -9),
            "u" => (1, -6),
            "m" => (1, -3),
            "k" => (1, 3),
            "M" => (1, 6),
            "G" => (1, 9),
            "T" => (1, 12),
            "P" => (1, 15),
            "E" => (1, 18),
            "Ki" => (1 << 10, 0),
            "Mi" => (1 << 20, 0),
            "Gi" => (1 << 30, 0),
            "Ti" => (1 << 40, 0),
            "Pi" => (1 << 50, 0),
            "Ei" => (1 << 60, 0),
            exp if exp.starts_with(['e', 'E']) => {
                let e: i32 = exp[1..].parse().map_err(|_| bad())?;
                if !(-30..=30).contains(&e) {
                    return Err(bad());
                }
                (1, e)
            }
            _ => return Err(bad()),
        };
        // Milli-units: multiply by 1000 (exponent + 3).
        scale -= exponent + 3;
        let mut value = mantissa.checked_mul(binary).ok_or_else(bad)?;
        if scale < 0 {
            value = value
                .checked_mul(10i128.checked_pow((-scale) as u32).ok_or_else(bad)?)
                .ok_or_else(bad)?;
        } else if scale > 0 {
            let divisor = 10i128.checked_pow(scale as u32).ok_or_else(bad)?;
            // Round up: 0.1m of CPU is still a request.
            value = (value + divisor - 1) / divisor;
        }
        Ok(Milli(if negative { -value } else { value }))
    }

    pub fn saturating_sub(self, other: Milli) -> Milli {
        Milli(self.0.saturating_sub(other.0).max(0))
    }
}

impl std::ops::Add for Milli {
    type Output = Milli;
    fn add(self, other: Milli) -> Milli {
        Milli(self.0.saturating_add(other.0))
    }
}

impl std::ops::AddAssign for Milli {
    fn add_assign(&mut self, other: Milli) {
        *self = *self + other;
    }
}

impl fmt::Display for Milli {
    /// Whole units print plainly (`16`, `17179869184`), others in milli (`3800m`): both are
    /// canonical Kubernetes forms.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 % 1000 == 0 {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> i128 {
        Milli::parse(s).unwrap().0
    }

    #[test]
    fn decimal_binary_and_exponent_forms() {
        assert_eq!(m("4"), 4000);
        assert_eq!(m("3800m"), 3800);
        assert_eq!(m("0.5"), 500);
        assert_eq!(m("1.5k"), 1_500_000);
        assert_eq!(m("16Gi"), 16 * (1 << 30) * 1000);
        assert_eq!(m("128974848"), 128_974_848_000);
        assert_eq!(m("129e6"), 129_000_000_000);
        assert_eq!(m("123Mi"), 123 * (1 << 20) * 1000);
        assert_eq!(m("100n"), 1); // rounds up
        assert_eq!(m("-2"), -2000);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "m",
            ".",
            "1x",
            "1.2.3",
            "Gi",
            "1e99",
            "99999999999999999999999999999999Ei",
        ] {
            assert!(Milli::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prints_canonical_forms() {
        assert_eq!(Milli(4000).to_string(), "4");
        assert_eq!(Milli(3800).to_string(), "3800m");
        assert_eq!(
            (Milli::parse("1Gi").unwrap() + Milli::parse("512Mi").unwrap()).to_string(),
            "1610612736"
        );
        assert_eq!(Milli(1000).saturating_sub(Milli(3000)), Milli(0));
    }
}

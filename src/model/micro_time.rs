//! Lease times as the apiserver keeps them: `MicroTime`, to the microsecond. A time written
//! with nanoseconds comes back cut to microseconds, so a writer that compares what it wrote
//! with what it reads back, or keeps renewals in order, works on the cut value from the start.

use k8s_openapi::jiff::Timestamp;

/// `t` cut to the microsecond, as a `MicroTime` field stores it.
pub fn to_microsecond(t: Timestamp) -> Timestamp {
    Timestamp::from_microsecond(t.as_microsecond()).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanoseconds_are_cut_never_rounded_up() {
        let t = Timestamp::from_nanosecond(1_800_000_000_123_456_789).unwrap();
        assert_eq!(
            to_microsecond(t),
            Timestamp::from_nanosecond(1_800_000_000_123_456_000).unwrap()
        );
        assert_eq!(to_microsecond(to_microsecond(t)), to_microsecond(t));
    }
}

//! When a leaf's loop runs its rounds: every `period`, and at once when something needs it,
//! with every regular round on a grid shared by the whole process.
//!
//! Each loop's schedule starts when its leaf is registered, so a fleet's loops have phases
//! spread over the registration; unaligned, 1,000 loops ticking every 2 s would wake the
//! runtime about 500 times a second. On a 100-ms grid the rounds of many loops fall on the
//! same instant and share one wake-up, while a fleet's writes stay spread over the period.

use std::time::Duration;

use tokio::time::{Instant, Interval};

/// The grid regular rounds fall on: every `STEP` from the moment the process's controller
/// started.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    epoch: Instant,
}

const STEP: Duration = Duration::from_millis(100);

impl Grid {
    /// A grid starting now.
    pub fn starting_now() -> Grid {
        Grid {
            epoch: Instant::now(),
        }
    }

    /// `at`, or the first point of the grid after it.
    fn at_or_after(self, at: Instant) -> Instant {
        let into = at.saturating_duration_since(self.epoch).as_nanos() % STEP.as_nanos();
        if into == 0 {
            at
        } else {
            at + (STEP - Duration::from_nanos(into as u64))
        }
    }
}

/// One loop's round schedule.
pub(super) struct Rounds {
    interval: Interval,
    period: Duration,
    grid: Grid,
}

impl Rounds {
    /// Rounds every `period` on `grid`, the first at once.
    pub(super) fn every(period: Duration, grid: Grid) -> Rounds {
        Rounds {
            interval: tokio::time::interval(period),
            period,
            grid,
        }
    }

    /// Waits for the next round; returns when it was due (what the round judges by).
    pub(super) async fn next(&mut self) -> Instant {
        let due = self.interval.tick().await;
        // A round that ran past the next one's time is followed by one round, not a burst.
        let next = (due + self.period).max(Instant::now());
        self.interval.reset_at(self.grid.at_or_after(next));
        due
    }

    /// Makes the next round come at once.
    pub(super) fn now(&mut self) {
        self.interval.reset_immediately();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_secs(2);

    #[tokio::test(start_paused = true)]
    async fn rounds_fall_on_the_grid_whenever_the_loop_started() {
        let grid = Grid::starting_now();
        let since = |t: Instant| t - grid.epoch;
        tokio::time::sleep(Duration::from_millis(37)).await;
        let mut a = Rounds::every(PERIOD, grid);
        tokio::time::sleep(Duration::from_millis(1_261)).await;
        let mut b = Rounds::every(PERIOD, grid);
        // The first round of each is when it started, off the grid; the next ones are on it.
        assert_eq!(since(a.next().await), Duration::from_millis(37));
        assert_eq!(since(b.next().await), Duration::from_millis(1_298));
        assert_eq!(since(a.next().await), Duration::from_millis(2_100));
        assert_eq!(since(b.next().await), Duration::from_millis(3_300));
        assert_eq!(since(a.next().await), Duration::from_millis(4_100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_asked_for_comes_at_once_and_the_next_on_the_grid() {
        let grid = Grid::starting_now();
        let since = |t: Instant| t - grid.epoch;
        let mut rounds = Rounds::every(PERIOD, grid);
        assert_eq!(since(rounds.next().await), Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(750)).await;
        rounds.now();
        assert_eq!(since(rounds.next().await), Duration::from_millis(750));
        assert_eq!(since(rounds.next().await), Duration::from_millis(2_800));
        assert_eq!(since(rounds.next().await), Duration::from_millis(4_800));
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_that_ran_long_is_followed_by_one_not_a_burst() {
        let grid = Grid::starting_now();
        let since = |t: Instant| t - grid.epoch;
        let mut rounds = Rounds::every(PERIOD, grid);
        rounds.next().await;
        tokio::time::sleep(Duration::from_millis(5_050)).await;
        // Due at 2 s, run at 5.05 s; the next is on the grid after that.
        assert_eq!(since(rounds.next().await), Duration::from_millis(2_000));
        assert_eq!(since(rounds.next().await), Duration::from_millis(5_100));
    }
}

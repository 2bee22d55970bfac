//! How fast this instance reads buckets for queries and rolls up the hours
//! marked late: what reading a query's marked buckets would take, and about
//! when the catch-up ends. Measured, never assumed: until a figure is
//! known, queries read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Reads shorter than this many documents say little about the pace.
const MIN_SAMPLE: u64 = 20;
/// When the catch-up's own pace is not known yet: a retry this much later.
pub(super) const UNKNOWN_CATCH_UP: Duration = Duration::from_secs(10);

/// Moving averages, in nanoseconds per item (0: not measured yet).
#[derive(Debug, Default)]
pub(super) struct Pace {
    /// Per bucket document a query read.
    bucket: AtomicU64,
    /// Per series-hour the upkeep rolled up.
    series_hour: AtomicU64,
    /// Series-hours marked late at the last count.
    late: AtomicU64,
}

fn record(cell: &AtomicU64, items: u64, elapsed: Duration) {
    if items < MIN_SAMPLE {
        return;
    }
    let sample = u64::try_from(elapsed.as_nanos() / u128::from(items)).unwrap_or(u64::MAX);
    let sample = sample.max(1);
    // A quarter of each new sample: a few reads follow a change of load.
    let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
        Some(if old == 0 {
            sample
        } else {
            old / 4 * 3 + sample / 4
        })
    });
}

fn per(cell: &AtomicU64, items: u64) -> Option<Duration> {
    match cell.load(Ordering::Acquire) {
        0 => None,
        ns => Some(Duration::from_nanos(ns.saturating_mul(items))),
    }
}

impl Pace {
    pub(super) fn read_buckets(&self, documents: u64, elapsed: Duration) {
        record(&self.bucket, documents, elapsed);
    }

    pub(super) fn rolled_up(&self, series_hours: u64, elapsed: Duration) {
        record(&self.series_hour, series_hours, elapsed);
    }

    pub(super) fn set_late(&self, series_hours: u64) {
        self.late.store(series_hours, Ordering::Release);
    }

    /// Series-hours marked late at the last count.
    pub(super) fn late(&self) -> u64 {
        self.late.load(Ordering::Acquire)
    }

    /// How long reading `documents` buckets takes at the measured pace.
    pub(super) fn reading(&self, documents: u64) -> Option<Duration> {
        per(&self.bucket, documents)
    }

    /// How long rolling up `series_hours` takes at the measured pace (a
    /// second a hundred before it is measured).
    pub(super) fn rolling_up(&self, series_hours: u64) -> Duration {
        per(&self.series_hour, series_hours).unwrap_or(Duration::from_millis(10 * series_hours))
    }

    /// About when the hours marked at the last count are rolled up.
    pub(super) fn catch_up(&self) -> Duration {
        per(&self.series_hour, self.late.load(Ordering::Acquire)).unwrap_or(UNKNOWN_CATCH_UP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_estimated_before_a_read_worth_measuring() {
        let pace = Pace::default();
        assert_eq!(pace.reading(1000), None);
        pace.read_buckets(MIN_SAMPLE - 1, Duration::from_secs(1));
        assert_eq!(pace.reading(1000), None);
        assert_eq!(pace.catch_up(), UNKNOWN_CATCH_UP);
    }

    #[test]
    fn estimates_follow_the_measured_pace() {
        let pace = Pace::default();
        pace.read_buckets(1000, Duration::from_millis(500));
        assert_eq!(pace.reading(2000), Some(Duration::from_secs(1)));
        // A quarter of a new sample twice as slow.
        pace.read_buckets(1000, Duration::from_millis(1000));
        assert_eq!(pace.reading(1000), Some(Duration::from_millis(625)));
        pace.rolled_up(500, Duration::from_secs(1));
        pace.set_late(1500);
        assert_eq!(pace.catch_up(), Duration::from_secs(3));
    }
}

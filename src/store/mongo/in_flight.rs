//! The hours this instance's flushes under way write into, counted for as
//! long as each flush lives.

use crate::domain::BucketUpdate;
use crate::store::rollup::schedule::HOUR;

/// The hours written by flushes of this instance under way: a flush marks
/// the ended ones late when it ends, so rolling one of them up for quiet
/// before then would be done twice. Any other hour may be rolled up while
/// flushes go on (a backfill's older hours, while it writes newer ones).
#[derive(Debug, Default)]
pub(super) struct InFlight(std::sync::Mutex<std::collections::BTreeMap<i64, usize>>);

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<i64, usize>> {
        // Nothing panics while it is held: the map is whole.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a flush under way writes into `hour`.
    pub(super) fn writes(&self, hour: i64) -> bool {
        self.lock().contains_key(&hour)
    }
}

/// The hours of one flush, counted in [`InFlight`] for as long as it lives
/// (a flush cancelled midway counts no more).
pub(super) struct Flushing<'a> {
    in_flight: &'a InFlight,
    hours: Vec<i64>,
}

impl<'a> Flushing<'a> {
    pub(super) fn enter(in_flight: &'a InFlight, updates: &[&BucketUpdate]) -> Self {
        let mut hours: Vec<i64> = updates
            .iter()
            .map(|u| u.key.start - u.key.start.rem_euclid(HOUR))
            .collect();
        hours.sort_unstable();
        hours.dedup();
        let mut map = in_flight.lock();
        for &h in &hours {
            *map.entry(h).or_default() += 1;
        }
        drop(map);
        Self { in_flight, hours }
    }
}

impl Drop for Flushing<'_> {
    fn drop(&mut self) {
        let mut map = self.in_flight.lock();
        for h in &self.hours {
            if let Some(n) = map.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    map.remove(h);
                }
            }
        }
    }
}

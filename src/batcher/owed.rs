//! The hours this instance's batcher still owes writes to: buckets pending
//! or being written, counted per hour. The rollup upkeep reads it to roll an
//! ended hour up as soon as its last bucket is written, not after a quiet
//! that a journaled backfill never leaves (`store::mongo::rollup`).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Seconds in an hour: the unit rollups are made of.
const HOUR: i64 = 3600;

/// Buckets held per hour (pending or in flight), shared between the
/// batcher's core, which counts them, and the upkeep, which asks.
#[derive(Debug, Default)]
pub struct OwedHours {
    hours: Mutex<BTreeMap<i64, usize>>,
    /// Woken when an hour is no longer owed.
    paid: tokio::sync::Notify,
}

fn hour_of(start: i64) -> i64 {
    start - start.rem_euclid(HOUR)
}

impl OwedHours {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, usize>> {
        // Nothing panics while it is held: the map is whole.
        self.hours
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a bucket of the hour beginning at `hour` is still to be
    /// written by this instance.
    pub fn owes(&self, hour: i64) -> bool {
        self.lock().contains_key(&hour_of(hour))
    }

    /// Resolves once an hour is no longer owed (or was since the last wait).
    pub async fn paid(&self) {
        self.paid.notified().await;
    }

    /// The oldest hour owed, if any.
    pub fn oldest(&self) -> Option<i64> {
        self.lock().keys().next().copied()
    }

    /// The hours owed, oldest first (for tests and diagnostics).
    pub fn hours(&self) -> Vec<i64> {
        self.lock().keys().copied().collect()
    }

    /// A bucket starting at `start` is now held.
    pub(super) fn add(&self, start: i64) {
        *self.lock().entry(hour_of(start)).or_default() += 1;
    }

    /// A bucket starting at `start` is settled (stored, dead-lettered or
    /// given up): no longer owed.
    pub(super) fn settle(&self, start: i64) {
        let mut map = self.lock();
        let hour = hour_of(start);
        if let Some(n) = map.get_mut(&hour) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&hour);
                drop(map);
                self.paid.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_hour_is_owed_until_its_last_bucket_is_settled() {
        let owed = OwedHours::default();
        owed.add(7200 + 60);
        owed.add(7200 + 120);
        owed.add(3600);
        assert!(owed.owes(7200) && owed.owes(7200 + 3599) && owed.owes(3600));
        owed.settle(7200 + 60);
        assert!(owed.owes(7200), "one bucket of it is still held");
        owed.settle(7200 + 120);
        assert!(!owed.owes(7200));
        assert_eq!(owed.hours(), vec![3600]);
    }

    #[tokio::test]
    async fn paying_an_hour_wakes_a_waiter() {
        let owed = std::sync::Arc::new(OwedHours::default());
        owed.add(0);
        let waiter = tokio::spawn({
            let owed = owed.clone();
            async move { owed.paid().await }
        });
        owed.settle(0);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("joined");
    }
}

//! The in-memory batcher between the ingestors and storage.
//!
//! [`Batcher`] is the pure, synchronous core: readings in, one [`BucketUpdate`]
//! per touched bucket out, with `now` passed in by the caller. The async
//! [`driver`] owns the timer, the store and shutdown, and answers the writers
//! waiting for their readings to be stored.

pub mod driver;

use std::time::Duration;

use hashbrown::HashMap;
use tokio::time::Instant;

use crate::domain::{BucketKey, BucketKeyRef, BucketUpdate, Granularity, Reading};

/// When a batch closes and how much the batcher may hold.
#[derive(Debug, Clone, Copy)]
pub struct BatcherLimits {
    /// A batch closes this long after its first reading arrived.
    pub flush_interval: Duration,
    /// A batch closes as soon as it holds this many values.
    pub max_pending_readings: usize,
    /// Pending plus in-flight values never exceed this; beyond it input is refused.
    pub max_buffered_readings: usize,
    /// Distinct buckets pending plus in flight never exceed this: a flood of
    /// new sensor ids is refused instead of becoming a flood of documents.
    pub max_buckets: usize,
}

/// The batcher is at a bound: the caller must refuse the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the batcher holds {held} {what} and takes at most {limit}")]
pub struct Full {
    /// `"readings"` or `"buckets"`.
    pub what: &'static str,
    pub held: usize,
    pub limit: usize,
}

/// A closed batch, ready for one write to storage.
#[derive(Debug)]
pub struct Batch<W> {
    /// One update per bucket touched since the previous batch.
    pub updates: Vec<BucketUpdate>,
    /// Everyone waiting for these readings to be stored.
    pub waiters: Vec<W>,
    /// Distinct (bucket, second) values in the batch.
    pub values: usize,
    /// Readings accepted into the batch, overwritten ones included.
    pub readings: usize,
}

/// What the driver needs to know after an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered {
    /// The flush deadline changed or the batch is full: the driver must look again.
    pub wake_driver: bool,
}

/// The pure core: coalesces readings per bucket, last write wins per second.
///
/// `W` is whatever a writer waits on (a oneshot sender in the service); the core
/// only carries it to the batch that stores the writer's readings.
#[derive(Debug)]
pub struct Batcher<W> {
    granularity: Granularity,
    limits: BatcherLimits,
    pending: HashMap<BucketKey, Vec<(u16, f64)>>,
    pending_values: usize,
    pending_readings: usize,
    in_flight_values: usize,
    in_flight_buckets: usize,
    waiters: Vec<W>,
    /// When the first reading of the open batch arrived.
    opened_at: Option<Instant>,
    /// Someone waits on the open batch and asked for it not to wait the interval.
    hurried: bool,
}

impl<W> Batcher<W> {
    pub fn new(granularity: Granularity, limits: BatcherLimits) -> Self {
        Self {
            granularity,
            limits,
            pending: HashMap::new(),
            pending_values: 0,
            pending_readings: 0,
            in_flight_values: 0,
            in_flight_buckets: 0,
            waiters: Vec::new(),
            opened_at: None,
            hurried: false,
        }
    }

    /// Values held: pending and in flight.
    pub fn buffered(&self) -> usize {
        self.pending_values + self.in_flight_values
    }

    pub fn pending_values(&self) -> usize {
        self.pending_values
    }

    /// Buckets held: pending and in flight.
    pub fn buckets(&self) -> usize {
        self.pending.len() + self.in_flight_buckets
    }

    /// Adds all of `readings` or none of them.
    ///
    /// Refuses when the readings might not fit under the memory bound (the
    /// check counts every reading as a new value, so the bound holds even when
    /// none of them overwrite) or would open more buckets than allowed.
    pub fn offer(
        &mut self,
        readings: Vec<Reading<'_>>,
        waiter: Option<W>,
        now: Instant,
    ) -> Result<Offered, Full> {
        let n = readings.len();
        let limit = self.limits.max_buffered_readings;
        if self.buffered().saturating_add(n) > limit {
            return Err(Full {
                what: "readings",
                held: self.buffered(),
                limit,
            });
        }
        self.check_buckets(&readings)?;
        let was_empty = self.opened_at.is_none();
        if n > 0 && was_empty {
            self.opened_at = Some(now);
        }
        for r in readings {
            self.insert(r);
        }
        self.pending_readings += n;
        if let Some(w) = waiter {
            self.waiters.push(w);
        }
        let full = self.pending_values >= self.limits.max_pending_readings;
        Ok(Offered {
            wake_driver: (was_empty && n > 0) || full,
        })
    }

    fn key<'r>(&self, r: &'r Reading<'_>) -> BucketKeyRef<'r> {
        BucketKeyRef {
            sensor: r.sensor.as_str(),
            metric: r.metric.as_str(),
            start: self.granularity.bucket_start(r.ts),
        }
    }

    fn check_buckets(&self, readings: &[Reading<'_>]) -> Result<(), Full> {
        let limit = self.limits.max_buckets;
        let held = self.buckets();
        // Fast path: even if every reading opened a bucket, they would fit.
        if held.saturating_add(readings.len()) <= limit {
            return Ok(());
        }
        let mut new: hashbrown::HashSet<BucketKeyRef<'_>> = hashbrown::HashSet::new();
        for r in readings {
            let key = self.key(r);
            if !self.pending.contains_key(&key) {
                new.insert(key);
                if held + new.len() > limit {
                    return Err(Full {
                        what: "buckets",
                        held,
                        limit,
                    });
                }
            }
        }
        Ok(())
    }

    fn insert(&mut self, r: Reading<'_>) {
        let start = self.granularity.bucket_start(r.ts);
        let offset = self.granularity.offset(r.ts);
        let key = BucketKeyRef {
            sensor: r.sensor.as_str(),
            metric: r.metric.as_str(),
            start,
        };
        let values = match self.pending.get_mut(&key) {
            Some(values) => values,
            None => self
                .pending
                .entry(BucketKey {
                    sensor: r.sensor.into_owned(),
                    metric: r.metric.into_owned(),
                    start,
                })
                .or_default(),
        };
        // Readings mostly arrive in time order: check the end before searching.
        match values.last_mut() {
            Some(last) if last.0 == offset => last.1 = r.value,
            Some(last) if last.0 < offset => {
                values.push((offset, r.value));
                self.pending_values += 1;
            }
            None => {
                values.push((offset, r.value));
                self.pending_values += 1;
            }
            Some(_) => match values.binary_search_by_key(&offset, |&(o, _)| o) {
                Ok(i) => values[i].1 = r.value,
                Err(i) => {
                    values.insert(i, (offset, r.value));
                    self.pending_values += 1;
                }
            },
        }
    }

    /// Makes the open batch due now. Returns whether there is one (and so the
    /// driver must look again).
    pub fn hurry(&mut self) -> bool {
        self.hurried = self.opened_at.is_some();
        self.hurried
    }

    /// When the open batch must be flushed, if there is one.
    pub fn deadline(&self) -> Option<Instant> {
        let opened = self.opened_at?;
        if self.hurried || self.pending_values >= self.limits.max_pending_readings {
            Some(opened)
        } else {
            Some(opened + self.limits.flush_interval)
        }
    }

    pub fn is_due(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| d <= now)
    }

    /// Closes the open batch (whether due or not) and counts it as in flight.
    pub fn take(&mut self) -> Option<Batch<W>> {
        self.opened_at.take()?;
        self.hurried = false;
        let updates: Vec<BucketUpdate> = self
            .pending
            .drain()
            .map(|(key, values)| BucketUpdate { key, values })
            .collect();
        let values = std::mem::take(&mut self.pending_values);
        self.in_flight_values += values;
        self.in_flight_buckets += updates.len();
        Some(Batch {
            updates,
            waiters: std::mem::take(&mut self.waiters),
            values,
            readings: std::mem::take(&mut self.pending_readings),
        })
    }

    /// A batch taken earlier is done with (stored or given up): frees its room.
    pub fn complete(&mut self, values: usize, buckets: usize) {
        self.in_flight_values = self.in_flight_values.saturating_sub(values);
        self.in_flight_buckets = self.in_flight_buckets.saturating_sub(buckets);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{MetricName, SensorId};
    use proptest::prelude::*;
    use std::collections::HashMap as StdMap;

    const LIMITS: BatcherLimits = BatcherLimits {
        flush_interval: Duration::from_secs(1),
        max_pending_readings: 1000,
        max_buffered_readings: 2000,
        max_buckets: 1000,
    };

    fn reading(sensor: &str, ts: i64, value: f64) -> Reading<'static> {
        Reading {
            sensor: SensorId::parse(sensor.to_owned()).expect("valid sensor"),
            metric: MetricName::default_metric(),
            ts,
            value,
        }
    }

    #[test]
    fn readings_for_one_bucket_become_one_update_with_the_last_value_per_second() {
        let mut b: Batcher<u32> = Batcher::new(Granularity::Minute, LIMITS);
        let now = Instant::now();
        let rs = vec![
            reading("s1", 125, 1.0),
            reading("s1", 121, 2.0),
            reading("s1", 125, 3.0),
            reading("s1", 179, 4.0),
        ];
        b.offer(rs, Some(7), now).expect("room");
        let batch = b.take().expect("a batch");
        assert_eq!(batch.updates.len(), 1);
        assert_eq!(batch.updates[0].key.start, 120);
        assert_eq!(batch.updates[0].values, vec![(1, 2.0), (5, 3.0), (59, 4.0)]);
        assert_eq!((batch.values, batch.readings), (3, 4));
        assert_eq!(batch.waiters, vec![7]);
        assert!(b.take().is_none());
    }

    #[test]
    fn hour_buckets_key_seconds_by_offset_in_the_hour() {
        let mut b: Batcher<()> = Batcher::new(Granularity::Hour, LIMITS);
        b.offer(vec![reading("s", 3600 + 61, 1.0)], None, Instant::now())
            .expect("room");
        let batch = b.take().expect("a batch");
        assert_eq!(batch.updates[0].key.start, 3600);
        assert_eq!(batch.updates[0].values, vec![(61, 1.0)]);
    }

    #[test]
    fn a_batch_is_due_after_the_flush_interval_or_when_full() {
        let limits = BatcherLimits {
            max_pending_readings: 3,
            ..LIMITS
        };
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, limits);
        let t0 = Instant::now();
        assert_eq!(b.deadline(), None);
        let o = b.offer(vec![reading("a", 1, 1.0)], None, t0).expect("room");
        assert!(o.wake_driver, "the first reading sets a deadline");
        assert!(!b.is_due(t0 + Duration::from_millis(999)));
        assert!(b.is_due(t0 + Duration::from_secs(1)));
        let o = b.offer(vec![reading("a", 2, 1.0)], None, t0).expect("room");
        assert!(!o.wake_driver);
        let o = b.offer(vec![reading("b", 2, 1.0)], None, t0).expect("room");
        assert!(o.wake_driver, "a full batch wakes the driver");
        assert!(b.is_due(t0));
    }

    #[test]
    fn a_hurried_batch_is_due_at_once_and_the_next_one_is_not() {
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
        let t0 = Instant::now();
        assert!(!b.hurry(), "nothing to hurry");
        b.offer(vec![reading("a", 1, 1.0)], None, t0).expect("room");
        assert!(b.hurry());
        assert!(b.is_due(t0));
        b.take().expect("batch");
        b.offer(vec![reading("a", 2, 1.0)], None, t0).expect("room");
        assert!(!b.is_due(t0), "hurrying applied to the batch that was open");
    }

    #[test]
    fn input_beyond_the_memory_bound_is_refused_whole_and_changes_nothing() {
        let limits = BatcherLimits {
            max_pending_readings: 2,
            max_buffered_readings: 3,
            ..LIMITS
        };
        let mut b: Batcher<u8> = Batcher::new(Granularity::Minute, limits);
        let now = Instant::now();
        b.offer(
            (0..2i32).map(|i| reading("a", i64::from(i), 1.0)).collect(),
            Some(1),
            now,
        )
        .expect("room");
        let batch = b.take().expect("batch");
        // In-flight values still count against the bound.
        let err = b
            .offer(
                (0..2i32).map(|i| reading("b", i64::from(i), 1.0)).collect(),
                Some(2),
                now,
            )
            .expect_err("over the bound");
        assert_eq!(
            err,
            Full {
                what: "readings",
                held: 2,
                limit: 3
            }
        );
        assert_eq!(b.pending_values(), 0);
        assert!(b.take().is_none(), "the refused offer left nothing behind");
        b.complete(batch.values, batch.updates.len());
        b.offer(
            (0..3i32).map(|i| reading("b", i64::from(i), 1.0)).collect(),
            Some(3),
            now,
        )
        .expect("room after the flush completed");
    }

    #[test]
    fn readings_that_would_open_too_many_buckets_are_refused_whole() {
        let limits = BatcherLimits {
            max_buckets: 3,
            ..LIMITS
        };
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, limits);
        let now = Instant::now();
        // Two buckets, many readings: fine.
        let two: Vec<_> = (0..100)
            .map(|i| reading(if i % 2 == 0 { "a" } else { "b" }, i % 60, 1.0))
            .collect();
        b.offer(two, None, now).expect("two buckets fit");
        // Existing buckets do not count again; one new one fits.
        b.offer(vec![reading("a", 1, 2.0), reading("c", 1, 1.0)], None, now)
            .expect("one new bucket fits");
        let err = b
            .offer(vec![reading("a", 2, 1.0), reading("d", 1, 1.0)], None, now)
            .expect_err("a fourth bucket");
        assert_eq!(
            err,
            Full {
                what: "buckets",
                held: 3,
                limit: 3
            }
        );
        let batch = b.take().expect("batch");
        assert_eq!(batch.updates.len(), 3, "the refused offer added nothing");
        // In-flight buckets still count until their batch completes.
        assert!(b.offer(vec![reading("d", 1, 1.0)], None, now).is_err());
        b.complete(batch.values, batch.updates.len());
        b.offer(vec![reading("d", 1, 1.0)], None, now)
            .expect("room after the flush");
    }

    proptest! {
        /// Whatever the interleaving of offers and flushes, applying the batches in
        /// order gives exactly the last value written per (sensor, second).
        #[test]
        fn batches_applied_in_order_equal_last_write_wins(
            ops in prop::collection::vec(
                prop_oneof![
                    4 => prop::collection::vec((0..3usize, 0..200i64, -5..5i32), 1..20).prop_map(Some),
                    1 => Just(None),
                ],
                1..40,
            )
        ) {
            let sensors = ["a", "b", "c"];
            let mut b: Batcher<usize> = Batcher::new(Granularity::Minute, LIMITS);
            let mut model: StdMap<(usize, i64), f64> = StdMap::new();
            let mut stored: StdMap<(String, i64), f64> = StdMap::new();
            let now = Instant::now();
            let apply = |batch: Batch<usize>, stored: &mut StdMap<(String, i64), f64>| {
                let mut keys = std::collections::HashSet::new();
                for u in &batch.updates {
                    assert!(keys.insert(u.key.clone()), "one update per bucket per batch");
                    assert!(u.values.windows(2).all(|w| w[0].0 < w[1].0));
                    for &(off, v) in &u.values {
                        stored.insert((u.key.sensor.to_string(), u.key.start + i64::from(off)), v);
                    }
                }
                batch.values
            };
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Some(rs) => {
                        for &(s, ts, v) in &rs { model.insert((s, ts), f64::from(v)); }
                        let readings: Vec<_> = rs.iter().map(|&(s, ts, v)| reading(sensors[s], ts, f64::from(v))).collect();
                        b.offer(readings, Some(i), now).expect("room");
                    }
                    None => if let Some(batch) = b.take() {
                        let (n, k) = (batch.values, batch.updates.len());
                        apply(batch, &mut stored);
                        b.complete(n, k);
                    },
                }
                prop_assert!(b.buffered() <= LIMITS.max_buffered_readings);
            }
            if let Some(batch) = b.take() { let (n, k) = (batch.values, batch.updates.len()); apply(batch, &mut stored); b.complete(n, k); }
            prop_assert_eq!(b.buffered(), 0);
            let expected: StdMap<(String, i64), f64> =
                model.into_iter().map(|((s, ts), v)| ((sensors[s].to_owned(), ts), v)).collect();
            prop_assert_eq!(stored, expected);
        }
    }
}

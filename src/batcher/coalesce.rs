//! The pure core: readings taken in, coalesced per bucket with last write
//! wins per second, under the limits; deciding what is due and settling it
//! is `flush`, answering queries `pending`.

use std::collections::BTreeMap;

use hashbrown::HashMap;
use tokio::time::Instant;

use super::batch::{Full, Offered, UnstoredValue};
use super::limits::{BatcherLimits, Hold};
use super::owed::OwedHours;
use crate::domain::{BucketKey, BucketKeyRef, Granularity, Reading};
use std::time::Duration;

#[derive(Debug)]
pub(super) struct Open {
    /// Each second's value with when it was acknowledged (epoch ms), by
    /// offset: one vector, so an insert touches one allocation, not two
    /// (apart, they were two cache misses an insert on a fleet's buckets).
    pub(super) values: Vec<UnstoredValue>,
    /// The earliest of `acks`.
    pub(super) min_ack: i64,
    pub(super) tickets: Vec<u64>,
    pub(super) readings: usize,
    /// When the first reading since the bucket's last write arrived.
    pub(super) since: Instant,
    /// Goes out with the open batch: it has readings that are not in the
    /// journal, or a writer waits on it.
    pub(super) prompt: bool,
    /// When its held readings must be written at the latest.
    pub(super) held_due: Option<Instant>,
    /// Held readings per origin: what settling this bucket frees in the journal.
    pub(super) origins: Vec<(u64, u32)>,
}

/// Room a new bucket's values start with: a bucket that gathers readings
/// over a flush interval or a hold grows past the 4 a vector starts with,
/// and every growth is a reallocation and a copy on the insert path.
const INITIAL_VALUES: usize = 16;

impl Open {
    /// Puts a second's value acknowledged at `ack`, unless a later
    /// acknowledgement holds it; returns whether the second is new here.
    pub(super) fn put(&mut self, offset: u16, value: f64, ack: i64) -> bool {
        self.min_ack = self.min_ack.min(ack);
        let values = &mut self.values;
        // Readings mostly arrive in time order: check the end before searching.
        let at = match values.last() {
            Some(last) if last.0 == offset => Ok(values.len() - 1),
            Some(last) if last.0 < offset => Err(values.len()),
            None => Err(0),
            Some(_) => values.binary_search_by_key(&offset, |&(o, _, _)| o),
        };
        match at {
            Ok(i) => {
                let v = &mut values[i];
                if ack >= v.2 {
                    v.1 = value;
                    v.2 = ack;
                }
                false
            }
            Err(i) => {
                values.insert(i, (offset, value, ack));
                true
            }
        }
    }

    /// An empty bucket about to take `readings` readings.
    pub(super) fn new(since: Instant, readings: usize) -> Self {
        Self {
            values: Vec::with_capacity(readings.max(INITIAL_VALUES)),
            min_ack: i64::MAX,
            tickets: Vec::new(),
            readings: 0,
            since,
            prompt: false,
            held_due: None,
            origins: Vec::new(),
        }
    }
}

/// How a reading enters the core.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    Prompt { ticket: Option<u64> },
    Held { origin: u64, unix_ms: i64 },
}

#[derive(Debug)]
pub(super) struct Waiting<W> {
    pub(super) waiter: W,
    /// Buckets of this writer not settled yet.
    pub(super) buckets: usize,
    pub(super) dead: Vec<BucketKey>,
    pub(super) unstored: bool,
}

/// The pure core: coalesces readings per bucket, last write wins per second,
/// decides when each bucket is written, and answers each writer once every
/// bucket it touched is settled.
///
/// `W` is whatever a writer waits on (a oneshot sender in the service); the core
/// hands it back with the writer's result.
#[derive(Debug)]
pub struct Batcher<W> {
    pub(super) granularity: Granularity,
    pub(super) limits: BatcherLimits,
    pub(super) pending: HashMap<BucketKey, Open>,
    pub(super) pending_values: usize,
    pub(super) in_flight_values: usize,
    pub(super) in_flight_buckets: usize,
    pub(super) waiting: HashMap<u64, Waiting<W>>,
    pub(super) next_ticket: u64,
    /// When the first prompt reading of the open batch arrived.
    pub(super) opened_at: Option<Instant>,
    /// Prompt readings since the open batch opened.
    pub(super) prompt_readings: usize,
    /// Someone waits on the open batch and asked for it not to wait the interval.
    pub(super) hurried: bool,
    /// No held bucket is due before this (a lower bound, exact after a take).
    pub(super) next_held_due: Option<Instant>,
    /// Held readings not settled yet, per origin.
    pub(super) outstanding: BTreeMap<u64, u64>,
    /// The size of the last held offer refused for room: pressure frees
    /// enough for it.
    pub(super) wanted: usize,
    /// The earliest acknowledgement of each bucket in flight.
    pub(super) in_flight_acks: BTreeMap<i64, usize>,
    /// Buckets held per hour, for the rollup upkeep (see [`OwedHours`]).
    pub(super) owed: std::sync::Arc<OwedHours>,
}

impl<W> Batcher<W> {
    pub fn new(granularity: Granularity, limits: BatcherLimits) -> Self {
        Self {
            granularity,
            limits,
            pending: HashMap::new(),
            pending_values: 0,
            in_flight_values: 0,
            in_flight_buckets: 0,
            waiting: HashMap::new(),
            next_ticket: 0,
            opened_at: None,
            prompt_readings: 0,
            hurried: false,
            next_held_due: None,
            outstanding: BTreeMap::new(),
            wanted: 0,
            in_flight_acks: BTreeMap::new(),
            owed: std::sync::Arc::default(),
        }
    }

    /// The hours whose buckets this core holds, as the upkeep sees them.
    pub fn owed_hours(&self) -> std::sync::Arc<OwedHours> {
        self.owed.clone()
    }

    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    /// Values held: pending and in flight.
    pub fn buffered(&self) -> usize {
        self.pending_values + self.in_flight_values
    }

    pub fn pending_values(&self) -> usize {
        self.pending_values
    }

    /// Readings pending that are not in the journal (overwritten ones
    /// included, as `readings` counts them).
    pub fn pending_unjournaled(&self) -> usize {
        self.pending
            .values()
            .map(|o| {
                let journaled: usize = o.origins.iter().map(|&(_, n)| n as usize).sum();
                o.readings.saturating_sub(journaled)
            })
            .sum()
    }

    /// Buckets held: pending and in flight.
    pub fn buckets(&self) -> usize {
        self.pending.len() + self.in_flight_buckets
    }

    /// Writers waiting for an answer.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The lowest origin with held readings not yet settled: every reading of
    /// a lower origin that was offered is stored or dead-lettered.
    pub fn lowest_unsettled_origin(&self) -> Option<u64> {
        self.outstanding.first_key_value().map(|(&o, _)| o)
    }

    /// The earliest acknowledgement among the values held, pending or in
    /// flight: no value acknowledged before it waits here. A scan of the
    /// pending buckets, once a second or so.
    pub fn oldest_ack(&self) -> Option<i64> {
        let pending = self.pending.values().map(|o| o.min_ack).min();
        let in_flight = self.in_flight_acks.first_key_value().map(|(&a, _)| a);
        match (pending, in_flight) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the oldest held reading not yet settled arrived (pending buckets
    /// only: in-flight ones are moments from settling). A scan: for metrics.
    pub fn oldest_held_since(&self) -> Option<Instant> {
        self.pending
            .values()
            .filter(|o| !o.origins.is_empty())
            .map(|o| o.since)
            .min()
    }

    /// Adds all of `readings` or none of them, to go out with the open batch.
    /// A `waiter` is answered once every bucket these readings touch is
    /// settled (so pass one only with readings: nothing would ever answer it
    /// otherwise).
    ///
    /// Refuses when the readings might not fit under the memory bound (the
    /// check counts every reading as a new value, so the bound holds even when
    /// none of them overwrite) or would open more buckets than allowed.
    pub fn offer(
        &mut self,
        readings: Vec<Reading<'_>>,
        waiter: Option<W>,
        now: Instant,
        ack_ms: i64,
    ) -> Result<Offered, Full> {
        let n = readings.len();
        self.check_room(&readings)?;
        let was_empty = self.opened_at.is_none();
        if n > 0 && was_empty {
            self.opened_at = Some(now);
        }
        let ticket = waiter.as_ref().map(|_| {
            self.next_ticket += 1;
            self.next_ticket
        });
        let buckets = self.insert(&readings, Kind::Prompt { ticket }, now, ack_ms);
        self.prompt_readings += n;
        if let (Some(waiter), Some(ticket)) = (waiter, ticket)
            && buckets > 0
        {
            self.waiting.insert(
                ticket,
                Waiting {
                    waiter,
                    buckets,
                    dead: Vec::new(),
                    unstored: false,
                },
            );
        }
        let full = self.prompt_readings >= self.limits.max_pending_readings;
        Ok(Offered {
            wake_driver: (was_empty && n > 0) || full,
        })
    }

    /// Adds all of `readings` or none of them, held until their buckets are
    /// due. `origin` (a journal segment) is what [`Self::lowest_unsettled_origin`]
    /// reports until they are settled; `unix_ms` is the wall clock now, which
    /// places the end of each bucket's window; `ack_ms` is when the journal
    /// acknowledged them.
    pub fn offer_held(
        &mut self,
        readings: Vec<Reading<'_>>,
        origin: u64,
        now: Instant,
        unix_ms: i64,
        ack_ms: i64,
    ) -> Result<Offered, Full> {
        if let Err(full) = self.check_room(&readings) {
            self.wanted = readings.len();
            return Err(full);
        }
        self.wanted = 0;
        let before = self.next_held_due;
        let was_pressured = self.pressured();
        let n = readings.len() as u64;
        self.insert(&readings, Kind::Held { origin, unix_ms }, now, ack_ms);
        if n > 0 {
            *self.outstanding.entry(origin).or_default() += n;
        }
        let earlier = match (before, self.next_held_due) {
            (Some(b), Some(a)) => a < b,
            (None, Some(_)) => true,
            _ => false,
        };
        Ok(Offered {
            wake_driver: earlier || (!was_pressured && self.pressured()),
        })
    }

    fn check_room(&self, readings: &[Reading<'_>]) -> Result<(), Full> {
        let limit = self.limits.max_buffered_readings;
        if self.buffered().saturating_add(readings.len()) > limit {
            return Err(Full {
                what: "readings",
                held: self.buffered(),
                limit,
            });
        }
        self.check_buckets(readings)
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

    /// When held readings of the bucket starting at `start`, first held at
    /// `now` (`unix_ms` on the wall clock), must be written.
    fn held_due(
        granularity: Granularity,
        hold: Hold,
        start: i64,
        now: Instant,
        unix_ms: i64,
    ) -> Instant {
        let window_end_ms = start
            .saturating_add(granularity.seconds())
            .saturating_mul(1000);
        let grace_ms = i64::try_from(hold.grace.as_millis()).unwrap_or(i64::MAX);
        let wait_ms = window_end_ms
            .saturating_add(grace_ms)
            .saturating_sub(unix_ms)
            .max(0);
        let wait = Duration::from_millis(wait_ms.unsigned_abs()).min(hold.max_hold);
        now + wait
    }

    /// Inserts `readings`; returns how many buckets a prompt ticket was
    /// newly tied to.
    ///
    /// A reading right after one of the same bucket with the very same names
    /// (as a decoder hands a series grouped) goes to the bucket already at
    /// hand: a bucket is looked up once per run, not once per reading. Only
    /// addresses are compared: comparing text would cost readings that are
    /// not grouped more than a run saves.
    ///
    /// Per second the value acknowledged last wins (the later offer on a tie):
    /// a journal replayed behind fresher readings never overwrites them.
    fn insert(&mut self, readings: &[Reading<'_>], kind: Kind, now: Instant, ack: i64) -> usize {
        // Long: the insert path every reading takes; kept in one piece so it stays allocation-light.
        let (granularity, hold) = (self.granularity, self.limits.hold);
        let seconds = granularity.seconds();
        let (mut tied, mut added) = (0, 0);
        let mut next_held_due = self.next_held_due;
        let pending = &mut self.pending;
        // The run's first reading, its bucket's start, and the bucket.
        let mut run: Option<(&Reading<'_>, i64, &mut Open)> = None;
        let in_run = |r: &Reading<'_>, first: &Reading<'_>, start: i64| {
            r.ts >= start && r.ts - start < seconds && r.shares_names(first)
        };
        for (i, r) in readings.iter().enumerate() {
            let same = run
                .as_ref()
                .is_some_and(|(first, start, _)| in_run(r, first, *start));
            if !same {
                let start = granularity.bucket_start(r.ts);
                // Room for the whole run at once: grown a reading at a time,
                // a bucket's values were copied at each doubling.
                // A bucket holds a value per second at most, however many
                // readings repeat one.
                let len = readings[i..]
                    .iter()
                    .take_while(|x| in_run(x, r, start))
                    .count()
                    .min(usize::try_from(seconds).unwrap_or(usize::MAX));
                let key = BucketKeyRef {
                    sensor: r.sensor.as_str(),
                    metric: r.metric.as_str(),
                    start,
                };
                let open = match pending.get_mut(&key) {
                    Some(open) => {
                        open.values.reserve(len);
                        open
                    }
                    None => {
                        self.owed.add(start);
                        pending
                            .entry(BucketKey {
                                sensor: r.sensor.clone().into_owned(),
                                metric: r.metric.clone().into_owned(),
                                start,
                            })
                            .or_insert_with(|| Open::new(now, len))
                    }
                };
                match kind {
                    Kind::Prompt { ticket } => {
                        open.prompt = true;
                        // Tickets only grow and an offer is applied whole, so this
                        // offer's ticket, if already tied to the bucket, is the last one.
                        if let Some(t) = ticket
                            && open.tickets.last() != Some(&t)
                        {
                            open.tickets.push(t);
                            tied += 1;
                        }
                    }
                    Kind::Held { unix_ms, .. } => {
                        if open.held_due.is_none() {
                            let due = Self::held_due(granularity, hold, start, now, unix_ms);
                            open.held_due = Some(due);
                            next_held_due = Some(next_held_due.map_or(due, |d| d.min(due)));
                        }
                    }
                }
                run = Some((r, start, open));
            }
            if let Some((_, _, open)) = run.as_mut() {
                open.readings += 1;
                added += usize::from(open.put(granularity.offset(r.ts), r.value, ack));
                if let Kind::Held { origin, .. } = kind {
                    match open.origins.last_mut() {
                        Some((o, n)) if *o == origin => *n += 1,
                        _ => open.origins.push((origin, 1)),
                    }
                }
            }
        }
        self.pending_values += added;
        self.next_held_due = next_held_due;
        tied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batcher::{Batch, FlushResult, NotStored, Settled};
    use crate::domain::{MetricName, SensorId};
    use proptest::prelude::*;
    use std::collections::HashMap as StdMap;

    const LIMITS: BatcherLimits = BatcherLimits {
        flush_interval: Duration::from_secs(1),
        max_pending_readings: 1000,
        max_buffered_readings: 2000,
        max_buckets: 1000,
        max_flush_buckets: 1000,
        hold: HOLD,
    };

    const HOLD: Hold = Hold {
        grace: Duration::from_secs(10),
        max_hold: Duration::from_secs(300),
    };

    /// Settles every item of `batch` as `settled`; returns the answers.
    fn settle_all<W>(b: &mut Batcher<W>, batch: &Batch, settled: Settled) -> Vec<(W, FlushResult)> {
        let mut answers = Vec::new();
        for item in &batch.items {
            b.settle(item, settled, &mut answers);
        }
        answers
    }

    fn reading(sensor: &str, ts: i64, value: f64) -> Reading<'static> {
        Reading {
            sensor: SensorId::parse(sensor.to_owned()).expect("valid sensor"),
            metric: MetricName::default_metric(),
            ts,
            value,
        }
    }

    /// A reading whose sensor name is `sensor` itself, shared by every
    /// reading made so (as a decoder's series), or every third second a
    /// copy of it (the same text elsewhere).
    fn reading_of(sensor: &'static str, ts: i64, value: f64) -> Reading<'static> {
        let sensor = if ts % 3 == 0 {
            SensorId::parse(sensor.to_owned())
        } else {
            SensorId::parse(sensor)
        };
        Reading {
            sensor: sensor.expect("valid sensor"),
            metric: MetricName::default_metric(),
            ts,
            value,
        }
    }

    /// Offers of fewer than `len` readings, in runs: a sensor below
    /// `sensors`, a second below `seconds` and a value, then up to 3 more
    /// seconds of that sensor (runs cross bucket ends at times).
    fn runs(
        sensors: usize,
        seconds: i64,
        len: usize,
    ) -> impl Strategy<Value = Vec<(usize, i64, i32)>> {
        prop::collection::vec((0..sensors, 0..seconds, -5..5i32, 1..5i64), 1..len).prop_map(
            move |runs| {
                runs.into_iter()
                    .flat_map(|(s, ts, v, n)| (0..n).map(move |k| (s, ts + k, v + k as i32)))
                    .take(len - 1)
                    .collect()
            },
        )
    }

    #[test]
    fn a_run_of_one_series_fills_its_bucket_up_to_the_bucket_s_end_only() {
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
        let t0 = Instant::now();
        // s1's seconds 58, 59, 61 and 62 (shared names, across a minute's
        // end), s2, then s1's 60 (its name copied) and 59 again: each in its
        // bucket, the last value per second winning.
        let readings = vec![
            reading_of("s1", 58, 1.0),
            reading_of("s1", 59, 2.0),
            reading_of("s1", 61, 4.0),
            reading_of("s1", 62, 5.0),
            reading_of("s2", 59, 6.0),
            reading_of("s1", 60, 7.0),
            reading_of("s1", 59, 8.0),
        ];
        assert!(
            !readings[1].shares_names(&readings[5]),
            "a copy, not shared"
        );
        b.offer_held(readings, 9, t0, 0, 0).expect("room");
        let batch = b.take_all().expect("a batch");
        let mut got: Vec<_> = batch
            .items
            .iter()
            .map(|i| {
                let k = &i.update.key;
                (
                    k.sensor.to_string(),
                    k.start,
                    i.update.values.clone(),
                    i.readings,
                    i.journaled(),
                )
            })
            .collect();
        got.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        assert_eq!(
            got,
            vec![
                ("s1".into(), 0, vec![(58, 1.0), (59, 8.0)], 3, 3),
                ("s1".into(), 60, vec![(0, 7.0), (1, 4.0), (2, 5.0)], 3, 3),
                ("s2".into(), 0, vec![(59, 6.0)], 1, 1),
            ]
        );
        assert_eq!(b.lowest_unsettled_origin(), Some(9));
        settle_all(&mut b, &batch, Settled::Stored);
        assert_eq!((b.buffered(), b.lowest_unsettled_origin()), (0, None));
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
        b.offer(rs, Some(7), now, 0).expect("room");
        let batch = b.take_all().expect("a batch");
        assert_eq!(batch.items.len(), 1);
        assert_eq!(batch.items[0].update.key.start, 120);
        assert_eq!(
            batch.items[0].update.values,
            vec![(1, 2.0), (5, 3.0), (59, 4.0)]
        );
        assert_eq!((b.buffered(), batch.readings), (3, 4));
        assert!(b.take_all().is_none());
        assert_eq!(
            settle_all(&mut b, &batch, Settled::Stored),
            vec![(7, Ok(()))]
        );
        assert_eq!(b.buffered(), 0);
    }

    #[test]
    fn hour_buckets_key_seconds_by_offset_in_the_hour() {
        let mut b: Batcher<()> = Batcher::new(Granularity::Hour, LIMITS);
        b.offer(vec![reading("s", 3600 + 61, 1.0)], None, Instant::now(), 0)
            .expect("room");
        let batch = b.take_all().expect("a batch");
        assert_eq!(batch.items[0].update.key.start, 3600);
        assert_eq!(batch.items[0].update.values, vec![(61, 1.0)]);
    }

    #[test]
    fn a_batch_is_due_after_the_flush_interval_or_when_full() {
        let limits = BatcherLimits {
            max_pending_readings: 3,
            ..LIMITS
        };
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, limits);
        let t0 = Instant::now();
        assert_eq!(b.deadline(t0), None);
        let o = b
            .offer(vec![reading("a", 1, 1.0)], None, t0, 0)
            .expect("room");
        assert!(o.wake_driver, "the first reading sets a deadline");
        assert!(!b.is_due(t0 + Duration::from_millis(999)));
        assert!(b.is_due(t0 + Duration::from_secs(1)));
        let o = b
            .offer(vec![reading("a", 2, 1.0)], None, t0, 0)
            .expect("room");
        assert!(!o.wake_driver);
        let o = b
            .offer(vec![reading("b", 2, 1.0)], None, t0, 0)
            .expect("room");
        assert!(o.wake_driver, "a full batch wakes the driver");
        assert!(b.is_due(t0));
    }

    #[test]
    fn a_hurried_batch_is_due_at_once_and_the_next_one_is_not() {
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
        let t0 = Instant::now();
        assert!(!b.hurry(), "nothing to hurry");
        b.offer(vec![reading("a", 1, 1.0)], None, t0, 0)
            .expect("room");
        assert!(b.hurry());
        assert!(b.is_due(t0));
        b.take_all().expect("batch");
        b.offer(vec![reading("a", 2, 1.0)], None, t0, 0)
            .expect("room");
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
            0,
        )
        .expect("room");
        let batch = b.take_all().expect("batch");
        // In-flight values still count against the bound.
        let err = b
            .offer(
                (0..2i32).map(|i| reading("b", i64::from(i), 1.0)).collect(),
                Some(2),
                now,
                0,
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
        assert!(
            b.take_all().is_none(),
            "the refused offer left nothing behind"
        );
        assert_eq!(
            settle_all(&mut b, &batch, Settled::Stored),
            vec![(1, Ok(()))]
        );
        b.offer(
            (0..3i32).map(|i| reading("b", i64::from(i), 1.0)).collect(),
            Some(3),
            now,
            0,
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
        b.offer(two, None, now, 0).expect("two buckets fit");
        // Existing buckets do not count again; one new one fits.
        b.offer(
            vec![reading("a", 1, 2.0), reading("c", 1, 1.0)],
            None,
            now,
            0,
        )
        .expect("one new bucket fits");
        let err = b
            .offer(
                vec![reading("a", 2, 1.0), reading("d", 1, 1.0)],
                None,
                now,
                0,
            )
            .expect_err("a fourth bucket");
        assert_eq!(
            err,
            Full {
                what: "buckets",
                held: 3,
                limit: 3
            }
        );
        let batch = b.take_all().expect("batch");
        assert_eq!(batch.items.len(), 3, "the refused offer added nothing");
        // In-flight buckets still count until their batch completes.
        assert!(b.offer(vec![reading("d", 1, 1.0)], None, now, 0).is_err());
        settle_all(&mut b, &batch, Settled::Stored);
        b.offer(vec![reading("d", 1, 1.0)], None, now, 0)
            .expect("room after the flush");
    }

    #[test]
    fn a_writer_is_answered_by_its_own_buckets_only() {
        let mut b: Batcher<&str> = Batcher::new(Granularity::Minute, LIMITS);
        let now = Instant::now();
        b.offer(
            vec![reading("a", 1, 1.0), reading("b", 1, 1.0)],
            Some("ab"),
            now,
            0,
        )
        .expect("room");
        b.offer(vec![reading("b", 2, 1.0)], Some("b"), now, 0)
            .expect("room");
        b.offer(vec![reading("c", 2, 1.0)], Some("c"), now, 0)
            .expect("room");
        let batch = b.take_all().expect("batch");
        let item = |sensor: &str| {
            batch
                .items
                .iter()
                .find(|i| i.update.key.sensor.as_str() == sensor)
                .expect("an item")
        };
        let mut answers = Vec::new();
        b.settle(item("a"), Settled::Stored, &mut answers);
        assert!(answers.is_empty(), "ab still waits for b");
        b.settle(item("b"), Settled::DeadLettered, &mut answers);
        let b_key = item("b").update.key.clone();
        assert_eq!(
            answers,
            vec![
                ("ab", Err(NotStored::DeadLettered(vec![b_key.clone()]))),
                ("b", Err(NotStored::DeadLettered(vec![b_key])))
            ]
        );
        answers.clear();
        b.settle(item("c"), Settled::Unstored, &mut answers);
        assert_eq!(answers, vec![("c", Err(NotStored::Shutdown))]);
        assert_eq!((b.waiting(), b.buffered(), b.buckets()), (0, 0, 0));
    }

    #[test]
    fn a_flush_takes_at_most_max_flush_buckets_and_the_rest_stays_due() {
        let limits = BatcherLimits {
            max_flush_buckets: 2,
            ..LIMITS
        };
        let mut b: Batcher<u8> = Batcher::new(Granularity::Minute, limits);
        let t0 = Instant::now();
        let five: Vec<_> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|s| reading(s, 1, 1.0))
            .collect();
        b.offer(five, Some(1), t0, 0).expect("room");
        let first = b.take_all().expect("batch");
        assert_eq!(first.items.len(), 2);
        assert!(b.is_due(t0), "the rest is due at once");
        let second = b.take_all().expect("batch");
        let third = b.take_all().expect("batch");
        assert_eq!((second.items.len(), third.items.len()), (2, 1));
        assert!(b.take_all().is_none());
        let mut answers = settle_all(&mut b, &first, Settled::Stored);
        answers.extend(settle_all(&mut b, &second, Settled::Stored));
        assert!(answers.is_empty(), "the writer waits for all five buckets");
        answers.extend(settle_all(&mut b, &third, Settled::Stored));
        assert_eq!(answers, vec![(1, Ok(()))]);
    }

    /// A fleet of `series` live series at 1 Hz for `secs` seconds, journaled,
    /// with the driver looking every second: bucket writes per reading.
    fn live_fleet_writes_per_reading(g: Granularity, series: usize, secs: i64) -> f64 {
        let mut b: Batcher<()> = Batcher::new(g, LIMITS_LARGE);
        let t0 = Instant::now();
        let unix0 = 1_700_000_000i64; // a whole hour
        let (mut writes, mut readings) = (0usize, 0usize);
        for sec in 0..secs {
            let now = t0 + Duration::from_secs(sec as u64);
            let rs: Vec<_> = (0..series)
                .map(|s| reading(&format!("s{s}"), unix0 + sec, 1.0))
                .collect();
            readings += rs.len();
            b.offer_held(rs, 1, now, (unix0 + sec) * 1000, 0)
                .expect("room");
            while let Some(batch) = b.take_due(now) {
                writes += batch.items.len();
                settle_all(&mut b, &batch, Settled::Stored);
            }
        }
        writes as f64 / readings as f64
    }

    proptest! {
        /// A backlog larger than a flush goes out whole hours at a time, the
        /// newest first, and each hour is owed until its last bucket is
        /// settled (checked against the buckets left, by brute force).
        #[test]
        fn a_backlog_goes_out_whole_hours_newest_first_and_stays_owed_until_settled(
            buckets in prop::collection::vec((0..4usize, 0..6i64, 0..60i64), 1..200),
            room in 1..40usize,
        ) {
            let limits = BatcherLimits { max_flush_buckets: room, ..LIMITS_LARGE };
            let mut b: Batcher<()> = Batcher::new(Granularity::Minute, limits);
            let owed = b.owed_hours();
            let t0 = Instant::now();
            let base = 1_700_000_000 - 1_700_000_000 % 3600;
            let rs: Vec<_> = buckets
                .iter()
                .map(|&(s, h, m)| reading(&format!("s{s}"), base + h * 3600 + m * 60, 1.0))
                .collect();
            // Long ended: every bucket is due at once.
            b.offer_held(rs, 1, t0, (base + 30 * 86_400) * 1000, 0).expect("room");
            let mut left: Vec<(String, i64)> = buckets
                .iter()
                .map(|&(s, h, m)| (format!("s{s}"), base + h * 3600 + m * 60))
                .collect();
            left.sort();
            left.dedup();
            let mut taken_hours: Vec<i64> = Vec::new();
            while let Some(batch) = b.take_due(t0) {
                prop_assert!(batch.items.len() <= room);
                let mut hours: Vec<i64> =
                    batch.items.iter().map(|i| i.update.key.start / 3600 * 3600).collect();
                hours.sort_unstable_by(|a, b| b.cmp(a));
                taken_hours.extend(hours);
                for item in &batch.items {
                    let mut answers = Vec::new();
                    b.settle(item, Settled::Stored, &mut answers);
                    let k = (item.update.key.sensor.to_string(), item.update.key.start);
                    left.retain(|x| *x != k);
                    for h in 0..6 {
                        let hour = base + h * 3600;
                        let model = left.iter().any(|(_, st)| st / 3600 * 3600 == hour);
                        prop_assert_eq!(owed.owes(hour), model, "hour {}", h);
                    }
                }
            }
            prop_assert!(left.is_empty());
            prop_assert!(taken_hours.windows(2).all(|w| w[0] >= w[1]), "{:?}", taken_hours);
        }
    }

    const LIMITS_LARGE: BatcherLimits = BatcherLimits {
        max_buffered_readings: 10_000_000,
        max_buckets: 1_000_000,
        max_pending_readings: 1_000_000,
        max_flush_buckets: 1_000_000,
        ..LIMITS
    };

    #[test]
    fn a_live_fleet_writes_a_minute_bucket_about_once_per_minute() {
        let ratio = live_fleet_writes_per_reading(Granularity::Minute, 50, 3600);
        assert!(ratio <= 1.0 / 30.0, "{ratio}");
        // Once per window, plus nothing: 60 readings per write.
        assert!(ratio <= 1.0 / 59.0, "{ratio}");
    }

    #[test]
    fn a_live_fleet_rewrites_an_hour_bucket_at_most_every_max_hold() {
        let ratio = live_fleet_writes_per_reading(Granularity::Hour, 20, 3 * 3600);
        assert!(ratio <= 1.0 / 290.0, "{ratio}");
    }

    #[test]
    fn held_readings_wait_for_the_window_and_grace_but_late_ones_go_at_once() {
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
        let t0 = Instant::now();
        let unix = 1_700_000_050_000i64; // 10 s into a minute
        b.offer_held(vec![reading("a", 1_700_000_050, 1.0)], 7, t0, unix, 0)
            .expect("room");
        // 50 s to the end of the window, then 10 s of grace.
        assert_eq!(b.deadline(t0), Some(t0 + Duration::from_secs(60)));
        assert!(b.take_due(t0 + Duration::from_secs(59)).is_none());
        assert_eq!(b.lowest_unsettled_origin(), Some(7));
        // A reading for a window long past is due at once.
        b.offer_held(vec![reading("b", 1_600_000_000, 1.0)], 8, t0, unix, 0)
            .expect("room");
        let late = b.take_due(t0).expect("due at once");
        assert_eq!(late.items.len(), 1);
        assert_eq!(late.items[0].update.key.sensor.as_str(), "b");
        settle_all(&mut b, &late, Settled::Stored);
        assert_eq!(b.lowest_unsettled_origin(), Some(7));
        let on_time = b.take_due(t0 + Duration::from_secs(60)).expect("due");
        assert_eq!(on_time.items[0].origins, vec![(7, 1)]);
        settle_all(&mut b, &on_time, Settled::Stored);
        assert_eq!(b.lowest_unsettled_origin(), None);
    }

    #[test]
    fn unstored_held_readings_stay_owed_to_the_journal() {
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
        let t0 = Instant::now();
        b.offer_held(vec![reading("a", 1, 1.0)], 3, t0, 10_000_000, 0)
            .expect("room");
        let batch = b.take_all().expect("batch");
        settle_all(&mut b, &batch, Settled::Unstored);
        assert_eq!(b.lowest_unsettled_origin(), Some(3));
        assert_eq!(b.buffered(), 0);
    }

    #[test]
    fn per_second_the_value_acknowledged_last_wins_and_the_oldest_acknowledgement_is_known() {
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
        let t0 = Instant::now();
        // A fresh value acknowledged at 200, then a journal replayed behind
        // it: the same second acknowledged at 100 does not overwrite it.
        b.offer_held(vec![reading("a", 61, 2.0)], 1, t0, 0, 200)
            .expect("room");
        b.offer_held(
            vec![reading("a", 61, 1.0), reading("a", 62, 3.0)],
            2,
            t0,
            0,
            100,
        )
        .expect("room");
        let held = |b: &Batcher<()>| b.pending_values_of("a", "value", 0, 180);
        assert_eq!(held(&b), vec![(60, vec![(1, 2.0, 200), (2, 3.0, 100)])]);
        assert_eq!(b.oldest_ack(), Some(100));
        // An equal acknowledgement is a later offer: it wins.
        b.offer_held(vec![reading("a", 61, 4.0)], 3, t0, 0, 200)
            .expect("room");
        assert_eq!(held(&b), vec![(60, vec![(1, 4.0, 200), (2, 3.0, 100)])]);
        let batch = b.take_all().expect("batch");
        assert_eq!(b.oldest_ack(), Some(100), "in flight, still unstored");
        settle_all(&mut b, &batch, Settled::Stored);
        assert_eq!(b.oldest_ack(), None);
    }

    #[test]
    fn queries_see_pending_values_of_their_series_only() {
        let mut b: Batcher<()> = Batcher::new(Granularity::Minute, LIMITS);
        let t0 = Instant::now();
        b.offer_held(
            vec![
                reading("a", 60, 1.0),
                reading("a", 61, 2.0),
                reading("a", 200, 3.0),
                reading("b", 60, 9.0),
            ],
            1,
            t0,
            0,
            7,
        )
        .expect("room");
        let mut got = b.pending_values_of("a", "value", 0, 180);
        got.sort_by_key(|(s, _)| *s);
        assert_eq!(got, vec![(60, vec![(0, 1.0, 7), (1, 2.0, 7)])]);
        let mut wide = b.pending_values_of("a", "value", i64::MIN / 2, i64::MAX / 2);
        wide.sort_by_key(|(s, _)| *s);
        assert_eq!(wide.len(), 2, "a long range scans instead of probing");
    }

    proptest! {
        /// The hold/flush core against a brute-force model: for any arrival
        /// order, wall clock and memory bound, every journaled reading is
        /// written exactly once (in some bucket write), the last value per
        /// second wins, memory never exceeds its bounds, a refused offer is
        /// always followed by a take that frees room, and every origin is
        /// released once its readings are settled.
        #[test]
        fn held_readings_are_each_written_once_within_the_memory_bound(
            ops in prop::collection::vec(
                prop_oneof![
                    4 => runs(4, 400, 12).prop_map(Op::Offer),
                    2 => (0..30_000u64).prop_map(Op::Advance),
                    1 => Just(Op::Take),
                ],
                1..60,
            ),
            max_buffered in 12..60usize,
            max_buckets in 12..20usize,
            hour in any::<bool>(),
            max_flush_buckets in 1..5usize,
        ) {
            let g = if hour { Granularity::Hour } else { Granularity::Minute };
            let limits = BatcherLimits {
                max_buffered_readings: max_buffered,
                max_buckets,
                max_flush_buckets,
                hold: Hold { grace: Duration::from_secs(2), max_hold: Duration::from_secs(20) },
                ..LIMITS
            };
            let sensors = ["a", "b", "c", "d"];
            let mut b: Batcher<()> = Batcher::new(g, limits);
            let t0 = Instant::now();
            let mut now = t0;
            let unix0 = 0i64;
            let mut model: StdMap<(usize, i64), f64> = StdMap::new();
            let mut stored: StdMap<(String, i64), f64> = StdMap::new();
            let (mut offered, mut written) = (0usize, 0usize);
            let mut origin = 0u64;
            let write = |b: &mut Batcher<()>, batch: Batch, stored: &mut StdMap<(String, i64), f64>| {
                let mut n = 0;
                for item in &batch.items {
                    n += item.readings;
                    assert_eq!(item.journaled(), item.readings);
                    for &(off, v) in &item.update.values {
                        stored.insert((item.update.key.sensor.to_string(), item.update.key.start + i64::from(off)), v);
                    }
                }
                settle_all(b, &batch, Settled::Stored);
                n
            };
            for op in ops {
                match op {
                    Op::Offer(rs) => {
                        origin += 1;
                        let unix_ms = (unix0 + (now - t0).as_secs() as i64) * 1000;
                        let readings: Vec<_> = rs.iter().map(|&(s, ts, v)| reading_of(sensors[s], ts, f64::from(v))).collect();
                        let mut tries = 0;
                        loop {
                            match b.offer_held(readings.clone(), origin, now, unix_ms, 0) {
                                Ok(_) => break,
                                Err(_) => {
                                    // Full: the driver must be able to free room now.
                                    prop_assert!(b.is_due(now), "full but nothing due");
                                    let batch = b.take_due(now);
                                    prop_assert!(batch.is_some(), "full but nothing taken");
                                    if let Some(batch) = batch {
                                        written += write(&mut b, batch, &mut stored);
                                    }
                                    tries += 1;
                                    prop_assert!(tries < 100);
                                }
                            }
                        }
                        offered += rs.len();
                        for &(s, ts, v) in &rs { model.insert((s, ts), f64::from(v)); }
                    }
                    Op::Advance(ms) => now += Duration::from_millis(ms),
                    Op::Take => {
                        while let Some(batch) = b.take_due(now) {
                            written += write(&mut b, batch, &mut stored);
                        }
                    }
                }
                prop_assert!(b.buffered() <= max_buffered);
                prop_assert!(b.buckets() <= max_buckets);
                if let Some(d) = b.deadline(now) {
                    // Nothing is held past its hold: the deadline never
                    // lies beyond max_hold from now.
                    prop_assert!(d <= now + Duration::from_secs(20));
                }
            }
            // Everything comes due by itself within max_hold.
            now += Duration::from_secs(21);
            while let Some(batch) = b.take_due(now) {
                written += write(&mut b, batch, &mut stored);
            }
            prop_assert_eq!((b.buffered(), b.buckets()), (0, 0));
            prop_assert_eq!(written, offered, "each reading written exactly once");
            prop_assert_eq!(b.lowest_unsettled_origin(), None);
            let expected: StdMap<(String, i64), f64> = model
                .into_iter()
                .map(|((s, ts), v)| ((sensors[s].to_owned(), ts), v))
                .collect();
            prop_assert_eq!(stored, expected);
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Offer(Vec<(usize, i64, i32)>),
        Advance(u64),
        Take,
    }

    proptest! {
        /// Whatever the interleaving of offers, flushes and outcomes, applying
        /// the stored batches in order gives exactly the last value written per
        /// (sensor, second) among stored buckets, every writer is answered
        /// exactly once, with the worst outcome among its buckets, and memory
        /// returns to zero.
        #[test]
        fn batches_applied_in_order_equal_last_write_wins(
            ops in prop::collection::vec(
                prop_oneof![
                    4 => runs(3, 200, 20).prop_map(Some),
                    1 => Just(None),
                ],
                1..40,
            ),
            max_flush_buckets in 1..6usize,
            dead_sensor in prop::option::of(0..3usize),
        ) {
            let sensors = ["a", "b", "c"];
            let limits = BatcherLimits { max_flush_buckets, ..LIMITS };
            let mut b: Batcher<usize> = Batcher::new(Granularity::Minute, limits);
            let mut model: StdMap<(usize, i64), f64> = StdMap::new();
            // The model of answers: which writers touched the dead sensor.
            let mut expect_dead: StdMap<usize, bool> = StdMap::new();
            let mut stored: StdMap<(String, i64), f64> = StdMap::new();
            let mut answered: StdMap<usize, FlushResult> = StdMap::new();
            let now = Instant::now();
            let dead = dead_sensor.map(|s| sensors[s]);
            let apply = |b: &mut Batcher<usize>, batch: Batch, stored: &mut StdMap<(String, i64), f64>, answered: &mut StdMap<usize, FlushResult>| {
                let mut keys = std::collections::HashSet::new();
                let mut answers = Vec::new();
                for item in &batch.items {
                    let u = &item.update;
                    assert!(keys.insert(u.key.clone()), "one update per bucket per batch");
                    assert!(u.values.windows(2).all(|w| w[0].0 < w[1].0));
                    let settled = if Some(u.key.sensor.as_str()) == dead {
                        Settled::DeadLettered
                    } else {
                        for &(off, v) in &u.values {
                            stored.insert((u.key.sensor.to_string(), u.key.start + i64::from(off)), v);
                        }
                        Settled::Stored
                    };
                    b.settle(item, settled, &mut answers);
                }
                for (w, result) in answers {
                    assert!(answered.insert(w, result).is_none(), "answered once");
                }
            };
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Some(rs) => {
                        for &(s, ts, v) in &rs { model.insert((s, ts), f64::from(v)); }
                        expect_dead.insert(i, rs.iter().any(|&(s, _, _)| Some(s) == dead_sensor));
                        let readings: Vec<_> = rs.iter().map(|&(s, ts, v)| reading_of(sensors[s], ts, f64::from(v))).collect();
                        b.offer(readings, Some(i), now, 0).expect("room");
                    }
                    None => if let Some(batch) = b.take_all() {
                        apply(&mut b, batch, &mut stored, &mut answered);
                    },
                }
                prop_assert!(b.buffered() <= LIMITS.max_buffered_readings);
                prop_assert!(b.buckets() <= LIMITS.max_buckets);
            }
            while let Some(batch) = b.take_all() { apply(&mut b, batch, &mut stored, &mut answered); }
            prop_assert_eq!((b.buffered(), b.buckets(), b.waiting()), (0, 0, 0));
            let expected: StdMap<(String, i64), f64> = model
                .into_iter()
                .filter(|((s, _), _)| Some(*s) != dead_sensor)
                .map(|((s, ts), v)| ((sensors[s].to_owned(), ts), v))
                .collect();
            prop_assert_eq!(stored, expected);
            prop_assert_eq!(answered.len(), expect_dead.len());
            for (w, dead) in expect_dead {
                prop_assert_eq!(answered[&w].is_err(), dead, "writer {}", w);
            }
        }
    }
}

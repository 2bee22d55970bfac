//! Runs the [`Batcher`] core: wakes at its deadline, writes each closed batch to
//! the store, settles every bucket by its own outcome (stored, retried through
//! an outage, or dead-lettered), answers the waiting writers, and drains
//! everything at shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info_span, warn};

use super::{
    Batch, Batcher, BatcherLimits, DeadLetter, FlushResult, Full, Outcome, Settled, Sink, Unstored,
    UnstoredValue, with_acks,
};
use crate::domain::{BucketUpdate, Granularity, Reading};
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::Metrics;

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
pub use super::sink::UNKNOWN_ERROR_ATTEMPTS;

/// Capped exponential backoff with jitter, for as long as an outage lasts.
pub fn retry_policy(min: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
}

type Waiter = oneshot::Sender<FlushResult>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Full(#[from] Full),
    #[error("the service is shutting down")]
    Closed,
}

struct Shared {
    // A std mutex: nothing awaits while holding it and every critical section is
    // short, so it is cheaper than an async one (as in mini-redis' `Db`).
    core: Mutex<Batcher<Waiter>>,
    wake: Notify,
    shutdown: Shutdown,
    /// The last write round met an outage and is being retried.
    outage: AtomicBool,
    /// The batch being written: still visible to queries until it is settled.
    /// Locked only while holding `core`, so a bucket is never in neither.
    in_flight: Mutex<Option<Arc<Batch>>>,
    /// Notified whenever settling freed room.
    room: Notify,
}

/// The ingestors' side of the batcher: cheap to clone.
#[derive(Clone)]
pub struct BatcherHandle {
    shared: Arc<Shared>,
}

impl BatcherHandle {
    fn core(&self) -> MutexGuard<'_, Batcher<Waiter>> {
        lock(&self.shared)
    }

    /// The hours whose buckets are still to be written (see [`OwedHours`]).
    pub fn owed_hours(&self) -> Arc<super::OwedHours> {
        self.core().owed_hours()
    }

    /// The batch being written now, if any.
    fn in_flight(&self) -> Option<Arc<Batch>> {
        self.shared
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Queues all of `readings` or none. With `wait`, the receiver resolves once
    /// every bucket they touch is settled (stored, dead-lettered, or given up).
    pub fn submit<'a>(
        &self,
        readings: Vec<Reading<'a>>,
        wait: bool,
    ) -> Result<Option<oneshot::Receiver<FlushResult>>, SubmitError> {
        if self.shared.shutdown.is_triggered() {
            return Err(SubmitError::Closed);
        }
        let (tx, rx) = if wait && !readings.is_empty() {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let offered = self
            .core()
            .offer(readings, tx, Instant::now(), super::clock::ack_ms())?;
        if offered.wake_driver {
            self.shared.wake.notify_one();
        }
        Ok(rx)
    }

    /// Queues readings that are safe in the journal, held until their buckets
    /// are due (see [`Batcher::offer_held`]). Taken even while shutting down:
    /// what the final drain misses stays in the journal.
    pub fn submit_held(
        &self,
        readings: Vec<Reading<'_>>,
        origin: u64,
        unix_ms: i64,
        ack_ms: i64,
    ) -> Result<(), Full> {
        let offered = self
            .core()
            .offer_held(readings, origin, Instant::now(), unix_ms, ack_ms);
        // Refused: the driver writes the oldest buckets early to make room.
        if offered.is_err() || offered.is_ok_and(|o| o.wake_driver) {
            self.shared.wake.notify_one();
        }
        offered.map(|_| ())
    }

    /// Resolves after settling has freed room (or at once, if it did since
    /// the last call).
    pub async fn room(&self) {
        self.shared.room.notified().await;
    }

    /// Whether something is due now or being written: a replay is done once
    /// it is not.
    pub fn has_due_now(&self) -> bool {
        let core = self.core();
        core.is_due(Instant::now()) || core.buffered() > core.pending_values()
    }

    /// How long the oldest held reading has waited for its bucket write.
    pub fn oldest_held_age(&self) -> Option<Duration> {
        self.core().oldest_held_since().map(|since| since.elapsed())
    }

    /// The earliest acknowledgement held, pending or in flight.
    pub fn oldest_ack(&self) -> Option<i64> {
        self.core().oldest_ack()
    }

    /// See [`Batcher::lowest_unsettled_origin`].
    pub fn lowest_unsettled_origin(&self) -> Option<u64> {
        self.core().lowest_unsettled_origin()
    }

    /// Values of each series (`sensors` and `metric`) not yet known stored,
    /// in buckets starting in `[from, to)`, sorted by start: the batch being
    /// written, overlaid by what is pending.
    pub fn unstored_values_of(
        &self,
        sensors: &[&str],
        metric: &str,
        from: i64,
        to: i64,
    ) -> Vec<Unstored> {
        let core = self.core();
        let pending = core.pending_values_of_many(sensors, metric, from, to);
        // Buckets that start before `from` still hold seconds inside it.
        let first = core.granularity().bucket_start(from);
        let in_flight = self.in_flight();
        drop(core);
        let Some(batch) = in_flight else {
            return pending;
        };
        let index: std::collections::HashMap<&str, usize> =
            sensors.iter().enumerate().map(|(i, &s)| (s, i)).collect();
        let mut merged: Vec<std::collections::BTreeMap<i64, Vec<UnstoredValue>>> =
            vec![std::collections::BTreeMap::new(); sensors.len()];
        for u in batch.items.iter().map(|i| &i.update) {
            if u.key.metric.as_str() == metric
                && u.key.start >= first
                && u.key.start < to
                && let Some(&i) = index.get(u.key.sensor.as_str())
            {
                merged[i].insert(u.key.start, with_acks(&u.values, &u.acks));
            }
        }
        for (into, pending) in merged.iter_mut().zip(pending) {
            for (start, values) in pending {
                let into = into.entry(start).or_default();
                // Pending values are newer: they win per second.
                into.extend(values);
                // Stable: per second, the pending value stays last.
                into.sort_by_key(|&(o, _, _)| o);
                let mut dedup: Vec<UnstoredValue> = Vec::with_capacity(into.len());
                for value in into.drain(..) {
                    match dedup.last_mut() {
                        Some(last) if last.0 == value.0 => *last = value,
                        _ => dedup.push(value),
                    }
                }
                *into = dedup;
            }
        }
        merged
            .into_iter()
            .map(|m| m.into_iter().collect())
            .collect()
    }

    /// Asks for the open batch to be written now rather than at its deadline:
    /// for writers that hold something back until then (MQTT acknowledgements).
    pub fn flush_soon(&self) {
        if self.core().hurry() {
            self.shared.wake.notify_one();
        }
    }

    /// Values held in memory, pending and in flight.
    pub fn buffered(&self) -> usize {
        self.core().buffered()
    }

    /// Readings held in memory, pending and in flight, that are not in the
    /// journal: what stopping now would lose.
    pub fn unjournaled(&self) -> usize {
        let pending = self.core().pending_unjournaled();
        let in_flight = self.in_flight();
        pending
            + in_flight.map_or(0, |batch| {
                batch
                    .items
                    .iter()
                    .map(|i| i.readings.saturating_sub(i.journaled()))
                    .sum()
            })
    }

    pub fn is_closed(&self) -> bool {
        self.shared.shutdown.is_triggered()
    }

    /// Whether writes are failing for an outage right now (and being retried).
    pub fn storage_outage(&self) -> bool {
        self.shared.outage.load(Ordering::Acquire)
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, Batcher<Waiter>> {
    // A panic while holding the lock cannot leave the core half-updated in a way
    // that loses data silently, so keep serving rather than poison everything.
    shared.core.lock().unwrap_or_else(|e| e.into_inner())
}

/// The async side: owns the store and the timer.
pub struct Driver<S> {
    shared: Arc<Shared>,
    store: Arc<S>,
    metrics: Arc<Metrics>,
}

/// What the final drain left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Readings the stop could not store: those of flushes that ended
    /// after the shutdown was triggered (earlier losses were counted and
    /// logged as they happened).
    pub unstored_readings: usize,
}

pub fn new<S: Sink>(
    granularity: Granularity,
    limits: BatcherLimits,
    store: Arc<S>,
    metrics: Arc<Metrics>,
    shutdown: Shutdown,
) -> (BatcherHandle, Driver<S>) {
    let shared = Arc::new(Shared {
        core: Mutex::new(Batcher::new(granularity, limits)),
        wake: Notify::new(),
        shutdown,
        outage: AtomicBool::new(false),
        in_flight: Mutex::new(None),
        room: Notify::new(),
    });
    (
        BatcherHandle {
            shared: shared.clone(),
        },
        Driver {
            shared,
            store,
            metrics,
        },
    )
}

impl<S: Sink> Driver<S> {
    /// Flushes batches as they come due until the shutdown starts, then drains
    /// what is left. Outages are retried until the shutdown deadline.
    pub async fn run(self) -> Drained {
        let shutdown = self.shared.shutdown.clone();
        let mut unstored = 0;
        loop {
            let deadline = lock(&self.shared).deadline(Instant::now());
            tokio::select! {
                _ = shutdown.triggered() => break,
                _ = self.shared.wake.notified() => {}
                _ = sleep_until(deadline) => {}
            }
            while let Some(batch) = self.take(|core| core.take_due(Instant::now())) {
                let lost = self.flush(batch).await;
                if shutdown.is_triggered() {
                    unstored += lost;
                }
            }
        }
        // Nothing new comes in once triggered; what is left goes out now.
        while let Some(batch) = self.take(Batcher::take_all) {
            unstored += self.flush(batch).await;
        }
        Drained {
            unstored_readings: unstored,
        }
    }

    /// Takes a batch and makes it the one in flight, under one lock.
    fn take(&self, take: impl FnOnce(&mut Batcher<Waiter>) -> Option<Batch>) -> Option<Arc<Batch>> {
        let mut core = lock(&self.shared);
        let batch = Arc::new(take(&mut core)?);
        *self
            .shared
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(batch.clone());
        Some(batch)
    }

    /// Writes one batch; returns how many of its readings were not stored
    /// anywhere (neither in a bucket, nor in the dead-letter collection, nor
    /// in the journal).
    async fn flush(&self, batch: Arc<Batch>) -> usize {
        let span = info_span!(
            "flush",
            readings = batch.readings,
            buckets = batch.items.len(),
            round_trips = tracing::field::Empty,
            attempts = tracing::field::Empty,
        );
        let unstored = self.write_with_retries(&batch).instrument(span).await;
        let _core = lock(&self.shared);
        *self
            .shared
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        unstored
    }

    async fn write_with_retries(&self, batch: &Batch) -> usize {
        // Long: the retry loop of one batch, outcome by outcome.
        let started = Instant::now();
        let shutdown = &self.shared.shutdown;
        let mut backoff = retry_policy(RETRY_MIN, RETRY_MAX).build();
        let mut todo: Vec<usize> = (0..batch.items.len()).collect();
        let (mut attempts, mut round_trips, mut unstored) = (0u32, 0, 0);
        loop {
            attempts += 1;
            let updates: Vec<&BucketUpdate> =
                todo.iter().map(|&i| &batch.items[i].update).collect();
            let written = self.store.write(&updates).await;
            round_trips += written.round_trips;
            self.metrics
                .write_round_trips
                .inc_by(written.round_trips as u64);
            let (mut stored, mut retry, mut poison) = (Vec::new(), Vec::new(), Vec::new());
            let (mut outage, mut unknown) = (None, false);
            for (i, outcome) in todo.iter().copied().zip(written.outcomes) {
                match outcome {
                    Outcome::Stored => stored.push(i),
                    Outcome::Outage(reason) => {
                        retry.push(i);
                        outage = Some(reason);
                    }
                    Outcome::Poison(reason) => poison.push((i, reason)),
                    Outcome::Unknown(reason) if attempts >= UNKNOWN_ERROR_ATTEMPTS => {
                        poison.push((
                            i,
                            format!("still refused after {attempts} attempts: {reason}"),
                        ));
                    }
                    Outcome::Unknown(reason) => {
                        retry.push(i);
                        unknown = true;
                        outage = Some(reason);
                    }
                }
            }
            self.metrics.bucket_updates.inc_by(stored.len() as u64);
            self.settle(batch, &stored, Settled::Stored);
            if !poison.is_empty() {
                unstored += self.dead_letter(batch, &poison).await;
            }
            let Some(reason) = outage else {
                self.shared.outage.store(false, Ordering::Release);
                break;
            };
            self.shared.outage.store(true, Ordering::Release);
            self.metrics
                .storage_error(if unknown { "unknown" } else { "outage" });
            self.metrics.storage_retries.inc();
            let delay = backoff.next().unwrap_or(RETRY_MAX);
            warn!(error = %reason, buckets = retry.len(), attempt = attempts, retry_in_ms = delay.as_millis() as u64,
                "Storage is unavailable; retrying the buckets that were not stored.");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.deadline_passed() => {
                    // Journaled readings are not lost: the next start replays them.
                    let readings: usize = retry.iter().map(|&i| batch.items[i].readings - batch.items[i].journaled()).sum();
                    let journaled: usize = retry.iter().map(|&i| batch.items[i].journaled()).sum();
                    if readings > 0 {
                        error!(readings, buckets = retry.len(), error = %reason,
                            "Gave up storing readings at the shutdown deadline; they were not stored.");
                    }
                    if journaled > 0 {
                        warn!(readings = journaled, error = %reason,
                            "Stopping with readings not yet stored; they stay in the journal and are written at the next start.");
                    }
                    self.settle(batch, &retry, Settled::Unstored);
                    unstored += readings;
                    break;
                }
            }
            todo = retry;
        }
        self.metrics
            .flush_duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics.flush_readings.observe(batch.readings as f64);
        let span = tracing::Span::current();
        span.record("round_trips", round_trips);
        span.record("attempts", attempts);
        debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "Wrote a batch."
        );
        unstored
    }

    /// Writes the readings of updates that can never be applied to the
    /// dead-letter collection (retrying outages until the shutdown deadline),
    /// then settles them. Returns the readings that ended nowhere.
    async fn dead_letter(&self, batch: &Batch, poison: &[(usize, String)]) -> usize {
        let readings: usize = poison.iter().map(|&(i, _)| batch.items[i].readings).sum();
        let indexes: Vec<usize> = poison.iter().map(|&(i, _)| i).collect();
        let letters: Vec<DeadLetter<'_>> = poison
            .iter()
            .map(|(i, reason)| DeadLetter {
                update: &batch.items[*i].update,
                reason,
            })
            .collect();
        let first = &poison[0];
        let mut backoff = retry_policy(RETRY_MIN, RETRY_MAX).build();
        self.metrics.storage_error("poison");
        loop {
            match self.store.dead_letter(&letters).await {
                Outcome::Stored => {
                    error!(readings, buckets = poison.len(), sensor = %batch.items[first.0].update.key.sensor, reason = %first.1,
                        "Storage can never apply these bucket updates; their readings were written to the dead-letter collection.");
                    self.metrics.readings_dead_lettered.inc_by(readings as u64);
                    self.settle(batch, &indexes, Settled::DeadLettered);
                    return 0;
                }
                // Dead letters are the last place readings can go: retried
                // until the shutdown deadline, whatever the error.
                Outcome::Outage(e) | Outcome::Unknown(e) => {
                    let delay = backoff.next().unwrap_or(RETRY_MAX);
                    warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "Writing dead letters failed; retrying.");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.shared.shutdown.deadline_passed() => break,
                    }
                }
                Outcome::Poison(e) => {
                    error!(error = %e, readings, "The dead-letter collection refused readings too.");
                    break;
                }
            }
        }
        error!(
            readings,
            buckets = poison.len(),
            reason = %first.1,
            "Readings that storage can never apply could not be dead-lettered either; they were not stored."
        );
        self.settle(batch, &indexes, Settled::Unstored);
        readings
            - indexes
                .iter()
                .map(|&i| batch.items[i].journaled())
                .sum::<usize>()
    }

    /// Settles `indexes` of `batch` and answers the writers that are done.
    fn settle(&self, batch: &Batch, indexes: &[usize], settled: Settled) {
        if indexes.is_empty() {
            return;
        }
        let mut answers = Vec::new();
        let mut readings = 0;
        {
            let mut core = lock(&self.shared);
            for &i in indexes {
                core.settle(&batch.items[i], settled, &mut answers);
                readings += batch.items[i].readings;
            }
        }
        match settled {
            Settled::Stored => self.metrics.readings_stored.inc_by(readings as u64),
            Settled::Unstored => {
                let journaled: usize = indexes.iter().map(|&i| batch.items[i].journaled()).sum();
                self.metrics.unstored((readings - journaled) as u64);
            }
            Settled::DeadLettered => {}
        }
        self.shared.room.notify_one();
        for (waiter, result) in answers {
            // A writer that gave up waiting dropped its receiver: nothing to tell.
            let _ = waiter.send(result);
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batcher::{NotStored, Written};
    use crate::domain::{MetricName, SensorId};
    use std::sync::atomic::AtomicUsize;

    /// Records writes; fails the first `failures` of them for an outage, and
    /// every update of sensor `poison` as poison.
    #[derive(Default)]
    struct Recorder {
        writes: Mutex<Vec<Vec<BucketUpdate>>>,
        dead: Mutex<Vec<BucketUpdate>>,
        failures: AtomicUsize,
        poison: Mutex<Option<&'static str>>,
    }

    impl Sink for Recorder {
        async fn write(&self, updates: &[&BucketUpdate]) -> Written {
            if self.failures.load(Ordering::SeqCst) > 0 {
                self.failures.fetch_sub(1, Ordering::SeqCst);
                return Written {
                    outcomes: vec![Outcome::Outage("down".into()); updates.len()],
                    round_trips: 1,
                };
            }
            let poison = *self.poison.lock().expect("lock");
            let outcomes = updates
                .iter()
                .map(|u| {
                    if Some(u.key.sensor.as_str()) == poison {
                        Outcome::Poison("bad shape".into())
                    } else {
                        Outcome::Stored
                    }
                })
                .collect();
            self.writes
                .lock()
                .expect("lock")
                .push(updates.iter().map(|u| (*u).clone()).collect());
            Written {
                outcomes,
                round_trips: 1,
            }
        }
        async fn dead_letter(&self, letters: &[DeadLetter<'_>]) -> Outcome {
            self.dead
                .lock()
                .expect("lock")
                .extend(letters.iter().map(|l| l.update.clone()));
            Outcome::Stored
        }
    }

    const LIMITS: BatcherLimits = BatcherLimits {
        flush_interval: Duration::from_secs(1),
        max_pending_readings: 100,
        max_buffered_readings: 1000,
        max_buckets: 1000,
        max_flush_buckets: 1000,
        hold: crate::batcher::Hold {
            grace: Duration::from_secs(10),
            max_hold: Duration::from_secs(300),
        },
    };

    fn readings_of(sensor: &'static str, n: i64) -> Vec<Reading<'static>> {
        (0..n)
            .map(|i| Reading {
                sensor: SensorId::parse(sensor).expect("valid"),
                metric: MetricName::default_metric(),
                ts: i,
                value: 1.0,
            })
            .collect()
    }

    fn readings(n: i64) -> Vec<Reading<'static>> {
        readings_of("s", n)
    }

    fn start(store: Arc<Recorder>) -> (BatcherHandle, Shutdown, tokio::task::JoinHandle<Drained>) {
        let shutdown = Shutdown::new(Duration::from_secs(3));
        let (handle, driver) = new(
            Granularity::Minute,
            LIMITS,
            store,
            Arc::new(Metrics::new()),
            shutdown.clone(),
        );
        let task = tokio::spawn(driver.run());
        (handle, shutdown, task)
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_writer_is_answered_after_the_flush_interval() {
        let store = Arc::new(Recorder::default());
        let (handle, shutdown, task) = start(store.clone());
        let t0 = Instant::now();
        let rx = handle
            .submit(readings(3), true)
            .expect("room")
            .expect("receiver");
        assert_eq!(rx.await, Ok(Ok(())));
        assert!(t0.elapsed() >= LIMITS.flush_interval);
        assert_eq!(store.writes.lock().expect("lock").len(), 1);
        shutdown.trigger();
        assert_eq!(
            task.await.expect("joined"),
            Drained {
                unstored_readings: 0
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_flushes_before_the_interval() {
        let store = Arc::new(Recorder::default());
        let (handle, _shutdown, _task) = start(store.clone());
        let t0 = Instant::now();
        let rx = handle
            .submit(readings(100), true)
            .expect("room")
            .expect("receiver");
        assert_eq!(rx.await, Ok(Ok(())));
        assert!(t0.elapsed() < LIMITS.flush_interval);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_until_the_batch_is_stored() {
        let store = Arc::new(Recorder::default());
        store.failures.store(3, Ordering::SeqCst);
        let (handle, _shutdown, _task) = start(store.clone());
        let rx = handle
            .submit(readings(5), true)
            .expect("room")
            .expect("receiver");
        assert_eq!(rx.await, Ok(Ok(())));
        let writes = store.writes.lock().expect("lock");
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0][0].values.len(), 5);
        assert!(!handle.storage_outage(), "the outage is over");
    }

    #[tokio::test(start_paused = true)]
    async fn poison_is_dead_lettered_and_other_buckets_are_stored() {
        let store = Arc::new(Recorder::default());
        *store.poison.lock().expect("lock") = Some("bad");
        let (handle, _shutdown, _task) = start(store.clone());
        let mixed: Vec<Reading<'static>> = readings_of("bad", 2)
            .into_iter()
            .chain(readings_of("good", 2))
            .collect();
        let rx_mixed = handle.submit(mixed, true).expect("room").expect("rx");
        let rx_good = handle
            .submit(readings_of("good", 3), true)
            .expect("room")
            .expect("rx");
        match rx_mixed.await {
            Ok(Err(NotStored::DeadLettered(keys))) => {
                assert_eq!(keys.len(), 1);
                assert_eq!(keys[0].sensor.as_str(), "bad");
            }
            other => panic!("expected dead letters, got {other:?}"),
        }
        assert_eq!(rx_good.await, Ok(Ok(())), "a writer of good buckets only");
        assert_eq!(store.dead.lock().expect("lock").len(), 1);
        assert_eq!(handle.buffered(), 0, "settled buckets free their room");
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_drains_pending_readings_and_closing_refuses_new_ones() {
        let store = Arc::new(Recorder::default());
        let (handle, shutdown, task) = start(store.clone());
        handle.submit(readings(7), false).expect("room");
        shutdown.trigger();
        assert_eq!(
            handle.submit(readings(1), false).expect_err("closed"),
            SubmitError::Closed
        );
        assert_eq!(task.await.expect("joined").unstored_readings, 0);
        assert_eq!(store.writes.lock().expect("lock")[0][0].values.len(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn only_readings_outside_the_journal_count_as_what_a_stop_would_lose() {
        let store = Arc::new(Recorder::default());
        store.failures.store(usize::MAX, Ordering::SeqCst);
        let (handle, _shutdown, _task) = start(store.clone());
        handle
            .submit_held(readings_of("journaled", 3), 1, 0, 0)
            .expect("room");
        handle
            .submit(readings_of("memory", 4), false)
            .expect("room");
        assert_eq!(handle.buffered(), 7, "both held in memory");
        assert_eq!(handle.unjournaled(), 4, "pending");
        // The prompt bucket goes out and stays in flight through the outage.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(handle.storage_outage());
        assert_eq!(handle.unjournaled(), 4, "in flight and pending");
    }

    #[tokio::test(start_paused = true)]
    async fn the_shutdown_deadline_reports_what_could_not_be_stored() {
        let store = Arc::new(Recorder::default());
        store.failures.store(usize::MAX, Ordering::SeqCst);
        let (handle, shutdown, task) = start(store.clone());
        let rx = handle
            .submit(readings(4), true)
            .expect("room")
            .expect("receiver");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(handle.storage_outage());
        let t0 = Instant::now();
        shutdown.trigger();
        assert_eq!(task.await.expect("joined").unstored_readings, 4);
        assert!(
            t0.elapsed() <= Duration::from_secs(3),
            "within the deadline"
        );
        assert_eq!(rx.await, Ok(Err(NotStored::Shutdown)));
    }
}

//! Runs the [`Batcher`] core: wakes at its deadline, writes each closed batch to
//! the store (retrying what can succeed on retry), answers the waiting writers,
//! and drains everything at shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info_span, warn};

use super::{Batch, Batcher, BatcherLimits, Full};
use crate::domain::{Granularity, Reading};
use crate::store::{BucketStore, StoreError};
use crate::telemetry::metrics::Metrics;

const RETRY_BASE: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Why readings a writer waited for were not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotStored {
    #[error("storage refused the write")]
    Rejected,
    #[error("the service stopped before the readings could be stored")]
    Shutdown,
}

pub type FlushResult = Result<(), NotStored>;
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
    closed: AtomicBool,
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

    /// Queues all of `readings` or none. With `wait`, the receiver resolves once
    /// they are stored (or will not be).
    pub fn submit<'a>(
        &self,
        readings: Vec<Reading<'a>>,
        wait: bool,
    ) -> Result<Option<oneshot::Receiver<FlushResult>>, SubmitError> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(SubmitError::Closed);
        }
        let (tx, rx) = if wait {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let offered = self.core().offer(readings, tx, Instant::now())?;
        if offered.wake_driver {
            self.shared.wake.notify_one();
        }
        Ok(rx)
    }

    /// Asks for the open batch to be written now rather than at its deadline:
    /// for writers that hold something back until then (MQTT acknowledgements).
    pub fn flush_soon(&self) {
        if self.core().hurry() {
            self.shared.wake.notify_one();
        }
    }

    /// Refuses new input from now on; what was accepted is still flushed.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
    }

    /// Values held in memory, pending and in flight.
    pub fn buffered(&self) -> usize {
        self.core().buffered()
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
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
    pub unstored_readings: usize,
}

pub fn new<S: BucketStore>(
    granularity: Granularity,
    limits: BatcherLimits,
    store: Arc<S>,
    metrics: Arc<Metrics>,
) -> (BatcherHandle, Driver<S>) {
    let shared = Arc::new(Shared {
        core: Mutex::new(Batcher::new(granularity, limits)),
        wake: Notify::new(),
        closed: AtomicBool::new(false),
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

impl<S: BucketStore> Driver<S> {
    /// Flushes batches as they come due until `stop`, then drains what is left.
    /// Transient storage errors are retried until `abort` (the shutdown deadline).
    pub async fn run(self, stop: CancellationToken, abort: CancellationToken) -> Drained {
        let mut unstored = 0;
        loop {
            let deadline = lock(&self.shared).deadline();
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.shared.wake.notified() => {}
                _ = sleep_until(deadline) => {}
            }
            let batch = {
                let mut core = lock(&self.shared);
                if core.is_due(Instant::now()) {
                    core.take()
                } else {
                    None
                }
            };
            if let Some(batch) = batch {
                unstored += self.flush(batch, &abort).await;
            }
        }
        // Nothing new comes in once stopped; one last batch holds the rest.
        let last = lock(&self.shared).take();
        if let Some(batch) = last {
            unstored += self.flush(batch, &abort).await;
        }
        Drained {
            unstored_readings: unstored,
        }
    }

    /// Writes one batch; returns how many of its readings were not stored.
    async fn flush(&self, batch: Batch<Waiter>, abort: &CancellationToken) -> usize {
        let span = info_span!(
            "flush",
            readings = batch.readings,
            buckets = batch.updates.len(),
            round_trips = tracing::field::Empty,
            attempts = tracing::field::Empty,
        );
        let outcome = self
            .write_with_retries(&batch, abort)
            .instrument(span)
            .await;
        lock(&self.shared).complete(batch.values, batch.updates.len());
        for waiter in batch.waiters {
            // A writer that gave up waiting dropped its receiver: nothing to tell.
            let _ = waiter.send(outcome);
        }
        match outcome {
            Ok(()) => {
                self.metrics.readings_stored.inc_by(batch.readings as u64);
                self.metrics.flush_readings.observe(batch.readings as f64);
                0
            }
            Err(_) => {
                self.metrics.readings_unstored.inc_by(batch.readings as u64);
                batch.readings
            }
        }
    }

    async fn write_with_retries(
        &self,
        batch: &Batch<Waiter>,
        abort: &CancellationToken,
    ) -> FlushResult {
        let started = Instant::now();
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            match self.store.write(&batch.updates).await {
                Ok(report) => {
                    self.metrics.bucket_updates.inc_by(report.buckets as u64);
                    self.metrics
                        .write_round_trips
                        .inc_by(report.round_trips as u64);
                    self.metrics
                        .flush_duration
                        .observe(started.elapsed().as_secs_f64());
                    let span = tracing::Span::current();
                    span.record("round_trips", report.round_trips);
                    span.record("attempts", attempt);
                    debug!(
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "Stored a batch."
                    );
                    return Ok(());
                }
                Err(e) if e.is_transient() => {
                    self.metrics.storage_error("unavailable");
                    self.metrics.storage_retries.inc();
                    let delay = backoff(attempt);
                    warn!(error = %e, attempt, retry_in_ms = delay.as_millis() as u64, "Storing a batch failed; retrying.");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = abort.cancelled() => {
                            error!(readings = batch.readings, buckets = batch.updates.len(), error = %e,
                                "Gave up storing a batch at the shutdown deadline; its readings were not stored.");
                            return Err(NotStored::Shutdown);
                        }
                    }
                }
                Err(e) => {
                    self.metrics.storage_error(match e {
                        StoreError::Unreadable(_) => "unreadable",
                        _ => "rejected",
                    });
                    error!(readings = batch.readings, buckets = batch.updates.len(), error = %e,
                        "Storage refused a batch; its readings were not stored.");
                    return Err(NotStored::Rejected);
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Exponential backoff with jitter: half fixed, half random, capped.
fn backoff(attempt: u32) -> Duration {
    let exp = RETRY_BASE.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    let capped = exp.min(RETRY_MAX);
    let half = capped / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BucketUpdate, MetricName, SensorId};
    use crate::store::{BucketRead, Fetch, StoreError, WriteReport};
    use std::sync::atomic::AtomicUsize;

    /// Records writes; fails the first `failures` of them transiently.
    #[derive(Default)]
    struct Recorder {
        writes: Mutex<Vec<Vec<BucketUpdate>>>,
        failures: AtomicUsize,
        reject: AtomicBool,
    }

    impl BucketStore for Recorder {
        async fn write(&self, updates: &[BucketUpdate]) -> Result<WriteReport, StoreError> {
            if self.reject.load(Ordering::SeqCst) {
                return Err(StoreError::Rejected("no".into()));
            }
            if self.failures.load(Ordering::SeqCst) > 0 {
                self.failures.fetch_sub(1, Ordering::SeqCst);
                return Err(StoreError::Unavailable("down".into()));
            }
            self.writes.lock().expect("lock").push(updates.to_vec());
            Ok(WriteReport {
                buckets: updates.len(),
                round_trips: 1,
            })
        }
        async fn fetch(&self, _: Fetch<'_>) -> Result<Vec<BucketRead>, StoreError> {
            Ok(vec![])
        }
        async fn ping(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    const LIMITS: BatcherLimits = BatcherLimits {
        flush_interval: Duration::from_secs(1),
        max_pending_readings: 100,
        max_buffered_readings: 1000,
        max_buckets: 1000,
    };

    fn readings(n: i64) -> Vec<Reading<'static>> {
        (0..n)
            .map(|i| Reading {
                sensor: SensorId::parse("s").expect("valid"),
                metric: MetricName::default_metric(),
                ts: i,
                value: 1.0,
            })
            .collect()
    }

    fn start(
        store: Arc<Recorder>,
    ) -> (
        BatcherHandle,
        CancellationToken,
        CancellationToken,
        tokio::task::JoinHandle<Drained>,
    ) {
        let (handle, driver) = new(Granularity::Minute, LIMITS, store, Arc::new(Metrics::new()));
        let (stop, abort) = (CancellationToken::new(), CancellationToken::new());
        let task = tokio::spawn(driver.run(stop.clone(), abort.clone()));
        (handle, stop, abort, task)
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_writer_is_answered_after_the_flush_interval() {
        let store = Arc::new(Recorder::default());
        let (handle, stop, _abort, task) = start(store.clone());
        let t0 = Instant::now();
        let rx = handle
            .submit(readings(3), true)
            .expect("room")
            .expect("receiver");
        assert_eq!(rx.await, Ok(Ok(())));
        assert!(t0.elapsed() >= LIMITS.flush_interval);
        assert_eq!(store.writes.lock().expect("lock").len(), 1);
        stop.cancel();
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
        let (handle, _stop, _abort, _task) = start(store.clone());
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
        let (handle, _stop, _abort, _task) = start(store.clone());
        let rx = handle
            .submit(readings(5), true)
            .expect("room")
            .expect("receiver");
        assert_eq!(rx.await, Ok(Ok(())));
        let writes = store.writes.lock().expect("lock");
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0][0].values.len(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_batch_is_reported_to_its_writers() {
        let store = Arc::new(Recorder::default());
        store.reject.store(true, Ordering::SeqCst);
        let (handle, _stop, _abort, _task) = start(store.clone());
        let rx = handle
            .submit(readings(2), true)
            .expect("room")
            .expect("receiver");
        assert_eq!(rx.await, Ok(Err(NotStored::Rejected)));
        assert_eq!(handle.buffered(), 0, "a refused batch frees its room");
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_drains_pending_readings_and_closing_refuses_new_ones() {
        let store = Arc::new(Recorder::default());
        let (handle, stop, _abort, task) = start(store.clone());
        handle.submit(readings(7), false).expect("room");
        handle.close();
        assert_eq!(
            handle.submit(readings(1), false).expect_err("closed"),
            SubmitError::Closed
        );
        stop.cancel();
        assert_eq!(task.await.expect("joined").unstored_readings, 0);
        assert_eq!(store.writes.lock().expect("lock")[0][0].values.len(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn the_shutdown_deadline_reports_what_could_not_be_stored() {
        let store = Arc::new(Recorder::default());
        store.failures.store(usize::MAX, Ordering::SeqCst);
        let (handle, stop, abort, task) = start(store.clone());
        let rx = handle
            .submit(readings(4), true)
            .expect("room")
            .expect("receiver");
        stop.cancel();
        tokio::time::sleep(Duration::from_secs(3)).await;
        abort.cancel();
        assert_eq!(task.await.expect("joined").unstored_readings, 4);
        assert_eq!(rx.await, Ok(Err(NotStored::Shutdown)));
    }
}

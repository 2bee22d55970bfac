//! Dashboards first: the rollup upkeep's commands wait for a pause in the
//! queries' reads. After a backfill the upkeep rolls up thousands of late
//! series-hours, each step a bucket read and a rollup update of thousands
//! of documents; a panel's few round trips sent meanwhile queue behind them
//! on a server that runs one command at a time (the stand-in) or share its
//! disk and cores (MongoDB). So the upkeep's commands are kept short (reads
//! of [`UPKEEP_BATCH_DOCUMENTS`] a reply, updates of [`UPKEEP_STATEMENTS`]),
//! and before each (each `getMore` too) it waits until no query has read
//! for [`QUIET`], at most as long as its own last command took (and never
//! over [`MAX_WAIT`]): under a ceaseless stream of queries the upkeep still
//! has half the server. Queries that meet hours not yet rolled up are
//! slow because of it, so starving it would only make them slower; and
//! while a query waits for the upkeep's step (see `rollup::priority`) the
//! upkeep does not give way at all.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// A query's round trips follow each other within milliseconds; a gap this
/// long means it is done.
pub(super) const QUIET: Duration = Duration::from_millis(50);
/// The longest one upkeep command waits for queries.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(2);
/// Documents per reply of the upkeep's reads: a read of thousands of
/// buckets is several replies, each about a tenth of a second on the
/// stand-in, and the upkeep gives way before each `getMore` (the server's
/// default sends all after the first 101 in one reply, a second or more).
pub(super) const UPKEEP_BATCH_DOCUMENTS: u32 = 500;
/// Statements per rollup `update` of the upkeep, for the same reason: a
/// backfill's step of 500 series-hours wrote some 1 500 in one command.
pub(in crate::store::mongo) const UPKEEP_STATEMENTS: usize = 500;
/// How often a waiting command looks again.
const POLL: Duration = Duration::from_millis(10);

/// The queries' reads in progress, and when the last one ended.
#[derive(Debug)]
pub(super) struct Traffic {
    origin: Instant,
    reading: AtomicUsize,
    /// One more than the milliseconds from `origin` to the end of the last
    /// read (0: none yet).
    last_end: AtomicU64,
    /// One more than the milliseconds from `origin` to the last time the
    /// upkeep went ahead (0: never).
    granted: AtomicU64,
    /// Queries waiting for the upkeep's step under way.
    waiting: AtomicUsize,
}

impl Default for Traffic {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            reading: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
        }
    }
}

impl Traffic {
    /// Counts a query's read until the guard is dropped.
    pub(super) fn reading(&self) -> Reading<'_> {
        self.reading.fetch_add(1, Ordering::AcqRel);
        Reading(self)
    }

    /// Whether no read is in progress and none ended within [`QUIET`] of `now`.
    fn quiet(&self, now: Instant) -> bool {
        if self.reading.load(Ordering::Acquire) > 0 {
            return false;
        }
        match self.last_end.load(Ordering::Acquire) {
            0 => true,
            ended => {
                now.saturating_duration_since(self.origin)
                    >= Duration::from_millis(ended - 1) + QUIET
            }
        }
    }

    fn since_origin(&self, at: Instant) -> u64 {
        let ms = at.saturating_duration_since(self.origin).as_millis();
        u64::try_from(ms).unwrap_or(u64::MAX - 1) + 1
    }

    /// Counts a query waiting for the upkeep's step until the guard is
    /// dropped: meanwhile the upkeep goes ahead at once.
    pub(super) fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(self)
    }

    /// Waits until the queries pause, at most as long as the upkeep worked
    /// since it last went ahead (its last command) and never over
    /// [`MAX_WAIT`]; returns how long it waited. While a query waits for
    /// the upkeep, it goes ahead at once.
    pub(super) async fn give_way(&self) -> Duration {
        let start = Instant::now();
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.granted
                .store(self.since_origin(start), Ordering::Release);
            return Duration::ZERO;
        }
        let worked = match self.granted.load(Ordering::Acquire) {
            0 => MAX_WAIT,
            at => start
                .saturating_duration_since(self.origin)
                .saturating_sub(Duration::from_millis(at - 1)),
        };
        let bound = worked.min(MAX_WAIT);
        loop {
            let now = Instant::now();
            if self.quiet(now) || now >= start + bound {
                self.granted
                    .store(self.since_origin(now), Ordering::Release);
                return now - start;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// A query waiting for the upkeep (see [`Traffic::waiting`]).
pub(super) struct Waiting<'a>(&'a Traffic);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A read in progress (see [`Traffic::reading`]).
pub(super) struct Reading<'a>(&'a Traffic);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let ended = self.0.since_origin(Instant::now());
        self.0.last_end.store(ended, Ordering::Release);
        self.0.reading.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn with_no_query_reading_the_upkeep_goes_at_once() {
        let traffic = Traffic::default();
        assert_eq!(traffic.give_way().await, Duration::ZERO);
        drop(traffic.reading());
        tokio::time::advance(QUIET).await;
        assert_eq!(traffic.give_way().await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_upkeep_waits_for_a_read_to_end_and_a_quiet_gap_after_it() {
        let traffic = std::sync::Arc::new(Traffic::default());
        let reader = traffic.clone();
        let read = tokio::spawn(async move {
            let _reading = reader.reading();
            tokio::time::sleep(Duration::from_millis(300)).await;
        });
        tokio::task::yield_now().await;
        let waited = traffic.give_way().await;
        read.await.expect("the read ends");
        assert!(
            waited >= Duration::from_millis(300) + QUIET && waited < MAX_WAIT,
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn under_ceaseless_reads_the_upkeep_waits_no_longer_than_its_last_command_took() {
        let traffic = Traffic::default();
        let _reading = traffic.reading();
        traffic.give_way().await;
        for command in [100, 700, 30] {
            let command = Duration::from_millis(command);
            tokio::time::advance(command).await;
            let waited = traffic.give_way().await;
            assert!(
                waited >= command && waited < command + POLL * 2,
                "{command:?}: {waited:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn while_a_query_waits_for_the_upkeep_it_goes_ahead_of_reads() {
        let traffic = Traffic::default();
        let _reading = traffic.reading();
        let waiting = traffic.waiting();
        assert_eq!(traffic.give_way().await, Duration::ZERO);
        drop(waiting);
        tokio::time::advance(Duration::from_millis(300)).await;
        assert!(traffic.give_way().await >= Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn reads_without_end_hold_the_upkeep_back_no_longer_than_its_bound() {
        let traffic = Traffic::default();
        let _reading = traffic.reading();
        let waited = traffic.give_way().await;
        assert!(
            waited >= MAX_WAIT && waited < MAX_WAIT + POLL * 2,
            "{waited:?}"
        );
    }
}

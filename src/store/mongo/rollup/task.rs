//! The upkeep task: rolls up ended hours and the hours marked late.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::{late, reads};
use crate::store::StoreError;
use crate::store::mongo::MongoStore;
use crate::store::mongo::connection::unix_now;
use crate::store::rollup::schedule::Job;

/// How long until the wall clock reaches `due` (epoch seconds), a little
/// past it; a long time when it has already passed (nothing of ours falls
/// due then).
fn until_due(due: i64) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    match u64::try_from(due) {
        Ok(due) if Duration::from_secs(due) > now => {
            Duration::from_secs(due) - now + Duration::from_millis(20)
        }
        _ => Duration::MAX,
    }
}

impl MongoStore {
    /// Tells the upkeep which hours the batcher still holds buckets of (the
    /// journal is on, so the batcher holds what is still to come): an hour
    /// marked late by this instance alone is rolled up once none is.
    pub fn owe_to(&self, owed: Arc<crate::batcher::OwedHours>) {
        let _ = self.owed.set(owed);
    }

    /// Whether this instance's batcher still holds a bucket of `hour`.
    pub(in crate::store::mongo) fn owes(&self, hour: i64) -> bool {
        self.owed.get().is_some_and(|o| o.owes(hour))
    }

    /// Whether a catch-up is under way: hours marked late at the last
    /// count, or an ended hour the batcher still owes (see `share`).
    pub(in crate::store::mongo) fn catching_up(&self) -> bool {
        let hour = unix_now() - unix_now().rem_euclid(3600);
        self.pace.late() > 0
            || self
                .owed
                .get()
                .and_then(|o| o.oldest())
                .is_some_and(|oldest| oldest < hour)
    }

    /// Resolves when an hour the batcher held is paid (never without a
    /// batcher).
    async fn paid(&self) {
        match self.owed.get() {
            Some(o) => o.paid().await,
            None => std::future::pending().await,
        }
    }

    /// Rolls up `jobs`, counting what it read and wrote.
    pub async fn roll_up_counted(
        &self,
        jobs: &[Job],
        now: i64,
        written: Option<&reads::Written>,
        replace: bool,
    ) -> Result<usize, StoreError> {
        let cost = self.roll_up(jobs, now, written, replace).await?;
        self.count(|m| {
            m.db_documents("read", "buckets", "rollup_upkeep", cost.buckets_read);
            m.db_documents("read", "rollups", "rollup_upkeep", cost.rollups_read);
            m.db_documents("written", "rollups", "rollup_upkeep", cost.rollups_written);
            m.rollup_jobs.inc_by(jobs.len() as u64);
        });
        Ok(cost.round_trips)
    }

    /// Rolls up the hours this instance wrote into while they were open,
    /// once they are due (see `store::rollup::schedule`), and the hours any instance
    /// marked late once their writes pause (see `store::rollup::late`), until `stop`
    /// resolves; then the ones that ended (this instance writes nothing
    /// more) and every late marker.
    pub async fn run_upkeep(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        // Long: the upkeep task's loop: one arm per reason to wake.
        const MAX_JOBS: usize = 20_000;
        // Often enough that a marked hour waits about `late_after`.
        let tick = Duration::from_secs(self.late_after.clamp(1, 5).unsigned_abs());
        // When a poll of the markers last rolled up all that was due, and
        // when the last poll ran.
        let mut clean: Option<i64> = None;
        let mut polled = i64::MIN;
        tokio::pin!(stop);
        loop {
            let now = unix_now();
            let due = self.upkeep().due(now, MAX_JOBS);
            let mut more = false;
            if !due.is_empty() {
                let jobs: Vec<Job> = due.iter().map(|d| d.job.clone()).collect();
                match self.roll_up_counted(&jobs, now, None, false).await {
                    Ok(_) => self.upkeep().done(&due),
                    Err(e) => warn!(error = %e, jobs = jobs.len(),
                        "Rolling up ended hours failed; trying again (queries read their buckets meanwhile)."),
                }
                self.count(|m| m.rollup_pending.set(self.upkeep().pending() as i64));
                more = due.len() == MAX_JOBS;
            }
            // A lone instance whose last clean poll came after its own last
            // marks were due has none of its own left to find: it polls
            // once a minute, for marks of operators' commands (`redrive`).
            let lone = self.watermarks.others() == i64::MAX;
            let last_mark = self.last_mark.load(std::sync::atomic::Ordering::Acquire);
            // A lone instance whose batcher holds the backlog (the journal
            // is on) knows every write still to come: an hour is due once
            // none of it is owed.
            let ledger = lone && self.owed.get().is_some();
            let settle = if ledger { 0 } else { self.late_after };
            let none_left = clean.is_some_and(|at| at > last_mark.saturating_add(settle));
            // One instance rolls up the marked hours: two rolling up one
            // hour at once could write a roll-up read before a flush over one
            // read after it (late roll-ups replace their slots).
            let roller = self.late_roller.load(std::sync::atomic::Ordering::Acquire);
            // Hours a query asked for are looked for whatever this instance
            // marked (another's marks, an operator's command).
            let asked = !self.priority.wanted(tokio::time::Instant::now()).is_empty();
            if roller
                && (asked
                    || !(lone && none_left && now.saturating_sub(polled) < late::LATEST_AFTER))
            {
                polled = now;
                // A lone instance's marks are all its own: with the ledger
                // an hour is due once its batcher owes it nothing (however
                // busy the batcher is with other hours). Others' flushes,
                // or a client's next request, may still write into it:
                // then a quiet of `late_after` too.
                match self.roll_up_late(now, Some(settle)).await {
                    Ok(pass) => {
                        more = pass.full;
                        // Only a pass that looked at every due marker is clean.
                        clean = (!pass.full && pass.held == 0).then_some(now);
                    }
                    Err(e) => {
                        clean = None;
                        warn!(error = %e,
                            "Rolling up the hours marked late failed; trying again (queries read their buckets meanwhile).");
                    }
                }
                self.recount_late().await;
            }
            if !roller {
                self.count(|m| m.rollup_late.set(0));
            }
            if more {
                continue;
            }
            // Woken when this instance's newest marks fall due rather than
            // at the next tick: after a backfill, its last hours go to their
            // rollups up to a tick sooner.
            let last_mark = self.last_mark.load(std::sync::atomic::Ordering::Acquire);
            let wait = until_due(last_mark.saturating_add(self.late_after)).min(tick);
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(wait) => {}
                // A lone instance's hours are due as their last bucket is written.
                _ = self.paid(), if ledger => {}
                // A query met marked hours: they go first.
                _ = self.priority.asked(), if roller => {}
            }
        }
        let now = unix_now();
        let ended = self.upkeep().ended(now, usize::MAX);
        let jobs: Vec<Job> = ended.iter().map(|d| d.job.clone()).collect();
        if !jobs.is_empty() {
            match self.roll_up_counted(&jobs, now, None, false).await {
                Ok(_) => self.upkeep().done(&ended),
                Err(e) => warn!(error = %e, jobs = jobs.len(),
                    "Could not roll up the ended hours before stopping; queries read their buckets until they are."),
            }
        }
        // The instance that rolls them up goes on doing so; this one stops.
        while self.late_roller.load(std::sync::atomic::Ordering::Acquire) {
            match self.roll_up_late(now, Some(0)).await {
                Ok(pass) if pass.full => continue,
                Ok(_) => break,
                Err(e) => {
                    warn!(error = %e, "Could not roll up the hours marked late before stopping; another instance, or the next start, will.");
                    break;
                }
            }
        }
        let open = self.upkeep().pending();
        if open > 0 {
            info!(
                series_hours = open,
                "Hours still open at shutdown are rolled up when next written, or read from their buckets."
            );
        }
    }
}

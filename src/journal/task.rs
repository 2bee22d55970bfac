//! The journal task ([`JournalTask`]): owns the journal's files, commits
//! what writers queued with one fsync per group, offers it to the batcher
//! (or reads it back from disk later), and deletes segments once stored.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::cursor::{Cursor, Step};
use super::record::{self, FRAME_HEADER};
use super::segments::{ReadRecord, Segments};
use crate::batcher::clock::{self, Watermarks, unix_ms};
use crate::batcher::driver::BatcherHandle;
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::Metrics;

/// Appends waiting for the journal task; beyond it writers get "busy".
pub(super) const QUEUE: usize = 4096;

/// One commit takes at most about this much.
const MAX_GROUP_BYTES: usize = 16 << 20;
/// The backlog is read back in chunks of about this much.
const READ_BYTES: usize = 4 << 20;
/// How often the task looks for room for the backlog while there is one...
const TICK: Duration = Duration::from_millis(200);
/// ...and for segments to delete otherwise: each wake-up costs an idle
/// service CPU, and a segment deleted a second later costs nothing.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// The disk refused a commit: the readings are not journaled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the journal could not be written: {0}")]
pub struct JournalError(String);

pub(super) type Committed = oneshot::Sender<Result<(), JournalError>>;

pub(super) struct Append {
    pub(super) frame: Vec<u8>,
    pub(super) done: Option<Committed>,
}

pub(super) struct Shared {
    /// Bytes of the segments on disk.
    pub(super) disk: AtomicU64,
    /// Bytes appended but not yet committed.
    pub(super) queued: AtomicU64,
    pub(super) max_bytes: u64,
    /// An append was refused for space since the journal last shrank.
    pub(super) full: AtomicBool,
    /// Every journaled reading has been offered to the batcher.
    pub(super) caught_up: AtomicBool,
    /// When the oldest segment not yet read back was started, while behind.
    pub(super) behind_since: Mutex<Option<SystemTime>>,
    /// The acknowledgement time of the group being committed, until the
    /// batcher holds it (`i64::MAX`: none).
    pub(super) committing: AtomicI64,
    /// Told whether readings older than the batcher's wait on disk.
    pub(super) watermarks: Arc<Watermarks>,
    /// The id this instance publishes its floor under.
    pub(super) instance: String,
    pub(super) shutdown: Shutdown,
}

/// The task that owns the journal's files: commits appends, feeds the
/// batcher, and deletes segments once their readings are stored.
pub struct JournalTask {
    pub(super) segments: Arc<Mutex<Segments>>,
    pub(super) rx: mpsc::Receiver<Append>,
    pub(super) shared: Arc<Shared>,
    pub(super) batcher: BatcherHandle,
    pub(super) metrics: Arc<Metrics>,
    /// Where the reader is, and what it decides (pure).
    pub(super) cursor: Cursor,
    /// Records read back from disk, not yet offered.
    pub(super) staged: VecDeque<(u64, ReadRecord)>,
    /// Segments below this were written by an earlier run.
    pub(super) replay_before: u64,
}

fn lock(segments: &Mutex<Segments>) -> MutexGuard<'_, Segments> {
    segments.lock().unwrap_or_else(|e| e.into_inner())
}

impl JournalTask {
    /// Commits, feeds and tidies until the shutdown starts; then commits what
    /// was already queued and returns itself for [`Self::finish`].
    pub async fn run(mut self) -> Self {
        let shutdown = self.shared.shutdown.clone();
        self.feed().await;
        let mut tidy = Instant::now() + TICK;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.triggered() => break,
                Some(first) = self.rx.recv() => self.commit(first).await,
                _ = self.batcher.room(), if !self.cursor.caught_up() => self.feed().await,
                _ = tokio::time::sleep_until(tidy) => {
                    if !self.cursor.caught_up() {
                        self.feed().await;
                    }
                    self.retire().await;
                    let every = if self.cursor.caught_up() { IDLE_TICK } else { TICK };
                    tidy = Instant::now() + every;
                }
            }
        }
        self.rx.close();
        while let Some(first) = self.rx.recv().await {
            self.commit(first).await;
        }
        self
    }

    /// After the batcher drained: deletes what is stored and says what is
    /// left. Whether readings stay in the journal for the next start.
    pub async fn finish(mut self) -> bool {
        if self.cursor.caught_up() && self.batcher.lowest_unsettled_origin().is_none() {
            // Everything journaled is stored: nothing for the next start.
            if let Err(e) = lock(&self.segments).clear() {
                warn!(error = %e, "Could not empty the journal; the next start replays readings that are already stored, which changes nothing.");
            }
            self.publish();
            return false;
        }
        self.retire().await;
        let bytes = self.shared.disk.load(Ordering::Acquire);
        let segments = lock(&self.segments).list().len();
        info!(
            bytes,
            segments, "Readings not yet stored stay in the journal; the next start writes them."
        );
        true
    }

    async fn commit(&mut self, first: Append) {
        let mut group = vec![first];
        let mut size = group[0].frame.len();
        while size < MAX_GROUP_BYTES {
            match self.rx.try_recv() {
                Ok(next) => {
                    size += next.frame.len();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        // The group's acknowledgement time, published as this instance's
        // floor until the batcher holds the readings (see `floor`).
        let ack = clock::ack_ms();
        self.shared.committing.store(ack, Ordering::Release);
        for a in &mut group {
            record::stamp(&mut a.frame, ack);
        }
        let frames: Vec<u8> = if group.len() == 1 {
            std::mem::take(&mut group[0].frame)
        } else {
            let mut all = Vec::with_capacity(size);
            for a in &group {
                all.extend_from_slice(&a.frame);
            }
            all
        };
        let started = Instant::now();
        let segments = self.segments.clone();
        let appended = tokio::task::spawn_blocking(move || {
            let result = lock(&segments).append(&frames);
            (frames, result)
        })
        .await;
        self.metrics.journal_fsyncs.inc();
        self.metrics
            .journal_fsync_duration
            .observe(started.elapsed().as_secs_f64());
        self.shared.queued.fetch_sub(size as u64, Ordering::AcqRel);
        self.publish();
        let result = match appended {
            Ok((frames, result)) => {
                if group.len() == 1 {
                    group[0].frame = frames;
                }
                result
            }
            Err(e) => Err(std::io::Error::other(e.to_string())),
        };
        let outcome = match result {
            Ok((segment, at)) => {
                self.metrics.journal_appended_bytes.inc_by(size as u64);
                self.offer_committed(segment, at, &group);
                self.shared.committing.store(i64::MAX, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                self.shared.committing.store(i64::MAX, Ordering::Release);
                warn!(error = %e, appends = group.len(),
                    "Could not write to the journal; the writers were refused and nothing was acknowledged.");
                Err(JournalError(e.kind().to_string()))
            }
        };
        for a in group {
            if let Some(done) = a.done {
                // A writer that stopped waiting has nothing to be told.
                let _ = done.send(outcome.clone());
            }
        }
    }

    /// Offers freshly committed records to the batcher, if nothing older is
    /// still waiting; the first that does not fit starts a backlog. The
    /// readings are the ones the writers decoded and validated, framed a
    /// moment ago: read back without checking them again.
    fn offer_committed(&mut self, segment: u64, at: u64, group: &[Append]) {
        if !self.cursor.offer_fresh() {
            return;
        }
        let now = unix_ms();
        let mut offset = at;
        for a in group {
            let end = offset + a.frame.len() as u64;
            let offered = match record::decode_trusted(&a.frame[FRAME_HEADER..]) {
                Ok(d) => self
                    .batcher
                    .submit_held(d.readings, segment, now, d.ack_ms)
                    .is_ok(),
                // Encoded here a moment ago: this cannot happen.
                Err(e) => {
                    error!(error = %e, "A journal record just written does not read back; skipping it.");
                    true
                }
            };
            if !offered {
                self.fall_behind(segment, offset);
                return;
            }
            self.cursor.offered(segment, end);
            offset = end;
        }
    }

    fn fall_behind(&mut self, segment: u64, offset: u64) {
        if !self.cursor.refused(segment, offset) {
            return;
        }
        self.shared.watermarks.set_backlog(i64::MIN);
        self.shared.caught_up.store(false, Ordering::Release);
        let created = lock(&self.segments)
            .list()
            .iter()
            .find(|s| s.id == segment)
            .map(|s| s.created);
        *self
            .shared
            .behind_since
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = created;
    }

    /// Reads the backlog back from disk and offers it, in order, until the
    /// batcher is full or the backlog is gone.
    async fn feed(&mut self) {
        // Long: the backlog loop: read, offer, stop when the batcher is full.
        loop {
            while let Some((segment, record)) = self.staged.front() {
                let (segment, offset, end) = (*segment, record.offset, record.end);
                let readings = match &record.payload {
                    // Reported, with its count, when the journal was opened.
                    None if record.known_damage => None,
                    None => {
                        error!(
                            segment,
                            offset,
                            "A journal record failed its checksum when read back; its readings are lost."
                        );
                        None
                    }
                    Some(payload) => match record::decode(payload) {
                        Ok(d) => Some(d),
                        Err(e) => {
                            error!(segment, offset, error = %e,
                                "A journal record does not read back; its readings are lost.");
                            None
                        }
                    },
                };
                if let Some(d) = readings {
                    let n = d.readings.len() as u64;
                    if self
                        .batcher
                        .submit_held(d.readings, segment, unix_ms(), d.ack_ms)
                        .is_err()
                    {
                        // Full: the driver is writing; come back when it made room.
                        self.cursor.refused(segment, offset);
                        return;
                    }
                    if segment < self.replay_before {
                        self.metrics.journal_replayed_readings.inc_by(n);
                    }
                }
                self.cursor.offered(segment, end);
                self.staged.pop_front();
            }
            let step = {
                let segments = lock(&self.segments);
                let (segment, _) = self.cursor.at();
                self.cursor.next(
                    segments.end(),
                    segments.len_of(segment),
                    segments.next_after(segment),
                )
            };
            let (segment, offset) = match step {
                Step::CaughtUp => {
                    self.catch_up();
                    return;
                }
                Step::Read { segment, offset } => (segment, offset),
            };
            let segments = self.segments.clone();
            let read = tokio::task::spawn_blocking(move || {
                lock(&segments).read(segment, offset, READ_BYTES)
            })
            .await;
            match read {
                Ok(Ok(records)) if !records.is_empty() => {
                    self.staged
                        .extend(records.into_iter().map(|r| (segment, r)));
                }
                Ok(Ok(_)) => {
                    // Nothing whole past this point: the rest was cut off.
                    let segments = lock(&self.segments);
                    self.cursor
                        .skip_segment(segments.next_after(segment), segments.end());
                }
                Ok(Err(e)) => {
                    error!(segment, error = %e, "Could not read the journal back; retrying.");
                    return;
                }
                Err(e) => {
                    error!(error = %e, "Reading the journal back failed; retrying.");
                    return;
                }
            }
        }
    }

    fn catch_up(&mut self) {
        self.shared.caught_up.store(true, Ordering::Release);
        self.shared.watermarks.set_backlog(i64::MAX);
        *self
            .shared
            .behind_since
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Deletes the segments that are read and whose readings are all settled.
    async fn retire(&mut self) {
        let lowest = self.batcher.lowest_unsettled_origin();
        let done: Vec<u64> = {
            let segments = lock(&self.segments);
            let (end, _) = segments.end();
            self.cursor
                .retirable(segments.list().iter().map(|s| s.id), end, lowest)
        };
        if done.is_empty() {
            return;
        }
        let segments = self.segments.clone();
        let removed = tokio::task::spawn_blocking(move || {
            let mut segments = lock(&segments);
            let mut removed = 0;
            for id in done {
                match segments.remove(id) {
                    Ok(()) => removed += 1,
                    Err(e) => {
                        warn!(segment = id, error = %e, "Could not delete a journal segment whose readings are stored; will try again.");
                        break;
                    }
                }
            }
            removed
        })
        .await
        .unwrap_or(0);
        if removed > 0 {
            self.publish();
        }
    }

    fn publish(&self) {
        let segments = lock(&self.segments);
        let bytes = segments.bytes();
        self.shared.disk.store(bytes, Ordering::Release);
        if bytes < self.shared.max_bytes / 10 * 9 {
            // Room again (for all but a request nearly the journal's size).
            self.shared.full.store(false, Ordering::Release);
        }
        self.metrics
            .journal_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.metrics
            .journal_segments
            .set(segments.list().len() as i64);
    }
}

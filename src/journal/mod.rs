//! The journal: an append-only, checksummed, fsync'd log on local disk between
//! the ingestors and the batcher.
//!
//! A writer's readings are framed ([`record`]) and handed to the journal task,
//! which appends whatever has queued up since its last commit and fsyncs once
//! for all of them (group commit), then answers them: that is the
//! acknowledgement. Right after the fsync, the same task offers the readings
//! to the batcher as *held* readings, tagged with their segment; the batcher
//! writes each bucket when its window ends. When the batcher has no room
//! (MongoDB is down, or memory is at its bound) the task stops offering and
//! later reads the backlog back from disk, in order, as room frees up: memory
//! stays bounded and the disk absorbs the outage until `journal.max_bytes`.
//!
//! A segment is deleted once it is read and the batcher reports every reading
//! from it stored or dead-lettered. On start, [`segments::Segments::open`]
//! checks every record's checksum, cuts torn tails, and the task replays the
//! segments that remain; bucket upserts are idempotent, so a replay of
//! readings already stored changes nothing.
//!
//! [`Intake`] is what the ingestors call: it sends readings through the
//! journal, or straight to the batcher when the journal is off or the writer
//! asked to wait for storage.

mod cursor;
mod files;
mod intake;
mod record;
mod segments;
mod settings;

pub use intake::{Ack, Intake, IntakeError, NotSafe, REGISTER_WAIT, Registrar, Wait};
pub use settings::Settings;

/// One framed journal record of `readings` (for the benchmarks).
pub fn encode_frame(readings: &[Reading<'_>]) -> Vec<u8> {
    record::encode(readings, 0)
}

/// The readings of a framed record, checksum verified (for the benchmarks).
pub fn decode_frame(frame: &[u8]) -> Option<Vec<Reading<'_>>> {
    let record::Frame::Valid { len } = record::frame_at(frame, 0) else {
        return None;
    };
    record::decode(&frame[FRAME_HEADER..FRAME_HEADER + len])
        .ok()
        .map(|d| d.readings)
}

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{error, info, warn};

use self::cursor::{Cursor, Step};
use self::files::{bind, instance_id};
use self::record::FRAME_HEADER;
use self::segments::{ReadRecord, Recovered, Segments};
use crate::batcher::clock::{self, Watermarks, unix_ms};
use crate::batcher::driver::BatcherHandle;
use crate::domain::Reading;
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::Metrics;

/// Appends waiting for the journal task; beyond it writers get "busy".
const QUEUE: usize = 4096;
/// One commit takes at most about this much.
const MAX_GROUP_BYTES: usize = 16 << 20;
/// The backlog is read back in chunks of about this much.
const READ_BYTES: usize = 4 << 20;
/// How often the task looks for room for the backlog while there is one...
const TICK: Duration = Duration::from_millis(200);
/// ...and for segments to delete otherwise: each wake-up costs an idle
/// service CPU, and a segment deleted a second later costs nothing.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Opening the journal failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("opening the journal in {dir}: {source}")]
    Io { dir: String, source: std::io::Error },
    /// The journal holds readings acknowledged for another target: they
    /// must be stored there, never replayed into this one.
    #[error(
        "the journal in {dir} holds {readings} readings acknowledged for {found}, but this \
         instance writes to {configured}; start once with the old setting to store them (a \
         clean stop empties the journal), or give this configuration its own journal.dir"
    )]
    OtherTarget {
        dir: String,
        readings: u64,
        found: String,
        configured: String,
    },
}

/// The disk refused a commit: the readings are not journaled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the journal could not be written: {0}")]
pub struct JournalError(String);

type Committed = oneshot::Sender<Result<(), JournalError>>;

struct Append {
    frame: Vec<u8>,
    done: Option<Committed>,
}

struct Shared {
    /// Bytes of the segments on disk.
    disk: AtomicU64,
    /// Bytes appended but not yet committed.
    queued: AtomicU64,
    max_bytes: u64,
    /// An append was refused for space since the journal last shrank.
    full: AtomicBool,
    /// Every journaled reading has been offered to the batcher.
    caught_up: AtomicBool,
    /// When the oldest segment not yet read back was started, while behind.
    behind_since: Mutex<Option<SystemTime>>,
    /// The acknowledgement time of the group being committed, until the
    /// batcher holds it (`i64::MAX`: none).
    committing: AtomicI64,
    /// Told whether readings older than the batcher's wait on disk.
    watermarks: Arc<Watermarks>,
    /// The id this instance publishes its floor under.
    instance: String,
    shutdown: Shutdown,
}

/// The writers' side of the journal: cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: mpsc::Sender<Append>,
    shared: Arc<Shared>,
}

impl Journal {
    /// Opens the journal in `settings.dir` (recovering what a previous run
    /// left) and returns the handle and the task that must run for it.
    /// `target` names where its readings go (see [`bind`]).
    pub fn open(
        settings: &Settings,
        target: &str,
        batcher: BatcherHandle,
        metrics: Arc<Metrics>,
        watermarks: Arc<Watermarks>,
        shutdown: Shutdown,
    ) -> Result<(Journal, JournalTask), OpenError> {
        let (segments, recovered) =
            Segments::open(&settings.dir, settings.segment_bytes).map_err(|source| {
                OpenError::Io {
                    dir: settings.dir.display().to_string(),
                    source,
                }
            })?;
        bind(&settings.dir, target, recovered.readings)?;
        let instance = instance_id(&settings.dir)?;
        report(&recovered, &settings.dir.display().to_string());
        let (tx, rx) = mpsc::channel(QUEUE);
        let first = segments.first().unwrap_or(0);
        let (end, _) = segments.end();
        let shared = Arc::new(Shared {
            disk: AtomicU64::new(segments.bytes()),
            queued: AtomicU64::new(0),
            max_bytes: settings.max_bytes,
            full: AtomicBool::new(false),
            caught_up: AtomicBool::new(false),
            behind_since: Mutex::new(None),
            committing: AtomicI64::new(i64::MAX),
            watermarks,
            instance,
            shutdown,
        });
        // Until the replay is done, what is on disk may be older than
        // anything: every value stored keeps its version.
        shared.watermarks.set_backlog(i64::MIN);
        let task = JournalTask {
            segments: Arc::new(Mutex::new(segments)),
            rx,
            shared: shared.clone(),
            batcher,
            metrics,
            cursor: Cursor::new(first, record::HEADER as u64),
            staged: VecDeque::new(),
            replay_before: end,
        };
        Ok((Journal { tx, shared }, task))
    }

    /// Journals `readings`. With `wait`, the receiver resolves once they are
    /// on disk (fsync'd) and offered to the batcher.
    pub fn append(
        &self,
        readings: &[Reading<'_>],
        wait: bool,
    ) -> Result<Option<oneshot::Receiver<Result<(), JournalError>>>, IntakeError> {
        if self.shared.shutdown.is_triggered() {
            return Err(IntakeError::Closed);
        }
        // Stamped with its acknowledgement time when committed.
        let frame = record::encode(readings, 0);
        let len = frame.len() as u64;
        let bytes = self.bytes();
        if bytes.saturating_add(len) > self.shared.max_bytes {
            self.shared.full.store(true, Ordering::Release);
            return Err(IntakeError::JournalFull {
                bytes,
                max: self.shared.max_bytes,
            });
        }
        let (done, rx) = if wait {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        self.shared.queued.fetch_add(len, Ordering::AcqRel);
        if let Err(e) = self.tx.try_send(Append { frame, done }) {
            self.shared.queued.fetch_sub(len, Ordering::AcqRel);
            return Err(match e {
                mpsc::error::TrySendError::Full(_) => IntakeError::Busy,
                mpsc::error::TrySendError::Closed(_) => IntakeError::Closed,
            });
        }
        Ok(rx)
    }

    /// Bytes on disk plus bytes on their way there.
    pub fn bytes(&self) -> u64 {
        self.shared.disk.load(Ordering::Acquire) + self.shared.queued.load(Ordering::Acquire)
    }

    /// Whether input was refused for space and the journal has not shrunk
    /// below 90 % since.
    pub fn is_full(&self) -> bool {
        self.shared.full.load(Ordering::Acquire)
    }

    /// Whether every journaled reading has been handed to the batcher (so
    /// queries see them): false during a replay and while behind.
    pub fn caught_up(&self) -> bool {
        self.shared.caught_up.load(Ordering::Acquire)
    }

    /// The id this instance publishes its floor under.
    pub fn instance_id(&self) -> &str {
        &self.shared.instance
    }

    /// The earliest acknowledgement this journal holds that the batcher may
    /// not: `i64::MIN` while a backlog or replay is on disk, the group being
    /// committed, else `i64::MAX`. Read after the clock and before the
    /// batcher (see `store::floor`).
    pub fn floor(&self) -> i64 {
        let committing = self.shared.committing.load(Ordering::Acquire);
        if !self.caught_up() {
            return i64::MIN;
        }
        committing
    }

    /// How long the oldest journaled reading not yet read back has waited,
    /// if the journal is behind.
    pub fn behind_for(&self) -> Option<Duration> {
        let since = *self
            .shared
            .behind_since
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        since.and_then(|s| s.elapsed().ok())
    }
}

fn report(recovered: &Recovered, dir: &str) {
    if recovered.segments > 0 {
        info!(
            dir,
            segments = recovered.segments,
            records = recovered.records,
            readings = recovered.readings,
            "Found journaled readings from the previous run; replaying them."
        );
    }
    if recovered.truncated_bytes > 0 || recovered.corrupt_records > 0 {
        // Never acknowledged: an acknowledgement waits for the fsync that
        // would have made these records whole. A corrupt record in the middle
        // (a bad disk) was acknowledged, though: that is a loss.
        let log = |corrupt: usize| {
            if corrupt > 0 {
                error!(
                    dir,
                    corrupt_records = corrupt,
                    truncated_bytes = recovered.truncated_bytes,
                    "Journal records failed their checksum and were skipped; their readings are lost."
                );
            } else {
                warn!(
                    dir,
                    truncated_bytes = recovered.truncated_bytes,
                    "The journal ended in a torn record (a crash mid-write); cut it off. It was never acknowledged."
                );
            }
        };
        log(recovered.corrupt_records);
    }
}

/// The task that owns the journal's files: commits appends, feeds the
/// batcher, and deletes segments once their readings are stored.
pub struct JournalTask {
    segments: Arc<Mutex<Segments>>,
    rx: mpsc::Receiver<Append>,
    shared: Arc<Shared>,
    batcher: BatcherHandle,
    metrics: Arc<Metrics>,
    /// Where the reader is, and what it decides (pure).
    cursor: Cursor,
    /// Records read back from disk, not yet offered.
    staged: VecDeque<(u64, ReadRecord)>,
    /// Segments below this were written by an earlier run.
    replay_before: u64,
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

    /// After the batcher drained: deletes what is stored and says what is left.
    pub async fn finish(mut self) {
        if self.cursor.caught_up() && self.batcher.lowest_unsettled_origin().is_none() {
            // Everything journaled is stored: nothing for the next start.
            if let Err(e) = lock(&self.segments).clear() {
                warn!(error = %e, "Could not empty the journal; the next start replays readings that are already stored, which changes nothing.");
            }
            self.publish();
            return;
        }
        self.retire().await;
        let bytes = self.shared.disk.load(Ordering::Acquire);
        let segments = lock(&self.segments).list().len();
        info!(
            bytes,
            segments, "Readings not yet stored stay in the journal; the next start writes them."
        );
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
        loop {
            while let Some((segment, record)) = self.staged.front() {
                let (segment, offset, end) = (*segment, record.offset, record.end);
                let readings = match &record.payload {
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

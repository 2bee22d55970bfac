//! [`Journal`], the writers' side of the journal: opened once (recovering
//! what a previous run left), then cloned into every ingestor.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tracing::{error, info, warn};

use super::cursor::Cursor;
use super::errors::IntakeError;
use super::files::{OpenError, bind, instance_id};
use super::record;
use super::segments::{Recovered, Segments};
use super::settings::Settings;
use super::task::{Append, JournalError, JournalTask, QUEUE, Shared};
use crate::batcher::clock::Watermarks;
use crate::batcher::driver::BatcherHandle;
use crate::domain::Reading;
use crate::shutdown::Shutdown;
use crate::telemetry::metrics::Metrics;

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
        report(&recovered, &settings.dir.display().to_string(), &metrics);
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

fn report(recovered: &Recovered, dir: &str, metrics: &Metrics) {
    if recovered.segments > 0 {
        info!(
            dir,
            segments = recovered.segments,
            records = recovered.records,
            readings = recovered.readings,
            "Found journaled readings from the previous run; replaying them."
        );
    }
    if recovered.damaged_ranges > 0 {
        metrics.journal_damaged(recovered.damaged_ranges as u64);
        error!(
            dir,
            damaged_ranges = recovered.damaged_ranges,
            damaged_bytes = recovered.damaged_bytes,
            "Journal ranges failed their checksum (a damaged disk?) and were skipped to the next intact record; the acknowledged readings in them are lost. Their bytes are kept in .corrupt files beside the segments."
        );
    }
    if recovered.truncated_bytes > 0 {
        // Never acknowledged: an acknowledgement waits for the fsync that
        // would have made these bytes whole.
        warn!(
            dir,
            truncated_bytes = recovered.truncated_bytes,
            "The newest journal segment ended in a torn write (a crash mid-write); cut it off. It was never acknowledged."
        );
    }
}

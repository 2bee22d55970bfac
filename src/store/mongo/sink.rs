//! The batcher's [`Sink`]: a flush's registry entries, then its buckets
//! (without what a delete removed), then its late-hour markers, a failure
//! of the first or last deciding whether the whole batch goes again; and dead letters,
//! inserted once however often a replay offers them.

use std::sync::atomic::Ordering;

use tracing::{error, warn};

use super::connection::{MongoStore, unix_now};
use super::in_flight::Flushing;
use crate::batcher::{DeadLetter, Outcome, Sink, UNKNOWN_ERROR_ATTEMPTS, Written};
use crate::domain::BucketUpdate;
use crate::store::StoreError;
use crate::store::document::dead_letter_document;
use crate::store::errors::{self, Class};

/// Whether every error of an unordered insert is a duplicate key.
fn only_duplicates(e: &mongodb::error::Error) -> bool {
    match &*e.kind {
        mongodb::error::ErrorKind::InsertMany(failure) => {
            failure.write_concern_error.is_none()
                && failure.write_errors.as_ref().is_some_and(|w| {
                    !w.is_empty() && w.iter().all(|x| x.code == errors::DUPLICATE_KEY)
                })
        }
        _ => false,
    }
}

impl Sink for MongoStore {
    async fn write(&self, updates: &[&BucketUpdate]) -> Written {
        // Held for the whole write: a delete counts an instance as having
        // seen it only once no write that began before is still going.
        let deletes = self.deletes.read().await;
        if deletes.is_empty() {
            return self.write_kept(updates).await;
        }
        let kept: Vec<Option<std::borrow::Cow<'_, BucketUpdate>>> = updates
            .iter()
            .map(|u| crate::store::delete::without_deleted(u, &deletes))
            .collect();
        let sent: Vec<&BucketUpdate> = kept.iter().flatten().map(|c| c.as_ref()).collect();
        let inner = self.write_kept(&sent).await;
        // Updates left with nothing are done: what they held was deleted.
        let mut outcomes = inner.outcomes.into_iter();
        Written {
            outcomes: kept
                .iter()
                .map(|k| match k {
                    Some(_) => outcomes.next().unwrap_or(Outcome::Stored),
                    None => Outcome::Stored,
                })
                .collect(),
            round_trips: inner.round_trips,
        }
    }

    async fn dead_letter(&self, letters: &[DeadLetter<'_>]) -> Outcome {
        self.dead_letter_kept(letters).await
    }
}

impl MongoStore {
    async fn write_kept(&self, updates: &[&BucketUpdate]) -> Written {
        let _flushing = Flushing::enter(&self.in_flight, updates);
        // The registry first: a query skips the sensors whose newest
        // registered hour ends before its range (`SensorInfo::quiet`), so
        // an hour is registered before any reading in it is stored.
        let registered = match self.register(updates).await {
            Ok(n) => n,
            // Nothing is stored yet: the batch goes again as a bucket write
            // refused so would.
            Err(StoreError::Outage(message)) => {
                return Written {
                    outcomes: vec![Outcome::Outage(message); updates.len()],
                    round_trips: 0,
                };
            }
            Err(StoreError::Unclassed(message)) => {
                return Written {
                    outcomes: vec![Outcome::Unknown(message); updates.len()],
                    round_trips: 0,
                };
            }
            // A registry that refuses the statements (its document is
            // broken) would refuse them for ever: the readings are stored
            // without it, and `hourglass rebuild-rollups` mends it.
            Err(e) => {
                self.give_up(&e);
                0
            }
        };
        let began = std::time::Instant::now();
        let mut written = self.write_updates(updates).await;
        written.round_trips += registered;
        let buckets_ms = began.elapsed().as_millis() as u64;
        let stored: Vec<&BucketUpdate> = updates
            .iter()
            .zip(&written.outcomes)
            .filter(|(_, o)| matches!(o, Outcome::Stored))
            .map(|(u, _)| *u)
            .collect();
        self.count(|m| m.db_documents("written", "buckets", "bucket_update", stored.len() as u64));
        // Hours still open are remembered and rolled up once they end; the
        // ended ones written into are marked late (after their buckets,
        // before the batch counts as stored: queries read the marked buckets
        // instead of their stale slots) and rolled up once their writes
        // pause (see `store::rollup::late`).
        let now = unix_now();
        self.upkeep().stored(stored.iter().copied(), now);
        let marked = std::time::Instant::now();
        match self.mark_late(&stored, now).await {
            Ok(n) => {
                self.unclassed_after.store(0, Ordering::Release);
                written.round_trips += n;
                tracing::debug!(
                    buckets = stored.len(),
                    buckets_ms,
                    marks_ms = marked.elapsed().as_millis() as u64,
                    "Wrote buckets and marked their ended hours."
                );
            }
            Err(e) => match self.resend(&e) {
                // Buckets and rollups are idempotent: the whole batch goes again.
                Some(message) => {
                    for o in &mut written.outcomes {
                        if matches!(o, Outcome::Stored) {
                            *o = Outcome::Outage(message.clone());
                        }
                    }
                }
                None => self.give_up(&e),
            },
        }
        written
    }

    /// Whether a flush whose registry or late-marker step failed with `e`
    /// goes again, and with what message.
    fn resend(&self, e: &StoreError) -> Option<String> {
        match e {
            StoreError::Outage(message) => Some(message.clone()),
            // A bounded number of times: a deterministic refusal must not
            // rewrite the batch for ever.
            StoreError::Unclassed(message) => {
                let failed = self.unclassed_after.fetch_add(1, Ordering::AcqRel) + 1;
                if failed < UNKNOWN_ERROR_ATTEMPTS {
                    Some(message.clone())
                } else {
                    self.unclassed_after.store(0, Ordering::Release);
                    None
                }
            }
            _ => None,
        }
    }

    /// Says that a flush goes on without its registry or late-marker step.
    /// The readings are stored in their buckets; a summary may be stale
    /// where a late write changed a rolled-up hour.
    fn give_up(&self, e: &StoreError) {
        match e {
            StoreError::Unclassed(_) => error!(
                error = %e,
                attempts = UNKNOWN_ERROR_ATTEMPTS,
                "The late-hour markers or the sensor registry could not be updated for a flush, however often it was sent; the buckets are stored, but answers over the affected hours may be stale until `hourglass rebuild-rollups` is run over them."
            ),
            _ => warn!(
                error = %e,
                "The late-hour markers or the sensor registry could not be updated for a flush; the buckets are stored. Run `hourglass rebuild-rollups` over the affected days."
            ),
        }
    }

    async fn dead_letter_kept(&self, letters: &[DeadLetter<'_>]) -> Outcome {
        if letters.is_empty() {
            return Outcome::Stored;
        }
        let documents = letters
            .iter()
            .map(|l| dead_letter_document(l, self.granularity));
        match self
            .dead_letters
            .insert_many(documents)
            .ordered(false)
            .await
        {
            Ok(_) => {
                self.count(|m| {
                    m.db_documents("written", "rejected", "dead_letter", letters.len() as u64)
                });
                Outcome::Stored
            }
            // Already there (a replay): the same readings, one document.
            Err(e) if only_duplicates(&e) => Outcome::Stored,
            Err(e) => match errors::classify(&e) {
                Class::Outage => Outcome::Outage(e.to_string()),
                Class::Poison => Outcome::Poison(errors::describe(&e)),
            },
        }
    }
}

//! Where the batcher writes: the [`Sink`] trait it owns, implemented by the
//! store above it, and what a write reports back, bucket by bucket.

use std::future::Future;

use crate::domain::BucketUpdate;

/// What became of one bucket update of a write.
/// Attempts a bucket update refused with an unclassed error gets before its
/// readings are dead-lettered (about 3 s of backoff), and flushes whose
/// rollup or registry step fails so are sent again.
pub const UNKNOWN_ERROR_ATTEMPTS: u32 = 5;

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Applied (with the write concern of the URI).
    Stored,
    /// Not applied because of an outage; sending it again will succeed later.
    Outage(String),
    /// Can never be applied: its readings belong in the dead-letter collection.
    Poison(String),
    /// Refused as a whole with an error no list classes: sent again like an
    /// outage a bounded number of times, then dead-lettered.
    Unknown(String),
}

/// The result of a write: one outcome per update, in order, and its cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Written {
    pub outcomes: Vec<Outcome>,
    /// Commands sent to the server (chunks, splits and upsert-race retries).
    pub round_trips: usize,
}

/// Readings that can never be stored in their bucket, and why.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetter<'a> {
    pub update: &'a BucketUpdate,
    pub reason: &'a str,
}

/// What the batcher writes to. Implementations must make [`Sink::write`]
/// idempotent: applying the same update twice leaves the bucket as once.
pub trait Sink: Send + Sync + 'static {
    /// Applies one update per bucket, in as few round trips as the server's
    /// limits allow, and says what became of each.
    fn write(&self, updates: &[&BucketUpdate]) -> impl Future<Output = Written> + Send;

    /// Keeps readings that can never be stored where an operator finds them;
    /// says what became of them (stored there, an outage, or refused too).
    fn dead_letter(&self, letters: &[DeadLetter<'_>]) -> impl Future<Output = Outcome> + Send;
}

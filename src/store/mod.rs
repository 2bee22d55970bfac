//! Bucket storage: the [`BucketStore`] trait and its MongoDB implementation.

pub mod command;
pub mod document;
pub mod errors;
pub mod mongo;

use std::future::Future;

use crate::domain::{Agg, BucketUpdate, MetricName, SensorId};

pub use mongo::MongoStore;

/// The current bucket document layout; every bucket written carries it.
pub const SCHEMA_VERSION: i32 = 1;

/// A failed storage operation, in the two classes of [`errors`] (plus reads
/// of buckets this version cannot parse).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The server, network, authorization or topology is in the way: retry.
    #[error("storage is unavailable: {0}")]
    Outage(String),
    /// The operation itself can never succeed as it is.
    #[error("storage refused the operation: {0}")]
    Poison(String),
    /// A stored bucket does not have a layout this version can read.
    #[error("a stored bucket could not be read: {0}")]
    Unreadable(String),
}

/// What became of one bucket update of a write.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Applied (with the write concern of the URI).
    Stored,
    /// Not applied because of an outage; sending it again will succeed later.
    Outage(String),
    /// Can never be applied: its readings belong in the dead-letter collection.
    Poison(String),
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

/// Which buckets of one series to read.
#[derive(Debug, Clone)]
pub enum Starts {
    /// Bucket starts (epoch seconds) in `[from, to)`.
    Range(i64, i64),
    /// These bucket starts.
    Only(Vec<i64>),
}

/// What to read of each bucket.
#[derive(Debug, Clone)]
pub struct Fetch<'a> {
    pub sensor: &'a SensorId<'a>,
    pub metric: &'a MetricName<'a>,
    pub starts: Starts,
    /// Read the per-minute aggregates `m` (hour buckets).
    pub minutes: bool,
    /// Read the raw values: `None`, all of them, or (hour buckets) these minutes'.
    pub values: Values,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    None,
    All,
    Minutes(Vec<u16>),
}

/// One bucket as read back: its aggregates and whatever parts were asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BucketRead {
    /// Epoch seconds.
    pub start: i64,
    pub agg: Agg,
    /// `(minute, aggregates)` for hour buckets when asked for.
    pub minutes: Vec<(u16, Agg)>,
    /// `(offset in seconds from start, value)` when asked for.
    pub values: Vec<(u16, f64)>,
}

/// Where buckets live. Implementations must make [`BucketStore::write`]
/// idempotent: applying the same update twice leaves the bucket as once.
pub trait BucketStore: Send + Sync + 'static {
    /// Applies one update per bucket, in as few round trips as the server's
    /// limits allow, and says what became of each.
    fn write(&self, updates: &[&BucketUpdate]) -> impl Future<Output = Written> + Send;

    /// Keeps readings that can never be stored where an operator finds them.
    fn dead_letter(
        &self,
        letters: &[DeadLetter<'_>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads buckets of one series, sorted by start.
    fn fetch(
        &self,
        fetch: Fetch<'_>,
    ) -> impl Future<Output = Result<Vec<BucketRead>, StoreError>> + Send;

    /// Checks that the server answers.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

//! Bucket storage: the [`BucketStore`] trait and its MongoDB implementation.

pub mod document;
pub mod mongo;

use std::future::Future;

use crate::domain::{Agg, BucketUpdate, MetricName, SensorId};

pub use mongo::MongoStore;

/// The current bucket document layout; every bucket written carries it.
pub const SCHEMA_VERSION: i32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Worth retrying: the network, a primary change, a write conflict.
    #[error("storage is unavailable: {0}")]
    Unavailable(String),
    /// Retrying cannot help: authorization, a refused document, a bad command.
    #[error("storage refused the operation: {0}")]
    Rejected(String),
    /// A stored bucket does not have a layout this version can read.
    #[error("a stored bucket could not be read: {0}")]
    Unreadable(String),
}

impl StoreError {
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// What a write cost.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteReport {
    /// Bucket updates applied.
    pub buckets: usize,
    /// Commands sent to the server (one per chunk, plus retries of upsert races).
    pub round_trips: usize,
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
    /// Applies one batch: one update per bucket, in as few round trips as it can.
    fn write(
        &self,
        updates: &[BucketUpdate],
    ) -> impl Future<Output = Result<WriteReport, StoreError>> + Send;

    /// Reads buckets of one series, sorted by start.
    fn fetch(
        &self,
        fetch: Fetch<'_>,
    ) -> impl Future<Output = Result<Vec<BucketRead>, StoreError>> + Send;

    /// Checks that the server answers.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

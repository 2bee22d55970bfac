//! Bucket storage: the [`BucketStore`] trait and its MongoDB implementation.

pub mod command;
pub mod document;
pub mod errors;
pub mod mongo;
mod settings;

use std::future::Future;

use crate::batcher::Sink;
use crate::domain::{BucketRead, MetricName, SensorId, Starts, Values};

pub use mongo::MongoStore;
pub use settings::BucketSettings;

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

/// Where buckets live: the batcher's [`Sink`] plus the reads queries need.
pub trait BucketStore: Sink {
    /// Reads buckets of one series, sorted by start.
    fn fetch(
        &self,
        fetch: Fetch<'_>,
    ) -> impl Future<Output = Result<Vec<BucketRead>, StoreError>> + Send;

    /// Checks that the server answers.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

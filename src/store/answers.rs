//! The types the store's reads answer in (see `mongo::surface`).

use std::time::Duration;

use super::errors::StoreError;
use crate::domain::{BucketRead, Level, RollupRead, Starts, Values};

/// What to read of many series' documents at one level.
#[derive(Debug, Clone)]
pub struct Fetch<'a> {
    pub sensors: &'a [&'a str],
    pub metric: &'a str,
    pub level: Level,
    /// Document starts: each a read of its own (a range or a list).
    pub starts: Vec<Starts>,
    /// Buckets: their values, all of them or (hour buckets) these minutes'.
    pub values: Values,
    /// Hour buckets: their minute aggregates `m`.
    pub minutes: bool,
    /// The server gives up on the read after this long (`maxTimeMS`).
    pub max_time: Duration,
    /// The documents each series may have among those asked (the union of
    /// their starts): what a read of the level by time would take of every
    /// other series of the metric, at most.
    pub starts_each: usize,
    /// Rollups: decode the slots' percentile sketches.
    pub sketches: bool,
}

/// One document of a [`Fetch`].
#[derive(Debug, Clone)]
pub enum Doc {
    Bucket(BucketRead),
    Rollup(RollupRead),
}

/// What a read cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Read {
    pub documents: u64,
    /// Commands: the `find`, and a `getMore` per further batch.
    pub round_trips: u64,
}

/// The marks of hours rolled up again later (see `store::rollup::late`)
/// over a query's series and range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LateMarks {
    /// Per series, the starts of its marked buckets, sorted.
    pub starts: Vec<Vec<i64>>,
    /// The marker documents holding them: what the query asks the upkeep
    /// to roll up first.
    pub docs: Vec<i64>,
}

/// A stored bucket with its series, as an export streams it.
#[derive(Debug, Clone)]
pub struct StoredBucket {
    pub sensor: String,
    pub metric: String,
    /// Its values and aggregates (versions and minutes are not read).
    pub bucket: BucketRead,
}

/// A stream of stored buckets, read through a cursor.
pub type BucketStream = futures_util::stream::BoxStream<'static, Result<StoredBucket, StoreError>>;

/// An entry of the change log: a write, delete or rebuild that reached
/// these series (every series when `None`) in `[from, to)` (epoch seconds)
/// of a period that may be kept in a query cache (see `query::cache`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub seq: i64,
    pub series: Option<Vec<(String, String)>>,
    pub from: i64,
    pub to: i64,
}

/// A stored dead letter, as an operator lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterInfo {
    pub sensor: String,
    pub metric: String,
    /// Epoch seconds of its bucket's start.
    pub bucket_start: i64,
    /// How many readings it holds.
    pub readings: usize,
    pub reason: String,
    /// Epoch seconds when it was written.
    pub at: i64,
}

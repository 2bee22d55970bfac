//! [`BucketStore`]: what the batcher, queries and operators ask of bucket
//! storage, and the types its answers come in.

use std::future::Future;
use std::time::Duration;

use super::delete;
use super::errors::StoreError;
use super::registry::{SensorInfo, SensorQuery};
use crate::batcher::Sink;
use crate::domain::Labels;
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

/// Where buckets live: the batcher's [`Sink`] plus the reads queries need.
pub trait BucketStore: Sink {
    /// The relative accuracy of the percentile sketches rollup slots keep.
    fn sketch_accuracy(&self) -> f64;

    /// Streams the documents of the fetch's series to `each` with the index
    /// of their sensor in `fetch.sensors`, each sensor's in start order
    /// (sensors may interleave), never collecting them.
    fn fetch<F: FnMut(usize, Doc) + Send>(
        &self,
        fetch: Fetch<'_>,
        each: F,
    ) -> impl Future<Output = Result<Read, StoreError>> + Send;

    /// The bucket starts of each of `sensors` (for `metric`) in `[from, to)`
    /// whose rollup slots are stale until their hour is rolled up again
    /// (`store::rollup::late`), sorted; and what reading them cost.
    fn late(
        &self,
        sensors: &[&str],
        metric: &str,
        from: i64,
        to: i64,
        max_time: Duration,
    ) -> impl Future<Output = Result<(Vec<Vec<i64>>, Read), StoreError>> + Send;

    /// Streams the stored buckets of `sensors` (of `metric`, or of every
    /// metric) that hold seconds of `[from, to)`, sorted by sensor, metric
    /// and start, through one cursor: memory stays constant however many
    /// there are. Without a time limit: an export may take long.
    fn stored(
        &self,
        sensors: &[String],
        metric: Option<&str>,
        from: i64,
        to: i64,
    ) -> impl Future<Output = Result<BucketStream, StoreError>> + Send;

    /// Deletes the readings `selection` covers that were acknowledged
    /// before the call, everywhere they are (see `delete`); with `dry_run`
    /// counts them and changes nothing.
    fn delete_readings(
        &self,
        selection: &delete::Selection,
        dry_run: bool,
    ) -> impl Future<Output = Result<delete::Deleted, delete::DeleteError>> + Send;

    /// Leaves out of `unstored` (per sensor of `sensors`, of `metric`) the
    /// values a recorded delete removes: held readings it covers are never
    /// stored, so answers must not show them either.
    fn drop_deleted(
        &self,
        sensors: &[&str],
        metric: &str,
        unstored: &mut [crate::batcher::Unstored],
    ) -> impl Future<Output = ()> + Send;

    /// Checks that the server answers.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The change log's counter and its entries after `after` (see
    /// `query::cache`), and what reading them cost.
    fn changes(
        &self,
        after: i64,
    ) -> impl Future<Output = Result<(i64, Vec<Change>, Read), StoreError>> + Send;

    /// Streams registered sensors in id order (after `query.after`, under
    /// `query.prefix`, with `query.labels`) to `keep`, until it has kept `limit`.
    fn sensors<F: FnMut(&SensorInfo) -> bool + Send>(
        &self,
        query: SensorQuery<'_>,
        limit: usize,
        keep: F,
    ) -> impl Future<Output = Result<Vec<SensorInfo>, StoreError>> + Send;

    /// How many registry writes of a newer hour this instance has made so
    /// far. Each is made before the readings it registers are stored, so a
    /// listing taken when this read `n` vouches for what it says of the
    /// sensors' newest hours for as long as this still reads `n`
    /// ([`SensorInfo::quiet`]); other instances' readings are visible only
    /// once stored in any case.
    fn registrations(&self) -> u64;

    /// Replaces a sensor's labels (registering it if unknown).
    fn set_labels(
        &self,
        sensor: &str,
        labels: &Labels,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Adds `labels` to a sensor's (registering it if unknown), keeping the
    /// ones it has: unless the union would pass [`crate::domain::MAX_LABELS`],
    /// then nothing changes. Answers whether the sensor now has them all.
    fn merge_labels(
        &self,
        sensor: &str,
        labels: &[(String, String)],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The newest dead letters whose sensor `keep` accepts, newest first, at
    /// most `limit`, and how many are stored in all.
    fn dead_letters<F: FnMut(&str) -> bool + Send>(
        &self,
        limit: usize,
        keep: F,
    ) -> impl Future<Output = Result<(Vec<DeadLetterInfo>, u64), StoreError>> + Send;

    /// The newest stored reading of a series, found from its newest bucket:
    /// `(ts, value, version)`, the version (acknowledgement, epoch ms) if
    /// the value still keeps one. `since`: a time the newest bucket likely
    /// starts at or after (the registry's `last_seen`), looked at first.
    fn latest(
        &self,
        sensor: &str,
        metric: &str,
        since: Option<i64>,
        max_time: Duration,
    ) -> impl Future<Output = Result<Option<(i64, f64, Option<i64>)>, StoreError>> + Send;
}

//! What the layers above ask of [`MongoStore`] beside the batcher's
//! [`crate::batcher::Sink`]: reads for queries, the registry's labels, dead
//! letters, a ping. Each method is answered by the file that does that job;
//! the queries' reads are counted so that the rollup upkeep gives way to
//! them (see `give_way`).

use std::time::Duration;

use mongodb::bson::doc;

use super::classify::classify_read;
use super::connection::MongoStore;
use crate::store::{BucketStream, Doc, Fetch, Labels, Read, SensorInfo, SensorQuery, StoreError};

impl MongoStore {
    /// The relative accuracy of the percentile sketches rollup slots keep.
    pub fn sketch_accuracy(&self) -> f64 {
        self.sketch_accuracy
    }

    /// Streams the documents of the fetch's series to `each` with the index
    /// of their sensor in `fetch.sensors`, each sensor's in start order
    /// (sensors may interleave), never collecting them.
    pub async fn fetch<F: FnMut(usize, Doc) + Send>(
        &self,
        fetch: Fetch<'_>,
        each: F,
    ) -> Result<Read, StoreError> {
        let _reading = self.traffic.reading();
        self.read_level(fetch, each).await
    }

    /// The change log's counter and its entries after `after` (see
    /// `query::cache`), and what reading them cost.
    pub async fn changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<crate::store::Change>, Read), StoreError> {
        let _reading = self.traffic.reading();
        self.read_changes(after).await
    }

    /// The bucket starts of each of `sensors` (for `metric`) in `[from, to)`
    /// whose rollup slots are stale until their hour is rolled up again
    /// (`store::rollup::late`), sorted; and what reading them cost.
    pub async fn late(
        &self,
        sensors: &[&str],
        metric: &str,
        from: i64,
        to: i64,
        max_time: Duration,
    ) -> Result<(Vec<Vec<i64>>, Read), StoreError> {
        let _reading = self.traffic.reading();
        self.late_starts(sensors, metric, from, to, max_time).await
    }

    /// Streams the stored buckets of `sensors` (of `metric`, or of every
    /// metric) that hold seconds of `[from, to)`, sorted by sensor, metric
    /// and start, through one cursor: memory stays constant however many
    /// there are. Without a time limit: an export may take long.
    pub async fn stored(
        &self,
        sensors: &[String],
        metric: Option<&str>,
        from: i64,
        to: i64,
    ) -> Result<BucketStream, StoreError> {
        self.stored_buckets(sensors, metric, from, to).await
    }

    /// Leaves out of `unstored` (per sensor of `sensors`, of `metric`) the
    /// values a recorded delete removes: held readings it covers are never
    /// stored, so answers must not show them either.
    pub async fn drop_deleted(
        &self,
        sensors: &[&str],
        metric: &str,
        unstored: &mut [crate::batcher::Unstored],
    ) {
        let deletes = self.deletes.read().await;
        if deletes.is_empty() {
            return;
        }
        for (sensor, series) in sensors.iter().zip(unstored.iter_mut()) {
            let covering: Vec<_> = deletes
                .iter()
                .filter(|t| t.covers(sensor, metric))
                .collect();
            if covering.is_empty() {
                continue;
            }
            for (start, values) in series.iter_mut() {
                values.retain(|&(o, _, ack)| {
                    !covering
                        .iter()
                        .any(|t| t.deletes(*start + i64::from(o), ack))
                });
            }
        }
    }

    /// Checks that the server answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.db
            .run_command(doc! { "ping": 1 })
            .await
            .map(|_| ())
            .map_err(classify_read)
    }

    /// Streams registered sensors in id order (after `query.after`, under
    /// `query.prefix`, with `query.labels`) to `keep`, until it has kept `limit`.
    pub async fn sensors<F: FnMut(&SensorInfo) -> bool + Send>(
        &self,
        query: SensorQuery<'_>,
        limit: usize,
        keep: F,
    ) -> Result<Vec<SensorInfo>, StoreError> {
        let _reading = self.traffic.reading();
        self.list_sensors(query, limit, keep).await
    }

    /// How many registry writes of a newer hour this instance has made so
    /// far. Each is made before the readings it registers are stored, so a
    /// listing taken when this read `n` vouches for what it says of the
    /// sensors' newest hours for as long as this still reads `n`
    /// ([`SensorInfo::quiet`]); other instances' readings are visible only
    /// once stored in any case.
    pub fn registrations(&self) -> u64 {
        self.registrations.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Replaces a sensor's labels (registering it if unknown).
    pub async fn set_labels(&self, sensor: &str, labels: &Labels) -> Result<(), StoreError> {
        self.put_labels(sensor, labels).await
    }

    /// Adds `labels` to a sensor's (registering it if unknown), keeping the
    /// ones it has: unless the union would pass [`crate::domain::MAX_LABELS`],
    /// then nothing changes. Answers whether the sensor now has them all.
    pub async fn merge_labels(
        &self,
        sensor: &str,
        labels: &[(String, String)],
    ) -> Result<bool, StoreError> {
        self.add_labels(sensor, labels).await
    }

    /// The newest dead letters whose sensor `keep` accepts, newest first, at
    /// most `limit`, and how many are stored in all.
    pub async fn dead_letters<F: FnMut(&str) -> bool + Send>(
        &self,
        limit: usize,
        keep: F,
    ) -> Result<(Vec<crate::store::DeadLetterInfo>, u64), StoreError> {
        self.list_dead_letters(limit, keep).await
    }

    /// The newest stored reading of a series, found from its newest bucket:
    /// `(ts, value, version)`, the version (acknowledgement, epoch ms) if
    /// the value still keeps one. `since`: a time the newest bucket likely
    /// starts at or after (the registry's `last_seen`), looked at first.
    pub async fn latest(
        &self,
        sensor: &str,
        metric: &str,
        since: Option<i64>,
        max_time: Duration,
    ) -> Result<Option<(i64, f64, Option<i64>)>, StoreError> {
        let _reading = self.traffic.reading();
        self.newest_value(sensor, metric, since, max_time).await
    }
}

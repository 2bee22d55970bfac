//! [`BucketStore`] for [`MongoStore`]: each method answered by the file that
//! does that job.

use std::time::Duration;

use mongodb::bson::doc;

use super::classify::classify_read;
use super::connection::MongoStore;
use crate::store::{
    BucketStore, BucketStream, Doc, Fetch, Labels, Read, SensorInfo, SensorQuery, StoreError,
};

impl BucketStore for MongoStore {
    fn sketch_accuracy(&self) -> f64 {
        self.sketch_accuracy
    }

    async fn fetch<F: FnMut(usize, Doc) + Send>(
        &self,
        fetch: Fetch<'_>,
        each: F,
    ) -> Result<Read, StoreError> {
        let _reading = self.traffic.reading();
        self.read_level(fetch, each).await
    }

    async fn changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<crate::store::Change>, Read), StoreError> {
        let _reading = self.traffic.reading();
        self.read_changes(after).await
    }

    async fn late(
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

    async fn stored(
        &self,
        sensors: &[String],
        metric: Option<&str>,
        from: i64,
        to: i64,
    ) -> Result<BucketStream, StoreError> {
        self.stored_buckets(sensors, metric, from, to).await
    }

    async fn delete_readings(
        &self,
        selection: &crate::store::delete::Selection,
        dry_run: bool,
    ) -> Result<crate::store::delete::Deleted, crate::store::delete::DeleteError> {
        MongoStore::delete_readings(self, selection, dry_run).await
    }

    async fn drop_deleted(
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

    async fn ping(&self) -> Result<(), StoreError> {
        self.db
            .run_command(doc! { "ping": 1 })
            .await
            .map(|_| ())
            .map_err(classify_read)
    }

    async fn sensors<F: FnMut(&SensorInfo) -> bool + Send>(
        &self,
        query: SensorQuery<'_>,
        limit: usize,
        keep: F,
    ) -> Result<Vec<SensorInfo>, StoreError> {
        let _reading = self.traffic.reading();
        self.list_sensors(query, limit, keep).await
    }

    fn registrations(&self) -> u64 {
        self.registrations.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn set_labels(&self, sensor: &str, labels: &Labels) -> Result<(), StoreError> {
        self.put_labels(sensor, labels).await
    }

    async fn merge_labels(
        &self,
        sensor: &str,
        labels: &[(String, String)],
    ) -> Result<bool, StoreError> {
        self.add_labels(sensor, labels).await
    }

    async fn dead_letters<F: FnMut(&str) -> bool + Send>(
        &self,
        limit: usize,
        keep: F,
    ) -> Result<(Vec<crate::store::DeadLetterInfo>, u64), StoreError> {
        self.list_dead_letters(limit, keep).await
    }

    async fn latest(
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

//! What the layers above ask of [`MongoStore`] beside the batcher's
//! [`crate::batcher::Sink`]: reads for queries, the registry's labels, dead
//! letters, a ping. Each method is answered by the file that does that job;
//! the queries' reads are counted (`traffic.reading()`) so that the rollup
//! upkeep gives way to them (see `give_way`). Three public reads live where
//! they are answered, not forwarded from here: `latest` and `stored` in
//! read.rs, `late` in rollup/late.rs.

use std::time::Duration;

use mongodb::bson::doc;

use super::classify::classify_read;
use super::connection::MongoStore;
use super::rollup::priority::{Choice, decide};
use super::share::Admit;
use crate::domain::{SensorId, SensorLabels};
use crate::store::{Doc, Fetch, Labels, Read, SensorInfo, SensorQuery, StoreError};

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
        let buckets = matches!(fetch.level, crate::domain::Level::Buckets);
        let began = std::time::Instant::now();
        let read = self.read_level(fetch, each).await?;
        if buckets {
            self.pace.read_buckets(read.documents, began.elapsed());
        }
        Ok(read)
    }

    /// What a query does about the `marked` buckets it would read of hours
    /// marked late (instead of their rollups), held in the marker documents
    /// `docs` (see `rollup::priority`), and the `unstored` ones it reads to
    /// lay the batcher's readings over. It asks the upkeep to roll the
    /// marked hours up first. Then, if `may_wait` and the upkeep's step
    /// under way holds them all and ends sooner than they would be read, it
    /// waits for that step and answers `true`: look at the markers again.
    /// Otherwise it answers `false` (read them), after its turn in the
    /// queries' share of a catch-up (see `share`); or refuses when reading
    /// them would outlast `budget` at the pace measured: at once, with
    /// about when the catch-up ends, instead of at its timeout (having
    /// taken the server's time from the catch-up it waits for).
    pub async fn settle_marked(
        &self,
        docs: &[i64],
        (marked, unstored): (u64, u64),
        budget: Duration,
        may_wait: bool,
    ) -> Result<bool, StoreError> {
        let now = tokio::time::Instant::now();
        self.priority.want(docs, now);
        let step = (may_wait && !docs.is_empty())
            .then(|| self.priority.step_holding(docs, now))
            .flatten();
        let all = self.pace.reading(marked + unstored);
        let retry = || {
            let at = self.pace.catch_up().as_secs().max(1);
            StoreError::CatchingUp(at)
        };
        match decide(all, step.as_ref().map(|s| s.0), budget) {
            Choice::Wait(within) => {
                if let Some((_, mut ended)) = step {
                    let _waiting = self.traffic.waiting();
                    let _ = tokio::time::timeout(within, ended.changed()).await;
                }
                self.count(|m| m.query_waits_for_rollups.inc());
                Ok(true)
            }
            Choice::Refuse => {
                self.count(|m| m.query_catch_up_refusals.inc());
                Err(retry())
            }
            Choice::Read => {
                // Nothing marked to read: nothing drawn, no turn to wait (a
                // refresh answered by the cache and its tail, a live panel
                // over what this instance holds unstored).
                let reads = marked > 0;
                let Some(cost) = all.filter(|_| reads && self.catching_up()) else {
                    return Ok(false);
                };
                match self.share.admit(cost, budget, now) {
                    Admit::Go => Ok(false),
                    Admit::Wait(d) => {
                        tokio::time::sleep(d).await;
                        Ok(false)
                    }
                    Admit::Refuse => {
                        self.count(|m| m.query_catch_up_refusals.inc());
                        Err(retry())
                    }
                }
            }
        }
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
    pub async fn set_labels(
        &self,
        sensor: &SensorId<'_>,
        labels: &Labels,
    ) -> Result<(), StoreError> {
        self.put_labels(sensor.as_str(), labels).await
    }

    /// Adds a sensor's `labels` to those it has (registering it if
    /// unknown): unless the union would pass [`crate::domain::MAX_LABELS`],
    /// then nothing changes. Answers whether the sensor now has them all.
    pub async fn merge_labels(&self, labels: &SensorLabels<'_>) -> Result<bool, StoreError> {
        self.add_labels(labels).await
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
}

//! Deleting readings (see `store::delete`): the tombstones every write
//! follows, and the edit of the buckets already stored.
//!
//! A delete (1) records its tombstone, (2) waits until every running
//! instance has taken it in (each publishes the newest tombstone it applies
//! with its floor, and applies one only once no write that began before is
//! still going), (3) marks the ended hours it touches late, so queries read
//! their buckets rather than rollup slots, (4) edits each bucket guarded by
//! its write count `n` (a bucket written meanwhile is read again), deleting
//! the ones left empty, (5) marks those hours late again, so the upkeep
//! rolls them up from what is left (removing the slots of what is gone),
//! and (6) takes series with nothing left out of the registry's metrics.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, RawDocumentBuf, doc};

use super::classify::{classify, classify_read};
use super::connection::MongoStore;
use crate::batcher::clock;
use crate::domain::{BucketKey, BucketUpdate, MetricName, SensorId};
use crate::store::StoreError;
use crate::store::delete::{DeleteError, Deleted, PREFIX, Selection, Tombstone, removals};
use crate::store::document::{read_bucket, removal_pipeline, start_date};

/// How long a delete waits for every running instance to take it in.
const SEEN_WITHIN: Duration = Duration::from_secs(30);
/// An instance silent this long is not running: it reads the tombstones
/// when it starts, before it replays its journal.
const RUNNING_WITHIN_MS: i64 = 5_000;
/// Buckets edited per command.
const EDITS_PER_COMMAND: usize = 500;
/// Times a bucket written meanwhile is read again before the delete gives up.
const ATTEMPTS: usize = 8;
/// Sensors per bucket read.
const SENSORS_PER_READ: usize = 1_000;

/// One stored bucket's edit.
#[derive(Debug, Clone)]
struct Edit {
    id: Bson,
    key: (String, String, i64),
    n: u64,
    removed: Vec<u16>,
    left: Vec<u16>,
}

impl MongoStore {
    /// Deletes the readings `selection` covers that were acknowledged
    /// before now; with `dry_run`, counts them and changes nothing.
    pub async fn delete_readings(
        &self,
        selection: &Selection,
        dry_run: bool,
    ) -> Result<Deleted, DeleteError> {
        let mut sensors = selection.sensors.clone();
        sensors.sort_unstable();
        sensors.dedup();
        let at = if dry_run {
            i64::MAX
        } else {
            let t = Tombstone {
                id: format!("{PREFIX}{}", uuid::Uuid::new_v4().simple()),
                sensors: sensors.clone(),
                metric: selection.metric.clone(),
                from: selection.from,
                to: selection.to,
                at: clock::ack_ms(),
            };
            let at = t.at;
            self.metadata
                .insert_one(t.document())
                .await
                .map_err(classify)?;
            self.count(|m| m.db_documents("written", "metadata", "tombstone", 1));
            self.deletes.add(t).await;
            self.wait_seen(at).await?;
            at
        };
        let mut out = Deleted::default();
        let mut series: BTreeSet<(String, String)> = BTreeSet::new();
        let first = selection.from - selection.from.rem_euclid(self.granularity.seconds());
        // A sensor a read where the server would scan for a `$in` (see
        // `shapes`).
        let per_read = if self.read_shape == super::shapes::ReadShape::PerSeries {
            1
        } else {
            SENSORS_PER_READ
        };
        for chunk in sensors.chunks(per_read) {
            let sensor = match chunk {
                [one] => Bson::String(one.clone()),
                many => Bson::Document(doc! { "$in": many.to_vec() }),
            };
            let mut filter = doc! { "sensor": sensor };
            if let Some(m) = &selection.metric {
                filter.insert("metric", m.as_str());
            }
            filter.insert(
                "start",
                doc! { "$gte": start_date(first), "$lt": start_date(selection.to) },
            );
            let mut cursor = self
                .buckets
                .clone_with_type::<RawDocumentBuf>()
                .find(filter)
                .projection(PROJECTION.clone())
                .batch_size(EDITS_PER_COMMAND as u32)
                .await
                .map_err(classify_read)?;
            let mut edits = Vec::new();
            while let Some(d) = cursor.try_next().await.map_err(classify_read)? {
                self.count(|m| m.db_documents("read", "buckets", "delete", 1));
                if let Some(e) = self.edit_of(&d, selection, at)? {
                    series.insert((e.key.0.clone(), e.key.1.clone()));
                    edits.push(e);
                }
                if edits.len() >= EDITS_PER_COMMAND {
                    self.apply(std::mem::take(&mut edits), selection, at, dry_run, &mut out)
                        .await?;
                }
            }
            self.apply(edits, selection, at, dry_run, &mut out).await?;
        }
        if !dry_run {
            out.series_emptied = self.unregister_emptied(&series).await?;
        }
        Ok(out)
    }

    /// What the delete does to one stored bucket, if anything.
    fn edit_of(
        &self,
        d: &RawDocumentBuf,
        s: &Selection,
        at: i64,
    ) -> Result<Option<Edit>, StoreError> {
        let b = read_bucket(d, self.granularity)?;
        let removed = removals(b.start, &b.values, &b.versions, s.from, s.to, at);
        if removed.is_empty() {
            return Ok(None);
        }
        let left = b
            .values
            .iter()
            .map(|&(o, _)| o)
            .filter(|o| removed.binary_search(o).is_err())
            .collect();
        let text = |k: &str| d.get_str(k).map(str::to_owned).unwrap_or_default();
        let id = d
            .get("_id")
            .ok()
            .flatten()
            .and_then(|v| v.to_raw_bson().try_into().ok())
            .ok_or_else(|| StoreError::Unreadable("a bucket without an _id".into()))?;
        Ok(Some(Edit {
            id,
            key: (text("sensor"), text("metric"), b.start),
            n: b.n,
            removed,
            left,
        }))
    }

    /// Applies `edits`, reading again and retrying the buckets written
    /// meanwhile.
    async fn apply(
        &self,
        mut edits: Vec<Edit>,
        s: &Selection,
        at: i64,
        dry_run: bool,
        out: &mut Deleted,
    ) -> Result<(), StoreError> {
        // Long: the edit loop: each command of edits sent, the buckets written meanwhile read again and retried.
        if dry_run {
            for e in &edits {
                out.readings += e.removed.len() as u64;
                if e.left.is_empty() {
                    out.buckets_deleted += 1;
                } else {
                    out.buckets_edited += 1;
                }
            }
            return Ok(());
        }
        for attempt in 0..ATTEMPTS {
            if edits.is_empty() {
                return Ok(());
            }
            let keys: Vec<BucketUpdate> = edits.iter().filter_map(key_of).collect();
            let refs: Vec<&BucketUpdate> = keys.iter().collect();
            // Before: queries read these buckets, not their rollup slots.
            self.mark_hours(&refs).await?;
            let guard = |e: &Edit| {
                let mut q = doc! { "_id": e.id.clone() };
                if e.n == 0 {
                    // Missing: `{$lte: null}`, which the `id_n` index (where
                    // a server needs it, see `shapes`) answers.
                    q.insert("n", doc! { "$lte": Bson::Null });
                } else {
                    q.insert("n", i64::try_from(e.n).unwrap_or(i64::MAX));
                }
                q
            };
            let mut updates = Vec::new();
            let mut deletes = Vec::new();
            for e in &edits {
                if e.left.is_empty() {
                    deletes.push(doc! { "q": guard(e), "limit": 1 });
                } else {
                    let pipeline: Vec<Document> =
                        removal_pipeline(self.granularity, &e.removed, &e.left)
                            .into_iter()
                            .filter_map(|r| r.to_document().ok())
                            .collect();
                    updates.push(doc! { "q": guard(e), "u": pipeline });
                }
            }
            let mut applied = 0;
            if !updates.is_empty() {
                let reply = self
                    .run_write(
                        doc! { "update": self.buckets.name(), "updates": updates, "ordered": false },
                        "editing buckets for a delete",
                    )
                    .await?;
                applied += reply.get_i32("n").map_or(0, |n| n.max(0) as usize);
            }
            if !deletes.is_empty() {
                let reply = self
                    .run_write(
                        doc! { "delete": self.buckets.name(), "deletes": deletes, "ordered": false },
                        "deleting emptied buckets",
                    )
                    .await?;
                applied += reply.get_i32("n").map_or(0, |n| n.max(0) as usize);
            }
            self.count(|m| m.db_documents("written", "buckets", "delete", applied as u64));
            // After: the upkeep rolls them up from what is left.
            self.mark_hours(&refs).await?;
            let retry = if applied == edits.len() {
                Vec::new()
            } else {
                // Some were written meanwhile: what they still hold that the
                // delete removes is read again.
                self.reread(&edits, s, at).await?
            };
            let again: BTreeSet<String> = retry.iter().map(|e| format!("{:?}", e.id)).collect();
            for e in &edits {
                if !again.contains(&format!("{:?}", e.id)) {
                    out.readings += e.removed.len() as u64;
                    if e.left.is_empty() {
                        out.buckets_deleted += 1;
                    } else {
                        out.buckets_edited += 1;
                    }
                }
            }
            edits = retry;
            if attempt + 1 == ATTEMPTS && !edits.is_empty() {
                return Err(StoreError::Outage(format!(
                    "{} buckets were written during the delete {ATTEMPTS} times in a row; send it again",
                    edits.len()
                )));
            }
        }
        Ok(())
    }

    async fn reread(
        &self,
        edits: &[Edit],
        s: &Selection,
        at: i64,
    ) -> Result<Vec<Edit>, StoreError> {
        let ids: Vec<Bson> = edits.iter().map(|e| e.id.clone()).collect();
        let mut cursor = self
            .buckets
            .clone_with_type::<RawDocumentBuf>()
            .find(doc! { "_id": { "$in": ids } })
            .projection(PROJECTION.clone())
            .await
            .map_err(classify_read)?;
        let mut out = Vec::new();
        while let Some(d) = cursor.try_next().await.map_err(classify_read)? {
            if let Some(e) = self.edit_of(&d, s, at)? {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Marks the ended hours of `keys` late (an open hour is rolled up from
    /// what is left once it ends).
    async fn mark_hours(&self, keys: &[&BucketUpdate]) -> Result<(), StoreError> {
        self.mark_late(keys, clock::unix_ms().div_euclid(1000))
            .await?;
        Ok(())
    }

    /// Takes each series with no bucket left out of its sensor's metrics.
    async fn unregister_emptied(
        &self,
        series: &BTreeSet<(String, String)>,
    ) -> Result<u64, StoreError> {
        let mut emptied = 0;
        for (sensor, metric) in series {
            let left = self
                .buckets
                .find_one(doc! { "sensor": sensor, "metric": metric })
                .projection(doc! { "_id": 1 })
                .await
                .map_err(classify_read)?;
            if left.is_some() {
                continue;
            }
            self.sensors
                .update_one(
                    doc! { "_id": sensor },
                    doc! { "$pull": { "metrics": metric } },
                )
                .await
                .map_err(classify)?;
            self.count(|m| m.db_documents("written", "sensors", "registry_update", 1));
            self.forget_series(sensor, metric);
            emptied += 1;
        }
        Ok(emptied)
    }

    /// Waits until every running instance has applied tombstones up to `at`.
    async fn wait_seen(&self, at: i64) -> Result<(), DeleteError> {
        let started = tokio::time::Instant::now();
        loop {
            let now = clock::unix_ms();
            let own = self.instance_id();
            let docs = self.instance_documents().await?;
            let behind = docs.iter().find(|d| {
                let id = d.get_str("_id").unwrap_or_default();
                let running = super::instances::published_within(d, now, RUNNING_WITHIN_MS);
                let seen = d.get_i64("seen").unwrap_or(i64::MIN);
                Some(id) != own.as_deref() && running && seen < at
            });
            let Some(d) = behind else {
                return Ok(());
            };
            if started.elapsed() >= SEEN_WITHIN {
                return Err(DeleteError::NotSeen(
                    d.get_str("_id").unwrap_or_default().to_owned(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Removes the tombstones no instance can hold a reading older than:
    /// every floor (`floor`, the earliest) is past them.
    pub async fn prune_tombstones(&self, floor: i64) -> Result<u64, StoreError> {
        let pattern = format!("^{}", regex::escape(PREFIX));
        let r = self
            .metadata
            .delete_many(doc! { "_id": { "$regex": pattern }, "at": { "$lt": floor } })
            .await
            .map_err(classify)?;
        self.count(|m| m.db_documents("written", "metadata", "tombstone", r.deleted_count));
        Ok(r.deleted_count)
    }

    /// Applies the recorded tombstones (`docs`, the metadata documents
    /// read with the floors).
    pub(super) async fn apply_tombstones(&self, docs: &[Document]) {
        let recorded: Vec<Tombstone> = docs.iter().filter_map(Tombstone::read).collect();
        self.deletes.replace(recorded).await;
    }

    /// The newest delete this instance has taken in (its `at`).
    pub fn deletes_seen(&self) -> i64 {
        self.deletes.seen()
    }

    /// Resolves once this instance takes a delete in (at once if it did
    /// since the last call resolved).
    pub async fn delete_taken(&self) {
        self.deletes.taken.notified().await;
    }
}

/// What a delete reads of a bucket.
static PROJECTION: std::sync::LazyLock<Document> = std::sync::LazyLock::new(|| {
    doc! { "_id": 1, "sensor": 1, "metric": 1, "start": 1, "schema_version": 1,
    "count": 1, "sum": 1, "min": 1, "max": 1, "v": 1, "a": 1, "n": 1 }
});

fn key_of(e: &Edit) -> Option<BucketUpdate> {
    Some(BucketUpdate {
        key: BucketKey {
            sensor: SensorId::parse(e.key.0.clone()).ok()?,
            metric: MetricName::parse(e.key.1.clone()).ok()?,
            start: e.key.2,
        },
        values: Vec::new(),
        acks: Vec::new(),
    })
}

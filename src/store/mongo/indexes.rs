//! The collections (created with `mongodb.block_compressor`) and the
//! indexes: the unique bucket index, and the TTL index that implements
//! `buckets.retention`, brought in line with the setting at every start.

use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::doc;
use mongodb::options::IndexOptions;
use tracing::info;

use super::classify::classify;
use super::connection::MongoStore;
use crate::domain::Period;
use crate::store::StoreError;
use crate::store::errors;

/// The unique index on a bucket's identity. Its prefix `(sensor, metric)` plus
/// the range on `start` also serves every query, so it is the only index.
const BUCKET_INDEX: &str = "sensor_metric_start";

/// The unique index on a rollup's identity; it also serves every rollup read.
const ROLLUP_INDEX: &str = "sensor_metric_period_start";

/// The TTL index that implements `buckets.retention`.
const RETENTION_INDEX: &str = "start_ttl";

/// The TTL index that implements `mongodb.dead_letter_retention`.
const DEAD_LETTER_RETENTION_INDEX: &str = "at_ttl";

/// The server's code for a `create` of a collection that exists.
const NAMESPACE_EXISTS: i32 = 48;

impl MongoStore {
    /// Creates the bucket index (a no-op when it exists) and brings the TTL
    /// index in line with `retention`: created, changed in place, or dropped.
    /// Creates the collections that do not exist yet with
    /// `mongodb.block_compressor` (an existing one keeps its own; with
    /// "server", nothing is created here and the first write creates them).
    pub async fn create_collections(&self) -> Result<(), StoreError> {
        let Some(engine) = self.block_compressor.storage_engine() else {
            return Ok(());
        };
        let existing: std::collections::HashSet<String> = self
            .db
            .list_collection_names()
            .await
            .map_err(classify)?
            .into_iter()
            .collect();
        for name in [
            self.buckets.name(),
            self.rollups.name(),
            self.late.name(),
            self.sensors.name(),
            self.metadata.name(),
            self.changes.name(),
            self.dead_letters.name(),
        ] {
            if existing.contains(name) {
                continue;
            }
            let created = self
                .db
                .run_command(doc! { "create": name, "storageEngine": engine.clone() })
                .await;
            match created {
                Ok(_) => {}
                // Another instance created it first.
                Err(e) if errors::command_code(&e) == Some(NAMESPACE_EXISTS) => {}
                Err(e) => return Err(classify(e)),
            }
        }
        Ok(())
    }

    pub async fn ensure_indexes(
        &self,
        retention: &crate::store::Retention,
    ) -> Result<(), StoreError> {
        // Long: each index created or brought in line with its setting, in turn.
        let index = IndexModel::builder()
            .keys(doc! { "sensor": 1, "metric": 1, "start": 1 })
            .options(
                IndexOptions::builder()
                    .unique(true)
                    .name(BUCKET_INDEX.to_owned())
                    .build(),
            )
            .build();
        self.buckets.create_index(index).await.map_err(classify)?;
        // What the server needs beside it for the writes' filters.
        super::shapes::bound_writes(&self.db, &self.buckets).await?;
        self.ensure_change_log().await?;
        // Rebuilds read the buckets of a period by start.
        let by_start = IndexModel::builder()
            .keys(doc! { "start": 1, "sensor": 1 })
            .options(
                IndexOptions::builder()
                    .name("start_sensor".to_owned())
                    .build(),
            )
            .build();
        self.buckets
            .create_index(by_start)
            .await
            .map_err(classify)?;
        // The version prune finds buckets still holding versions by their
        // latest: sparse, so only those few are in it.
        let versioned = IndexModel::builder()
            .keys(doc! { "amax": 1 })
            .options(
                IndexOptions::builder()
                    .name("amax".to_owned())
                    .sparse(true)
                    .build(),
            )
            .build();
        self.buckets
            .create_index(versioned)
            .await
            .map_err(classify)?;
        let rollup = IndexModel::builder()
            .keys(doc! { "sensor": 1, "metric": 1, "period": 1, "start": 1 })
            .options(
                IndexOptions::builder()
                    .unique(true)
                    .name(ROLLUP_INDEX.to_owned())
                    .build(),
            )
            .build();
        self.rollups.create_index(rollup).await.map_err(classify)?;
        // Rollups were once recomputed by time range through this index;
        // every rollup read and write now goes through the unique one.
        if let Err(e) = self.rollups.drop_index("period_start_sensor").await
            && !e.to_string().contains("index not found")
            && !matches!(errors::command_code(&e), Some(26 | 27))
        {
            return Err(classify(e));
        }
        let registry = IndexModel::builder()
            .keys(doc! { "metrics": 1, "_id": 1 })
            .options(
                IndexOptions::builder()
                    .name("metrics_id".to_owned())
                    .build(),
            )
            .build();
        self.sensors
            .create_index(registry)
            .await
            .map_err(classify)?;
        self.ensure_retention(
            &self.buckets,
            "start",
            RETENTION_INDEX,
            None,
            retention.buckets,
        )
        .await?;
        // Rollups: a TTL index per level (partial, on its period), counted
        // from a document's start: it goes its level's retention after its
        // last slot ends. One index for every level came first: it goes.
        self.ensure_retention(&self.rollups, "start", RETENTION_INDEX, None, None)
            .await?;
        for (period, kept) in [
            (Period::Hour, retention.hour),
            (Period::Day, retention.day),
            (Period::Days30, retention.days30),
        ] {
            let ttl = kept.map(|d| d + Duration::from_secs(period.seconds().unsigned_abs()));
            self.ensure_retention(
                &self.rollups,
                "start",
                &format!("{RETENTION_INDEX}_{}", period.name()),
                Some(doc! { "period": period.name() }),
                ttl,
            )
            .await?;
        }
        // Dead letters, newest first (an operator looks at the latest), and
        // their retention.
        let newest = IndexModel::builder()
            .keys(doc! { "at": -1 })
            .options(IndexOptions::builder().name("at_desc".to_owned()).build())
            .build();
        self.dead_letters
            .create_index(newest)
            .await
            .map_err(classify)?;
        self.ensure_retention(
            &self.dead_letters,
            "at",
            DEAD_LETTER_RETENTION_INDEX,
            None,
            self.dead_letter_retention,
        )
        .await
    }

    /// Brings the TTL index `name` on `field` (over the documents `partial`
    /// matches, if given) in line with `retention`.
    async fn ensure_retention(
        &self,
        collection: &mongodb::Collection<mongodb::bson::Document>,
        field: &str,
        name: &str,
        partial: Option<mongodb::bson::Document>,
        retention: Option<Duration>,
    ) -> Result<(), StoreError> {
        let mut current = None;
        let mut cursor = collection.list_indexes().await.map_err(classify)?;
        while let Some(index) = cursor.try_next().await.map_err(classify)? {
            let options = index.options.unwrap_or_default();
            if options.name.as_deref() == Some(name) {
                current = Some(options.expire_after.unwrap_or_default());
            }
        }
        let wanted = retention.map(|d| Duration::from_secs(d.as_secs()));
        match (current, wanted) {
            (None, None) => {}
            (Some(_), None) => {
                collection.drop_index(name).await.map_err(classify)?;
                info!(
                    collection = collection.name(),
                    index = name,
                    "Retention is off: dropped the TTL index; documents are kept."
                );
            }
            (Some(now), Some(want)) if now == want => {}
            (Some(now), Some(want)) => {
                self.db
                    .run_command(doc! {
                        "collMod": collection.name(),
                        "index": { "name": name, "expireAfterSeconds": want.as_secs() as i64 },
                    })
                    .await
                    .map_err(classify)?;
                info!(
                    collection = collection.name(),
                    index = name,
                    from_s = now.as_secs(),
                    to_s = want.as_secs(),
                    "Changed the retention."
                );
            }
            (None, Some(want)) => {
                let index = IndexModel::builder()
                    .keys(doc! { field: 1 })
                    .options(
                        IndexOptions::builder()
                            .name(name.to_owned())
                            .expire_after(want)
                            .partial_filter_expression(partial)
                            .build(),
                    )
                    .build();
                collection.create_index(index).await.map_err(classify)?;
                info!(
                    collection = collection.name(),
                    index = name,
                    retention_s = want.as_secs(),
                    "Created the TTL index for the retention."
                );
            }
        }
        Ok(())
    }
}

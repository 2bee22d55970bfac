//! The indexes: the unique bucket index, and the TTL index that implements
//! `buckets.retention`, brought in line with the setting at every start.

use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::IndexModel;
use mongodb::bson::doc;
use mongodb::options::IndexOptions;
use tracing::info;

use super::{BUCKET_INDEX, MongoStore, RETENTION_INDEX, classify};
use crate::store::StoreError;

impl MongoStore {
    /// Creates the bucket index (a no-op when it exists) and brings the TTL
    /// index in line with `retention`: created, changed in place, or dropped.
    pub async fn ensure_indexes(&self, retention: Option<Duration>) -> Result<(), StoreError> {
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
        self.ensure_retention(retention).await
    }

    async fn ensure_retention(&self, retention: Option<Duration>) -> Result<(), StoreError> {
        let mut current = None;
        let mut cursor = self.buckets.list_indexes().await.map_err(classify)?;
        while let Some(index) = cursor.try_next().await.map_err(classify)? {
            let options = index.options.unwrap_or_default();
            if options.name.as_deref() == Some(RETENTION_INDEX) {
                current = Some(options.expire_after.unwrap_or_default());
            }
        }
        let wanted = retention.map(|d| Duration::from_secs(d.as_secs()));
        match (current, wanted) {
            (None, None) => {}
            (Some(_), None) => {
                self.buckets
                    .drop_index(RETENTION_INDEX)
                    .await
                    .map_err(classify)?;
                info!("Retention is off: dropped the TTL index; buckets are kept.");
            }
            (Some(now), Some(want)) if now == want => {}
            (Some(now), Some(want)) => {
                self.db
                    .run_command(doc! {
                        "collMod": self.buckets.name(),
                        "index": { "name": RETENTION_INDEX, "expireAfterSeconds": want.as_secs() as i64 },
                    })
                    .await
                    .map_err(classify)?;
                info!(
                    from_s = now.as_secs(),
                    to_s = want.as_secs(),
                    "Changed bucket retention."
                );
            }
            (None, Some(want)) => {
                let index = IndexModel::builder()
                    .keys(doc! { "start": 1 })
                    .options(
                        IndexOptions::builder()
                            .name(RETENTION_INDEX.to_owned())
                            .expire_after(want)
                            .build(),
                    )
                    .build();
                self.buckets.create_index(index).await.map_err(classify)?;
                info!(
                    retention_s = want.as_secs(),
                    "Created the TTL index for bucket retention."
                );
            }
        }
        Ok(())
    }
}

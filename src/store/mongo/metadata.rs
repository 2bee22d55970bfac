//! The metadata document: what the database's documents are (bucket
//! granularity, bucket and rollup schema versions), recorded by the first
//! start on a database and checked by every start after. An instance
//! configured for another granularity, or older than the documents, refuses
//! to start instead of writing documents the others misread (hour → minute
//! turned `max` into a sub-document; minute → hour dead-lettered everything).

use mongodb::bson::{Bson, Document, doc};
use mongodb::error::{ErrorKind, WriteFailure};

use super::classify::{classify, classify_read};
use super::connection::MongoStore;
use crate::domain::Granularity;
use crate::store::errors::DUPLICATE_KEY;
use crate::store::rollup::ROLLUP_SCHEMA_VERSION;
use crate::store::{SCHEMA_VERSION, StoreError};

const FORMAT_ID: &str = "format";

/// Why this instance must not write to this database.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "buckets.granularity is \"{configured}\", but database {database} holds \"{found}\" \
         buckets ({how}); start with buckets.granularity = \"{found}\", or point \
         mongodb.database at another database"
    )]
    Granularity {
        configured: &'static str,
        found: String,
        database: String,
        how: &'static str,
    },
    #[error(
        "database {database} holds {what} schema_version {found}, newer than this version of \
         Hourglass writes ({ours}); upgrade this instance"
    )]
    Newer {
        what: &'static str,
        found: i64,
        ours: i32,
        database: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a start found the database's format to need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FormatCheck {
    /// The rollups are of an older layout, read as holding nothing complete
    /// (queries are exact, from the buckets): rebuild them, then
    /// [`MongoStore::raise_rollup_version`].
    pub rollups_outdated: bool,
}

/// The granularity a stored bucket was written with: hour buckets keep
/// minute aggregates in `m` and values under `v.<min>.<sec>`.
fn granularity_of(bucket: &Document) -> Option<Granularity> {
    if bucket.contains_key("m") {
        return Some(Granularity::Hour);
    }
    let (_, first) = bucket.get_document("v").ok()?.iter().next()?;
    Some(match first {
        Bson::Document(_) => Granularity::Hour,
        _ => Granularity::Minute,
    })
}

fn number(d: &Document, key: &str) -> Option<i64> {
    match d.get(key)? {
        Bson::Int32(x) => Some(i64::from(*x)),
        Bson::Int64(x) => Some(*x),
        Bson::Double(x) => Some(*x as i64),
        _ => None,
    }
}

fn duplicate_key(e: &mongodb::error::Error) -> bool {
    matches!(&*e.kind, ErrorKind::Write(WriteFailure::WriteError(w)) if w.code == DUPLICATE_KEY)
}

impl MongoStore {
    /// Records the format on a new database, or checks it against this
    /// instance's. A database from before the document was recorded is
    /// judged by one of its buckets.
    pub async fn check_format(&self) -> Result<FormatCheck, FormatError> {
        // Long: each recorded setting checked against this instance's, in turn, each refusal naming it.
        let database = self.db.name().to_owned();
        let filter = doc! { "_id": FORMAT_ID };
        let recorded = match self
            .metadata
            .find_one(filter.clone())
            .await
            .map_err(classify)?
        {
            Some(d) => d,
            None => {
                let stored = self
                    .buckets
                    .find_one(doc! {})
                    .projection(doc! { "v": 1, "m": 1 })
                    .await
                    .map_err(classify)?;
                if let Some(found) = stored.as_ref().and_then(granularity_of)
                    && found != self.granularity
                {
                    return Err(FormatError::Granularity {
                        configured: self.granularity.name(),
                        found: found.name().to_owned(),
                        database,
                        how: "judged by a stored bucket",
                    });
                }
                let fresh = doc! {
                    "_id": FORMAT_ID,
                    "granularity": self.granularity.name(),
                    "bucket_schema_version": SCHEMA_VERSION,
                    "rollup_schema_version": ROLLUP_SCHEMA_VERSION,
                };
                match self.metadata.insert_one(fresh.clone()).await {
                    Ok(_) => {
                        self.count(|m| m.db_documents("written", "metadata", "format", 1));
                        fresh
                    }
                    // Another instance recorded it first: check against that.
                    Err(e) if duplicate_key(&e) => self
                        .metadata
                        .find_one(filter)
                        .await
                        .map_err(classify)?
                        .ok_or_else(|| {
                            StoreError::Outage("the metadata document went away".into())
                        })?,
                    Err(e) => return Err(classify(e).into()),
                }
            }
        };
        let found = recorded.get_str("granularity").unwrap_or("unknown");
        if found != self.granularity.name() {
            return Err(FormatError::Granularity {
                configured: self.granularity.name(),
                found: found.to_owned(),
                database,
                how: "recorded in its metadata document",
            });
        }
        for (what, key, ours) in [
            ("bucket", "bucket_schema_version", SCHEMA_VERSION),
            ("rollup", "rollup_schema_version", ROLLUP_SCHEMA_VERSION),
        ] {
            let found = number(&recorded, key).unwrap_or(0);
            if found > i64::from(ours) {
                return Err(FormatError::Newer {
                    what,
                    found,
                    ours,
                    database,
                });
            }
        }
        let rollup_version = number(&recorded, "rollup_schema_version").unwrap_or(0);
        let rollups_outdated = rollup_version < i64::from(ROLLUP_SCHEMA_VERSION)
            && self
                .rollups
                .find_one(doc! {})
                .projection(doc! { "_id": 1 })
                .await
                .map_err(classify)?
                .is_some();
        // Never lowered: an older instance refuses above, a newer one raises
        // the versions once its migration has run (the rollups' once they
        // are rebuilt; buckets of older layouts read as they are).
        let mut raise = doc! { "bucket_schema_version": SCHEMA_VERSION };
        if !rollups_outdated {
            raise.insert("rollup_schema_version", ROLLUP_SCHEMA_VERSION);
        }
        let raised = self
            .metadata
            .update_one(doc! { "_id": FORMAT_ID }, doc! { "$max": raise })
            .await
            .map_err(classify)?;
        self.count(|m| m.db_documents("written", "metadata", "format", raised.modified_count));
        Ok(FormatCheck { rollups_outdated })
    }

    /// Records that every rollup is of this version's layout (after a
    /// rebuild of all of them).
    pub async fn raise_rollup_version(&self) -> Result<(), StoreError> {
        let raised = self
            .metadata
            .update_one(
                doc! { "_id": FORMAT_ID },
                doc! { "$max": { "rollup_schema_version": ROLLUP_SCHEMA_VERSION } },
            )
            .await
            .map_err(classify)?;
        self.count(|m| m.db_documents("written", "metadata", "format", raised.modified_count));
        Ok(())
    }
}

/// Documents other components keep beside the format document (Sparkplug
/// birth certificates): `_id`s under a prefix, read back at start.
impl MongoStore {
    /// Saves `value` as the document `_id` (replacing an older one).
    pub async fn put_metadata<T: serde::Serialize>(
        &self,
        id: &str,
        value: &T,
    ) -> Result<(), StoreError> {
        let mut body = mongodb::bson::to_document(value)
            .map_err(|e| StoreError::Poison(format!("{id} was not encoded: {e}")))?;
        body.insert("_id", id);
        self.metadata
            .replace_one(doc! { "_id": id }, body)
            .upsert(true)
            .await
            .map_err(classify)?;
        self.count(|m| m.db_documents("written", "metadata", "sparkplug_birth", 1));
        Ok(())
    }

    /// Every document whose `_id` starts with `prefix` (on the `_id` index),
    /// counted as read for `kind` of work.
    pub(super) async fn metadata_documents_under(
        &self,
        prefix: &str,
        kind: &str,
    ) -> Result<Vec<Document>, StoreError> {
        use futures_util::TryStreamExt;
        let pattern = format!("^{}", regex::escape(prefix));
        let docs: Vec<Document> = self
            .metadata
            .find(doc! { "_id": { "$regex": pattern } })
            .await
            .map_err(classify_read)?
            .try_collect()
            .await
            .map_err(classify_read)?;
        self.count(|m| m.db_documents("read", "metadata", kind, docs.len() as u64));
        Ok(docs)
    }

    /// Every document whose `_id` starts with `prefix` (on the `_id` index).
    pub async fn metadata_under<T: serde::de::DeserializeOwned>(
        &self,
        prefix: &str,
    ) -> Result<Vec<T>, StoreError> {
        let docs = self
            .metadata_documents_under(prefix, "sparkplug_birth")
            .await?;
        // One document that does not decode costs only itself.
        let mut out = Vec::with_capacity(docs.len());
        for d in docs {
            let id = d.get_str("_id").unwrap_or_default().to_owned();
            match mongodb::bson::from_document(d) {
                Ok(t) => out.push(t),
                Err(e) => {
                    self.count(|m| m.unreadable_documents.inc());
                    tracing::warn!(id, error = %e, "Skipped a metadata document that does not decode.");
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_bucket_tells_its_granularity() {
        let minute = doc! { "v": { "7": 1.5, "9": 2.0 }, "count": 2 };
        let hour = doc! { "v": { "3": { "7": 1.5 } }, "m": { "3": { "c": 1 } } };
        let hour_without_m = doc! { "v": { "3": { "7": 1.5 } } };
        assert_eq!(granularity_of(&minute), Some(Granularity::Minute));
        assert_eq!(granularity_of(&hour), Some(Granularity::Hour));
        assert_eq!(granularity_of(&hour_without_m), Some(Granularity::Hour));
        assert_eq!(granularity_of(&doc! { "v": {} }), None);
        assert_eq!(granularity_of(&doc! {}), None);
    }
}

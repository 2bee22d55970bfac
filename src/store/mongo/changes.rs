//! The change log the query caches of every instance follow (see
//! `query::cache`): a counter, `{_id: "changes", seq}` in the metadata
//! collection, and one document per change, `{_id: seq, at, series:
//! ["<sensor>|<metric>", …] or null for every series, from, to}` in
//! `mongodb.change_collection`, kept a day (a TTL index on `at`).
//!
//! Written wherever a closed period changes: with the late markers of a
//! flush into ended hours and of a delete (`late`), and after a rebuild of
//! the rollups. The counter is taken first, then the entry written: a
//! reader that sees the counter ahead of the entries waits for them.

use std::collections::BTreeSet;

use mongodb::IndexModel;
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::options::{IndexOptions, ReturnDocument};

use super::classify::{classify, classify_read};
use super::connection::MongoStore;
use crate::domain::BucketUpdate;
use crate::store::{Change, Read, StoreError};

/// The counter's document in the metadata collection.
const COUNTER: &str = "changes";
/// An entry names at most this many series; a change of more names every
/// series.
const MAX_SERIES: usize = 1000;
/// How long entries are kept (a cache that has not followed the log for
/// longer empties itself).
const KEPT_SECONDS: u64 = 86_400;

impl MongoStore {
    /// The TTL index that keeps the log a day.
    pub(super) async fn ensure_change_log(&self) -> Result<(), StoreError> {
        let index = IndexModel::builder()
            .keys(doc! { "at": 1 })
            .options(
                IndexOptions::builder()
                    .name("at_ttl".to_owned())
                    .expire_after(std::time::Duration::from_secs(KEPT_SECONDS))
                    .build(),
            )
            .build();
        self.changes.create_index(index).await.map_err(classify)?;
        Ok(())
    }

    /// Records that `series` (every series when `None`) changed in
    /// `[from, to)`.
    pub(super) async fn record_change(
        &self,
        series: Option<Vec<(String, String)>>,
        from: i64,
        to: i64,
    ) -> Result<(), StoreError> {
        let counter = self
            .metadata
            .find_one_and_update(doc! { "_id": COUNTER }, doc! { "$inc": { "seq": 1_i64 } })
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await
            .map_err(classify)?
            .ok_or_else(|| StoreError::Outage("the change counter was not returned".into()))?;
        let seq = number(&counter, "seq")
            .ok_or_else(|| StoreError::Unreadable("the change counter is not a number".into()))?;
        let names = match series.filter(|s| s.len() <= MAX_SERIES) {
            Some(s) => Bson::Array(
                s.iter()
                    .map(|(sensor, metric)| Bson::String(format!("{sensor}|{metric}")))
                    .collect(),
            ),
            None => Bson::Null,
        };
        self.changes
            .insert_one(doc! {
                "_id": seq,
                "at": DateTime::now(),
                "series": names,
                "from": from,
                "to": to,
            })
            .await
            .map_err(classify)?;
        self.count(|m| m.db_documents("written", "changes", "change", 2));
        Ok(())
    }

    /// Records the change of the ended hours `stored` wrote into.
    pub(super) async fn record_hours(&self, stored: &[&BucketUpdate]) -> Result<(), StoreError> {
        let series: BTreeSet<(String, String)> = stored
            .iter()
            .map(|u| {
                (
                    u.key.sensor.as_str().to_owned(),
                    u.key.metric.as_str().to_owned(),
                )
            })
            .collect();
        let from = stored.iter().map(|u| u.key.start).min().unwrap_or(0);
        let to = stored
            .iter()
            .map(|u| u.key.start + self.granularity.seconds())
            .max()
            .unwrap_or(0);
        let from = from - from.rem_euclid(3600);
        self.record_change(Some(series.into_iter().collect()), from, to)
            .await
    }

    /// The counter and the entries after `after`.
    pub(super) async fn read_changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<Change>, Read), StoreError> {
        use futures_util::TryStreamExt;
        let mut read = Read {
            documents: 0,
            round_trips: 1,
        };
        let counter = self
            .metadata
            .find_one(doc! { "_id": COUNTER })
            .await
            .map_err(classify_read)?;
        let now = counter.as_ref().and_then(|c| number(c, "seq")).unwrap_or(0);
        if now <= after {
            return Ok((now, Vec::new(), read));
        }
        let docs: Vec<Document> = self
            .changes
            .find(doc! { "_id": { "$gt": after } })
            .sort(doc! { "_id": 1 })
            .limit(10_000)
            .await
            .map_err(classify_read)?
            .try_collect()
            .await
            .map_err(classify_read)?;
        read.round_trips += 1;
        read.documents = docs.len() as u64;
        let changes = docs
            .iter()
            .filter_map(|d| {
                let series = match d.get("series") {
                    Some(Bson::Array(a)) => Some(
                        a.iter()
                            .filter_map(Bson::as_str)
                            .filter_map(|k| k.rsplit_once('|'))
                            .map(|(s, m)| (s.to_owned(), m.to_owned()))
                            .collect(),
                    ),
                    _ => None,
                };
                Some(Change {
                    seq: number(d, "_id")?,
                    series,
                    from: number(d, "from").unwrap_or(i64::MIN),
                    to: number(d, "to").unwrap_or(i64::MAX),
                })
            })
            .collect();
        Ok((now, changes, read))
    }
}

fn number(d: &Document, key: &str) -> Option<i64> {
    match d.get(key)? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(n) => Some(*n as i64),
        _ => None,
    }
}

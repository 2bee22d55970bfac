//! [`BucketStore`] on MongoDB (any server ≥ 7 speaking its wire protocol).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, RawDocumentBuf, doc};
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};
use secrecy::ExposeSecret;
use tracing::{info, warn};

use super::command::Limits;
use super::document::{dead_letter_document, read_bucket, start_date};
use super::errors::{self, Class};
use super::{BucketStore, Fetch, Labels, SensorInfo, SensorQuery, StoreError};
use crate::batcher::{DeadLetter, Outcome, Sink, Written};
use crate::domain::{BucketRead, Level, Starts, Values};
use crate::domain::{BucketUpdate, Granularity, field_name};

/// The unique index on a bucket's identity. Its prefix `(sensor, metric)` plus
/// the range on `start` also serves every query, so it is the only index.
mod indexes;
mod registry;
mod rollups;
mod settings;
mod write;

pub use settings::{Settings, tls_options};

pub const BUCKET_INDEX: &str = "sensor_metric_start";

/// The unique index on a rollup's identity; it also serves every rollup read.
pub const ROLLUP_INDEX: &str = "sensor_metric_period_start";

/// The TTL index that implements `buckets.retention`.
pub const RETENTION_INDEX: &str = "start_ttl";

#[derive(Clone)]
pub struct MongoStore {
    db: Database,
    buckets: Collection<Document>,
    dead_letters: Collection<Document>,
    rollups: Collection<Document>,
    sensors: Collection<Document>,
    /// Series the registry knows, and the newest hour it was told of.
    known: Arc<Mutex<hashbrown::HashMap<(String, String), i64>>>,
    granularity: Granularity,
    limits: Limits,
    /// The URI's write concern, encoded once for every command.
    write_concern: Option<RawDocumentBuf>,
}

impl std::fmt::Debug for MongoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoStore")
            .field("database", &self.db.name())
            .field("collection", &self.buckets.name())
            .finish_non_exhaustive()
    }
}

fn classify(e: mongodb::error::Error) -> StoreError {
    // The driver's messages hold no credentials: the URI is never part of them.
    match errors::classify(&e) {
        Class::Outage => StoreError::Outage(e.to_string()),
        Class::Poison => StoreError::Poison(e.to_string()),
    }
}

/// What a reply says when the server applied a write but could not confirm
/// it with the write concern asked for: not stored yet (sending it again is
/// harmless, every write here is idempotent).
fn unconfirmed(reply: &Document) -> Option<String> {
    reply
        .get_document("writeConcernError")
        .ok()
        .map(|wce| format!("write concern error: {wce}"))
}

impl MongoStore {
    /// Runs `command`, which writes, with the URI's write concern (the driver
    /// adds it to its own write helpers only); `what` names it in errors. A
    /// write concern error is an outage.
    async fn run_write(&self, command: Document, what: &str) -> Result<Document, StoreError> {
        let mut command = RawDocumentBuf::from_document(&command)
            .map_err(|e| StoreError::Poison(format!("{what} was not encoded: {e}")))?;
        if let Some(wc) = &self.write_concern {
            command.append("writeConcern", wc.clone());
        }
        let reply = self.db.run_raw_command(command).await.map_err(classify)?;
        match unconfirmed(&reply) {
            Some(message) => Err(StoreError::Outage(format!(
                "{what} was not confirmed: {message}"
            ))),
            None => Ok(reply),
        }
    }

    /// Connects (lazily: the driver dials on first use) and creates the index.
    pub async fn connect(
        settings: &Settings,
        granularity: Granularity,
    ) -> Result<Self, StoreError> {
        let mut options = ClientOptions::parse(settings.uri.expose_secret())
            .await
            .map_err(|e| StoreError::Poison(format!("mongodb.uri: {e}")))?;
        options.app_name = Some("hourglass".to_owned());
        if let Some(tls) = tls_options(&settings.tls) {
            options.tls = Some(tls);
        }
        if options.server_selection_timeout.is_none() {
            options.server_selection_timeout = Some(settings.server_selection_timeout);
        }
        let write_concern = match &options.write_concern {
            Some(wc) => Some(
                mongodb::bson::to_document(wc)
                    .ok()
                    .and_then(|d| RawDocumentBuf::from_document(&d).ok())
                    .ok_or_else(|| StoreError::Poison("mongodb.uri: write concern".into()))?,
            ),
            None => None,
        };
        let client = Client::with_options(options).map_err(classify)?;
        let db = client.database(&settings.database);
        let buckets = db.collection::<Document>(&settings.collection);
        let dead_letters = db.collection::<Document>(&settings.dead_letter_collection);
        let rollups = db.collection::<Document>(&settings.rollup_collection);
        let sensors = db.collection::<Document>(&settings.sensor_collection);
        Ok(Self {
            db,
            buckets,
            dead_letters,
            rollups,
            sensors,
            known: Arc::default(),
            granularity,
            limits: Limits::default(),
            write_concern,
        })
    }

    /// Reads the server's size limits from its `hello` reply, so that no
    /// command this store sends can exceed them.
    pub async fn read_limits(&mut self) -> Result<Limits, StoreError> {
        let hello = self
            .db
            .run_command(doc! { "hello": 1 })
            .await
            .map_err(classify)?;
        let get = |field: &str, default: usize| match hello.get(field) {
            Some(Bson::Int32(n)) => usize::try_from(*n).unwrap_or(default),
            Some(Bson::Int64(n)) => usize::try_from(*n).unwrap_or(default),
            Some(Bson::Double(n)) if *n >= 1.0 => *n as usize,
            _ => default,
        };
        let d = Limits::default();
        self.limits = Limits {
            max_bson_object_size: get("maxBsonObjectSize", d.max_bson_object_size),
            max_message_size: get("maxMessageSizeBytes", d.max_message_size),
            max_write_batch_size: get("maxWriteBatchSize", d.max_write_batch_size).max(1),
        };
        info!(limits = ?self.limits, "Read the storage server's limits.");
        Ok(self.limits)
    }
}

impl Sink for MongoStore {
    async fn write(&self, updates: &[&BucketUpdate]) -> Written {
        let mut written = self.write_updates(updates).await;
        let stored: Vec<&BucketUpdate> = updates
            .iter()
            .zip(&written.outcomes)
            .filter(|(_, o)| matches!(o, Outcome::Stored))
            .map(|(u, _)| *u)
            .collect();
        // Rollups and registry follow the buckets before the batch counts as
        // stored: while a batch is in flight, queries read its buckets, not
        // rollups that may not include it yet.
        let after = match self.roll_up(&stored).await {
            Ok(n) => {
                written.round_trips += n;
                self.register(&stored).await
            }
            Err(e) => Err(e),
        };
        match after {
            Ok(n) => written.round_trips += n,
            // Buckets and rollups are idempotent: the whole batch goes again.
            Err(StoreError::Outage(message)) => {
                for o in &mut written.outcomes {
                    if matches!(o, Outcome::Stored) {
                        *o = Outcome::Outage(message.clone());
                    }
                }
            }
            // The readings are stored in their buckets; only a summary lags.
            Err(e) => warn!(
                error = %e,
                "The rollups or the sensor registry could not be updated after a flush; the buckets are stored. Run `hourglass rebuild-rollups` over the affected days."
            ),
        }
        written
    }

    async fn dead_letter(&self, letters: &[DeadLetter<'_>]) -> Outcome {
        if letters.is_empty() {
            return Outcome::Stored;
        }
        let documents = letters
            .iter()
            .map(|l| dead_letter_document(l, self.granularity));
        match self
            .dead_letters
            .insert_many(documents)
            .ordered(false)
            .await
        {
            Ok(_) => Outcome::Stored,
            Err(e) => match errors::classify(&e) {
                Class::Outage => Outcome::Outage(e.to_string()),
                Class::Poison => Outcome::Poison(e.to_string()),
            },
        }
    }
}

impl BucketStore for MongoStore {
    async fn fetch<F: FnMut(BucketRead) + Send>(
        &self,
        fetch: Fetch<'_>,
        mut each: F,
    ) -> Result<u64, StoreError> {
        let len = match fetch.level {
            Level::Buckets => self.granularity.seconds(),
            Level::Rollups(period) => period.seconds(),
        };
        // A dense list of starts is read as one index range (servers that
        // scan for `$in`, like the test stand-in, stay fast; MongoDB reads
        // at most twice the documents), the ones not listed skipped here.
        let mut only: Option<&[i64]> = None;
        let start = match &fetch.starts {
            Starts::Range(from, to) => doc! { "$gte": start_date(*from), "$lt": start_date(*to) },
            Starts::Only(starts) => match (starts.first(), starts.last()) {
                (Some(&a), Some(&b))
                    if starts.is_sorted() && (b - a) / len.max(1) < 2 * starts.len() as i64 =>
                {
                    only = Some(starts);
                    // Half-open: see `rollup::flush_filters`.
                    doc! { "$gte": start_date(a), "$lt": start_date(b + len) }
                }
                _ => {
                    doc! { "$in": starts.iter().map(|&s| Bson::DateTime(start_date(s))).collect::<Vec<_>>() }
                }
            },
        };
        let mut filter = doc! { "sensor": fetch.sensor, "metric": fetch.metric };
        let collection = match fetch.level {
            Level::Buckets => &self.buckets,
            Level::Rollups(period) => {
                filter.insert("period", period.name());
                &self.rollups
            }
        };
        filter.insert("start", start);
        let mut projection = doc! {
            "_id": 0, "start": 1, "schema_version": 1,
            "count": 1, "sum": 1, "min": 1, "max": 1,
        };
        if fetch.slots {
            projection.insert(
                match fetch.level {
                    Level::Buckets => "m",
                    Level::Rollups(_) => "s",
                },
                1,
            );
        }
        match &fetch.values {
            Values::None => {}
            Values::All => {
                projection.insert("v", 1);
            }
            Values::Minutes(minutes) => {
                for &minute in minutes {
                    projection.insert(format!("v.{}", field_name(minute)), 1);
                }
            }
        }
        let mut cursor = collection
            .find(filter)
            .projection(projection)
            .sort(doc! { "start": 1 })
            .max_time(fetch.max_time)
            .await
            .map_err(classify)?;
        let mut read = 0;
        while let Some(doc) = cursor.try_next().await.map_err(classify)? {
            read += 1;
            let b = read_bucket(&doc, self.granularity)?;
            if only.is_none_or(|o| o.binary_search(&b.start).is_ok()) {
                each(b);
            }
        }
        Ok(read)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.db
            .run_command(doc! { "ping": 1 })
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn sensors<F: FnMut(&SensorInfo) -> bool + Send>(
        &self,
        query: SensorQuery<'_>,
        limit: usize,
        keep: F,
    ) -> Result<Vec<SensorInfo>, StoreError> {
        self.list_sensors(query, limit, keep).await
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

    async fn latest(
        &self,
        sensor: &str,
        metric: &str,
        max_time: Duration,
    ) -> Result<Option<(i64, f64)>, StoreError> {
        let newest = self
            .buckets
            .find_one(doc! { "sensor": sensor, "metric": metric })
            .projection(doc! { "_id": 0, "start": 1, "schema_version": 1, "count": 1, "sum": 1, "min": 1, "max": 1, "v": 1 })
            .sort(doc! { "start": -1 })
            .max_time(max_time)
            .await
            .map_err(classify)?;
        let Some(doc) = newest else {
            return Ok(None);
        };
        let read = read_bucket(&doc, self.granularity)?;
        Ok(read
            .values
            .last()
            .map(|&(offset, value)| (read.start + i64::from(offset), value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_with_a_write_concern_error_is_unconfirmed() {
        let ok = doc! { "n": 1, "nModified": 1, "ok": 1 };
        assert_eq!(unconfirmed(&ok), None);
        let wce = doc! {
            "n": 1,
            "writeConcernError": { "code": 64, "errmsg": "waiting for replication timed out" },
            "ok": 1,
        };
        assert!(unconfirmed(&wce).is_some_and(|m| m.contains("64")));
    }
}

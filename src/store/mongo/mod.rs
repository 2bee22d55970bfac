//! [`BucketStore`] on MongoDB (any server ≥ 7 speaking its wire protocol).

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, RawDocumentBuf, doc};
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};
use secrecy::ExposeSecret;
use tracing::info;

use super::command::Limits;
use super::document::{dead_letter_document, read_bucket, start_date};
use super::errors::{self, Class};
use super::{BucketStore, Fetch, StoreError};
use crate::batcher::{DeadLetter, Outcome, Sink, Written};
use crate::domain::{BucketRead, Starts, Values};
use crate::domain::{BucketUpdate, Granularity, field_name};

/// The unique index on a bucket's identity. Its prefix `(sensor, metric)` plus
/// the range on `start` also serves every query, so it is the only index.
mod indexes;
mod settings;
mod write;

pub use settings::{Settings, tls_options};

pub const BUCKET_INDEX: &str = "sensor_metric_start";

/// The TTL index that implements `buckets.retention`.
pub const RETENTION_INDEX: &str = "start_ttl";

#[derive(Clone)]
pub struct MongoStore {
    db: Database,
    buckets: Collection<Document>,
    dead_letters: Collection<Document>,
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

impl MongoStore {
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
        Ok(Self {
            db,
            buckets,
            dead_letters,
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
        self.write_updates(updates).await
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
    async fn fetch(&self, fetch: Fetch<'_>) -> Result<Vec<BucketRead>, StoreError> {
        let start = match &fetch.starts {
            Starts::Range(from, to) => doc! { "$gte": start_date(*from), "$lt": start_date(*to) },
            Starts::Only(starts) => {
                doc! { "$in": starts.iter().map(|&s| Bson::DateTime(start_date(s))).collect::<Vec<_>>() }
            }
        };
        let filter = doc! {
            "sensor": fetch.sensor.as_str(),
            "metric": fetch.metric.as_str(),
            "start": start,
        };
        let mut projection = doc! {
            "_id": 0, "start": 1, "schema_version": 1,
            "count": 1, "sum": 1, "min": 1, "max": 1,
        };
        if fetch.minutes {
            projection.insert("m", 1);
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
        let mut cursor = self
            .buckets
            .find(filter)
            .projection(projection)
            .sort(doc! { "start": 1 })
            .await
            .map_err(classify)?;
        let mut out = Vec::new();
        while let Some(doc) = cursor.try_next().await.map_err(classify)? {
            out.push(read_bucket(&doc, self.granularity)?);
        }
        Ok(out)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.db
            .run_command(doc! { "ping": 1 })
            .await
            .map(|_| ())
            .map_err(classify)
    }
}

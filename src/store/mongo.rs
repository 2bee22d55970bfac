//! [`BucketStore`] on MongoDB (any server ≥ 7 speaking its wire protocol).

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, RawDocumentBuf, doc};
use mongodb::options::{ClientOptions, IndexOptions, Tls, TlsOptions};
use mongodb::{Client, Collection, Database, IndexModel};
use secrecy::ExposeSecret;
use std::time::Duration;
use tracing::info;

use super::command::{Chunk, Commands, Limits};
use super::document::{dead_letter_document, read_bucket, start_date};
use super::errors::{self, Class, DUPLICATE_KEY};
use super::{
    BucketRead, BucketStore, DeadLetter, Fetch, Outcome, Starts, StoreError, Values, Written,
};
use crate::config::{MongoSettings, MongoTlsSettings};
use crate::domain::{BucketUpdate, Granularity, field_name};

/// The unique index on a bucket's identity. Its prefix `(sensor, metric)` plus
/// the range on `start` also serves every query, so it is the only index.
pub const BUCKET_INDEX: &str = "sensor_metric_start";

/// The TTL index that implements `buckets.retention`.
pub const RETENTION_INDEX: &str = "start_ttl";

/// Times an upsert that lost a race to create its bucket is sent again.
const DUPLICATE_KEY_RETRIES: usize = 5;

#[derive(Clone)]
pub struct MongoStore {
    client: Client,
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

/// The driver's TLS options for `mongodb.tls`, when it is enabled.
pub fn tls_options(settings: &MongoTlsSettings) -> Option<Tls> {
    settings.enabled.then(|| {
        Tls::Enabled(
            TlsOptions::builder()
                .ca_file_path(settings.ca_file.clone())
                .cert_key_file_path(settings.cert_key_file.clone())
                .allow_invalid_certificates(settings.allow_invalid_certificates.then_some(true))
                .build(),
        )
    })
}

impl MongoStore {
    /// Connects (lazily: the driver dials on first use) and creates the index.
    pub async fn connect(
        settings: &MongoSettings,
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
            client,
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

    pub fn granularity(&self) -> Granularity {
        self.granularity
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends `group` (indexes into `updates`) as commands within the limits,
    /// recording each update's outcome; returns the indexes that lost an
    /// upsert race and must be sent again.
    async fn send_group(
        &self,
        updates: &[&BucketUpdate],
        group: Vec<usize>,
        outcomes: &mut [Option<Outcome>],
        round_trips: &mut usize,
    ) -> Vec<usize> {
        let mut races = Vec::new();
        // Groups to send; a command refused as a whole for a poison error is
        // split in halves until the statement that causes it stands alone.
        let mut work = std::collections::VecDeque::from([group]);
        while let Some(group) = work.pop_front() {
            let mut commands = Commands::new(
                updates,
                group.into_iter(),
                self.buckets.name(),
                self.write_concern.as_deref(),
                self.granularity,
                self.limits,
            );
            while let Some(chunk) = commands.next() {
                let command = match chunk {
                    Chunk::Oversized { index, bytes } => {
                        outcomes[index] = Some(Outcome::Poison(format!(
                            "the bucket update is {bytes} bytes, more than the server takes in one command"
                        )));
                        continue;
                    }
                    Chunk::Command(command) => command,
                };
                *round_trips += 1;
                match self.db.run_raw_command(command.body).await {
                    Ok(reply) => read_reply(&reply, &command.indexes, outcomes, &mut races),
                    Err(e) => {
                        let class = errors::classify(&e);
                        let message = e.to_string();
                        match class {
                            Class::Poison if command.indexes.len() == 1 => {
                                outcomes[command.indexes[0]] = Some(Outcome::Poison(message));
                            }
                            Class::Poison => {
                                let mut indexes = command.indexes;
                                let back = indexes.split_off(indexes.len() / 2);
                                work.push_front(back);
                                work.push_front(indexes);
                            }
                            Class::Outage => {
                                // The server is in the way: nothing more goes out now.
                                let rest = command
                                    .indexes
                                    .into_iter()
                                    .chain(commands.rest())
                                    .chain(work.into_iter().flatten())
                                    .chain(races);
                                for i in rest {
                                    outcomes[i] = Some(Outcome::Outage(message.clone()));
                                }
                                return Vec::new();
                            }
                        }
                    }
                }
            }
        }
        races
    }
}

/// Records the outcome of each statement of one unordered `update` reply.
fn read_reply(
    reply: &Document,
    indexes: &[usize],
    outcomes: &mut [Option<Outcome>],
    races: &mut Vec<usize>,
) {
    let mut failed = vec![false; indexes.len()];
    if let Ok(errors) = reply.get_array("writeErrors") {
        for e in errors.iter().filter_map(Bson::as_document) {
            let code = e.get_i32("code").unwrap_or_default();
            let Some(position) = e
                .get_i32("index")
                .ok()
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < indexes.len())
            else {
                continue;
            };
            failed[position] = true;
            let i = indexes[position];
            if code == DUPLICATE_KEY {
                races.push(i);
                continue;
            }
            let message = format!(
                "code {code}: {}",
                e.get_str("errmsg").unwrap_or("no message")
            );
            outcomes[i] = Some(match errors::classify_write_error(code) {
                Class::Outage => Outcome::Outage(message),
                Class::Poison => Outcome::Poison(message),
            });
        }
    }
    // Applied, but not confirmed with the write concern asked for: not stored
    // yet. Sending it again is harmless (updates are idempotent).
    let unconfirmed = reply
        .get_document("writeConcernError")
        .ok()
        .map(|wce| format!("write concern error: {wce}"));
    for (position, &i) in indexes.iter().enumerate() {
        if !failed[position] {
            outcomes[i] = Some(match &unconfirmed {
                Some(message) => Outcome::Outage(message.clone()),
                None => Outcome::Stored,
            });
        }
    }
}

impl BucketStore for MongoStore {
    async fn write(&self, updates: &[&BucketUpdate]) -> Written {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; updates.len()];
        let mut round_trips = 0;
        let mut group: Vec<usize> = (0..updates.len()).collect();
        // Two writers creating the same bucket at once: one insert wins, the
        // other fails on the unique index and succeeds as an update when resent.
        for _ in 0..=DUPLICATE_KEY_RETRIES {
            if group.is_empty() {
                break;
            }
            group = self
                .send_group(updates, group, &mut outcomes, &mut round_trips)
                .await;
        }
        for i in group {
            outcomes[i] = Some(Outcome::Outage(
                "the upsert kept losing races on the unique index".into(),
            ));
        }
        Written {
            outcomes: outcomes
                .into_iter()
                .map(|o| o.unwrap_or_else(|| Outcome::Outage("not sent".into())))
                .collect(),
            round_trips,
        }
    }

    async fn dead_letter(&self, letters: &[DeadLetter<'_>]) -> Result<(), StoreError> {
        if letters.is_empty() {
            return Ok(());
        }
        let documents = letters
            .iter()
            .map(|l| dead_letter_document(l, self.granularity));
        self.dead_letters
            .insert_many(documents)
            .ordered(false)
            .await
            .map(|_| ())
            .map_err(classify)
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn tls_settings_become_driver_options() {
        assert!(
            tls_options(&MongoTlsSettings::default()).is_none(),
            "off by default"
        );
        let settings = MongoTlsSettings {
            enabled: true,
            ca_file: Some(PathBuf::from("/etc/ca.pem")),
            cert_key_file: Some(PathBuf::from("/etc/client.pem")),
            allow_invalid_certificates: false,
        };
        match tls_options(&settings) {
            Some(Tls::Enabled(o)) => {
                assert_eq!(o.ca_file_path, settings.ca_file);
                assert_eq!(o.cert_key_file_path, settings.cert_key_file);
                assert_eq!(o.allow_invalid_certificates, None);
            }
            other => panic!("expected TLS, got {other:?}"),
        }
    }
}

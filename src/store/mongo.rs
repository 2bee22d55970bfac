//! [`BucketStore`] on MongoDB (any server ≥ 7 speaking its wire protocol).

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, RawArrayBuf, RawDocumentBuf, doc, rawdoc};
use mongodb::error::{Error as MongoError, ErrorKind};
use mongodb::options::{ClientOptions, IndexOptions, Tls, TlsOptions};
use mongodb::{Client, Collection, Database, IndexModel};
use secrecy::ExposeSecret;
use std::time::Duration;
use tracing::info;

use super::document::{estimated_size, read_bucket, start_date, update_statement};
use super::{BucketRead, BucketStore, Fetch, Starts, StoreError, Values, WriteReport};
use crate::config::{MongoSettings, MongoTlsSettings};
use crate::domain::{BucketUpdate, Granularity, field_name};

/// The unique index on a bucket's identity. Its prefix `(sensor, metric)` plus
/// the range on `start` also serves every query, so it is the only index.
pub const BUCKET_INDEX: &str = "sensor_metric_start";

/// The TTL index that implements `buckets.retention`.
pub const RETENTION_INDEX: &str = "start_ttl";

/// Statements per `update` command; the server takes up to 100 000.
const MAX_STATEMENTS_PER_COMMAND: usize = 10_000;
/// Estimated bytes per `update` command, well under the 16 MiB document limit.
const MAX_COMMAND_BYTES: usize = 8 * 1024 * 1024;
/// Times an upsert that lost a race to create its bucket is sent again.
const DUPLICATE_KEY_RETRIES: usize = 5;

const DUPLICATE_KEY: i32 = 11000;
/// Server error codes that a later attempt can get past (the drivers' retryable
/// codes plus write conflicts).
const TRANSIENT_CODES: &[i32] = &[
    6, 7, 89, 91, 112, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436, 63, 150, 134,
];

#[derive(Clone)]
pub struct MongoStore {
    client: Client,
    db: Database,
    buckets: Collection<Document>,
    granularity: Granularity,
}

impl std::fmt::Debug for MongoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoStore")
            .field("database", &self.db.name())
            .field("collection", &self.buckets.name())
            .finish_non_exhaustive()
    }
}

fn classify(e: MongoError) -> StoreError {
    let transient = match e.kind.as_ref() {
        ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::ServerSelection { .. }
        | ErrorKind::DnsResolve { .. } => true,
        ErrorKind::Command(c) => TRANSIENT_CODES.contains(&c.code),
        _ => {
            e.contains_label("RetryableWriteError") || e.contains_label("TransientTransactionError")
        }
    };
    // The driver's messages hold no credentials: the URI is never part of them.
    if transient {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Rejected(e.to_string())
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
            .map_err(|e| StoreError::Rejected(format!("mongodb.uri: {e}")))?;
        options.app_name = Some("hourglass".to_owned());
        if let Some(tls) = tls_options(&settings.tls) {
            options.tls = Some(tls);
        }
        if options.server_selection_timeout.is_none() {
            options.server_selection_timeout = Some(settings.server_selection_timeout);
        }
        let client = Client::with_options(options).map_err(classify)?;
        let db = client.database(&settings.database);
        let buckets = db.collection::<Document>(&settings.collection);
        Ok(Self {
            client,
            db,
            buckets,
            granularity,
        })
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

    /// Sends statements as one unordered `update` command; returns the indexes
    /// (into `statements`) that lost an upsert race and must be sent again.
    async fn send<'u>(
        &self,
        updates: impl Iterator<Item = &'u BucketUpdate>,
    ) -> Result<Vec<usize>, StoreError> {
        // Statements go straight into the command's array: no copy per flush.
        let mut statements = RawArrayBuf::new();
        for u in updates {
            statements.push(update_statement(u, self.granularity));
        }
        let mut command = rawdoc! {
            "update": self.buckets.name(),
            "updates": statements,
            "ordered": false,
        };
        if let Some(wc) = self.buckets.write_concern() {
            let wc = mongodb::bson::to_document(wc)
                .map_err(|e| e.to_string())
                .and_then(|d| RawDocumentBuf::from_document(&d).map_err(|e| e.to_string()))
                .map_err(|e| StoreError::Rejected(format!("write concern: {e}")))?;
            command.append("writeConcern", wc);
        }
        let reply = self.db.run_raw_command(command).await.map_err(classify)?;
        if let Ok(wce) = reply.get_document("writeConcernError") {
            return Err(StoreError::Unavailable(format!(
                "write concern error: {wce}"
            )));
        }
        let mut retry = Vec::new();
        let mut first_error = None;
        if let Ok(errors) = reply.get_array("writeErrors") {
            for e in errors.iter().filter_map(Bson::as_document) {
                let code = e.get_i32("code").unwrap_or_default();
                let index = e
                    .get_i32("index")
                    .ok()
                    .and_then(|i| usize::try_from(i).ok());
                match (code, index) {
                    (DUPLICATE_KEY, Some(i)) => retry.push(i),
                    _ => {
                        let msg = e.get_str("errmsg").unwrap_or("no message").to_owned();
                        let transient = TRANSIENT_CODES.contains(&code);
                        // A permanent error outranks a transient one: retrying cannot fix it.
                        if first_error
                            .as_ref()
                            .is_none_or(|(t, _): &(bool, String)| *t)
                        {
                            first_error = Some((transient, format!("code {code}: {msg}")));
                        }
                    }
                }
            }
        }
        match first_error {
            Some((true, msg)) => Err(StoreError::Unavailable(msg)),
            Some((false, msg)) => Err(StoreError::Rejected(msg)),
            None => Ok(retry),
        }
    }

    async fn write_chunk(&self, chunk: &[BucketUpdate]) -> Result<usize, StoreError> {
        let mut round_trips = 1;
        let mut retry = self.send(chunk.iter()).await?;
        // Two writers creating the same bucket at once: one insert wins, the
        // other fails on the unique index and succeeds as an update when resent
        // (rare, so its statements are simply built again).
        let mut attempt = 0;
        while !retry.is_empty() {
            attempt += 1;
            if attempt > DUPLICATE_KEY_RETRIES {
                return Err(StoreError::Unavailable(format!(
                    "{} upserts kept losing races on the unique index",
                    retry.len()
                )));
            }
            let next = self
                .send(retry.iter().filter_map(|&i| chunk.get(i)))
                .await?;
            round_trips += 1;
            retry = next
                .into_iter()
                .filter_map(|i| retry.get(i).copied())
                .collect();
        }
        Ok(round_trips)
    }
}

impl BucketStore for MongoStore {
    async fn write(&self, updates: &[BucketUpdate]) -> Result<WriteReport, StoreError> {
        let mut report = WriteReport::default();
        let mut begin = 0;
        while begin < updates.len() {
            let mut end = begin;
            let mut bytes = 0;
            while end < updates.len()
                && end - begin < MAX_STATEMENTS_PER_COMMAND
                && (end == begin || bytes + estimated_size(&updates[end]) <= MAX_COMMAND_BYTES)
            {
                bytes += estimated_size(&updates[end]);
                end += 1;
            }
            report.round_trips += self.write_chunk(&updates[begin..end]).await?;
            report.buckets += end - begin;
            begin = end;
        }
        Ok(report)
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

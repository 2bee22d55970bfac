//! [`BucketStore`] on MongoDB (any server ≥ 7 speaking its wire protocol).

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{Bson, Document, RawDocumentBuf, doc};
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};
use secrecy::ExposeSecret;
use tracing::info;

use super::command::Limits;
use super::errors::{self, Class};
use super::rollup::schedule::Upkeep;
use super::{
    BucketStore, BucketStream, Doc, Fetch, Labels, Read, SensorInfo, SensorQuery, StoreError,
};
use crate::batcher::clock::Watermarks;
use crate::domain::Granularity;
use crate::telemetry::metrics::Metrics;

mod changes;
mod dead_letters;
mod delete;
mod driver_cpu;
mod indexes;
mod instances;
mod metadata;
mod read;
mod registry;
mod replies;
mod rollup;
mod settings;
mod shapes;
mod sink;
mod write;

pub use dead_letters::{MAX_LISTED as MAX_LISTED_DEAD_LETTERS, Redriven};
pub use instances::{Beat, InstanceInfo, Others};
pub use settings::{BlockCompressor, Settings, tls_options};

/// The unique index on a bucket's identity. Its prefix `(sensor, metric)` plus
/// the range on `start` also serves every query, so it is the only index.
pub const BUCKET_INDEX: &str = "sensor_metric_start";

/// How long a pooled connection may sit unused before the driver closes it.
const IDLE_CONNECTIONS_CLOSED_AFTER: Duration = Duration::from_secs(60);

/// The unique index on a rollup's identity; it also serves every rollup read.
pub const ROLLUP_INDEX: &str = "sensor_metric_period_start";

/// The TTL index that implements `buckets.retention`.
pub const RETENTION_INDEX: &str = "start_ttl";

/// The TTL index that implements `mongodb.dead_letter_retention`.
pub const DEAD_LETTER_RETENTION_INDEX: &str = "at_ttl";

/// Documents a query's cursor asks for per batch: the server sends up to
/// 16 MiB at a time, rather than its default first batch of 101.
const BATCH_DOCUMENTS: u32 = 100_000;

/// Documents an export's cursor asks for per batch: small enough that a
/// slow reader holds a few megabytes, not a 16 MiB batch.
const EXPORT_BATCH_DOCUMENTS: u32 = 2_000;

#[derive(Clone)]
pub struct MongoStore {
    db: Database,
    buckets: Collection<Document>,
    dead_letters: Collection<Document>,
    rollups: Collection<Document>,
    /// Late markers (see `store::rollup::late`).
    late: Collection<Document>,
    sensors: Collection<Document>,
    /// The metadata document (see `metadata`).
    metadata: Collection<Document>,
    /// The change log (see `changes`).
    changes: Collection<Document>,
    /// Flushes in a row whose rollup or registry step failed unclassed.
    unclassed_after: Arc<AtomicU32>,
    /// Series the registry knows, and the newest hour it was told of.
    known: Arc<Mutex<hashbrown::HashMap<(String, String), i64>>>,
    /// Registry writes of newer hours this instance has made (see
    /// [`BucketStore::registrations`]).
    registrations: Arc<std::sync::atomic::AtomicU64>,
    granularity: Granularity,
    /// The relative accuracy of rollup slots' sketches (`buckets.sketch_accuracy`).
    sketch_accuracy: f64,
    limits: Limits,
    /// The URI's write concern, encoded once for every command.
    write_concern: Option<RawDocumentBuf>,
    /// Open hours written, rolled up once they end (see `store::rollup::schedule`).
    upkeep: Arc<Mutex<Upkeep>>,
    /// Seconds after an hour ends before the upkeep rolls it up anyway.
    close_after: i64,
    /// Seconds without a late mark before a marked hour is rolled up.
    late_after: i64,
    /// When this instance last marked hours late (epoch seconds): a lone
    /// instance polls the markers only while some of its own may be left.
    last_mark: Arc<std::sync::atomic::AtomicI64>,
    /// This instance rolls up the hours marked late: no other running
    /// instance has a lower id (set with each read of the floors).
    late_roller: Arc<std::sync::atomic::AtomicBool>,
    /// Hours written by flushes of this instance under way: not rolled up
    /// for quiet while one is (it would mark them again when it ends).
    in_flight: Arc<sink::InFlight>,
    dead_letter_retention: Option<Duration>,
    /// How the collections this creates are compressed (`mongodb.block_compressor`).
    block_compressor: settings::BlockCompressor,
    metrics: Option<Arc<Metrics>>,
    /// New series of accepted readings, to register ahead of storage.
    registering: Option<tokio::sync::mpsc::Sender<registry::Registering>>,
    /// What is unstored elsewhere: which values keep their version.
    watermarks: Arc<Watermarks>,
    /// The deletes every write leaves out (see `store::delete`).
    deletes: Arc<delete::Deletes>,
    /// How reads of many series are sent to this server (see `shapes`).
    read_shape: shapes::ReadShape,
    /// Series of each metric, as last counted: what a read by time would
    /// take beyond what it asks (see `shapes::TIME_FIRST_SPARE`).
    series_counts: Arc<Mutex<std::collections::HashMap<String, (std::time::Instant, u64)>>>,
    /// This instance's id, once it has published its floor.
    instance_id: Arc<std::sync::OnceLock<String>>,
}

impl std::fmt::Debug for MongoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoStore")
            .field("database", &self.db.name())
            .field("collection", &self.buckets.name())
            .finish_non_exhaustive()
    }
}

/// A read's error: one the server stopped at its `maxTimeMS` is a timeout
/// (the query ran out of time), not an outage.
fn classify_read(e: mongodb::error::Error) -> StoreError {
    match errors::command_code(&e) {
        Some(code) if errors::TIME_LIMIT_CODES.contains(&code) => {
            StoreError::Timeout(e.to_string())
        }
        _ => classify(e),
    }
}

fn classify(e: mongodb::error::Error) -> StoreError {
    // The driver's messages hold no credentials: the URI is never part of them.
    if errors::is_unclassed(&e) {
        return StoreError::Unclassed(e.to_string());
    }
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
    /// `call`, a driver call, with its CPU counted as the driver's (see
    /// `driver_cpu`).
    fn driver<F: std::future::IntoFuture>(&self, call: F) -> driver_cpu::Timed<'_, F::IntoFuture> {
        driver_cpu::timed(call, self.metrics.as_deref().map(|m| &m.driver_cpu))
    }

    /// Runs `command`, which writes, with the URI's write concern (the driver
    /// adds it to its own write helpers only); `what` names it in errors. A
    /// write concern error is an outage.
    async fn run_write(&self, command: Document, what: &str) -> Result<Document, StoreError> {
        let command = RawDocumentBuf::from_document(&command)
            .map_err(|e| StoreError::Poison(format!("{what} was not encoded: {e}")))?;
        self.run_raw_write(command, what).await
    }

    async fn run_raw_write(
        &self,
        mut command: RawDocumentBuf,
        what: &str,
    ) -> Result<Document, StoreError> {
        if let Some(wc) = &self.write_concern {
            command.append("writeConcern", wc.clone());
        }
        let reply = self
            .driver(self.db.run_raw_command(command))
            .await
            .map_err(classify)?;
        match unconfirmed(&reply) {
            Some(message) => Err(StoreError::Outage(format!(
                "{what} was not confirmed: {message}"
            ))),
            None => Ok(reply),
        }
    }

    /// Connects (lazily: the driver dials on first use).
    pub async fn connect(
        settings: &Settings,
        buckets: &crate::store::BucketSettings,
    ) -> Result<Self, StoreError> {
        let granularity = buckets.granularity;
        let sketch_accuracy = buckets.sketch_accuracy;
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
        // Servers, proxies and NATs close connections left idle (the local
        // stand-in after 300 s); a pooled connection closed underneath fails
        // the next command sent on it. The URI's `maxIdleTimeMS` wins.
        if options.max_idle_time.is_none() {
            options.max_idle_time = Some(IDLE_CONNECTIONS_CLOSED_AFTER);
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
        let client = client_on_driver_runtime(options).map_err(classify)?;
        let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 4);
        let close_after = seconds(buckets.rollup_after);
        let late_after = seconds(buckets.late_rollup_after);
        let db = client.database(&settings.database);
        let buckets = db.collection::<Document>(&settings.collection);
        let dead_letters = db.collection::<Document>(&settings.dead_letter_collection);
        let rollups = db.collection::<Document>(&settings.rollup_collection);
        let late = db.collection::<Document>(&settings.late_collection);
        let sensors = db.collection::<Document>(&settings.sensor_collection);
        let metadata = db.collection::<Document>(&settings.metadata_collection);
        let changes = db.collection::<Document>(&settings.change_collection);
        Ok(Self {
            db,
            buckets,
            dead_letters,
            rollups,
            late,
            sensors,
            metadata,
            changes,
            unclassed_after: Arc::default(),
            known: Arc::default(),
            registrations: Arc::default(),
            granularity,
            sketch_accuracy,
            limits: Limits::default(),
            write_concern,
            upkeep: Arc::new(Mutex::new(Upkeep::new(close_after))),
            close_after,
            late_after,
            last_mark: Arc::new(std::sync::atomic::AtomicI64::new(i64::MIN)),
            late_roller: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            in_flight: Arc::default(),
            dead_letter_retention: settings.dead_letter_retention,
            block_compressor: settings.block_compressor,
            metrics: None,
            registering: None,
            watermarks: Arc::default(),
            deletes: Arc::default(),
            read_shape: shapes::ReadShape::default(),
            series_counts: Arc::default(),
            instance_id: Arc::default(),
        })
    }

    /// The watermarks its writes keep versions by (the instance publisher
    /// and the journal move them).
    pub fn watermarks(&self) -> Arc<Watermarks> {
        self.watermarks.clone()
    }

    /// Counts the documents this store reads and writes into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn count(&self, f: impl FnOnce(&Metrics)) {
        if let Some(m) = &self.metrics {
            f(m);
        }
    }

    fn upkeep(&self) -> std::sync::MutexGuard<'_, Upkeep> {
        self.upkeep.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Measures how the server reads several series at once (see
    /// `shapes`), on a scratch collection of this database.
    pub async fn probe_read_shape(&mut self) -> Result<shapes::ReadShape, StoreError> {
        let scratch = format!("{}_probe", self.buckets.name());
        self.read_shape = shapes::read_shape(&self.db, &scratch).await?;
        if self.read_shape == shapes::ReadShape::PerSeries {
            shapes::bound_reads(&self.buckets, &self.rollups).await?;
        }
        Ok(self.read_shape)
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

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 4))
}

impl BucketStore for MongoStore {
    fn sketch_accuracy(&self) -> f64 {
        self.sketch_accuracy
    }

    async fn fetch<F: FnMut(usize, Doc) + Send>(
        &self,
        fetch: Fetch<'_>,
        each: F,
    ) -> Result<Read, StoreError> {
        self.read_level(fetch, each).await
    }

    async fn changes(
        &self,
        after: i64,
    ) -> Result<(i64, Vec<crate::store::Change>, Read), StoreError> {
        self.read_changes(after).await
    }

    async fn late(
        &self,
        sensors: &[&str],
        metric: &str,
        from: i64,
        to: i64,
        max_time: Duration,
    ) -> Result<(Vec<Vec<i64>>, Read), StoreError> {
        self.late_starts(sensors, metric, from, to, max_time).await
    }

    async fn stored(
        &self,
        sensors: &[String],
        metric: Option<&str>,
        from: i64,
        to: i64,
    ) -> Result<BucketStream, StoreError> {
        self.stored_buckets(sensors, metric, from, to).await
    }

    async fn delete_readings(
        &self,
        selection: &crate::store::delete::Selection,
        dry_run: bool,
    ) -> Result<crate::store::delete::Deleted, crate::store::delete::DeleteError> {
        MongoStore::delete_readings(self, selection, dry_run).await
    }

    async fn drop_deleted(
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

    async fn ping(&self) -> Result<(), StoreError> {
        self.db
            .run_command(doc! { "ping": 1 })
            .await
            .map(|_| ())
            .map_err(classify_read)
    }

    async fn sensors<F: FnMut(&SensorInfo) -> bool + Send>(
        &self,
        query: SensorQuery<'_>,
        limit: usize,
        keep: F,
    ) -> Result<Vec<SensorInfo>, StoreError> {
        self.list_sensors(query, limit, keep).await
    }

    fn registrations(&self) -> u64 {
        self.registrations.load(std::sync::atomic::Ordering::SeqCst)
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

    async fn dead_letters<F: FnMut(&str) -> bool + Send>(
        &self,
        limit: usize,
        keep: F,
    ) -> Result<(Vec<crate::store::DeadLetterInfo>, u64), StoreError> {
        self.list_dead_letters(limit, keep).await
    }

    async fn latest(
        &self,
        sensor: &str,
        metric: &str,
        since: Option<i64>,
        max_time: Duration,
    ) -> Result<Option<(i64, f64, Option<i64>)>, StoreError> {
        self.newest_value(sensor, metric, since, max_time).await
    }
}

/// A client made on the driver's own runtime, where its background tasks
/// then run (see `crate::runtime`), whatever runtime calls it.
fn client_on_driver_runtime(options: ClientOptions) -> mongodb::error::Result<Client> {
    let _driver = crate::runtime::driver().map(|rt| rt.enter());
    Client::with_options(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_s_background_tasks_run_on_the_driver_s_thread_not_the_caller_s() {
        // Nothing listens on port 1: the monitors keep trying, in tasks.
        let options = ClientOptions::builder()
            .hosts(vec![mongodb::options::ServerAddress::Tcp {
                host: "127.0.0.1".into(),
                port: Some(1),
            }])
            .build();
        let here = tokio::runtime::Handle::current().metrics();
        let before = here.num_alive_tasks();
        let client = client_on_driver_runtime(options).expect("a client");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            here.num_alive_tasks(),
            before,
            "driver tasks on the caller's runtime"
        );
        let driver = crate::runtime::driver().expect("the driver's runtime");
        assert!(
            driver.metrics().num_alive_tasks() > 0,
            "no driver tasks on its runtime"
        );
        drop(client);
    }

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

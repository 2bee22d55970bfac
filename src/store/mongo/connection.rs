//! [`MongoStore`]: the client, its collections and settings, connected and
//! probed at start, and the helpers every statement goes through (the
//! driver's CPU, the URI's write concern, the counters).

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{Bson, Document, RawDocumentBuf, doc};
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};
use secrecy::ExposeSecret;
use tracing::info;

use super::classify::{classify, unconfirmed};
use super::driver_cpu;
use super::give_way::Traffic;
use super::in_flight::InFlight;
use super::settings::{BlockCompressor, Settings, tls_options};
use super::shapes;
use super::tombstones::Deletes;
use crate::batcher::clock::Watermarks;
use crate::domain::Granularity;
use crate::store::StoreError;
use crate::store::command::Limits;
use crate::store::rollup::schedule::Upkeep;
use crate::telemetry::metrics::Metrics;

/// How long a pooled connection may sit unused before the driver closes it.
const IDLE_CONNECTIONS_CLOSED_AFTER: Duration = Duration::from_secs(60);

/// Documents a query's cursor asks for per batch: the server sends up to
/// 16 MiB at a time, rather than its default first batch of 101.
pub(super) const BATCH_DOCUMENTS: u32 = 100_000;

/// Documents an export's cursor asks for per batch: small enough that a
/// slow reader holds a few megabytes, not a 16 MiB batch.
pub(super) const EXPORT_BATCH_DOCUMENTS: u32 = 2_000;

/// New series to register, and whom to tell once they are.
pub type Registering = (Vec<(String, String)>, tokio::sync::oneshot::Sender<()>);

#[derive(Clone)]
pub struct MongoStore {
    pub(super) db: Database,
    pub(super) buckets: Collection<Document>,
    pub(super) dead_letters: Collection<Document>,
    pub(super) rollups: Collection<Document>,
    /// Late markers (see `store::rollup::late`).
    pub(super) late: Collection<Document>,
    pub(super) sensors: Collection<Document>,
    /// The metadata document (see `metadata`).
    pub(super) metadata: Collection<Document>,
    /// The change log (see `changes`).
    pub(super) changes: Collection<Document>,
    /// Flushes in a row whose rollup or registry step failed unclassed.
    pub(super) unclassed_after: Arc<AtomicU32>,
    /// Series the registry knows, and the newest hour it was told of.
    pub(super) known: Arc<Mutex<hashbrown::HashMap<(String, String), i64>>>,
    /// Registry writes of newer hours this instance has made (see
    /// [`crate::store::MongoStore::registrations`]).
    pub(super) registrations: Arc<std::sync::atomic::AtomicU64>,
    pub(super) granularity: Granularity,
    /// The relative accuracy of rollup slots' sketches (`buckets.sketch_accuracy`).
    pub(super) sketch_accuracy: f64,
    pub(super) limits: Limits,
    /// The URI's write concern, encoded once for every command.
    pub(super) write_concern: Option<RawDocumentBuf>,
    /// Open hours written, rolled up once they end (see `store::rollup::schedule`).
    pub(super) upkeep: Arc<Mutex<Upkeep>>,
    /// Seconds after an hour ends before the upkeep rolls it up anyway.
    pub(super) close_after: i64,
    /// Seconds without a late mark before a marked hour is rolled up.
    pub(super) late_after: i64,
    /// When this instance last marked hours late (epoch seconds): a lone
    /// instance polls the markers only while some of its own may be left.
    pub(super) last_mark: Arc<std::sync::atomic::AtomicI64>,
    /// This instance rolls up the hours marked late: no other running
    /// instance has a lower id (set with each read of the floors).
    pub(super) late_roller: Arc<std::sync::atomic::AtomicBool>,
    /// Hours written by flushes of this instance under way: not rolled up
    /// for quiet while one is (it would mark them again when it ends).
    pub(super) in_flight: Arc<InFlight>,
    /// Hours the batcher still holds buckets of (set once it runs): a marked
    /// hour is rolled up once none is owed, not after a quiet.
    pub(super) owed: Arc<std::sync::OnceLock<Arc<crate::batcher::OwedHours>>>,
    /// Measured paces of query reads and of the catch-up (see `pace`).
    pub(super) pace: Arc<super::pace::Pace>,
    /// Queries' reads, which the rollup upkeep gives way to (see `give_way`).
    pub(super) traffic: Arc<Traffic>,
    /// The queries' budget of reading time during a catch-up (see `share`).
    pub(super) share: Arc<super::share::Share>,
    /// The marked hours queries asked for, and the upkeep's step under way.
    pub(super) priority: Arc<super::rollup::priority::Priority>,
    pub(super) dead_letter_retention: Option<Duration>,
    /// How the collections this creates are compressed (`mongodb.block_compressor`).
    pub(super) block_compressor: BlockCompressor,
    pub(super) metrics: Option<Arc<Metrics>>,
    /// New series of accepted readings, to register ahead of storage.
    pub(super) registering: Option<tokio::sync::mpsc::Sender<Registering>>,
    /// What is unstored elsewhere: which values keep their version.
    pub(super) watermarks: Arc<Watermarks>,
    /// The deletes every write leaves out (see `store::delete`).
    pub(super) deletes: Arc<Deletes>,
    /// How reads of many series are sent to this server (see `shapes`).
    pub(super) read_shape: shapes::ReadShape,
    /// Series of each metric, as last counted: what a read by time would
    /// take beyond what it asks (see `shapes::TIME_FIRST_SPARE`).
    pub(super) series_counts:
        Arc<Mutex<std::collections::HashMap<String, (std::time::Instant, u64)>>>,
    /// This instance's id, once it has published its floor.
    pub(super) instance_id: Arc<std::sync::OnceLock<String>>,
}

impl std::fmt::Debug for MongoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoStore")
            .field("database", &self.db.name())
            .field("collection", &self.buckets.name())
            .finish_non_exhaustive()
    }
}

impl MongoStore {
    /// `call`, a driver call, with its CPU counted as the driver's (see
    /// `driver_cpu`).
    pub(super) fn driver<F: std::future::IntoFuture>(
        &self,
        call: F,
    ) -> driver_cpu::Timed<'_, F::IntoFuture> {
        driver_cpu::timed(call, self.metrics.as_deref().map(|m| &m.driver_cpu))
    }

    /// Runs `command`, which writes, with the URI's write concern (the driver
    /// adds it to its own write helpers only); `what` names it in errors. A
    /// write concern error is an outage.
    pub(super) async fn run_write(
        &self,
        command: Document,
        what: &str,
    ) -> Result<Document, StoreError> {
        let command = RawDocumentBuf::from_document(&command)
            .map_err(|e| StoreError::Poison(format!("{what} was not encoded: {e}")))?;
        self.run_raw_write(command, what).await
    }

    pub(super) async fn run_raw_write(
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
        // Long: the store's every part set up in one place, each field once.
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
            owed: Arc::default(),
            pace: Arc::default(),
            traffic: Arc::default(),
            priority: Arc::default(),
            share: Arc::default(),
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

    pub(super) fn count(&self, f: impl FnOnce(&Metrics)) {
        if let Some(m) = &self.metrics {
            f(m);
        }
    }

    pub(super) fn upkeep(&self) -> std::sync::MutexGuard<'_, Upkeep> {
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

pub(super) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 4))
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
}

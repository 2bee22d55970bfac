//! Wires the parts together: [`Application::build`] connects storage, opens
//! the journal and replays what it holds, and binds the listener;
//! [`Application::run_until_stopped`] serves until the shutdown future
//! resolves, then drains.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tracing::{error, info, warn};

use crate::api::{self, AppState};
use crate::auth::Authenticator;
use crate::batcher::driver::{self, BatcherHandle};
use crate::config::Settings;
use crate::ingest::line_protocol::LabelSync;
use crate::ingest::mqtt::{LineProtocol, MqttIngest, MqttStats};
use crate::journal::{Intake, Journal, JournalTask};
use crate::shutdown::Shutdown;
use crate::store::MongoStore;
use crate::store::floor;
use crate::telemetry::metrics::Metrics;

pub struct Application {
    listener: TcpListener,
    address: SocketAddr,
    settings: Arc<Settings>,
    batcher: BatcherHandle,
    driver: tokio::task::JoinHandle<driver::Drained>,
    journal: Option<(Journal, tokio::task::JoinHandle<JournalTask>)>,
    /// Who this instance is to the others (see `store::floor`).
    instance: floor::Instance,
    store: Arc<MongoStore>,
    mqtt_stats: Option<Arc<MqttStats>>,
    metrics: Arc<Metrics>,
    auth: Arc<Authenticator>,
    shutdown: Shutdown,
}

/// How long after the shutdown deadline a write still under way may take
/// before the process gives up on it: the deadline plus this is the longest
/// a shutdown lasts.
const DEADLINE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a stopping instance tries to leave its floor (see `store::floor`).
const FLOOR_FAREWELL: std::time::Duration = std::time::Duration::from_secs(10);

/// How often startup looks whether the replay is done.
const REPLAY_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Waits until what the journal held at start is back in memory (so queries
/// see it) and whatever of it was due is written, or storage turns out to be
/// unreachable (then the replay goes on in the background, as after any
/// outage).
/// Teaches the cardinality guard the registry's series, so a restart does
/// not count a fleet's series as new; until then it counts nothing.
/// Retried while storage is down.
async fn seed_guard(
    store: Arc<MongoStore>,
    guard: Arc<crate::cardinality::Shared>,
    shutdown: Shutdown,
) {
    use crate::store::{BucketStore, SensorQuery};
    let mut pause = std::time::Duration::from_secs(1);
    loop {
        let listed = store
            .sensors(SensorQuery::default(), usize::MAX, |info| {
                guard.know(
                    info.metrics
                        .iter()
                        .map(|m| (info.sensor.as_str(), m.as_str())),
                );
                false
            })
            .await;
        match listed {
            Ok(_) => {
                guard.seeded();
                info!(
                    "The cardinality guard knows the registry's series; new ones count from now."
                );
                return;
            }
            Err(e) => {
                warn!(error = %e, "Could not read the sensor registry for the cardinality guard; retrying. New series are not bounded meanwhile.");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shutdown.triggered() => return,
        }
        pause = (pause * 2).min(std::time::Duration::from_secs(60));
    }
}

async fn replay(journal: &Journal, batcher: &BatcherHandle) {
    let started = tokio::time::Instant::now();
    loop {
        if batcher.storage_outage() {
            warn!("Storage is unavailable; the journal replay goes on in the background.");
            return;
        }
        if journal.caught_up() && !batcher.has_due_now() {
            break;
        }
        tokio::time::sleep(REPLAY_POLL).await;
    }
    let ms = started.elapsed().as_millis() as u64;
    if ms > 100 {
        info!(elapsed_ms = ms, "Replayed the journal.");
    }
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        // Long: wires the service in dependency order (metrics, store, journal, batcher, listener); each step a few lines.
        let metrics = Arc::new(Metrics::new());
        // The runtime this runs on: `[runtime]`'s in the binary, a test's own.
        metrics
            .runtime_workers
            .set(tokio::runtime::Handle::current().metrics().num_workers() as i64);
        let mut store = MongoStore::connect(&settings.mongodb, &settings.buckets)
            .await
            .context("connecting to MongoDB")?
            .with_metrics(metrics.clone());
        store.create_collections().await.with_context(|| {
            format!(
                "creating the collections with mongodb.block_compressor = \"{}\" (set it to \"server\" if the server refuses it)",
                settings.mongodb.block_compressor.name()
            )
        })?;
        let format = store
            .check_format()
            .await
            .context("checking the database's format")?;
        store
            .ensure_indexes(&settings.retention())
            .await
            .context("creating the indexes (is MongoDB reachable at mongodb.uri?)")?;
        store
            .read_limits()
            .await
            .context("reading the storage server's limits")?;
        let shape = store
            .probe_read_shape()
            .await
            .context("measuring how the storage server reads many series")?;
        metrics
            .store_read_shape
            .with_label_values(&[shape.name()])
            .set(1);
        let registering = store.registrar_queue();
        let store = Arc::new(store);
        if format.rollups_outdated {
            tokio::spawn(rebuild_outdated_rollups(store.clone()));
        }
        let limits = settings.batcher.limits();
        let shutdown = Shutdown::new(settings.shutdown.timeout);
        let stopping = shutdown.clone();
        tokio::spawn(
            store
                .clone()
                .run_registrar(registering, async move { stopping.triggered().await }),
        );
        let auth = Arc::new(settings.auth.build().context("reading the auth settings")?);
        if !auth.enabled() {
            warn!(
                "AUTHENTICATION IS OFF: anyone who can reach the port can write and read. Set auth.enabled = true with auth.tokens for anything but local development."
            );
        }
        let (batcher, driver) = driver::new(
            settings.buckets.granularity,
            limits,
            store.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
        // The driver runs from here on: a replay writes through it.
        let driver = tokio::spawn(driver.run());
        let journal = if settings.journal.enabled {
            let target = format!(
                "{}/{} ({})",
                settings.mongodb.database,
                settings.mongodb.collection,
                settings.buckets.granularity.name()
            );
            let (journal, task) = Journal::open(
                &settings.journal,
                &target,
                batcher.clone(),
                metrics.clone(),
                store.watermarks(),
                shutdown.clone(),
            )?;
            let task = tokio::spawn(task.run());
            Some((journal, task))
        } else {
            None
        };
        // Published before the replay writes anything: until it is done,
        // every value any instance stores keeps its version.
        let instance = floor::Instance {
            id: journal.as_ref().map_or_else(
                || uuid::Uuid::new_v4().to_string(),
                |(j, _)| j.instance_id().to_owned(),
            ),
            durable: journal.is_some(),
        };
        floor::join(
            &instance,
            &store,
            &batcher,
            journal.as_ref().map(|(j, _)| j),
        )
        .await;
        if let Some((journal, _)) = &journal {
            replay(journal, &batcher).await;
        }
        let listener = TcpListener::bind(settings.http.listen)
            .await
            .with_context(|| format!("binding http.listen = {}", settings.http.listen))?;
        let address = listener.local_addr()?;
        let mqtt_stats = settings
            .mqtt
            .enabled
            .then(|| Arc::new(MqttStats::default()));
        Ok(Self {
            listener,
            address,
            settings: Arc::new(settings),
            batcher,
            driver,
            journal,
            instance,
            store,
            mqtt_stats,
            metrics,
            auth,
            shutdown,
        })
    }

    /// MQTT counters, when MQTT is enabled.
    pub fn mqtt_stats(&self) -> Option<Arc<MqttStats>> {
        self.mqtt_stats.clone()
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// Serves until `signal` resolves, then stops taking input, drains the
    /// batcher and returns, all within `shutdown.timeout` (plus a moment for a
    /// write still under way). Fails if accepted readings were not stored.
    pub async fn run_until_stopped(
        self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        // Long: starts the service's tasks in the order they depend on each other, then serves and stops.
        let Self {
            listener,
            address,
            settings,
            batcher,
            driver: driver_task,
            journal,
            instance,
            store,
            mqtt_stats,
            metrics,
            auth,
            shutdown,
        } = self;
        let guard = Arc::new(crate::cardinality::Shared::new(
            settings.cardinality.clone(),
            metrics.new_series.clone(),
            metrics.new_series_refused.clone(),
            metrics.new_series_guard_seeded.clone(),
        ));
        if guard.enabled() {
            tokio::spawn(seed_guard(store.clone(), guard.clone(), shutdown.clone()));
        }
        let intake = Intake::new(
            batcher.clone(),
            journal.as_ref().map(|(j, _)| j.clone()),
            Some(store.clone() as Arc<dyn crate::journal::Registrar>),
            Some(guard),
        );
        // This instance's floor is published until everything is drained.
        let (end_floor, floor_ends) = tokio::sync::oneshot::channel::<()>();
        let floor_task = tokio::spawn(floor::run(
            instance,
            store.clone(),
            batcher.clone(),
            journal.as_ref().map(|(j, _)| j.clone()),
            async move {
                let _ = floor_ends.await;
            },
        ));
        let (labels, label_writer) = LabelSync::new();
        tokio::spawn(label_writer.run(store.clone(), shutdown.clone()));
        // The rollup upkeep runs until the batcher has drained, then rolls
        // up what has ended.
        let (end_upkeep, upkeep_ends) = tokio::sync::oneshot::channel::<()>();
        let upkeep = tokio::spawn(store.clone().run_upkeep(async move {
            let _ = upkeep_ends.await;
        }));
        let mqtt = start_mqtt(
            &settings,
            mqtt_stats.clone(),
            LineProtocol {
                settings: settings.line_protocol.clone(),
                labels: labels.clone(),
            },
            intake.clone(),
            &store,
            (&metrics, &shutdown),
        )?;

        let state = app_state(
            &settings,
            labels,
            store,
            batcher.clone(),
            intake,
            metrics,
            mqtt_stats,
            auth,
        );
        tokio::spawn(api::query::count_silent(state.clone(), shutdown.clone()));
        let app = api::router(state);
        info!(%address, granularity = ?settings.buckets.granularity, "Hourglass is listening.");

        serve_until(signal, listener, app, &settings, &shutdown).await?;
        stop(Stopping {
            shutdown,
            batcher,
            driver: driver_task,
            upkeep: (end_upkeep, upkeep),
            floor: (end_floor, floor_task),
            mqtt,
            journal,
        })
        .await
    }
}

/// MQTT ingestion, when it is on.
fn start_mqtt(
    settings: &Settings,
    stats: Option<Arc<MqttStats>>,
    line_protocol: LineProtocol,
    intake: Intake,
    store: &Arc<MongoStore>,
    (metrics, shutdown): (&Arc<Metrics>, &Shutdown),
) -> anyhow::Result<Option<MqttIngest>> {
    let Some(stats) = stats else {
        return Ok(None);
    };
    let mqtt = MqttIngest::start(
        &settings.mqtt,
        &settings.ingest,
        line_protocol,
        intake,
        Some(Arc::new(StoredBirths::new(store.clone()))),
        stats,
        metrics.clone(),
        shutdown.clone(),
    )
    .context("starting MQTT ingestion")?;
    info!(
        url = %settings.mqtt.url,
        client_id = %settings.mqtt.client_id,
        dead_letters = settings.mqtt.dead_letters().unwrap_or("none (mqtt.dead_letter_topic is empty)"),
        "Consuming MQTT; unusable messages are republished on the dead-letter topic."
    );
    Ok(Some(mqtt))
}

/// What every handler shares.
// Each argument is a part the state holds; a struct of them would only
// rename the list.
#[allow(clippy::too_many_arguments)]
fn app_state(
    settings: &Settings,
    labels: Arc<LabelSync>,
    store: Arc<MongoStore>,
    batcher: BatcherHandle,
    intake: Intake,
    metrics: Arc<Metrics>,
    mqtt_stats: Option<Arc<MqttStats>>,
    auth: Arc<Authenticator>,
) -> AppState<MongoStore> {
    AppState {
        labels,
        store,
        batcher,
        intake,
        settings: Arc::new(api::Config {
            http: settings.http.clone(),
            ingest: settings.ingest.clone(),
            line_protocol: settings.line_protocol.clone(),
            query: settings.query.clone(),
            granularity: settings.buckets.granularity,
            max_buffered_readings: settings.batcher.max_buffered_readings,
            retention: settings.retention(),
        }),
        metrics,
        mqtt: mqtt_stats,
        auth,
        query_permits: Arc::new(tokio::sync::Semaphore::new(settings.query.max_concurrency)),
        cache: Arc::new(crate::query::cache::ResultCache::new(
            settings.query.cache_bytes,
        )),
        ping: Arc::default(),
    }
}

/// Serves HTTP until `signal` (or a failure) triggers the shutdown, and
/// requests still in progress at its deadline are cut off.
async fn serve_until(
    signal: impl Future<Output = ()> + Send + 'static,
    listener: TcpListener,
    app: axum::Router,
    settings: &Settings,
    shutdown: &Shutdown,
) -> anyhow::Result<()> {
    // One trigger for every stage: HTTP stops accepting, the batcher
    // refuses input and drains, MQTT stops reading; one deadline for all.
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = signal => {
                info!("Shutting down: no new input; storing what was accepted.");
                trigger.trigger();
            }
            _ = trigger.triggered() => {}
        }
    });
    let stopping = shutdown.clone();
    // On a worker: the binary awaits this function on its main thread,
    // and the accept loop (and every wake of it) would run there, one
    // more thread woken beside the workers.
    let http = settings.http.clone();
    let mut serve = tokio::spawn(async move {
        api::serve(
            listener,
            app,
            &http,
            async move { stopping.triggered().await },
        )
        .await;
    });
    tokio::select! {
        served = &mut serve => served.context("the HTTP server panicked")?,
        // In-flight requests (a stuck upload, say) get until the deadline.
        _ = shutdown.deadline_passed() => {
            serve.abort();
            warn!("HTTP requests still in progress at the shutdown deadline were cut off.");
        }
    }
    Ok(())
}

/// What is left to stop once HTTP is done.
struct Stopping {
    shutdown: Shutdown,
    batcher: BatcherHandle,
    driver: tokio::task::JoinHandle<driver::Drained>,
    upkeep: (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    floor: (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    mqtt: Option<MqttIngest>,
    journal: Option<(Journal, tokio::task::JoinHandle<JournalTask>)>,
}

/// The batcher drained, the upkeep's last roll-up, MQTT's outstanding
/// acknowledgements, the floor's farewell and the journal's last commit,
/// all within the shutdown's deadline. Fails if accepted readings were not
/// stored.
async fn stop(stopping: Stopping) -> anyhow::Result<()> {
    let Stopping {
        shutdown,
        batcher,
        driver,
        upkeep,
        floor,
        mqtt,
        journal,
    } = stopping;
    // Serving can end without a signal only by failing; either way, stop.
    shutdown.trigger();
    let grace = async {
        shutdown.deadline_passed().await;
        tokio::time::sleep(DEADLINE_GRACE).await;
    };
    let unstored = tokio::select! {
        drained = driver => drained.context("the batcher driver panicked")?.unstored_readings,
        // A write still under way at the deadline: what it holds counts as unstored.
        _ = grace => batcher.buffered(),
    };
    let (end_upkeep, upkeep) = upkeep;
    let (end_floor, mut floor_task) = floor;
    let _ = end_upkeep.send(());
    let _ = end_floor.send(());
    tokio::select! {
        _ = upkeep => {}
        _ = shutdown.deadline_passed() => {
            info!("The rollup upkeep was still running at the shutdown deadline; queries read the buckets of what it did not roll up.");
        }
    }
    if let Some(mqtt) = mqtt {
        // Everything stored has its acknowledgement sent before we disconnect.
        mqtt.finish().await;
    }
    // Its last write says whether this instance still owes readings;
    // bounded, since the database may be gone. Cut short, the floor it
    // published last stays: never later than what it owes.
    let left = tokio::select! {
        done = tokio::time::timeout(FLOOR_FAREWELL, &mut floor_task) => done.is_ok(),
        _ = async {
            shutdown.deadline_passed().await;
            tokio::time::sleep(DEADLINE_GRACE).await;
        } => false,
    };
    if !left {
        floor_task.abort();
        warn!(
            "Could not update this instance's floor on the way out; the last one published stands."
        );
    }
    if let Some((_, task)) = journal {
        // Appends already queued are committed; stored segments deleted.
        match task.await {
            Ok(task) => task.finish().await,
            Err(e) => {
                error!(error = %e, "The journal task failed; the next start replays what it holds.")
            }
        }
    }
    if unstored > 0 {
        error!(
            readings = unstored,
            "Stopped with accepted readings that were not stored."
        );
        anyhow::bail!("{unstored} accepted readings were not stored");
    }
    info!("Hourglass stopped; every accepted reading was stored.");
    Ok(())
}

/// `sensor` as the operator commands take it: an id, or a prefix ending in
/// `*` (all sensors when absent). Answers the prefix and whether it is exact.
fn sensor_selection(sensor: Option<&str>) -> (&str, bool) {
    let sensor = sensor.unwrap_or("*");
    match sensor.strip_suffix('*') {
        Some(prefix) => (prefix, false),
        None => (sensor, true),
    }
}

/// The store for an operator command: connected, the database's format
/// checked, the server's limits read.
async fn operator_store(settings: &Settings) -> anyhow::Result<MongoStore> {
    let mut store = MongoStore::connect(&settings.mongodb, &settings.buckets)
        .await
        .context("connecting to MongoDB")?;
    store
        .check_format()
        .await
        .context("checking the database's format")?;
    store
        .read_limits()
        .await
        .context("reading the storage server's limits")?;
    Ok(store)
}

/// `hourglass instances`: every instance recorded on this database, as it
/// last published its floor.
pub async fn instances(settings: &Settings) -> anyhow::Result<Vec<crate::store::InstanceInfo>> {
    operator_store(settings)
        .await?
        .instances()
        .await
        .context("reading the instances' floors")
}

/// `hourglass instances --forget ID`: removes the record of an instance
/// that is gone for good (its journal lost), so that versions are pruned
/// again. Refuses one that published within the last 30 s.
pub async fn forget_instance(settings: &Settings, id: &str) -> anyhow::Result<()> {
    operator_store(settings)
        .await?
        .forget_stopped_instance(id, crate::batcher::clock::unix_ms())
        .await
        .with_context(|| format!("forgetting instance {id:?}"))
}

/// `hourglass redrive`: writes the dead letters of `sensor` (an id, or a
/// prefix ending in `*`; all when absent) into their buckets and deletes
/// them, or (`dry_run`) counts them.
pub async fn redrive(
    settings: &Settings,
    sensor: Option<&str>,
    dry_run: bool,
) -> anyhow::Result<crate::store::Redriven> {
    let (prefix, exact) = sensor_selection(sensor);
    operator_store(settings)
        .await?
        .redrive(prefix, exact, dry_run)
        .await
        .context("re-driving the dead letters")
}

/// `hourglass rebuild-rollups`: recomputes the rollups and registry entries
/// of the buckets in `[from, to)` (epoch seconds; all when not given) for
/// sensor `sensor` or, ending in `*`, the sensors with that id prefix. The
/// migration for data written before rollups, and the repair after a rollup
/// could not be written.
pub async fn rebuild_rollups(
    settings: &Settings,
    sensor: Option<&str>,
    from: Option<i64>,
    to: Option<i64>,
) -> anyhow::Result<i64> {
    let (prefix, exact) = sensor_selection(sensor);
    let store = operator_store(settings).await?;
    store
        .ensure_indexes(&settings.retention())
        .await
        .context("creating the indexes (is MongoDB reachable at mongodb.uri?)")?;
    let days = store
        .rebuild_rollups(prefix, exact, from, to, jiff::Timestamp::now().as_second())
        .await
        .context("rebuilding the rollups")?;
    // All of them: now of this version's layout.
    if sensor.is_none() && from.is_none() && to.is_none() {
        store
            .raise_rollup_version()
            .await
            .context("recording the rollups' layout")?;
    }
    Ok(days)
}

/// Rollups of an older layout (after an upgrade), rebuilt in the background
/// by the upkeep's own roll-up: meanwhile queries read below them, exact and
/// slower. Safe beside writes and beside another instance doing the same.
async fn rebuild_outdated_rollups(store: Arc<MongoStore>) {
    info!(
        "The rollups are of an older layout: rebuilding them in the background. Queries stay exact meanwhile, reading the buckets."
    );
    let now = jiff::Timestamp::now().as_second();
    match store.rebuild_rollups("", false, None, None, now).await {
        Ok(days) => match store.raise_rollup_version().await {
            Ok(()) => info!(days, "Rebuilt the rollups of an older layout."),
            Err(e) => warn!(error = %e,
                "Rebuilt the rollups but could not record it; the next start rebuilds them again."),
        },
        Err(e) => warn!(error = %e,
            "Rebuilding the rollups of an older layout failed; queries stay exact but read the buckets until `hourglass rebuild-rollups` runs or the service starts again."),
    }
}

/// Sparkplug birth certificates, kept in the metadata collection by one
/// writer task (so a node's births are written in the order they came).
struct StoredBirths {
    store: Arc<MongoStore>,
    queue: tokio::sync::mpsc::Sender<crate::ingest::sparkplug::Birth>,
}

impl StoredBirths {
    fn new(store: Arc<MongoStore>) -> Self {
        let (queue, mut births) =
            tokio::sync::mpsc::channel::<crate::ingest::sparkplug::Birth>(1024);
        let writer = store.clone();
        tokio::spawn(async move {
            while let Some(birth) = births.recv().await {
                if let Err(e) = writer.put_metadata(&birth.id(), &birth).await {
                    tracing::warn!(id = birth.id(), error = %e,
                        "Could not keep a Sparkplug birth certificate; after a restart its node is asked to rebirth.");
                }
            }
        });
        Self { store, queue }
    }
}

impl crate::ingest::sparkplug::BirthBook for StoredBirths {
    fn save(&self, birth: crate::ingest::sparkplug::Birth) {
        if self.queue.try_send(birth).is_err() {
            tracing::warn!("Sparkplug births arrive faster than they are kept; one was not kept.");
        }
    }

    fn load(
        &self,
    ) -> futures_util::future::BoxFuture<'_, Result<Vec<crate::ingest::sparkplug::Birth>, String>>
    {
        Box::pin(async move {
            self.store
                .metadata_under(crate::ingest::sparkplug::BIRTH_PREFIX)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

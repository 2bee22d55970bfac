//! [`Application`]: built (storage connected, the journal replayed, the
//! listener bound), then serving until its shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tracing::{info, warn};

use super::births::StoredBirths;
use super::stop::{Stopping, stop};
use crate::api::{self, AppState};
use crate::auth::Keyring;
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
    auth: Arc<Keyring>,
    /// What reloads the tokens beyond their file (`startup::tokens`).
    reload: Option<super::tokens::Reload>,
    shutdown: Shutdown,
}

/// How often startup looks whether the replay is done.
const REPLAY_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Teaches the cardinality guard the registry's series, so a restart does
/// not count a fleet's series as new; until then it counts nothing.
/// Retried while storage is down.
async fn seed_guard(
    store: Arc<MongoStore>,
    guard: Arc<crate::cardinality::Shared>,
    shutdown: Shutdown,
) {
    use crate::store::SensorQuery;
    let mut pause = std::time::Duration::from_secs(1);
    loop {
        let listed = store
            .sensors(SensorQuery::default(), usize::MAX, |info| {
                guard.know(
                    info.metrics
                        .iter()
                        .map(String::as_str)
                        .chain([crate::cardinality::SENSOR_ENTRY])
                        .map(|m| (info.sensor.as_str(), m)),
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

/// Waits until what the journal held at start is back in memory (so queries
/// see it) and whatever of it was due is written, or storage turns out to be
/// unreachable (then the replay goes on in the background, as after any
/// outage).
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
        let auth = Arc::new(Keyring::new(
            settings.auth.build().context("reading the auth settings")?,
        ));
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
        // With the journal the batcher holds a whole backlog: what it owes
        // is what is still to come. Without it, a client's next request is
        // the next write, and a marked hour waits for a quiet.
        if settings.journal.enabled {
            store.owe_to(batcher.owed_hours());
        }
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
            reload: None,
            shutdown,
        })
    }

    /// Re-reads `file`'s `[auth]` for the tokens on each of `hangups` (the
    /// binary's configuration and its SIGHUP stream).
    pub fn reloading_tokens_from(
        mut self,
        file: std::path::PathBuf,
        hangups: tokio::signal::unix::Signal,
    ) -> Self {
        self.reload = Some(super::tokens::Reload {
            config: file,
            hangups,
        });
        self
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
            reload,
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
        tokio::spawn(super::tokens::run(
            auth.clone(),
            settings.auth.clone(),
            reload,
            metrics.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(super::losses::report(
            store.clone(),
            settings.journal.dir.clone(),
            metrics.clone(),
            shutdown.clone(),
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

        let losses = (store.clone(), settings.journal.dir.clone());
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
            losses,
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
        Some(Arc::new(StoredBirths::new(
            store.clone(),
            settings.mqtt.sparkplug.max_state_bytes,
        ))),
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
    auth: Arc<Keyring>,
) -> AppState {
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
        query_memory: crate::query::promql::MemoryPool::new(settings.query.max_memory),
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

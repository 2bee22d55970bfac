//! Wires the parts together: [`Application::build`] connects storage, binds the
//! listener and starts nothing yet; [`Application::run_until_stopped`] serves
//! until the shutdown future resolves, then drains.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api::{self, AppState};
use crate::auth::Authenticator;
use crate::batcher::BatcherLimits;
use crate::batcher::driver::{self, BatcherHandle, Driver};
use crate::config::Settings;
use crate::ingest::mqtt::{MqttIngest, MqttStats};
use crate::store::MongoStore;
use crate::telemetry::metrics::Metrics;

pub struct Application {
    listener: TcpListener,
    address: SocketAddr,
    settings: Arc<Settings>,
    batcher: BatcherHandle,
    driver: Driver<MongoStore>,
    store: Arc<MongoStore>,
    mqtt_stats: Option<Arc<MqttStats>>,
    metrics: Arc<Metrics>,
    auth: Arc<Authenticator>,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let store = MongoStore::connect(&settings.mongodb, settings.buckets.granularity)
            .await
            .context("connecting to MongoDB")?;
        store
            .ensure_indexes(settings.buckets.retention)
            .await
            .context("creating the bucket index (is MongoDB reachable at mongodb.uri?)")?;
        let store = Arc::new(store);
        let limits = BatcherLimits {
            flush_interval: settings.batcher.flush_interval,
            max_pending_readings: settings.batcher.max_pending_readings,
            max_buffered_readings: settings.batcher.max_buffered_readings,
            max_buckets: settings.batcher.max_buckets,
        };
        let auth = Arc::new(settings.auth.build().context("reading the auth settings")?);
        if !auth.enabled() {
            warn!(
                "AUTHENTICATION IS OFF: anyone who can reach the port can write and read. Set auth.enabled = true with auth.tokens for anything but local development."
            );
        }
        let metrics = Arc::new(Metrics::new());
        let (batcher, driver) = driver::new(
            settings.buckets.granularity,
            limits,
            store.clone(),
            metrics.clone(),
        );
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
            store,
            mqtt_stats,
            metrics,
            auth,
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

    /// Serves until `shutdown` resolves, then stops taking input, drains the
    /// batcher and returns. Fails if accepted readings could not be stored.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Self {
            listener,
            address,
            settings,
            batcher,
            driver,
            store,
            mqtt_stats,
            metrics,
            auth,
        } = self;
        let stop = CancellationToken::new();
        let abort = CancellationToken::new();
        let driver_task = tokio::spawn(driver.run(stop.clone(), abort.clone()));
        let mqtt = if let Some(stats) = mqtt_stats.clone() {
            let mqtt = MqttIngest::start(
                &settings.mqtt,
                &settings.ingest,
                batcher.clone(),
                stats,
                metrics.clone(),
            )
            .context("starting MQTT ingestion")?;
            info!(url = %settings.mqtt.url, client_id = %settings.mqtt.client_id, "Consuming MQTT.");
            Some(mqtt)
        } else {
            None
        };
        let mqtt_stop = mqtt.as_ref().map(|m| m.stop_handle());

        let state = AppState {
            store,
            batcher: batcher.clone(),
            settings: settings.clone(),
            metrics,
            mqtt: mqtt_stats,
            auth,
        };
        let app = api::router(state);
        info!(%address, granularity = ?settings.buckets.granularity, "Hourglass is listening.");

        let timeout = settings.shutdown.timeout;
        let closing = batcher.clone();
        let abort_at_deadline = abort.clone();
        let signalled = async move {
            shutdown.await;
            info!("Shutting down: no new input; flushing what was accepted.");
            closing.close();
            if let Some(stop) = mqtt_stop {
                stop.cancel();
            }
            // From here on everything must finish within shutdown.timeout.
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                abort_at_deadline.cancel();
            });
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(signalled)
            .await
            .context("serving HTTP")?;
        batcher.close();
        stop.cancel();
        let drained = driver_task.await.context("the batcher driver panicked")?;
        if let Some(mqtt) = mqtt {
            // Everything stored has its acknowledgement sent before we disconnect.
            mqtt.finish(timeout).await;
        }
        if drained.unstored_readings > 0 {
            error!(
                readings = drained.unstored_readings,
                "Stopped with accepted readings that were not stored."
            );
            anyhow::bail!(
                "{} accepted readings were not stored",
                drained.unstored_readings
            );
        }
        info!("Hourglass stopped; every accepted reading was stored.");
        Ok(())
    }
}

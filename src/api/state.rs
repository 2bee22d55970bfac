//! What every handler shares: the HTTP surface's view of the
//! configuration and the state cloned into each request.

use std::sync::Arc;

use super::{Settings, health};
use crate::auth::Keyring;
use crate::batcher::driver::BatcherHandle;
use crate::domain::Granularity;
use crate::ingest::line_protocol::LabelSync;
use crate::ingest::mqtt::MqttStats;
use crate::journal::Intake;
use crate::store::MongoStore;
use crate::telemetry::metrics::Metrics;

/// What the HTTP surface needs of the configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub http: Settings,
    pub ingest: crate::ingest::Settings,
    pub line_protocol: crate::ingest::line_protocol::Settings,
    pub query: crate::query::Settings,
    pub granularity: Granularity,
    /// Readiness reports overload near this bound.
    pub max_buffered_readings: usize,
    /// How long each level is kept: older ranges are answered coarser.
    pub retention: crate::store::Retention,
}

/// What every handler shares. Cheap to clone.
pub struct AppState {
    pub store: Arc<MongoStore>,
    pub batcher: BatcherHandle,
    /// Where writes go: the journal, or the batcher when it is off.
    pub intake: Intake,
    pub settings: Arc<Config>,
    pub metrics: Arc<Metrics>,
    /// Present when MQTT is enabled.
    pub mqtt: Option<Arc<MqttStats>>,
    pub auth: Arc<Keyring>,
    /// Queries running at once (`query.max_concurrency`), apart from ingest.
    pub query_permits: Arc<tokio::sync::Semaphore>,
    /// Line-protocol tags on their way to the sensor registry.
    pub labels: Arc<LabelSync>,
    /// The results cache of closed periods (`query.cache_bytes`).
    pub cache: Arc<crate::query::cache::ResultCache>,
    /// The last storage ping readiness made (see [`health::PingCache`]).
    pub ping: Arc<health::PingCache>,
    /// What every query together may hold (`query.max_memory`).
    pub query_memory: Arc<crate::query::promql::MemoryPool>,
}

impl Clone for AppState {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            batcher: self.batcher.clone(),
            intake: self.intake.clone(),
            settings: self.settings.clone(),
            metrics: self.metrics.clone(),
            mqtt: self.mqtt.clone(),
            auth: self.auth.clone(),
            query_permits: self.query_permits.clone(),
            labels: self.labels.clone(),
            cache: self.cache.clone(),
            ping: self.ping.clone(),
            query_memory: self.query_memory.clone(),
        }
    }
}

//! `GET /health/live`, `GET /health/ready` and `GET /metrics`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Serialize;

use super::AppState;
use crate::store::MongoStore;

/// How long readiness waits for the storage server to answer a ping.
pub const STORAGE_PING_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one storage ping answers readiness: probes from every load
/// balancer and orchestrator, however many, cost at most one ping a second.
pub const STORAGE_PING_REUSE: Duration = Duration::from_secs(1);

/// The last ping's time and outcome. A mutex held across the ping: probes
/// arriving while it runs wait for its answer instead of pinging too.
#[derive(Debug, Default)]
pub struct PingCache(tokio::sync::Mutex<Option<(Instant, Result<(), PingFailure>)>>);

#[derive(Debug, Clone, Copy)]
enum PingFailure {
    Unreachable,
    Slow,
}

impl PingCache {
    async fn ping(&self, store: &MongoStore) -> Result<(), PingFailure> {
        let mut last = self.0.lock().await;
        if let Some((at, outcome)) = *last
            && at.elapsed() < STORAGE_PING_REUSE
        {
            return outcome;
        }
        let outcome = match tokio::time::timeout(STORAGE_PING_TIMEOUT, store.ping()).await {
            Ok(Ok(())) => Ok(()),
            // The cause goes to the log, not to whoever asks.
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "Readiness: storage did not answer a ping.");
                Err(PingFailure::Unreachable)
            }
            Err(_) => Err(PingFailure::Slow),
        };
        *last = Some((Instant::now(), outcome));
        outcome
    }
}

/// Above this share of `batcher.max_buffered_readings` the service is overloaded.
pub const OVERLOAD_SHARE: f64 = 0.9;

/// One readiness check.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Check {
    pub ok: bool,
    /// Why it fails; absent when it passes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Check {
    fn pass() -> Self {
        Self {
            ok: true,
            reason: None,
        }
    }

    fn fail(reason: impl Into<String>) -> Self {
        Self {
            ok: false,
            reason: Some(reason.into()),
        }
    }
}

/// `GET /health/ready`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Readiness {
    pub ready: bool,
    pub checks: Checks,
}

/// Each readiness check.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Checks {
    /// The storage server answers a ping within 2 s and writes are not
    /// failing for an outage (with the journal on, reported only).
    pub storage: Check,
    /// Connected and subscribed; absent when MQTT is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mqtt: Option<Check>,
    /// Under 90 % of `batcher.max_buffered_readings` (always passes with
    /// the journal on).
    pub capacity: Check,
    /// The journal is not full; absent when it is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal: Option<Check>,
    /// Not shutting down.
    pub running: Check,
}

/// Liveness: 200 while the process runs.
#[utoipa::path(get, path = "/health/live",
    responses((status = 200, body = Object, description = "The process runs: `{\"live\": true}`")))]
pub async fn live() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "live": true }))
}

/// Readiness: 200 when storage, MQTT, capacity and the journal allow input; 503 naming the failing checks.
#[utoipa::path(get, path = "/health/ready",
    responses((status = 200, body = Readiness, description = "Ready: every check passes"),
        (status = 503, body = Readiness, description = "Not ready: the failing checks say why (no `Retry-After`)")))]
pub async fn ready(State(state): State<AppState>) -> impl IntoResponse {
    let storage = match state.ping.ping(state.store.as_ref()).await {
        // The server answers pings but refuses writes (authorization, a
        // stepdown, a write concern it cannot satisfy): still an outage.
        Ok(()) if state.batcher.storage_outage() => {
            Check::fail("storage refuses writes for now; retrying")
        }
        Ok(()) => Check::pass(),
        Err(PingFailure::Unreachable) => Check::fail("storage is unreachable"),
        Err(PingFailure::Slow) => Check::fail("storage did not answer in time"),
    };
    let mqtt = state.mqtt.as_ref().map(|stats| {
        if !stats.connected.load(Ordering::Acquire) {
            Check::fail("not connected to the broker")
        } else if stats.is_silent() {
            Check::fail("no word from the broker for two keep-alive periods; reconnecting")
        } else if !stats.subscribed.load(Ordering::Acquire) {
            Check::fail("connected, not yet subscribed")
        } else {
            Check::pass()
        }
    });
    let limit = state.settings.max_buffered_readings;
    let buffered = state.batcher.buffered();
    let journal = state.intake.journal();
    // With the journal, memory at its bound only means buckets are written
    // early, and a storage outage only means the journal grows: neither stops
    // input. A full journal does.
    let capacity = if journal.is_some() || (buffered as f64) < limit as f64 * OVERLOAD_SHARE {
        Check::pass()
    } else {
        Check::fail(format!("holding {buffered} of at most {limit} readings"))
    };
    let journal = journal.map(|j| {
        if j.is_full() {
            Check::fail(format!(
                "the journal is full ({} bytes); input is refused until storage catches up",
                j.bytes()
            ))
        } else {
            Check::pass()
        }
    });
    let running = if state.batcher.is_closed() {
        Check::fail("shutting down")
    } else {
        Check::pass()
    };
    let storage_needed = journal.is_none();
    let ready = (storage.ok || !storage_needed)
        && mqtt.as_ref().is_none_or(|c| c.ok)
        && capacity.ok
        && journal.as_ref().is_none_or(|c| c.ok)
        && running.ok;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Readiness {
            ready,
            checks: Checks {
                storage,
                mqtt,
                capacity,
                journal,
                running,
            },
        }),
    )
}

/// The service's metrics in Prometheus text format.
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, body = String, content_type = "text/plain", description = "Prometheus text format, version 0.0.4")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let m = &state.metrics;
    m.pending_readings.set(state.batcher.buffered() as i64);
    if let Some(journal) = state.intake.journal() {
        let behind = journal.behind_for().unwrap_or_default();
        let held = state.batcher.oldest_held_age().unwrap_or_default();
        m.journal_behind_seconds.set(behind.as_secs() as i64);
        m.journal_oldest_unstored_seconds
            .set(behind.max(held).as_secs() as i64);
    }
    let cache = state.cache.stats();
    m.query_cache_hits
        .inc_by(cache.hits.saturating_sub(m.query_cache_hits.get()));
    m.query_cache_misses
        .inc_by(cache.misses.saturating_sub(m.query_cache_misses.get()));
    m.query_cache_bytes.set(cache.bytes as i64);
    m.query_memory_bytes
        .set(i64::try_from(state.query_memory.used()).unwrap_or(i64::MAX));
    if let Some(stats) = &state.mqtt {
        m.mqtt_connected.set(i64::from(stats.is_up()));
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        m.render(),
    )
}

//! What every query route shares around the reading: admission under
//! `query.max_concurrency`, the deadline (`query.timeout`, passed on as
//! `maxTimeMS`), storage errors as answers, and the cost recorded.

use std::time::Duration;

use axum::http::StatusCode;
use tokio::time::Instant;
use tracing::warn;

use crate::api::{ApiError, AppState};
use crate::query::Cost;
use crate::store::StoreError;

pub(crate) fn store_error(e: StoreError) -> ApiError {
    warn!(error = %e, "A query could not read its documents.");
    match e {
        StoreError::Outage(_) | StoreError::Unclassed(_) => {
            ApiError::unavailable("storage is unavailable; retry later")
        }
        StoreError::Timeout(_) => timed_out(),
        StoreError::CatchingUp(seconds) => catching_up(seconds),
        StoreError::Poison(_) | StoreError::Unreadable(_) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the query failed")
        }
    }
}

/// Hours of the range are being rolled up again (after a backfill or late
/// writes), and reading their buckets instead would outlast the query.
pub(crate) fn catching_up(seconds: u64) -> ApiError {
    ApiError::unavailable_for(
        format!(
            "hours of this range were written late (a backfill) and are being rolled up; reading them before then would take longer than query.timeout: retry in about {seconds} s"
        ),
        seconds,
    )
}

pub(crate) fn timed_out() -> ApiError {
    ApiError::unavailable(
        "the query took longer than query.timeout; ask for a shorter range, fewer points or fewer sensors",
    )
}

/// A query let in under the query concurrency limit, with its deadline
/// (`query.timeout`, counted from arrival).
pub(crate) struct Admitted<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    started: Instant,
    pub(crate) deadline: Instant,
}

pub(crate) async fn admit(state: &AppState) -> Result<Admitted<'_>, ApiError> {
    let started = Instant::now();
    let deadline = started + state.settings.query.timeout;
    let permit = tokio::time::timeout_at(deadline, state.query_permits.acquire())
        .await
        .map_err(|_| {
            ApiError::unavailable(
                "too many queries are running; retry later (query.max_concurrency)",
            )
        })?
        .map_err(|_| ApiError::unavailable("the service is stopping"))?;
    Ok(Admitted {
        _permit: permit,
        started,
        deadline,
    })
}

impl Admitted<'_> {
    /// A deadline nearer than `query.timeout` (a client's own timeout).
    pub(crate) fn shorten(&mut self, timeout: Duration) {
        self.deadline = self.deadline.min(self.started + timeout);
    }

    /// What is left for the server (`maxTimeMS`), so it gives up no later
    /// than the route does.
    pub(crate) fn max_time(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    pub(crate) async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        tokio::time::timeout_at(self.deadline, work)
            .await
            .map_err(|_| timed_out())?
    }

    /// Records the query's latency, the documents it read and its round trips.
    pub(crate) fn done(self, state: &AppState, endpoint: &str, cost: Cost) {
        let m = &state.metrics;
        m.query_duration
            .with_label_values(&[endpoint])
            .observe(self.started.elapsed().as_secs_f64());
        m.query_documents
            .with_label_values(&[endpoint])
            .observe(cost.documents as f64);
        m.query_round_trips
            .with_label_values(&[endpoint])
            .observe(cost.round_trips as f64);
    }
}

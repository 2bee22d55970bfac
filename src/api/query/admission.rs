//! What every query route shares around the reading: admission under
//! `query.max_concurrency`, the deadline (`query.timeout`, passed on as
//! `maxTimeMS`), storage errors as answers, the cost recorded, and the one
//! evaluation of series folded into groups.

use std::time::Duration;

use axum::http::StatusCode;
use tokio::time::Instant;
use tracing::warn;

use super::range::Range;
use crate::api::{ApiError, AppState};
use crate::domain::{Agg, MetricName, Sketch};
use crate::query::{Cost, Grid, Need, Question, Series};
use crate::store::{BucketStore, StoreError};

pub(crate) fn store_error(e: StoreError) -> ApiError {
    warn!(error = %e, "A query could not read its documents.");
    match e {
        StoreError::Outage(_) | StoreError::Unclassed(_) => {
            ApiError::unavailable("storage is unavailable; retry later")
        }
        StoreError::Timeout(_) => timed_out(),
        StoreError::Poison(_) | StoreError::Unreadable(_) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the query failed")
        }
    }
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

pub(crate) async fn admit<S>(state: &AppState<S>) -> Result<Admitted<'_>, ApiError> {
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
    pub(crate) fn done<S>(self, state: &AppState<S>, endpoint: &str, cost: Cost) {
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

/// Each group's points: every member series answered, folded into its
/// group's points as its batch finishes.
pub(crate) async fn evaluate<S: BucketStore>(
    state: &AppState<S>,
    endpoint: &str,
    metric: &MetricName<'_>,
    r: &Range,
    grid: Grid,
    series: &[(Series<'_>, usize)],
    groups: usize,
) -> Result<Vec<Vec<Agg>>, ApiError> {
    let figures = evaluate_figures(state, endpoint, metric, r, grid, series, groups, false).await?;
    Ok(figures.aggs)
}

/// Each group's points, and with `sketches` each point's percentile sketch
/// (none for a point without readings).
pub(crate) struct Figures {
    pub aggs: Vec<Vec<Agg>>,
    pub sketches: Vec<Vec<Option<Sketch>>>,
}

/// Points (over all groups) one answer with quantiles may hold: a point's
/// sketch may hold thousands of bins.
const MAX_SKETCHED_POINTS: usize = 100_000;

/// [`evaluate`], with each point's sketch when `sketches` is set.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn evaluate_figures<S: BucketStore>(
    state: &AppState<S>,
    endpoint: &str,
    metric: &MetricName<'_>,
    r: &Range,
    grid: Grid,
    series: &[(Series<'_>, usize)],
    groups: usize,
    sketches: bool,
) -> Result<Figures, ApiError> {
    let points = grid.points();
    if sketches && points.saturating_mul(groups) > MAX_SKETCHED_POINTS {
        return Err(ApiError::bad_request(format!(
            "quantiles= over more than {MAX_SKETCHED_POINTS} points (groups times steps): ask for a longer step or fewer groups"
        )));
    }
    let mut out = Figures {
        aggs: vec![vec![Agg::default(); points]; groups],
        sketches: if sketches {
            vec![vec![None; points]; groups]
        } else {
            Vec::new()
        },
    };
    if r.from >= r.to || series.is_empty() {
        return Ok(out);
    }
    let admitted = admit(state).await?;
    let q = Question {
        metric: metric.as_str(),
        from: r.from,
        to: r.to,
        granularity: state.settings.granularity,
        need: if sketches {
            Need::Sketches
        } else {
            Need::Aggregates
        },
        max_time: admitted.max_time(),
        cache: crate::api::cache_use(state),
    };
    let members: Vec<Series<'_>> = series.iter().map(|(s, _)| *s).collect();
    let work = crate::query::evaluate(
        state.store.as_ref(),
        &state.batcher,
        q,
        grid,
        &members,
        |i, cells| {
            let group = series[i].1;
            for (into, cell) in out.aggs[group].iter_mut().zip(&cells) {
                into.merge(&cell.agg);
            }
            if let Some(into) = out.sketches.get_mut(group) {
                for (into, cell) in into.iter_mut().zip(cells) {
                    match (into.as_mut(), cell.sketch) {
                        (Some(all), Some(k)) => {
                            // Sketches of one accuracy, the store's: they merge.
                            let _ = all.merge(&k);
                        }
                        (None, k) => *into = k,
                        (Some(_), None) => {}
                    }
                }
            }
        },
    );
    let cost = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(state, endpoint, cost);
    for p in &out.aggs {
        check_finite(p)?;
    }
    Ok(out)
}

/// Finite readings can still add up beyond a double: say so rather than
/// answer a sum of `null`.
pub(crate) fn check_finite(aggs: &[Agg]) -> Result<(), ApiError> {
    if aggs.iter().all(|a| a.sum.is_finite()) {
        return Ok(());
    }
    Err(beyond_a_double())
}

/// A sum (of readings, or of a time integral) beyond a double.
pub(crate) fn beyond_a_double() -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "the sum of the readings in the range is beyond the range of a double; query a shorter range or smaller steps",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_beyond_a_double_is_a_clear_error_not_null() {
        let mut a = Agg::default();
        a.add(f64::MAX);
        a.add(f64::MAX);
        let err = check_finite(&[Agg::default(), a]).expect_err("overflowed");
        assert_eq!(err.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(check_finite(&[Agg::default()]).is_ok());
    }
}

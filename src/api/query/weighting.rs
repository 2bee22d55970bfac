//! `weighting=` and `staleness=`: time-weighted averages of one sensor
//! (`query::weighted`).

use super::admission::{admit, check_finite, store_error};
use super::range::Range;
use crate::api::ApiError;
use crate::api::AppState;
use crate::api::params::Params;
use crate::domain::{Agg, MetricName, Weighted, Weighting};
use crate::query::weighted::{WeightedError, time_weighted};
use crate::query::{Need, Question, Series};
use crate::store::BucketStore;

/// The request's weighting (`readings`, the default, `time` or `linear`).
pub(crate) fn weighting(params: &Params) -> Result<Weighting, ApiError> {
    match params.get("weighting") {
        None | Some("readings") => Ok(Weighting::Readings),
        Some("time") => Ok(Weighting::Time),
        Some("linear") => Ok(Weighting::Linear),
        Some(_) => Err(ApiError::bad_request(
            "weighting must be readings, time (each value held until the next) or linear",
        )),
    }
}

/// The name a response gives a weighting.
pub(crate) fn weighting_name(w: Weighting) -> &'static str {
    match w {
        Weighting::Readings => "readings",
        Weighting::Time => "time",
        Weighting::Linear => "linear",
    }
}

/// The request's staleness limit in seconds: `staleness=` (a duration such
/// as `15m` or `2d`, at most `query.max_range`), else `query.staleness`.
pub(crate) fn staleness<S>(state: &AppState<S>, params: &Params) -> Result<i64, ApiError> {
    let q = &state.settings.query;
    let d = match params.get("staleness") {
        None => q.staleness,
        Some(text) => humantime::parse_duration(text)
            .ok()
            .filter(|d| d.as_secs() >= 1 && *d <= q.max_range)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "staleness must be a duration of at least 1s and at most query.max_range ({}), such as 15m or 2d",
                    humantime::format_duration(q.max_range)
                ))
            })?,
    };
    Ok(i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Each group's time-weighted figures over `r` (its sensors' integrals
/// over their held time together), with its readings' aggregates.
pub(crate) async fn weighted_average<S: BucketStore>(
    state: &AppState<S>,
    endpoint: &str,
    metric: &MetricName<'_>,
    r: &Range,
    series: &[(Series<'_>, usize)],
    groups: usize,
    (weighting, staleness): (Weighting, i64),
) -> Result<Vec<(Weighted, Agg)>, ApiError> {
    let mut out = vec![(Weighted::default(), Agg::default()); groups];
    if r.from >= r.to || series.is_empty() {
        return Ok(out);
    }
    let admitted = admit(state).await?;
    let q = Question {
        metric: metric.as_str(),
        from: r.from,
        to: r.to,
        granularity: state.settings.granularity,
        need: Need::Summaries,
        max_time: admitted.max_time(),
        cache: None,
    };
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let members: Vec<Series<'_>> = series.iter().map(|(s, _)| *s).collect();
    let work = time_weighted(
        state.store.as_ref(),
        &state.batcher,
        q,
        &members,
        weighting,
        staleness,
        now,
    );
    let (each, cost) = admitted
        .within(async {
            work.await.map_err(|e| match e {
                WeightedError::Store(e) => store_error(e),
                e @ WeightedError::TooManyReadings => {
                    ApiError::new(axum::http::StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
                }
            })
        })
        .await?;
    admitted.done(state, endpoint, cost);
    for ((w, agg), (_, group)) in each.into_iter().zip(series) {
        let into = &mut out[*group];
        into.0.integral += w.integral;
        into.0.held += w.held;
        into.1.merge(&agg);
    }
    let aggs: Vec<Agg> = out.iter().map(|(_, a)| *a).collect();
    check_finite(&aggs)?;
    Ok(out)
}

//! `GET /api/v1/sensors/{sensor}/average` and `…/series`.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tracing::error;

use super::{ApiError, AppState};
use crate::auth::Principal;
use crate::domain::{Agg, MetricName, SensorId};
use crate::domain::{BucketRead, Starts, Values};
use crate::query::{Grid, Plan};
use crate::store::{BucketStore, Fetch, StoreError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeParams {
    pub metric: Option<String>,
    pub from: String,
    pub to: String,
    pub step: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct AverageResponse {
    pub sensor: String,
    pub metric: String,
    pub from: String,
    pub to: String,
    pub count: u64,
    pub sum: f64,
    pub avg: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Point {
    pub start: String,
    pub count: u64,
    pub sum: f64,
    pub avg: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct SeriesResponse {
    pub sensor: String,
    pub metric: String,
    pub from: String,
    pub to: String,
    pub step: String,
    pub points: Vec<Point>,
}

/// Epoch milliseconds from RFC 3339 text or an integer.
pub fn parse_instant(name: &str, s: &str) -> Result<i64, ApiError> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    OffsetDateTime::parse(s, &Rfc3339)
        .ok()
        .and_then(|t| i64::try_from(t.unix_timestamp_nanos().div_euclid(1_000_000)).ok())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{name} must be an RFC 3339 timestamp or integer epoch milliseconds"
            ))
        })
}

fn format_ms(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// `1m`, `5m`, `15m`, `1h`, `1d`, or any whole number of minutes, in seconds.
pub fn parse_step(s: &str) -> Result<i64, ApiError> {
    humantime::parse_duration(s)
        .ok()
        .and_then(|d| {
            i64::try_from(d.as_secs())
                .ok()
                .filter(|_| d.subsec_nanos() == 0)
        })
        .filter(|&secs| secs > 0 && secs % 60 == 0)
        .ok_or_else(|| {
            ApiError::bad_request(
                "step must be a whole number of minutes, such as 1m, 5m, 15m, 1h or 1d",
            )
        })
}

/// A validated request: the series and its range in whole stored seconds.
struct Request<'a> {
    sensor: SensorId<'a>,
    metric: MetricName<'a>,
    from_ms: i64,
    to_ms: i64,
    /// A stored second `s` counts when `from_ms <= s·1000 < to_ms`.
    from: i64,
    to: i64,
}

fn request<'a, S>(
    state: &AppState<S>,
    sensor: &'a str,
    params: &'a RangeParams,
) -> Result<Request<'a>, ApiError> {
    let sensor = SensorId::parse(sensor).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let metric = match params.metric.as_deref() {
        Some(m) => MetricName::parse(m).map_err(|e| ApiError::bad_request(e.to_string()))?,
        None => MetricName::default_metric(),
    };
    let from_ms = parse_instant("from", &params.from)?;
    let to_ms = parse_instant("to", &params.to)?;
    if from_ms >= to_ms {
        return Err(ApiError::bad_request("from must be before to"));
    }
    let max = state.settings.query.max_range;
    if u128::try_from(i128::from(to_ms) - i128::from(from_ms)).unwrap_or(u128::MAX)
        > max.as_millis()
    {
        return Err(ApiError::bad_request(format!(
            "the range is longer than {}",
            humantime::format_duration(max)
        )));
    }
    Ok(Request {
        sensor,
        metric,
        from_ms,
        to_ms,
        from: from_ms.div_euclid(1000) + i64::from(from_ms.rem_euclid(1000) != 0),
        to: to_ms.div_euclid(1000) + i64::from(to_ms.rem_euclid(1000) != 0),
    })
}

fn store_error(e: StoreError) -> ApiError {
    error!(error = %e, "A query could not read its buckets.");
    match e {
        StoreError::Outage(_) => ApiError::unavailable("storage is unavailable; retry later"),
        StoreError::Poison(_) | StoreError::Unreadable(_) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the query failed")
        }
    }
}

/// Runs a plan: one read of the whole buckets, one of the edge buckets, and
/// the readings acknowledged but not yet stored laid over them.
async fn evaluate<S: BucketStore>(
    state: &AppState<S>,
    req: &Request<'_>,
    plan: &Plan,
) -> Result<Vec<Agg>, ApiError> {
    let store = state.store.as_ref();
    // Memory first: a bucket written between the two looks is then in both,
    // never in neither.
    let unstored =
        state
            .batcher
            .unstored_values(req.sensor.as_str(), req.metric.as_str(), req.from, req.to);
    let mut read: Vec<BucketRead> = Vec::new();
    if let Some((starts, minutes)) = plan.whole_buckets() {
        let fetch = Fetch {
            sensor: &req.sensor,
            metric: &req.metric,
            starts,
            minutes,
            values: Values::None,
        };
        read.extend(store.fetch(fetch).await.map_err(store_error)?);
    }
    if let Some((starts, minutes, values)) = plan.edge_buckets() {
        let fetch = Fetch {
            sensor: &req.sensor,
            metric: &req.metric,
            starts,
            minutes,
            values,
        };
        read.extend(store.fetch(fetch).await.map_err(store_error)?);
    }
    if !unstored.is_empty() {
        let starts: Vec<i64> = unstored.iter().map(|(start, _)| *start).collect();
        read.retain(|b| !starts.contains(&b.start));
        let fetch = Fetch {
            sensor: &req.sensor,
            metric: &req.metric,
            starts: Starts::Only(starts),
            minutes: false,
            values: Values::All,
        };
        let stored = store.fetch(fetch).await.map_err(store_error)?;
        read.extend(unstored.into_iter().map(|(start, values)| {
            overlay(start, stored.iter().find(|b| b.start == start), values)
        }));
    }
    Ok(plan.fold(&read))
}

/// A bucket as stored with the unstored values laid over it (they are newer:
/// they win per second), aggregates recomputed.
fn overlay(start: i64, stored: Option<&BucketRead>, newer: Vec<(u16, f64)>) -> BucketRead {
    let mut values: Vec<(u16, f64)> = stored.map(|b| b.values.clone()).unwrap_or_default();
    values.retain(|(o, _)| newer.binary_search_by_key(o, |&(n, _)| n).is_err());
    values.extend(newer);
    values.sort_by_key(|&(o, _)| o);
    let mut agg = Agg::default();
    for &(_, v) in &values {
        agg.add(v);
    }
    BucketRead {
        start,
        agg,
        minutes: Vec::new(),
        values,
    }
}

fn rejected(e: QueryRejection) -> ApiError {
    ApiError::bad_request(e.body_text())
}

pub async fn average<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    params: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Json<AverageResponse>, ApiError> {
    principal.check_sensors(std::iter::once(sensor.as_str()))?;
    let _timer = state
        .metrics
        .query_duration
        .with_label_values(&["average"])
        .start_timer();
    let Query(params) = params.map_err(rejected)?;
    if params.step.is_some() {
        return Err(ApiError::bad_request(
            "step belongs to /series, not /average",
        ));
    }
    let req = request(&state, &sensor, &params)?;
    let agg = if req.from < req.to {
        let grid = Grid::whole(req.from, req.to);
        let plan = Plan::new(state.settings.granularity, req.from, req.to, grid);
        evaluate(&state, &req, &plan).await?[0]
    } else {
        Agg::default()
    };
    check_finite(std::slice::from_ref(&agg))?;
    Ok(Json(AverageResponse {
        sensor: req.sensor.to_string(),
        metric: req.metric.to_string(),
        from: format_ms(req.from_ms),
        to: format_ms(req.to_ms),
        count: agg.count,
        sum: agg.sum,
        avg: agg.avg(),
        min: agg.min(),
        max: agg.max(),
    }))
}

pub async fn series<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    params: Result<Query<RangeParams>, QueryRejection>,
) -> Result<Json<SeriesResponse>, ApiError> {
    principal.check_sensors(std::iter::once(sensor.as_str()))?;
    let _timer = state
        .metrics
        .query_duration
        .with_label_values(&["series"])
        .start_timer();
    let Query(params) = params.map_err(rejected)?;
    let step_text = params
        .step
        .as_deref()
        .ok_or_else(|| ApiError::bad_request("step is required"))?;
    let step = parse_step(step_text)?;
    let max_range = state.settings.query.max_range;
    if u64::try_from(step).unwrap_or(u64::MAX) > max_range.as_secs() {
        return Err(ApiError::bad_request(format!(
            "step is longer than the longest range, {}",
            humantime::format_duration(max_range)
        )));
    }
    let req = request(&state, &sensor, &params)?;
    // The grid spans the requested instants; stored seconds are counted in [from, to).
    let grid = Grid::aligned(req.from_ms.div_euclid(1000), req.to.max(req.from), step);
    let max_points = state.settings.query.max_points;
    if grid.points > max_points {
        return Err(ApiError::bad_request(format!(
            "the range holds {} steps of {step_text}; the limit is {max_points}",
            grid.points
        )));
    }
    let aggs = if req.from < req.to {
        let plan = Plan::new(state.settings.granularity, req.from, req.to, grid);
        evaluate(&state, &req, &plan).await?
    } else {
        vec![Agg::default(); grid.points]
    };
    check_finite(&aggs)?;
    let points = aggs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            Ok(Point {
                start: format_ms(point_start_ms(grid.origin, i, grid.step).ok_or_else(|| {
                    ApiError::bad_request("the range lies beyond the representable times")
                })?),
                count: a.count,
                sum: a.sum,
                avg: a.avg(),
                min: a.min(),
                max: a.max(),
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Json(SeriesResponse {
        sensor: req.sensor.to_string(),
        metric: req.metric.to_string(),
        from: format_ms(req.from_ms),
        to: format_ms(req.to_ms),
        step: step_text.to_owned(),
        points,
    }))
}

/// Epoch milliseconds of point `i`'s start, if representable.
fn point_start_ms(origin: i64, i: usize, step: i64) -> Option<i64> {
    i64::try_from(i)
        .ok()?
        .checked_mul(step)?
        .checked_add(origin)?
        .checked_mul(1000)
}

/// Finite readings can still add up beyond a double: say so rather than
/// answer a sum of `null`.
fn check_finite(aggs: &[Agg]) -> Result<(), ApiError> {
    if aggs.iter().all(|a| a.sum.is_finite()) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "the sum of the readings in the range is beyond the range of a double; query a shorter range or smaller steps",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_starts_never_overflow() {
        assert_eq!(point_start_ms(60, 2, 60), Some(180_000));
        assert_eq!(point_start_ms(i64::MAX / 1000, 1, 60), None);
        assert_eq!(point_start_ms(i64::MIN / 1000 - 1, 0, 60), None);
    }

    #[test]
    fn a_sum_beyond_a_double_is_a_clear_error_not_null() {
        let mut a = Agg::default();
        a.add(f64::MAX);
        a.add(f64::MAX);
        let err = check_finite(&[Agg::default(), a]).expect_err("overflowed");
        assert_eq!(err.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(check_finite(&[Agg::default()]).is_ok());
    }

    #[test]
    fn steps_are_whole_minutes() {
        assert_eq!(parse_step("1m").ok(), Some(60));
        assert_eq!(parse_step("15m").ok(), Some(900));
        assert_eq!(parse_step("1h").ok(), Some(3600));
        assert_eq!(parse_step("1d").ok(), Some(86400));
        assert_eq!(parse_step("90m").ok(), Some(5400));
        for bad in ["", "0m", "30s", "90s", "1.5m", "m", "-1m", "1 fortnight"] {
            assert!(parse_step(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn instants_are_rfc3339_or_epoch_milliseconds() {
        assert_eq!(parse_instant("from", "1000").ok(), Some(1000));
        assert_eq!(
            parse_instant("from", "1970-01-01T00:00:01.5Z").ok(),
            Some(1500)
        );
        assert!(parse_instant("from", "yesterday").is_err());
        assert_eq!(format_ms(1500), "1970-01-01T00:00:01.5Z");
    }
}

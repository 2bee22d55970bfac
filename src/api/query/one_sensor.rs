//! The one-sensor routes: a sensor's average, series and newest reading.

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::api::ApiError;
use crate::api::AppState;
use crate::api::descriptions as text;
use crate::api::error::ErrorBody;
use crate::api::params::Params;
use crate::auth::Principal;
use crate::domain::{Agg, Labels, SensorId};
use crate::query::{Cost, Grid, Series};

use super::points::{Ask, group_points};
use super::{AverageResponse, LatestResponse, Point, SeriesResponse, groups, quantiles, weighting};
use super::{
    admit, coarse, coarse_header, csv_point, csv_response, format_ms, format_start, metric,
    parse_tz, point_columns, range, series_grid, store_error, wants_csv,
};

pub(super) fn sensor_param<'a>(
    principal: &Principal,
    sensor: &'a str,
) -> Result<SensorId<'a>, ApiError> {
    principal.check_sensors(std::iter::once(sensor))?;
    SensorId::parse(sensor).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Count, sum, mean, min and max of one sensor's metric over a range, exact.
#[utoipa::path(get, path = "/api/v1/sensors/{sensor}/average",
    params(("sensor" = String, Path, description = text::SENSOR), ("metric" = Option<String>, Query, description = text::METRIC),
        ("from" = String, Query, description = text::FROM), ("to" = String, Query, description = text::TO),
        ("weighting" = Option<String>, Query, description = text::WEIGHTING), ("staleness" = Option<String>, Query, description = text::STALENESS),
        ("quantiles" = Option<String>, Query, description = text::QUANTILES)),
    responses(
        (status = 200, body = AverageResponse, description = "The range's aggregates (`avg`, `min` and `max` are `null` without readings)"),
        (status = 400, body = ErrorBody, description = text::BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY_SENSOR),
        (status = 422, body = ErrorBody, description = text::TOO_BIG),
        (status = 500, body = ErrorBody, description = text::QUERY_FAILED),
        (status = 503, body = ErrorBody, description = text::QUERY_UNAVAILABLE)))]
pub async fn average(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<AverageResponse>, ApiError> {
    sensor_param(&principal, &sensor)?;
    let params = Params::parse(
        raw.as_deref(),
        &[
            "metric",
            "from",
            "to",
            "weighting",
            "staleness",
            "quantiles",
        ],
        false,
    )?;
    let metric = metric(&params)?;
    let weighing = weighting::weighing(&state, &params)?;
    let asked = quantiles::quantiles(&params)?;
    let mut r = range(&state, &params)?;
    let coarse = coarse(&state, &mut r, None)?;
    let grid = Grid::whole(r.from, r.to);
    let limit = match weighing {
        Some(how) => Some(one_limit(&state, "average", &sensor, &how).await?),
        None => None,
    };
    let ask = Ask::new(
        "average",
        &metric,
        &r,
        &grid,
        None,
        weighing,
        asked.as_ref(),
    );
    let one = [(Series::of(&sensor), 0, limit.unwrap_or(0))];
    let mut points = group_points(&state, &ask, &one, 1).await?;
    // The whole range is one point, without a start.
    let mut aggregates = points
        .pop()
        .and_then(|mut p| p.pop())
        .unwrap_or_else(|| Point::new(None, &Agg::default()));
    aggregates.start = None;
    Ok(Json(AverageResponse {
        sensor,
        metric: metric.to_string(),
        from: format_ms(r.from_ms),
        to: format_ms(r.to_ms),
        aggregates,
        weighting: weighing.map(|w| w.name()),
        staleness_seconds: limit,
        coarse,
    }))
}

/// One sensor's staleness limit: the request's, else its label's (one
/// registry read), else the fleet's.
async fn one_limit(
    state: &AppState,
    endpoint: &str,
    sensor: &str,
    how: &weighting::Weighing,
) -> Result<i64, ApiError> {
    let labels = if how.asked() {
        Labels::default()
    } else {
        groups::labels_of(state, endpoint, sensor).await?
    };
    Ok(how.limit(&labels))
}

/// One sensor's metric as a step series (JSON or CSV).
#[utoipa::path(get, path = "/api/v1/sensors/{sensor}/series",
    params(("sensor" = String, Path, description = text::SENSOR), ("metric" = Option<String>, Query, description = text::METRIC),
        ("from" = String, Query, description = text::FROM), ("to" = String, Query, description = text::TO),
        ("step" = String, Query, description = text::STEP), ("tz" = Option<String>, Query, description = text::TZ),
        ("format" = Option<String>, Query, description = text::FORMAT),
        ("weighting" = Option<String>, Query, description = text::WEIGHTING), ("staleness" = Option<String>, Query, description = text::STALENESS),
        ("quantiles" = Option<String>, Query, description = text::QUANTILES)),
    responses(
        (status = 200, description = "A point per step of the range, empty ones included (`count` 0); CSV with `format=csv` or `Accept: text/csv` (columns `start,count,sum,avg,min,max`, then `held_seconds` and a `q<quantile>` each when asked; past `retention.buckets`, an `X-Hourglass-Coarse` header)",
            content((SeriesResponse = "application/json"), (String = "text/csv"))),
        (status = 400, body = ErrorBody, description = text::BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY_SENSOR),
        (status = 422, body = ErrorBody, description = text::TOO_BIG),
        (status = 500, body = ErrorBody, description = text::QUERY_FAILED),
        (status = 503, body = ErrorBody, description = text::QUERY_UNAVAILABLE)))]
pub async fn series(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    sensor_param(&principal, &sensor)?;
    let params = Params::parse(
        raw.as_deref(),
        &[
            "metric",
            "from",
            "to",
            "step",
            "tz",
            "format",
            "weighting",
            "staleness",
            "quantiles",
        ],
        false,
    )?;
    let csv = wants_csv(&headers, &params)?;
    let metric = metric(&params)?;
    let weighing = weighting::weighing(&state, &params)?;
    let asked = quantiles::quantiles(&params)?;
    let tz = parse_tz(&params)?;
    let mut r = range(&state, &params)?;
    let grid = series_grid(&state, &params, &r, tz.as_ref().map(|t| &t.1))?;
    let coarse = coarse(&state, &mut r, Some(&grid))?;
    let zone = tz.as_ref().map(|t| &t.1);
    let limit = match weighing {
        Some(how) => Some(one_limit(&state, "series", &sensor, &how).await?),
        None => None,
    };
    let ask = Ask::new("series", &metric, &r, &grid, zone, weighing, asked.as_ref());
    let one = [(Series::of(&sensor), 0, limit.unwrap_or(0))];
    let points = group_points(&state, &ask, &one, 1)
        .await?
        .pop()
        .unwrap_or_default();
    if csv {
        let mut response = csv_response(|w| {
            w.write_record(point_columns(weighing.is_some(), asked.as_ref()))?;
            for p in &points {
                w.write_record(csv_point(&[], p))?;
            }
            Ok(())
        });
        coarse_header(&mut response, coarse.as_ref());
        return Ok(response);
    }
    Ok(Json(SeriesResponse {
        sensor,
        metric: metric.to_string(),
        from: format_ms(r.from_ms),
        to: format_ms(r.to_ms),
        step: params.get("step").unwrap_or_default().to_owned(),
        tz: tz.map_or_else(|| "UTC".to_owned(), |t| t.0),
        weighting: weighing.map(|w| w.name()),
        staleness_seconds: limit,
        points,
        coarse,
    })
    .into_response())
}

/// A sensor's latest reading of a metric, stored or still held in memory.
#[utoipa::path(get, path = "/api/v1/sensors/{sensor}/latest",
    params(("sensor" = String, Path, description = text::SENSOR), ("metric" = Option<String>, Query, description = text::METRIC)),
    responses(
        (status = 200, body = LatestResponse, description = "The newest reading by timestamp, stored or acknowledged and not yet stored"),
        (status = 400, body = ErrorBody, description = text::BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY_SENSOR),
        (status = 404, body = ErrorBody, description = "The sensor has no readings of this metric"),
        (status = 500, body = ErrorBody, description = text::QUERY_FAILED),
        (status = 503, body = ErrorBody, description = text::QUERY_UNAVAILABLE)))]
pub async fn latest(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<LatestResponse>, ApiError> {
    sensor_param(&principal, &sensor)?;
    let params = Params::parse(raw.as_deref(), &["metric"], false)?;
    let metric = metric(&params)?;
    let admitted = admit(&state).await?;
    let work = crate::query::latest(
        state.store.as_ref(),
        &state.batcher,
        (&sensor, metric.as_str()),
        None,
        admitted.max_time(),
    );
    let found = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(
        &state,
        "latest",
        Cost {
            documents: 1,
            round_trips: 1,
        },
    );
    let (ts, value) = found.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("sensor {sensor} has no readings of metric {metric}"),
        )
    })?;
    Ok(Json(LatestResponse {
        sensor,
        metric: metric.to_string(),
        ts: format_start(ts, None)?,
        value,
    }))
}

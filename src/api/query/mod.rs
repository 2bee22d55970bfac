//! Dashboards' routes: averages and series of one sensor or of a group of
//! sensors, the newest reading, and the sensor registry.
//!
//! - [`range`]: the parameters every route shares (instants, steps, time
//!   zones, the range and its grid).
//! - [`admission`]: admission under `query.max_concurrency`, the deadline,
//!   the cost recorded, and the one evaluation every point route runs.
//! - [`csv`]: CSV answers for spreadsheets.
//! - [`groups`]: groups of sensors from the registry.
//! - [`registry`]: the sensor listing and labels.
//! - [`dead_letters`]: the newest dead letters.
//! - [`weighting`]: time-weighted averages (`weighting=`, `staleness=`).
//! - this module: the answers' types and the one-sensor routes.

mod admission;
mod csv;
mod dead_letters;
mod groups;
mod quantiles;
mod range;
mod registry;
mod silence;
mod weighting;

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::collections::BTreeMap;

use super::ApiError;
use super::AppState;
use super::params::Params;
use crate::auth::Principal;
use crate::domain::{Agg, Labels, SensorId};
use crate::query::{Cost, Grid, Series};
use crate::store::BucketStore;

pub(super) use admission::{Admitted, admit};
pub(super) use admission::{evaluate, evaluate_figures, store_error};
use csv::{csv_point, csv_response, point_columns, wants_csv};
pub use dead_letters::{
    __path_list_dead_letters, DeadLetterEntry, DeadLetterList, list_dead_letters,
};
pub use groups::check_group_params;
pub(super) use groups::sensor_glob;
pub use groups::{__path_group_average, __path_group_series, group_average, group_series};
pub use quantiles::QuantileValues;
pub use range::Coarse;
pub(super) use range::{Range, coarse, coarse_header, metric, range, series_grid};
pub use range::{Step, parse_instant, parse_step};
use range::{format_ms, format_start, parse_tz, points_of};
pub use registry::{__path_list_sensors, __path_put_labels, list_sensors, put_labels};
pub use silence::{__path_uptime, GapEntry, UptimeResponse, count_silent, uptime};
pub(super) use weighting::{Weighing, weighing, weighted_points};

/// Aggregates of one point, range or group.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Point {
    /// Start of the point, RFC 3339 (with the `tz` offset when one is given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    pub count: u64,
    pub sum: f64,
    pub avg: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// With `weighting=time` or `linear`: the seconds of the point a
    /// reading's value held (of its sensors, summed, for a group); `avg`
    /// is the time integral over them, and count, sum, min and max stay
    /// the readings'.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_seconds: Option<i64>,
    /// With `quantiles=`: each quantile of the point's readings, within
    /// `buckets.sketch_accuracy` of the exact one (`null` without readings).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub quantiles: Option<QuantileValues>,
}

impl Point {
    fn new(start: Option<String>, a: &Agg) -> Self {
        Self {
            start,
            count: a.count,
            sum: a.sum,
            avg: a.avg(),
            min: a.min(),
            max: a.max(),
            held_seconds: None,
            quantiles: None,
        }
    }
}

/// `GET /api/v1/sensors/{sensor}/average`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AverageResponse {
    pub sensor: String,
    pub metric: String,
    pub from: String,
    pub to: String,
    #[serde(flatten)]
    pub aggregates: Point,
    /// With `weighting=time` or `linear`: the weighting of `avg`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weighting: Option<&'static str>,
    /// With `weighting=time` or `linear`: the staleness limit applied, in
    /// seconds (`staleness=`, else the sensor's `staleness` label, else
    /// `query.staleness`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness_seconds: Option<i64>,
    /// Present when the range reaches back past `retention.buckets`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coarse: Option<Coarse>,
}

/// `GET /api/v1/sensors/{sensor}/series`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SeriesResponse {
    pub sensor: String,
    pub metric: String,
    pub from: String,
    pub to: String,
    pub step: String,
    pub tz: String,
    /// With `weighting=time` or `linear`: the weighting of each point's `avg`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weighting: Option<&'static str>,
    /// With `weighting=time` or `linear`: the staleness limit applied, in
    /// seconds, as for the average.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staleness_seconds: Option<i64>,
    pub points: Vec<Point>,
    /// Present when the range reaches back past `retention.buckets`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coarse: Option<Coarse>,
}

/// One group of a group query.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Group {
    /// What the group shares: `{}` without `group_by`, `{"sensor": id}`, or
    /// `{"<label>": value}` (`null` for sensors without the label).
    #[schema(value_type = Object)]
    pub group: BTreeMap<String, Option<String>>,
    /// How many sensors it sums.
    pub sensors: usize,
    /// Averages: the group's aggregates.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub aggregates: Option<Point>,
    /// Series: its points.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub points: Option<Vec<Point>>,
}

/// `GET /api/v1/average` and `GET /api/v1/series`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GroupResponse {
    pub metric: String,
    pub from: String,
    pub to: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    pub group_by: Option<String>,
    /// With `weighting=time` or `linear`: the weighting of each group's `avg`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weighting: Option<&'static str>,
    pub groups: Vec<Group>,
    /// Present when the range reaches back past `retention.buckets`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coarse: Option<Coarse>,
}

/// `GET /api/v1/sensors/{sensor}/latest`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LatestResponse {
    pub sensor: String,
    pub metric: String,
    pub ts: String,
    pub value: f64,
}

/// A registered sensor.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SensorEntry {
    pub sensor: String,
    pub metrics: Vec<String>,
    #[schema(value_type = Object)]
    pub labels: Labels,
    /// Start of the hour of its newest reading.
    pub last_seen: Option<String>,
    /// With `silent=true`: the time of its newest reading (`null`: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_reading: Option<Option<String>>,
}

/// `GET /api/v1/sensors`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SensorList {
    pub sensors: Vec<SensorEntry>,
    /// Pass as `after` for the next page; `null` on the last.
    pub next: Option<String>,
}

fn sensor_param(principal: &Principal, sensor: &str) -> Result<(), ApiError> {
    principal.check_sensors(std::iter::once(sensor))?;
    SensorId::parse(sensor).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(())
}

/// Count, sum, mean, min and max of one sensor's metric over a range, exact.
#[utoipa::path(get, path = "/api/v1/sensors/{sensor}/average",
    params(("sensor" = String, Path), ("metric" = Option<String>, Query), ("from" = String, Query), ("to" = String, Query),
        ("weighting" = Option<String>, Query), ("staleness" = Option<String>, Query),
        ("quantiles" = Option<String>, Query, description = "e.g. 0.5,0.95,0.99: percentiles from rollups' sketches")),
    responses((status = 200, body = AverageResponse)))]
pub async fn average<S: BucketStore>(
    State(state): State<AppState<S>>,
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
    let series = [(Series::of(&sensor), 0)];
    let grid = Grid::whole(r.from, r.to);
    let limit = match weighing {
        Some(how) => Some(one_limit(&state, "average", &sensor, &how).await?),
        None => None,
    };
    let (mut aggregates, sketches) = match weighing.zip(limit) {
        Some((how, limit)) => {
            let one = [(series[0].0, 0, limit)];
            let figures = weighting::weighted_points(
                &state,
                "average",
                &metric,
                &r,
                &grid,
                &one,
                1,
                how.weighting,
            )
            .await?;
            let (w, agg) = figures
                .first()
                .and_then(|g| g.first())
                .copied()
                .unwrap_or_default();
            let mut point = Point::new(None, &agg);
            point.avg = w.average();
            point.held_seconds = Some(w.held);
            let sketches = quantiles::sketches(
                &state,
                "average",
                &metric,
                &r,
                &grid,
                &series,
                1,
                asked.as_ref(),
            )
            .await?;
            (point, sketches)
        }
        None => {
            let f = evaluate_figures(
                &state,
                "average",
                &metric,
                &r,
                grid,
                &series,
                1,
                asked.is_some(),
            )
            .await?;
            (Point::new(None, &f.aggs[0][0]), f.sketches)
        }
    };
    if let Some(q) = &asked {
        q.annotate(
            std::slice::from_mut(&mut aggregates),
            sketches.first().map_or(&[][..], Vec::as_slice),
        );
    }
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
async fn one_limit<S: BucketStore>(
    state: &AppState<S>,
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
    params(("sensor" = String, Path), ("metric" = Option<String>, Query), ("from" = String, Query), ("to" = String, Query),
        ("step" = String, Query), ("tz" = Option<String>, Query), ("format" = Option<String>, Query),
        ("weighting" = Option<String>, Query), ("staleness" = Option<String>, Query),
        ("quantiles" = Option<String>, Query, description = "e.g. 0.5,0.95,0.99: percentiles from rollups' sketches")),
    responses((status = 200, body = SeriesResponse), (status = 200, content_type = "text/csv", body = String)))]
pub async fn series<S: BucketStore>(
    State(state): State<AppState<S>>,
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
    let series = [(Series::of(&sensor), 0)];
    let zone = tz.as_ref().map(|t| &t.1);
    let limit = match weighing {
        Some(how) => Some(one_limit(&state, "series", &sensor, &how).await?),
        None => None,
    };
    let (mut points, sketches) = match weighing.zip(limit) {
        Some((how, limit)) => {
            let one = [(series[0].0, 0, limit)];
            let figures = weighting::weighted_points(
                &state,
                "series",
                &metric,
                &r,
                &grid,
                &one,
                1,
                how.weighting,
            )
            .await?;
            let none = Vec::new();
            let points =
                weighting::weighted_points_of(&grid, figures.first().unwrap_or(&none), zone)?;
            let sketches = quantiles::sketches(
                &state,
                "series",
                &metric,
                &r,
                &grid,
                &series,
                1,
                asked.as_ref(),
            )
            .await?;
            (points, sketches)
        }
        None => {
            let f = evaluate_figures(
                &state,
                "series",
                &metric,
                &r,
                grid.clone(),
                &series,
                1,
                asked.is_some(),
            )
            .await?;
            (points_of(&grid, &f.aggs[0], zone)?, f.sketches)
        }
    };
    if let Some(q) = &asked {
        q.annotate(&mut points, sketches.first().map_or(&[][..], Vec::as_slice));
    }
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
    params(("sensor" = String, Path), ("metric" = Option<String>, Query)),
    responses((status = 200, body = LatestResponse), (status = 404, description = "No readings")))]
pub async fn latest<S: BucketStore>(
    State(state): State<AppState<S>>,
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

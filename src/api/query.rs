//! Dashboards' routes: averages and series of one sensor or of a group of
//! sensors, the newest reading, and the sensor registry.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jiff::tz::TimeZone;
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::time::Instant;
use tracing::warn;
use wildmatch::WildMatch;

use super::params::Params;
use super::{ApiError, AppState};
use crate::auth::Principal;
use crate::domain::{Agg, Labels, MetricName, SensorId};
use crate::query::{Calendar, Cost, Grid, GridError, Need, Question, Series};
use crate::store::{BucketStore, SensorInfo, SensorQuery, StoreError};

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
    pub points: Vec<Point>,
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
    pub groups: Vec<Group>,
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
}

/// `GET /api/v1/sensors`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SensorList {
    pub sensors: Vec<SensorEntry>,
    /// Pass as `after` for the next page; `null` on the last.
    pub next: Option<String>,
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

/// A point's start: UTC as `…Z`, or with the offset of `tz` when asked for one.
fn format_start(secs: i64, tz: Option<&TimeZone>) -> Result<String, ApiError> {
    let out_of_range = || ApiError::bad_request("the range lies beyond the representable times");
    match tz {
        None => Ok(format_ms(secs.checked_mul(1000).ok_or_else(out_of_range)?)),
        Some(tz) => jiff::Timestamp::from_second(secs)
            .map(|t| {
                t.to_zoned(tz.clone())
                    .strftime("%Y-%m-%dT%H:%M:%S%:z")
                    .to_string()
            })
            .map_err(|_| out_of_range()),
    }
}

/// A step: calendar (`1d`, `1w` from Monday, `1mo`, aligned to local
/// midnight in `tz`) or a whole number of minutes aligned to the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Fixed(i64),
    Calendar(Calendar),
}

pub fn parse_step(s: &str) -> Result<Step, ApiError> {
    match s {
        "1d" => return Ok(Step::Calendar(Calendar::Day)),
        "1w" => return Ok(Step::Calendar(Calendar::Week)),
        "1mo" => return Ok(Step::Calendar(Calendar::Month)),
        _ => {}
    }
    humantime::parse_duration(s)
        .ok()
        .and_then(|d| {
            i64::try_from(d.as_secs())
                .ok()
                .filter(|_| d.subsec_nanos() == 0)
        })
        .filter(|&secs| secs > 0 && secs % 60 == 0)
        .map(Step::Fixed)
        .ok_or_else(|| {
            ApiError::bad_request(
                "step must be 1d, 1w, 1mo or a whole number of minutes, such as 1m, 5m, 15m or 1h",
            )
        })
}

fn parse_tz(params: &Params) -> Result<Option<(String, TimeZone)>, ApiError> {
    params
        .get("tz")
        .map(|name| {
            TimeZone::get(name)
                .map(|tz| (name.to_owned(), tz))
                .map_err(|_| {
                    ApiError::bad_request(format!(
                        "tz {name:?} is not an IANA time zone name such as Europe/Berlin or UTC"
                    ))
                })
        })
        .transpose()
}

/// A validated range: as asked, and in whole stored seconds.
struct Range {
    from_ms: i64,
    to_ms: i64,
    /// A stored second `s` counts when `from_ms <= s·1000 < to_ms`.
    from: i64,
    to: i64,
}

fn range<S>(state: &AppState<S>, params: &Params) -> Result<Range, ApiError> {
    let from_ms = parse_instant("from", params.require("from")?)?;
    let to_ms = parse_instant("to", params.require("to")?)?;
    if from_ms >= to_ms {
        return Err(ApiError::bad_request("from must be before to"));
    }
    let max = state.settings.query.max_range;
    if u128::try_from(i128::from(to_ms) - i128::from(from_ms)).unwrap_or(u128::MAX)
        > max.as_millis()
    {
        return Err(ApiError::bad_request(format!(
            "the range is longer than {} (query.max_range)",
            humantime::format_duration(max)
        )));
    }
    Ok(Range {
        from_ms,
        to_ms,
        from: from_ms.div_euclid(1000) + i64::from(from_ms.rem_euclid(1000) != 0),
        to: to_ms.div_euclid(1000) + i64::from(to_ms.rem_euclid(1000) != 0),
    })
}

fn metric(params: &Params) -> Result<MetricName<'_>, ApiError> {
    match params.get("metric") {
        Some(m) => MetricName::parse(m).map_err(|e| ApiError::bad_request(e.to_string())),
        None => Ok(MetricName::default_metric()),
    }
}

/// The grid of a series: its step's points over the range.
fn series_grid<S>(
    state: &AppState<S>,
    params: &Params,
    r: &Range,
    tz: Option<&TimeZone>,
) -> Result<Grid, ApiError> {
    let step_text = params.require("step")?;
    let max_points = state.settings.query.max_points;
    let too_many = |points: String| {
        ApiError::bad_request(format!(
            "the range holds {points} steps of {step_text}; the limit is {max_points} (query.max_points)"
        ))
    };
    // The grid spans the requested instants; stored seconds count in [from, to).
    let (from, to) = (r.from_ms.div_euclid(1000), r.to.max(r.from));
    match parse_step(step_text)? {
        Step::Fixed(step) => {
            let max_range = state.settings.query.max_range;
            if u64::try_from(step).unwrap_or(u64::MAX) > max_range.as_secs() {
                return Err(ApiError::bad_request(format!(
                    "step is longer than the longest range, {}",
                    humantime::format_duration(max_range)
                )));
            }
            let grid = Grid::aligned(from, to, step);
            if grid.points() > max_points {
                return Err(too_many(grid.points().to_string()));
            }
            Ok(grid)
        }
        Step::Calendar(c) => Grid::calendar(from, to, c, tz.unwrap_or(&TimeZone::UTC), max_points)
            .map_err(|e| match e {
                GridError::TooManyPoints(_) => too_many("more than that".into()),
                GridError::OutOfRange => ApiError::bad_request(e.to_string()),
            }),
    }
}

fn store_error(e: StoreError) -> ApiError {
    warn!(error = %e, "A query could not read its documents.");
    match e {
        StoreError::Outage(_) => ApiError::unavailable("storage is unavailable; retry later"),
        StoreError::Poison(m) if m.contains("MaxTimeMSExpired") || m.contains("code 50") => {
            timed_out()
        }
        StoreError::Poison(_) | StoreError::Unreadable(_) => {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the query failed")
        }
    }
}

fn timed_out() -> ApiError {
    ApiError::unavailable(
        "the query took longer than query.timeout; ask for a shorter range, fewer points or fewer sensors",
    )
}

/// A query let in under the query concurrency limit, with its deadline
/// (`query.timeout`, counted from arrival).
pub(super) struct Admitted<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    started: Instant,
    pub(super) deadline: Instant,
}

pub(super) async fn admit<S>(state: &AppState<S>) -> Result<Admitted<'_>, ApiError> {
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
    pub(super) fn shorten(&mut self, timeout: Duration) {
        self.deadline = self.deadline.min(self.started + timeout);
    }

    /// What is left for the server (`maxTimeMS`), so it gives up no later
    /// than the route does.
    pub(super) fn max_time(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        tokio::time::timeout_at(self.deadline, work)
            .await
            .map_err(|_| timed_out())?
    }

    /// Records the query's latency, the documents it read and its round trips.
    pub(super) fn done<S>(self, state: &AppState<S>, endpoint: &str, cost: Cost) {
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
async fn evaluate<S: BucketStore>(
    state: &AppState<S>,
    endpoint: &str,
    metric: &MetricName<'_>,
    r: &Range,
    grid: Grid,
    series: &[(Series<'_>, usize)],
    groups: usize,
) -> Result<Vec<Vec<Agg>>, ApiError> {
    let points = grid.points();
    let mut out = vec![vec![Agg::default(); points]; groups];
    if r.from >= r.to || series.is_empty() {
        return Ok(out);
    }
    let admitted = admit(state).await?;
    let q = Question {
        metric: metric.as_str(),
        from: r.from,
        to: r.to,
        granularity: state.settings.granularity,
        need: Need::Aggregates,
        max_time: admitted.max_time(),
    };
    let members: Vec<Series<'_>> = series.iter().map(|(s, _)| *s).collect();
    let work = crate::query::evaluate(
        state.store.as_ref(),
        &state.batcher,
        q,
        grid,
        &members,
        |i, cells| {
            for (into, cell) in out[series[i].1].iter_mut().zip(&cells) {
                into.merge(&cell.agg);
            }
        },
    );
    let cost = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(state, endpoint, cost);
    for p in &out {
        check_finite(p)?;
    }
    Ok(out)
}

/// Whether the client asked for CSV (`Accept: text/csv` or `format=csv`).
fn wants_csv(headers: &HeaderMap, params: &Params) -> Result<bool, ApiError> {
    match params.get("format") {
        Some("csv") => return Ok(true),
        Some("json") => return Ok(false),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "format {other:?} is neither json nor csv"
            )));
        }
        None => {}
    }
    Ok(headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/csv")))
}

fn csv_response(rows: impl FnOnce(&mut csv::Writer<Vec<u8>>) -> csv::Result<()>) -> Response {
    let mut w = csv::Writer::from_writer(Vec::new());
    match rows(&mut w).and_then(|()| w.into_inner().map_err(|e| e.into_error().into())) {
        Ok(body) => ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], body).into_response(),
        Err(e) => {
            warn!(error = %e, "A CSV answer could not be written.");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the query failed").into_response()
        }
    }
}

fn opt(x: Option<f64>) -> String {
    x.map(|v| v.to_string()).unwrap_or_default()
}

fn csv_point(prefix: &[String], p: &Point) -> Vec<String> {
    let mut row = prefix.to_vec();
    row.extend([
        p.start.clone().unwrap_or_default(),
        p.count.to_string(),
        p.sum.to_string(),
        opt(p.avg),
        opt(p.min),
        opt(p.max),
    ]);
    row
}

const POINT_COLUMNS: [&str; 6] = ["start", "count", "sum", "avg", "min", "max"];

fn sensor_param(principal: &Principal, sensor: &str) -> Result<(), ApiError> {
    principal.check_sensors(std::iter::once(sensor))?;
    SensorId::parse(sensor).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(())
}

#[utoipa::path(get, path = "/api/v1/sensors/{sensor}/average",
    params(("sensor" = String, Path), ("metric" = Option<String>, Query), ("from" = String, Query), ("to" = String, Query)),
    responses((status = 200, body = AverageResponse)))]
pub async fn average<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<AverageResponse>, ApiError> {
    sensor_param(&principal, &sensor)?;
    let params = Params::parse(raw.as_deref(), &["metric", "from", "to"], false)?;
    let metric = metric(&params)?;
    let r = range(&state, &params)?;
    let series = [(Series { sensor: &sensor }, 0)];
    let points = evaluate(
        &state,
        "average",
        &metric,
        &r,
        Grid::whole(r.from, r.to),
        &series,
        1,
    )
    .await?;
    Ok(Json(AverageResponse {
        sensor,
        metric: metric.to_string(),
        from: format_ms(r.from_ms),
        to: format_ms(r.to_ms),
        aggregates: Point::new(None, &points[0][0]),
    }))
}

fn points_of(grid: &Grid, aggs: &[Agg], tz: Option<&TimeZone>) -> Result<Vec<Point>, ApiError> {
    aggs.iter()
        .enumerate()
        .map(|(i, a)| {
            let start = grid.start(i).ok_or_else(|| {
                ApiError::bad_request("the range lies beyond the representable times")
            })?;
            Ok(Point::new(Some(format_start(start, tz)?), a))
        })
        .collect()
}

#[utoipa::path(get, path = "/api/v1/sensors/{sensor}/series",
    params(("sensor" = String, Path), ("metric" = Option<String>, Query), ("from" = String, Query), ("to" = String, Query),
        ("step" = String, Query), ("tz" = Option<String>, Query), ("format" = Option<String>, Query)),
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
        &["metric", "from", "to", "step", "tz", "format"],
        false,
    )?;
    let csv = wants_csv(&headers, &params)?;
    let metric = metric(&params)?;
    let tz = parse_tz(&params)?;
    let r = range(&state, &params)?;
    let grid = series_grid(&state, &params, &r, tz.as_ref().map(|t| &t.1))?;
    let series = [(Series { sensor: &sensor }, 0)];
    let aggs = evaluate(&state, "series", &metric, &r, grid.clone(), &series, 1).await?;
    let points = points_of(&grid, &aggs[0], tz.as_ref().map(|t| &t.1))?;
    if csv {
        return Ok(csv_response(|w| {
            w.write_record(POINT_COLUMNS)?;
            for p in &points {
                w.write_record(csv_point(&[], p))?;
            }
            Ok(())
        }));
    }
    Ok(Json(SeriesResponse {
        sensor,
        metric: metric.to_string(),
        from: format_ms(r.from_ms),
        to: format_ms(r.to_ms),
        step: params.get("step").unwrap_or_default().to_owned(),
        tz: tz.map_or_else(|| "UTC".to_owned(), |t| t.0),
        points,
    })
    .into_response())
}

/// How a group query groups its sensors.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GroupBy {
    All,
    Sensor,
    Label(String),
}

impl GroupBy {
    fn parse(s: Option<&str>) -> Result<Self, ApiError> {
        match s {
            None => Ok(GroupBy::All),
            Some("sensor") => Ok(GroupBy::Sensor),
            Some(l) => l
                .strip_prefix("label.")
                .filter(|n| crate::domain::valid_label_name(n))
                .map(|n| GroupBy::Label(n.to_owned()))
                .ok_or_else(|| ApiError::bad_request("group_by must be sensor or label.<name>")),
        }
    }

    fn key(&self, info: &SensorInfo) -> BTreeMap<String, Option<String>> {
        match self {
            GroupBy::All => BTreeMap::new(),
            GroupBy::Sensor => BTreeMap::from([("sensor".to_owned(), Some(info.sensor.clone()))]),
            GroupBy::Label(n) => {
                BTreeMap::from([(n.clone(), info.labels.get(n).map(str::to_owned))])
            }
        }
    }
}

/// The sensors a group query covers, from the registry: those matching the
/// `sensor` glob and the label filters, that have the metric, and that the
/// token may read; at most `query.max_series`.
async fn members<S: BucketStore>(
    state: &AppState<S>,
    principal: &Principal,
    params: &Params,
    metric: &MetricName<'_>,
) -> Result<Vec<SensorInfo>, ApiError> {
    let glob = params.get("sensor").unwrap_or("*");
    if glob.is_empty()
        || !glob
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-*?".contains(&b))
    {
        return Err(ApiError::bad_request(
            "sensor must be a sensor id or a glob of one (* and ?)",
        ));
    }
    for (name, value) in params.labels() {
        if value.is_empty() {
            return Err(ApiError::bad_request(format!("label.{name} needs a value")));
        }
    }
    let prefix = &glob[..glob.find(['*', '?']).unwrap_or(glob.len())];
    let pattern = WildMatch::new(glob);
    let max = state.settings.query.max_series;
    let query = SensorQuery {
        after: None,
        prefix,
        labels: params.labels(),
        metric: Some(metric.as_str()),
    };
    let admitted = admit(state).await?;
    let work = state.store.sensors(query, max + 1, |s| {
        pattern.matches(&s.sensor) && principal.may_access(&s.sensor)
    });
    let found = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(
        state,
        "members",
        Cost {
            documents: found.len() as u64,
            round_trips: 1,
        },
    );
    if found.len() > max {
        return Err(ApiError::bad_request(format!(
            "the query covers more than {max} sensors (query.max_series); narrow sensor= or the label filters"
        )));
    }
    Ok(found)
}

const GROUP_PARAMS: [&str; 8] = [
    "sensor", "metric", "from", "to", "group_by", "step", "tz", "format",
];

async fn group_query<S: BucketStore>(
    state: AppState<S>,
    principal: Principal,
    headers: HeaderMap,
    raw: Option<String>,
    with_step: bool,
) -> Result<Response, ApiError> {
    let allowed: &[&str] = if with_step {
        &GROUP_PARAMS
    } else {
        &GROUP_PARAMS[..5]
    };
    let params = Params::parse(raw.as_deref(), allowed, true)?;
    let csv = with_step && wants_csv(&headers, &params)?;
    let metric = metric(&params)?;
    let group_by = GroupBy::parse(params.get("group_by"))?;
    let tz = if with_step { parse_tz(&params)? } else { None };
    let r = range(&state, &params)?;
    let grid = if with_step {
        series_grid(&state, &params, &r, tz.as_ref().map(|t| &t.1))?
    } else {
        Grid::whole(r.from, r.to)
    };
    let members = members(&state, &principal, &params, &metric).await?;
    let mut keys: Vec<BTreeMap<String, Option<String>>> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    let mut series = Vec::with_capacity(members.len());
    for m in &members {
        let key = group_by.key(m);
        let group = match keys.iter().position(|k| *k == key) {
            Some(g) => g,
            None => {
                keys.push(key);
                sizes.push(0);
                keys.len() - 1
            }
        };
        sizes[group] += 1;
        series.push((Series { sensor: &m.sensor }, group));
    }
    let endpoint = if with_step {
        "group_series"
    } else {
        "group_average"
    };
    let aggs = evaluate(
        &state,
        endpoint,
        &metric,
        &r,
        grid.clone(),
        &series,
        keys.len(),
    )
    .await?;
    let mut groups = Vec::with_capacity(keys.len());
    for ((group, sensors), points) in keys.into_iter().zip(sizes).zip(aggs) {
        groups.push(if with_step {
            Group {
                group,
                sensors,
                aggregates: None,
                points: Some(points_of(&grid, &points, tz.as_ref().map(|t| &t.1))?),
            }
        } else {
            Group {
                group,
                sensors,
                aggregates: Some(Point::new(None, &points[0])),
                points: None,
            }
        });
    }
    groups.sort_by(|a, b| a.group.cmp(&b.group));
    if csv {
        let label = match &group_by {
            GroupBy::All => None,
            GroupBy::Sensor => Some("sensor".to_owned()),
            GroupBy::Label(n) => Some(n.clone()),
        };
        return Ok(csv_response(|w| {
            let mut header: Vec<&str> = label.iter().map(String::as_str).collect();
            header.push("sensors");
            header.extend(POINT_COLUMNS);
            w.write_record(&header)?;
            for g in &groups {
                let mut prefix: Vec<String> = g
                    .group
                    .values()
                    .map(|v| v.clone().unwrap_or_default())
                    .collect();
                prefix.push(g.sensors.to_string());
                for p in g.points.iter().flatten() {
                    w.write_record(csv_point(&prefix, p))?;
                }
            }
            Ok(())
        }));
    }
    Ok(Json(GroupResponse {
        metric: metric.to_string(),
        from: format_ms(r.from_ms),
        to: format_ms(r.to_ms),
        step: with_step.then(|| params.get("step").unwrap_or_default().to_owned()),
        tz: with_step.then(|| tz.map_or_else(|| "UTC".to_owned(), |t| t.0)),
        group_by: params.get("group_by").map(str::to_owned),
        groups,
    })
    .into_response())
}

#[utoipa::path(get, path = "/api/v1/average",
    params(("sensor" = Option<String>, Query, description = "A sensor id or glob"), ("metric" = Option<String>, Query),
        ("from" = String, Query), ("to" = String, Query), ("group_by" = Option<String>, Query, description = "sensor or label.<name>")),
    responses((status = 200, body = GroupResponse)))]
pub async fn group_average<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    group_query(state, principal, headers, raw, false).await
}

#[utoipa::path(get, path = "/api/v1/series",
    params(("sensor" = Option<String>, Query, description = "A sensor id or glob"), ("metric" = Option<String>, Query),
        ("from" = String, Query), ("to" = String, Query), ("step" = String, Query), ("tz" = Option<String>, Query),
        ("group_by" = Option<String>, Query, description = "sensor or label.<name>"), ("format" = Option<String>, Query)),
    responses((status = 200, body = GroupResponse), (status = 200, content_type = "text/csv", body = String)))]
pub async fn group_series<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    group_query(state, principal, headers, raw, true).await
}

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
        &sensor,
        metric.as_str(),
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

pub const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 100;

#[utoipa::path(get, path = "/api/v1/sensors",
    params(("prefix" = Option<String>, Query), ("limit" = Option<usize>, Query), ("after" = Option<String>, Query),
        ("metric" = Option<String>, Query)),
    responses((status = 200, body = SensorList)))]
pub async fn list_sensors<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> Result<Json<SensorList>, ApiError> {
    let params = Params::parse(
        raw.as_deref(),
        &["prefix", "limit", "after", "metric"],
        true,
    )?;
    let limit = match params.get("limit") {
        None => DEFAULT_PAGE,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|&n| (1..=MAX_PAGE).contains(&n))
            .ok_or_else(|| ApiError::bad_request(format!("limit must be 1 to {MAX_PAGE}")))?,
    };
    let metric = params
        .get("metric")
        .map(|m| MetricName::parse(m).map_err(|e| ApiError::bad_request(e.to_string())))
        .transpose()?;
    let query = SensorQuery {
        after: params.get("after"),
        prefix: params.get("prefix").unwrap_or_default(),
        labels: params.labels(),
        metric: metric.as_ref().map(MetricName::as_str),
    };
    let admitted = admit(&state).await?;
    let work = state
        .store
        .sensors(query, limit, |s| principal.may_access(&s.sensor));
    let found = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(
        &state,
        "sensors",
        Cost {
            documents: found.len() as u64,
            round_trips: 1,
        },
    );
    let next = (found.len() == limit)
        .then(|| found.last().map(|s| s.sensor.clone()))
        .flatten();
    let sensors = found
        .into_iter()
        .map(|s| {
            Ok(SensorEntry {
                last_seen: s.last_seen.map(|t| format_start(t, None)).transpose()?,
                sensor: s.sensor,
                metrics: s.metrics,
                labels: s.labels,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Json(SensorList { sensors, next }))
}

#[utoipa::path(put, path = "/api/v1/sensors/{sensor}/labels",
    params(("sensor" = String, Path)),
    request_body(content = Object, description = "The sensor's labels, replacing the ones it had: {\"site\": \"berlin\"}"),
    responses((status = 204, description = "Stored")))]
pub async fn put_labels<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    body: Result<Json<BTreeMap<String, String>>, axum::extract::rejection::JsonRejection>,
) -> Result<StatusCode, ApiError> {
    sensor_param(&principal, &sensor)?;
    let Json(labels) = body.map_err(|e| {
        ApiError::bad_request(format!(
            "the body must be a JSON object of label names to string values: {}",
            e.body_text()
        ))
    })?;
    let labels = Labels::parse(labels).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let admitted = admit(&state).await?;
    let work = state.store.set_labels(&sensor, &labels);
    admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(
        &state,
        "labels",
        Cost {
            documents: 1,
            round_trips: 1,
        },
    );
    Ok(StatusCode::NO_CONTENT)
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
        assert!(format_start(i64::MAX / 1000 + 1, None).is_err());
        assert_eq!(
            format_start(60, None).ok().as_deref(),
            Some("1970-01-01T00:01:00Z")
        );
        let berlin = TimeZone::get("Europe/Berlin").expect("bundled");
        assert_eq!(
            format_start(1_774_738_800, Some(&berlin)).ok().as_deref(),
            Some("2026-03-29T00:00:00+01:00")
        );
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
    fn steps_are_calendar_units_or_whole_minutes() {
        assert_eq!(parse_step("1m").ok(), Some(Step::Fixed(60)));
        assert_eq!(parse_step("15m").ok(), Some(Step::Fixed(900)));
        assert_eq!(parse_step("1h").ok(), Some(Step::Fixed(3600)));
        assert_eq!(parse_step("90m").ok(), Some(Step::Fixed(5400)));
        assert_eq!(parse_step("2d").ok(), Some(Step::Fixed(2 * 86400)));
        assert_eq!(parse_step("1d").ok(), Some(Step::Calendar(Calendar::Day)));
        assert_eq!(parse_step("1w").ok(), Some(Step::Calendar(Calendar::Week)));
        assert_eq!(
            parse_step("1mo").ok(),
            Some(Step::Calendar(Calendar::Month))
        );
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

    #[test]
    fn group_by_is_sensor_or_a_label() {
        assert_eq!(GroupBy::parse(None).ok(), Some(GroupBy::All));
        assert_eq!(GroupBy::parse(Some("sensor")).ok(), Some(GroupBy::Sensor));
        assert_eq!(
            GroupBy::parse(Some("label.site")).ok(),
            Some(GroupBy::Label("site".into()))
        );
        for bad in ["site", "label.", "label.__name__", "metric"] {
            assert!(GroupBy::parse(Some(bad)).is_err(), "{bad}");
        }
    }
}

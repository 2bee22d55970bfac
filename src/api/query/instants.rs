//! `GET /api/v1/sensors/{sensor}/at`: a sensor's value at given instants
//! (a report's 00:00 of each day, an event's time), with the readings it
//! came from (see `domain::instants` for what a reading stands for).
//!
//! One read answers every instant: the windows each instant needs (the gap
//! limit before it, and after it for a line) are cut into cells of one
//! grid, read as any series is (rollup slots where whole, buckets and
//! unstored readings elsewhere) for their first and last readings.

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use serde::Serialize;

use super::admission::{admit, store_error};
use super::groups::labels_of;
use super::range::{format_ms, metric, parse_instant};
use super::sensor_param;
use super::weighting::staleness;
use crate::api::descriptions as text;
use crate::api::error::ErrorBody;
use crate::api::params::Params;
use crate::api::{ApiError, AppState};
use crate::auth::Principal;
use crate::domain::{At, Labels, Sample, Weighting, value_at};
use crate::query::{Cost, Grid, Need, Question, Series};

/// A reading an answer came from.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AtReading {
    pub ts: String,
    pub value: f64,
}

/// The value at one instant.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AtValue {
    /// The instant asked.
    pub at: String,
    /// `null` where no reading stands for the instant.
    pub value: Option<f64>,
    /// The reading taken, or the two a line joins.
    pub readings: Vec<AtReading>,
}

/// `GET /api/v1/sensors/{sensor}/at`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AtResponse {
    pub sensor: String,
    pub metric: String,
    /// `previous` or `linear`.
    pub method: &'static str,
    /// The longest a reading stands for its value, and the longest gap a
    /// line joins.
    pub staleness_seconds: i64,
    pub values: Vec<AtValue>,
}

/// Minutes one answer may read minute by minute (about 140 days of them,
/// or a thousand instants anywhere): what a 400-day series at a step of
/// an hour reads at most.
const MAX_MINUTES: i64 = 200_000;

const TS: &str = "Instants, separated by commas: RFC 3339 timestamps or integer epoch milliseconds, at most `query.max_points` (10 000 by default); or give `from`, `to` and `every` instead";
const FROM: &str =
    "With `to` and `every`, instead of `ts`: the first instant (RFC 3339 or epoch milliseconds)";
const TO: &str =
    "The last instant, included when `every` reaches it; within `query.max_range` of `from`";
const EVERY: &str =
    "The interval between instants from `from`: a duration of whole seconds (`1h`, `1d`)";
const METHOD: &str = "`previous` (the default: the reading at or before the instant, while it holds) or `linear` (the reading at the instant's second, else the line between the readings either side when at most the staleness limit apart)";
const STALENESS: &str = "The longest a reading stands for its value (and the longest gap a line joins), a duration from `1s` to `query.max_range`; by default the sensor's `staleness` label, else `query.staleness` (1 day by default)";

/// The instants asked, in epoch milliseconds, in the order asked.
fn instants(state: &AppState, params: &Params) -> Result<Vec<i64>, ApiError> {
    let most = state.settings.query.max_points;
    let max_range_ms =
        i64::try_from(state.settings.query.max_range.as_millis()).unwrap_or(i64::MAX);
    let grid = [params.get("from"), params.get("to"), params.get("every")];
    let out = match (params.get("ts"), grid) {
        (Some(list), [None, None, None]) => {
            // Counted before anything is held.
            if list.split(',').count() > most {
                return Err(ApiError::bad_request(format!(
                    "ts holds more than query.max_points ({most}) instants"
                )));
            }
            list.split(',')
                .map(|t| parse_instant("ts", t.trim()))
                .collect::<Result<Vec<_>, _>>()?
        }
        (None, [Some(from), Some(to), Some(every)]) => {
            let (from, to) = (parse_instant("from", from)?, parse_instant("to", to)?);
            let every = humantime::parse_duration(every)
                .ok()
                .filter(|d| d.subsec_nanos() == 0 && d.as_secs() >= 1)
                .and_then(|d| i64::try_from(d.as_millis()).ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "every must be a duration of whole seconds, at least 1s (1h, 1d)",
                    )
                })?;
            if from > to || to - from > max_range_ms {
                return Err(ApiError::bad_request(
                    "to must not be before from, and at most query.max_range after it",
                ));
            }
            let count = (to - from) / every + 1;
            if usize::try_from(count).map_or(true, |c| c > most) {
                return Err(ApiError::bad_request(format!(
                    "from, to and every give more than query.max_points ({most}) instants"
                )));
            }
            (0..count).map(|k| from + k * every).collect()
        }
        _ => {
            return Err(ApiError::bad_request(
                "give ts (instants separated by commas), or from, to and every, not both",
            ));
        }
    };
    let (lo, hi) = (out.iter().min(), out.iter().max());
    if let (Some(lo), Some(hi)) = (lo, hi)
        && hi - lo > max_range_ms
    {
        return Err(ApiError::bad_request(
            "the instants span more than query.max_range",
        ));
    }
    Ok(out)
}

fn method(params: &Params) -> Result<At, ApiError> {
    match params.get("method") {
        None | Some("previous") => Ok(At::Previous),
        Some("linear") => Ok(At::Linear),
        Some(_) => Err(ApiError::bad_request("method must be previous or linear")),
    }
}

/// One sensor's value of a metric at each instant asked.
#[utoipa::path(get, path = "/api/v1/sensors/{sensor}/at",
    params(("sensor" = String, Path, description = text::SENSOR), ("metric" = Option<String>, Query, description = text::METRIC),
        ("ts" = Option<String>, Query, description = TS), ("from" = Option<String>, Query, description = FROM),
        ("to" = Option<String>, Query, description = TO), ("every" = Option<String>, Query, description = EVERY),
        ("method" = Option<String>, Query, description = METHOD), ("staleness" = Option<String>, Query, description = STALENESS)),
    responses(
        (status = 200, body = AtResponse, description = "A value per instant, in the order asked, with the readings it came from (times kept to the second)"),
        (status = 400, body = ErrorBody, description = text::BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY_SENSOR),
        (status = 500, body = ErrorBody, description = text::QUERY_FAILED),
        (status = 503, body = ErrorBody, description = text::QUERY_UNAVAILABLE)))]
pub async fn at(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<AtResponse>, ApiError> {
    sensor_param(&principal, &sensor)?;
    let params = Params::parse(
        raw.as_deref(),
        &["metric", "ts", "from", "to", "every", "method", "staleness"],
        false,
    )?;
    let metric = metric(&params)?;
    let how = method(&params)?;
    let asked = instants(&state, &params)?;
    let weighing = staleness(&state, &params, Weighting::Time)?;
    let labels = if weighing.asked() {
        Labels::default()
    } else {
        labels_of(&state, "at", &sensor).await?
    };
    let gap = weighing.limit(&labels);
    // Each instant's second: a reading at or before it is one whose second
    // is at most this.
    let seconds: Vec<i64> = asked.iter().map(|ms| ms.div_euclid(1000)).collect();
    let bounds = bounds(&seconds, gap, how);
    // Cells that end within an hour are read minute by minute (a minute
    // slot or bucket each, and an entry each in the read's plan): counted
    // before anything is planned, at most two partial hours a cell.
    let span_minutes = bounds
        .last()
        .zip(bounds.first())
        .map_or(0, |(b, a)| (b - a) / 60 + 1);
    let cells = i64::try_from(bounds.len()).unwrap_or(i64::MAX);
    if span_minutes.min(cells.saturating_mul(120)) > MAX_MINUTES {
        return Err(ApiError::bad_request(format!(
            "these instants and their staleness limit would be read minute by minute over more than {MAX_MINUTES} minutes: ask fewer instants, or over a shorter span"
        )));
    }
    let cells = edges(&state, metric.as_str(), &sensor, &bounds).await?;
    let values = asked
        .iter()
        .zip(&seconds)
        .map(|(&ms, &t)| {
            let (prev, next) = neighbours(&bounds, &cells, t, gap);
            let found = value_at(how, gap, t, prev, next);
            AtValue {
                at: format_ms(ms),
                value: found.as_ref().map(|f| f.0),
                readings: found
                    .map(|f| f.1)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|s| AtReading {
                        ts: format_ms(s.t.saturating_mul(1000)),
                        value: s.v,
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(Json(AtResponse {
        sensor,
        metric: metric.to_string(),
        method: match how {
            At::Previous => "previous",
            At::Linear => "linear",
        },
        staleness_seconds: gap,
        values,
    }))
}

/// The first and last readings of `sensor`'s `metric` in each cell between
/// `bounds`, in one read.
async fn edges(
    state: &AppState,
    metric: &str,
    sensor: &str,
    bounds: &[i64],
) -> Result<Vec<Option<(Sample, Sample)>>, ApiError> {
    let mut cells: Vec<Option<(Sample, Sample)>> = Vec::new();
    if bounds.len() > 1 {
        let admitted = admit(state).await?;
        let q = Question {
            metric,
            from: bounds[0],
            to: bounds[bounds.len() - 1],
            granularity: state.settings.granularity,
            need: Need::Summaries,
            max_time: admitted.max_time(),
            cache: None,
        };
        let one = [Series::of(sensor)];
        let read = crate::query::evaluate(
            state.store.as_ref(),
            &state.batcher,
            q,
            Grid::Bounds(bounds.to_vec()),
            &one,
            |_, got| {
                cells = got
                    .iter()
                    .map(|c| c.summary.as_ref().map(|s| (s.first, s.last)))
                    .collect();
            },
        );
        let cost: Cost = admitted
            .within(async { read.await.map_err(store_error) })
            .await?;
        admitted.done(state, "at", cost);
    }
    Ok(cells)
}

/// The grid's bounds: for each instant `t` (seconds), `(t − gap, t]` (a
/// reading that still holds at `t`) and, for a line, `(t, t + gap]`.
fn bounds(seconds: &[i64], gap: i64, how: At) -> Vec<i64> {
    let mut out = Vec::with_capacity(seconds.len() * 3);
    for &t in seconds {
        out.push(t.saturating_sub(gap).saturating_add(1));
        out.push(t.saturating_add(1));
        if how == At::Linear {
            out.push(t.saturating_add(gap).saturating_add(1));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The last reading in `(t − gap, t]` and the first in `(t, t + gap]`,
/// from the cells between `bounds`.
fn neighbours(
    bounds: &[i64],
    cells: &[Option<(Sample, Sample)>],
    t: i64,
    gap: i64,
) -> (Option<Sample>, Option<Sample>) {
    let cell_at = |second: i64| bounds.partition_point(|&b| b <= second);
    // Cells k cover [bounds[k], bounds[k + 1]).
    let (a, b) = (cell_at(t.saturating_sub(gap)), cell_at(t).min(cells.len()));
    let prev = (a..b)
        .rev()
        .find_map(|k| cells.get(k).copied().flatten())
        .map(|e| e.1);
    let (c, d) = (b, cell_at(t.saturating_add(gap)).min(cells.len()));
    let next = (c..d)
        .find_map(|k| cells.get(k).copied().flatten())
        .map(|e| e.0);
    (prev, next)
}

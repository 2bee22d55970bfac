//! Silence and uptime: which sensors have gone longer than their expected
//! interval without a reading (the listing's `silent=true`), and a series'
//! uptime over a range with its gaps.
//!
//! A sensor's expected interval is its `expected_interval` label (a
//! duration such as `30s`), else `query.expected_interval`. Uptime folds
//! the series' windows of [`uptime::step_for`] its interval, read as any
//! series is (rollup slots where complete, buckets and unstored readings
//! elsewhere), so 400 days cost what a series at that step costs and the
//! answer is the one every reading would give (see `query::uptime`).

use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use serde::Serialize;

use super::admission::{admit, store_error};
use super::groups::labels_of;
use super::range::{format_start, metric, range};
use super::sensor_param;
use crate::api::descriptions as text;
use crate::api::error::ErrorBody;
use crate::api::params::Params;
use crate::api::{ApiError, AppState};
use crate::auth::Principal;
use crate::domain::Labels;
use crate::query::uptime::{Coverage, step_for};
use crate::query::{Cost, Grid, Need, Question, Series};
use crate::store::{SensorInfo, SensorQuery};

/// The label that sets a sensor's expected interval.
pub const INTERVAL_LABEL: &str = "expected_interval";
/// Gaps one uptime answer lists (all are counted).
pub const MAX_GAPS: usize = 1000;
/// Registry entries read per page while looking for silent sensors.
const SCAN_PAGE: usize = 200;

/// Whole seconds of a duration text, at least one.
fn seconds(text: &str) -> Option<i64> {
    humantime::parse_duration(text)
        .ok()
        .filter(|d| d.subsec_nanos() == 0)
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .filter(|&s| s >= 1)
}

/// A sensor's expected interval in seconds: its label if that is a
/// duration, else the fleet's.
pub(crate) fn expected_interval(labels: &Labels, fleet: Duration) -> i64 {
    labels
        .get(INTERVAL_LABEL)
        .and_then(seconds)
        .unwrap_or_else(|| i64::try_from(fleet.as_secs()).unwrap_or(i64::MAX).max(1))
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// A silent sensor: its entry and the time of its newest reading of any
/// metric asked (none if it never sent one).
pub(crate) struct Silent {
    pub info: SensorInfo,
    pub last_reading: Option<i64>,
}

/// Up to `limit` sensors of `query` that `keep` keeps and that are silent
/// now, looking at `scan` sensors at most, in id order, and the id to page
/// on from (none when the registry was read to its end). Each sensor looked
/// at costs a newest-reading lookup per metric; the query's timeout bounds
/// the scan.
pub(crate) async fn silent_sensors(
    state: &AppState,
    endpoint: &str,
    query: SensorQuery<'_>,
    (limit, scan): (usize, usize),
    keep: impl Fn(&SensorInfo) -> bool + Send + Sync,
) -> Result<(Vec<Silent>, Option<String>), ApiError> {
    let admitted = admit(state).await?;
    let fleet = state.settings.query.expected_interval;
    let now = now();
    let work = async {
        let mut found = Vec::new();
        let mut after = query.after.map(str::to_owned);
        let mut lookups = 0u64;
        let mut scanned = 0usize;
        loop {
            let page = state
                .store
                .sensors(
                    SensorQuery {
                        after: after.as_deref(),
                        ..query.clone()
                    },
                    SCAN_PAGE,
                    &keep,
                )
                .await?;
            let ended = page.len() < SCAN_PAGE;
            for info in page {
                after = Some(info.sensor.clone());
                let interval = expected_interval(&info.labels, fleet);
                let mut last: Option<i64> = None;
                let metrics: Vec<&str> = match query.metric {
                    Some(m) => vec![m],
                    None => info.metrics.iter().map(String::as_str).collect(),
                };
                for m in metrics {
                    lookups += 1;
                    let newest = crate::query::latest(
                        state.store.as_ref(),
                        &state.batcher,
                        (&info.sensor, m),
                        info.last_seen,
                        admitted.max_time(),
                    )
                    .await?;
                    last = last.max(newest.map(|(ts, _)| ts));
                }
                if last.is_none_or(|t| now - t > interval) {
                    found.push(Silent {
                        info,
                        last_reading: last,
                    });
                    if found.len() == limit {
                        return Ok((found, after, lookups));
                    }
                }
                scanned += 1;
                if scanned == scan {
                    return Ok((found, after, lookups));
                }
            }
            if ended {
                return Ok((found, None, lookups));
            }
        }
    };
    let (found, next, lookups) = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(
        state,
        endpoint,
        Cost {
            documents: lookups,
            round_trips: lookups,
        },
    );
    Ok((found, next))
}

/// Keeps `hourglass_sensors_silent` current until the shutdown starts: a
/// count every `query.expected_interval` (at least 10 s) from the start,
/// the first one interval in (a sensor is silent after a whole interval;
/// and dashboards loaded at a start find the queries free). The registry
/// is counted a page at a time, each page one query (admitted as any,
/// under the endpoint `silence_count`), so a large fleet is counted within
/// the query timeout page by page.
pub async fn count_silent(state: AppState, shutdown: crate::shutdown::Shutdown) {
    let every = state
        .settings
        .query
        .expected_interval
        .max(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.triggered() => return,
        }
        match count_pages(&state).await {
            Ok(n) => state
                .metrics
                .sensors_silent
                .set(i64::try_from(n).unwrap_or(i64::MAX)),
            Err(e) => tracing::warn!(
                error = %e.message,
                "Could not count the silent sensors; trying again at the next interval."
            ),
        }
    }
}

async fn count_pages(state: &AppState) -> Result<usize, ApiError> {
    let mut count = 0;
    let mut after: Option<String> = None;
    loop {
        let query = SensorQuery {
            after: after.as_deref(),
            ..SensorQuery::default()
        };
        let scan = (usize::MAX, SCAN_PAGE);
        let (silent, next) = silent_sensors(state, "silence_count", query, scan, |_| true).await?;
        count += silent.len();
        match next {
            Some(next) => after = Some(next),
            None => return Ok(count),
        }
    }
}

/// `GET /api/v1/sensors/{sensor}/uptime`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UptimeResponse {
    pub sensor: String,
    pub metric: String,
    pub from: String,
    /// The end measured: the range's, or now if that is earlier (what has
    /// not happened yet is not downtime).
    pub to: String,
    /// The expected interval, in seconds.
    pub interval: i64,
    /// The share of the range within `interval` after a reading, 0 to 1.
    pub uptime: f64,
    /// The stretches without one, at most 1000, in time order.
    pub gaps: Vec<GapEntry>,
    /// Every gap, listed or not.
    pub gap_count: u64,
}

/// A stretch without a reading within the interval.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GapEntry {
    /// Its start, RFC 3339.
    pub from: String,
    /// Its end, RFC 3339.
    pub to: String,
}

/// Share of a range a sensor reported within its expected interval, with the gaps.
#[utoipa::path(get, path = "/api/v1/sensors/{sensor}/uptime",
    params(("sensor" = String, Path, description = text::SENSOR), ("metric" = Option<String>, Query, description = text::METRIC),
        ("from" = String, Query, description = text::FROM), ("to" = String, Query, description = "End of the range, excluded: RFC 3339 or epoch milliseconds, as `from`; at most `query.max_range` (400 days by default) after it; measured up to now at most"),
        ("interval" = Option<String>, Query, description = "The expected interval, a whole number of seconds from `1s` to `query.max_range` (`30s`, `5m`, `1h`); by default the sensor's `expected_interval` label, else `query.expected_interval` (5 minutes by default)")),
    responses(
        (status = 200, body = UptimeResponse, description = "The share of the range within the interval after a reading, and the gaps"),
        (status = 400, body = ErrorBody, description = text::BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY_SENSOR),
        (status = 500, body = ErrorBody, description = text::QUERY_FAILED),
        (status = 503, body = ErrorBody, description = text::QUERY_UNAVAILABLE)))]
pub async fn uptime(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<UptimeResponse>, ApiError> {
    // Long: the request's steps in order: parameters, the interval, the coverage, the gaps.
    sensor_param(&principal, &sensor)?;
    let params = Params::parse(raw.as_deref(), &["metric", "from", "to", "interval"], false)?;
    let metric = metric(&params)?;
    let r = range(&state, &params)?;
    let max = i64::try_from(state.settings.query.max_range.as_secs()).unwrap_or(i64::MAX);
    let asked = params
        .get("interval")
        .map(|text| {
            seconds(text).filter(|&s| s <= max).ok_or_else(|| {
                ApiError::bad_request(
                    "interval must be a whole number of seconds (30s, 5m, 1h), at most query.max_range",
                )
            })
        })
        .transpose()?;
    let interval = match asked {
        Some(i) => i,
        None => {
            let labels = labels_of(&state, "uptime", &sensor).await?;
            expected_interval(&labels, state.settings.query.expected_interval)
        }
    };
    let (from, to) = (r.from, r.to.min(now()).max(r.from));
    let step = step_for(interval);
    let mut coverage = Coverage::new(from, to, interval, MAX_GAPS);
    // Windows of `step` from an interval before the range (a reading just
    // before it covers its start), at most `max_points` a read.
    let chunk = step.saturating_mul(i64::try_from(state.settings.query.max_points).unwrap_or(1));
    let admitted = admit(&state).await?;
    let work = async {
        let mut cost = Cost::default();
        let mut at = from.saturating_sub(interval);
        while at < to {
            let end = (at - at.rem_euclid(step)).saturating_add(chunk).min(to);
            let q = Question {
                metric: metric.as_str(),
                from: at,
                to: end,
                granularity: state.settings.granularity,
                need: Need::Summaries,
                max_time: admitted.max_time(),
                cache: None,
            };
            let spent = crate::query::evaluate(
                state.store.as_ref(),
                &state.batcher,
                q,
                Grid::aligned(at, end, step),
                &[Series::of(&sensor)],
                |_, cells| {
                    for summary in cells.iter().filter_map(|c| c.summary.as_ref()) {
                        coverage.add(summary.first.t, summary.last.t);
                    }
                },
            )
            .await?;
            cost.documents += spent.documents;
            cost.round_trips += spent.round_trips;
            at = end;
        }
        Ok(cost)
    };
    let cost = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(&state, "uptime", cost);
    let (share, gaps, gap_count) = coverage.finish();
    Ok(Json(UptimeResponse {
        sensor,
        metric: metric.to_string(),
        from: format_start(from, None)?,
        to: format_start(to, None)?,
        interval,
        uptime: share,
        gaps: gaps
            .into_iter()
            .map(|g| {
                Ok(GapEntry {
                    from: format_start(g.from, None)?,
                    to: format_start(g.to, None)?,
                })
            })
            .collect::<Result<_, ApiError>>()?,
        gap_count,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sensors_label_sets_its_interval_and_anything_else_is_the_fleets() {
        let fleet = Duration::from_secs(300);
        let labels = |v: &str| {
            Labels::parse([(INTERVAL_LABEL.to_owned(), v.to_owned())].into()).expect("labels")
        };
        assert_eq!(expected_interval(&labels("30s"), fleet), 30);
        assert_eq!(expected_interval(&labels("1h"), fleet), 3600);
        assert_eq!(expected_interval(&labels("soon"), fleet), 300);
        assert_eq!(expected_interval(&labels("500ms"), fleet), 300);
        assert_eq!(expected_interval(&Labels::default(), fleet), 300);
    }
}

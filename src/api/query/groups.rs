//! `GET /api/v1/average` and `GET /api/v1/series`: groups of sensors from
//! the registry, each group's figures exact over all its sensors' readings.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Extension, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use wildmatch::WildMatch;

use super::admission::{admit, store_error};
use super::csv::{csv_point, csv_response, point_columns, wants_csv};
use super::points::{Ask, group_points};
use super::range::{coarse, coarse_header, format_ms, metric, parse_tz, range, series_grid};
use super::{Group, GroupResponse};
use crate::api::descriptions as text;
use crate::api::error::ErrorBody;
use crate::api::params::Params;
use crate::api::{ApiError, AppState};
use crate::auth::Principal;
use crate::domain::{Labels, MetricName};
use crate::query::{Cost, Grid, Series};
use crate::store::{SensorInfo, SensorQuery};

/// How a group query groups its sensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupBy {
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
pub(crate) async fn members(
    state: &AppState,
    principal: &Principal,
    params: &Params,
    metric: &MetricName<'_>,
) -> Result<Vec<SensorInfo>, ApiError> {
    let (prefix, pattern) = sensor_glob(params)?;
    for (name, value) in params.labels() {
        if value.is_empty() {
            return Err(ApiError::bad_request(format!("label.{name} needs a value")));
        }
    }
    let max = state.settings.query.max_series;
    let query = SensorQuery {
        after: None,
        prefix,
        labels: params.labels(),
        metric: Some(metric.as_str()),
        through: None,
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

/// One sensor's labels from the registry (none if it is not registered).
pub(crate) async fn labels_of(
    state: &AppState,
    endpoint: &str,
    sensor: &str,
) -> Result<Labels, ApiError> {
    let admitted = admit(state).await?;
    let query = SensorQuery {
        prefix: sensor,
        ..SensorQuery::default()
    };
    let work = state.store.sensors(query, 1, |s| s.sensor == sensor);
    let found = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(
        state,
        endpoint,
        Cost {
            documents: 1,
            round_trips: 1,
        },
    );
    Ok(found
        .into_iter()
        .next()
        .map(|s| s.labels)
        .unwrap_or_default())
}

/// `sensor=`, a sensor id or a glob of one (all sensors when absent): the
/// literal prefix the registry's index narrows to, and the pattern.
pub(crate) fn sensor_glob(params: &Params) -> Result<(&str, WildMatch), ApiError> {
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
    // Matching costs the glob's length times the id's: a glob longer than
    // any id is refused (every character but `*` matches one of the id's).
    if glob.len() > crate::domain::SENSOR_MAX_LEN {
        return Err(ApiError::bad_request(format!(
            "sensor: a glob is at most {} characters, like a sensor id",
            crate::domain::SENSOR_MAX_LEN
        )));
    }
    let prefix = &glob[..glob.find(['*', '?']).unwrap_or(glob.len())];
    Ok((prefix, WildMatch::new(glob)))
}

/// A group query string read as the route reads it, without a store: the
/// parameters, metric, grouping, time zone, step and instants, and the
/// sensor glob matched against `ids`; how many match. For the fuzz target
/// of the JSON API's parameters.
pub fn check_group_params(raw: &str, ids: &[&str]) -> Result<usize, String> {
    let params = Params::parse(Some(raw), &GROUP_PARAMS, true).map_err(|e| e.message)?;
    metric(&params).map_err(|e| e.message)?;
    GroupBy::parse(params.get("group_by")).map_err(|e| e.message)?;
    super::weighting::weighting(&params).map_err(|e| e.message)?;
    super::quantiles::quantiles(&params).map_err(|e| e.message)?;
    parse_tz(&params).map_err(|e| e.message)?;
    if let Some(step) = params.get("step") {
        super::parse_step(step).map_err(|e| e.message)?;
    }
    for name in ["from", "to"] {
        if let Some(t) = params.get(name) {
            super::parse_instant(name, t).map_err(|e| e.message)?;
        }
    }
    let (prefix, pattern) = sensor_glob(&params).map_err(|e| e.message)?;
    Ok(ids
        .iter()
        .filter(|id| id.starts_with(prefix) && pattern.matches(id))
        .count())
}

/// Every group route's parameters (the fuzz target reads them all).
pub(crate) const GROUP_PARAMS: [&str; 11] = [
    "sensor",
    "metric",
    "from",
    "to",
    "group_by",
    "step",
    "tz",
    "format",
    "weighting",
    "staleness",
    "quantiles",
];
const AVERAGE_PARAMS: [&str; 8] = [
    "sensor",
    "metric",
    "from",
    "to",
    "group_by",
    "weighting",
    "staleness",
    "quantiles",
];

pub(crate) async fn group_query(
    state: AppState,
    principal: Principal,
    headers: HeaderMap,
    raw: Option<String>,
    with_step: bool,
) -> Result<Response, ApiError> {
    // Long: the request's steps in order: parameters, members, their points, then JSON or CSV.
    let allowed: &[&str] = if with_step {
        &GROUP_PARAMS
    } else {
        &AVERAGE_PARAMS
    };
    let params = Params::parse(raw.as_deref(), allowed, true)?;
    let csv = with_step && wants_csv(&headers, &params)?;
    let metric = metric(&params)?;
    let group_by = GroupBy::parse(params.get("group_by"))?;
    let weighing = super::weighting::weighing(&state, &params)?;
    let asked = super::quantiles::quantiles(&params)?;
    let tz = if with_step { parse_tz(&params)? } else { None };
    let zone = tz.as_ref().map(|t| &t.1);
    let mut r = range(&state, &params)?;
    let (grid, coarse) = if with_step {
        let grid = series_grid(&state, &params, &r, zone)?;
        let c = coarse(&state, &mut r, Some(&grid))?;
        (grid, c)
    } else {
        let c = coarse(&state, &mut r, None)?;
        (Grid::whole(r.from, r.to), c)
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
        series.push((Series::listed(m), group, m));
    }
    check_answer_size(&state, keys.len(), grid.points())?;
    let endpoint = if with_step {
        "group_series"
    } else {
        "group_average"
    };
    let limited: Vec<(Series<'_>, usize, i64)> = series
        .iter()
        .map(|(s, g, m)| (*s, *g, weighing.map_or(0, |how| how.limit(&m.labels))))
        .collect();
    let ask = Ask::new(endpoint, &metric, &r, &grid, zone, weighing, asked.as_ref());
    let each_group = group_points(&state, &ask, &limited, keys.len()).await?;
    let mut groups = Vec::with_capacity(keys.len());
    for ((group, sensors), mut points) in keys.into_iter().zip(sizes).zip(each_group) {
        groups.push(if with_step {
            Group {
                group,
                sensors,
                aggregates: None,
                points: Some(points),
            }
        } else {
            let mut whole = points.pop();
            if let Some(p) = whole.as_mut() {
                p.start = None;
            }
            Group {
                group,
                sensors,
                aggregates: whole,
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
        let mut response = csv_response(|w| {
            let mut header: Vec<&str> = label.iter().map(String::as_str).collect();
            header.push("sensors");
            let columns = point_columns(weighing.is_some(), asked.as_ref());
            header.extend(columns.iter().map(String::as_str));
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
        });
        coarse_header(&mut response, coarse.as_ref());
        return Ok(response);
    }
    Ok(Json(GroupResponse {
        metric: metric.to_string(),
        from: format_ms(r.from_ms),
        to: format_ms(r.to_ms),
        step: with_step.then(|| params.get("step").unwrap_or_default().to_owned()),
        tz: with_step.then(|| tz.map_or_else(|| "UTC".to_owned(), |t| t.0)),
        group_by: params.get("group_by").map(str::to_owned),
        weighting: weighing.map(|w| w.name()),
        groups,
        coarse,
    })
    .into_response())
}

/// A group route's 400.
const GROUP_BAD_QUERY: &str = "A parameter is missing, unknown, given twice, malformed or out of its bounds (the message says which and why), or the query covers more than `query.max_series` (1000 by default) sensors";
/// A group route's 422.
const GROUP_TOO_BIG: &str = "The answer (groups times points) would take more than `query.max_memory_per_query`; or a sum (or, weighted by time, a time integral) is beyond the range of a double; or, with `weighting=time` or `linear`, gaps over the staleness limit span more than 31 days of hours to read reading by reading";

/// The average over every matching sensor, or per group of a label.
#[utoipa::path(get, path = "/api/v1/average",
    params(("sensor" = Option<String>, Query, description = text::SENSOR_GLOB),
        ("label.<name>" = Option<String>, Query, description = text::LABEL_FILTER),
        ("metric" = Option<String>, Query, description = text::METRIC),
        ("from" = String, Query, description = text::FROM), ("to" = String, Query, description = text::TO),
        ("group_by" = Option<String>, Query, description = text::GROUP_BY),
        ("weighting" = Option<String>, Query, description = text::WEIGHTING), ("staleness" = Option<String>, Query, description = text::STALENESS),
        ("quantiles" = Option<String>, Query, description = text::QUANTILES)),
    responses(
        (status = 200, body = GroupResponse, description = "Each group's aggregates, exact over all its sensors' readings"),
        (status = 400, body = ErrorBody, description = GROUP_BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY),
        (status = 422, body = ErrorBody, description = GROUP_TOO_BIG),
        (status = 500, body = ErrorBody, description = text::QUERY_FAILED),
        (status = 503, body = ErrorBody, description = text::QUERY_UNAVAILABLE)))]
pub async fn group_average(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    group_query(state, principal, headers, raw, false).await
}

/// What one point of an answer holds, in memory and as JSON, at most (its
/// start, the aggregates, held seconds, a few quantiles).
const ANSWER_POINT_BYTES: usize = 256;

/// Refuses an answer of `groups` × `points` past the query's memory
/// (`query.max_memory_per_query`) before any of it is read or built.
fn check_answer_size(state: &AppState, groups: usize, points: usize) -> Result<(), ApiError> {
    let max = state.settings.query.max_memory_per_query;
    let bytes = groups
        .saturating_mul(points)
        .saturating_mul(ANSWER_POINT_BYTES);
    if bytes > max {
        return Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "the answer would hold {groups} groups of {points} points, more than query.max_memory_per_query ({max} bytes); use a longer step, fewer sensors or a coarser group_by"
            ),
        ));
    }
    Ok(())
}

/// Step series over every matching sensor, or per group of a label.
#[utoipa::path(get, path = "/api/v1/series",
    params(("sensor" = Option<String>, Query, description = text::SENSOR_GLOB),
        ("label.<name>" = Option<String>, Query, description = text::LABEL_FILTER),
        ("metric" = Option<String>, Query, description = text::METRIC),
        ("from" = String, Query, description = text::FROM), ("to" = String, Query, description = text::TO),
        ("step" = String, Query, description = text::STEP), ("tz" = Option<String>, Query, description = text::TZ),
        ("group_by" = Option<String>, Query, description = text::GROUP_BY), ("format" = Option<String>, Query, description = text::FORMAT),
        ("weighting" = Option<String>, Query, description = text::WEIGHTING), ("staleness" = Option<String>, Query, description = text::STALENESS),
        ("quantiles" = Option<String>, Query, description = text::QUANTILES)),
    responses(
        (status = 200, description = "Each group's points, exact over all its sensors' readings; CSV with `format=csv` or `Accept: text/csv` (the group's label column and `sensors` before the point columns)",
            content((GroupResponse = "application/json"), (String = "text/csv"))),
        (status = 400, body = ErrorBody, description = GROUP_BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY),
        (status = 422, body = ErrorBody, description = GROUP_TOO_BIG),
        (status = 500, body = ErrorBody, description = text::QUERY_FAILED),
        (status = 503, body = ErrorBody, description = text::QUERY_UNAVAILABLE)))]
pub async fn group_series(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    group_query(state, principal, headers, raw, true).await
}

#[cfg(test)]
mod tests {
    use super::*;

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

//! The sensor registry's routes: the listing, paged, and labels.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;

use super::admission::{admit, store_error};
use super::groups::sensor_glob;
use super::range::format_start;
use super::silence::silent_sensors;
use super::{SensorEntry, SensorList, sensor_param};
use crate::api::descriptions as text;
use crate::api::error::ErrorBody;
use crate::api::params::Params;
use crate::api::{ApiError, AppState};
use crate::auth::Principal;
use crate::domain::{Labels, MetricName};
use crate::query::Cost;
use crate::store::SensorQuery;

pub const MAX_PAGE: usize = 1000;
pub(crate) const DEFAULT_PAGE: usize = 100;

/// Lists registered sensors with their metrics, labels and last reading, a page at a time.
#[utoipa::path(get, path = "/api/v1/sensors",
    params(("prefix" = Option<String>, Query, description = "Only ids starting with this text (the literal start of a `sensor` glob does the same)"),
        ("sensor" = Option<String>, Query, description = text::SENSOR_GLOB),
        ("label.<name>" = Option<String>, Query, description = text::LABEL_FILTER),
        ("limit" = Option<usize>, Query, description = "Sensors per page: 1 to 1000; 100 when absent"),
        ("after" = Option<String>, Query, description = "Ids after this one, excluded: the previous page's `next`; from the first id when absent"),
        ("through" = Option<String>, Query, description = "Ids up to this one, included: a page's end; to the last id when absent"),
        ("metric" = Option<String>, Query, description = "Only sensors with readings of this metric (1 to 64 characters of A-Z a-z 0-9 _ -); any metric when absent"),
        ("silent" = Option<bool>, Query, description = "`true`: only sensors without a reading (of `metric`, or of any of their metrics) within their expected interval (their `expected_interval` label, else `query.expected_interval`, 5 minutes by default), each with `last_reading`; `false` by default")),
    responses(
        (status = 200, body = SensorList, description = "A page of sensors in id order; `next` is `null` on the last"),
        (status = 400, body = ErrorBody, description = text::BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY),
        (status = 500, body = ErrorBody, description = text::QUERY_FAILED),
        (status = 503, body = ErrorBody, description = text::QUERY_UNAVAILABLE)))]
pub async fn list_sensors(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> Result<Json<SensorList>, ApiError> {
    // Long: the request's steps in order: parameters, the listing page by page, the answer.
    let params = Params::parse(
        raw.as_deref(),
        &[
            "prefix", "sensor", "limit", "after", "through", "metric", "silent",
        ],
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
    let (glob_prefix, pattern) = sensor_glob(&params)?;
    // Both narrow the range read: the longer prefix of the two (a `sensor`
    // glob and a `prefix` that disagree match nothing).
    let prefix = params.get("prefix").unwrap_or_default();
    let prefix = if prefix.len() >= glob_prefix.len() {
        prefix
    } else {
        glob_prefix
    };
    let query = SensorQuery {
        after: params.get("after"),
        prefix,
        labels: params.labels(),
        metric: metric.as_ref().map(MetricName::as_str),
        through: params.get("through"),
    };
    let silent = match params.get("silent") {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::bad_request("silent must be true or false")),
    };
    if silent {
        let keep = |s: &crate::store::SensorInfo| {
            pattern.matches(&s.sensor)
                && s.sensor.starts_with(prefix)
                && principal.may_access(&s.sensor)
        };
        let (found, next) =
            silent_sensors(&state, "sensors", query, (limit, usize::MAX), keep).await?;
        let sensors = found
            .into_iter()
            .map(|s| {
                Ok(SensorEntry {
                    last_seen: s
                        .info
                        .last_seen
                        .map(|t| format_start(t, None))
                        .transpose()?,
                    last_reading: Some(s.last_reading.map(|t| format_start(t, None)).transpose()?),
                    sensor: s.info.sensor,
                    metrics: s.info.metrics,
                    labels: s.info.labels,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        return Ok(Json(SensorList { sensors, next }));
    }
    let admitted = admit(&state).await?;
    let work = state.store.sensors(query, limit, |s| {
        pattern.matches(&s.sensor)
            && s.sensor.starts_with(prefix)
            && principal.may_access(&s.sensor)
    });
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
                last_reading: None,
                sensor: s.sensor,
                metrics: s.metrics,
                labels: s.labels,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Json(SensorList { sensors, next }))
}

/// Replaces a sensor's labels.
#[utoipa::path(put, path = "/api/v1/sensors/{sensor}/labels", tag = "ingest",
    params(("sensor" = String, Path, description = "The sensor's id: 1 to 128 characters of A-Z a-z 0-9 _ . : -; registered by this if it is not yet")),
    request_body(content = Object, description = "The sensor's labels, replacing the ones it had: `{\"site\": \"berlin\"}`. Names are Prometheus label names (`[A-Za-z_][A-Za-z0-9_]*`, at most 64 characters, not starting with `__`, not `sensor`); values 1 to 128 bytes without control or invisible formatting characters (bidirectional overrides, zero-width spaces); at most 32 labels"),
    responses(
        (status = 204, description = "Stored"),
        (status = 400, body = ErrorBody, description = "The body is not a JSON object of label names to string values (a body larger than `http.max_body_bytes` not announced as such by `Content-Length`, chunked or gzipped, included), or a name, a value or the sensor id is invalid; nothing changed"),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = "With `auth.enabled`: the token lacks the `ingest` scope, or is a device token whose `sensors` do not cover this sensor; or a browser sent the request from another site (`Origin`, `Sec-Fetch-Site`), whatever `auth.enabled` says"),
        (status = 413, body = ErrorBody, description = "`Content-Length` announces more than `http.max_body_bytes` (8 MiB by default)"),
        (status = 415, description = "`Content-Encoding` is not `gzip` (an empty body, with `Accept-Encoding`)"),
        (status = 429, body = ErrorBody, description = "The sensor is not registered yet, and registering it would pass the hour's new-series bound (`cardinality.max_new_series_per_hour` or the token's share); `Retry-After` is the seconds to the next hour"),
        (status = 500, body = ErrorBody, description = "Storage refused the write for good (logged)"),
        (status = 503, body = ErrorBody, description = "Retry later: storage is unavailable, or the write took longer than `query.timeout` (10 s by default) or waited that long for one of `query.max_concurrency` slots; more than `http.max_concurrent_requests` API requests are in progress; or the request took longer than `http.request_timeout` (an empty body)")))]
pub async fn put_labels(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(sensor): Path<String>,
    body: Result<Json<BTreeMap<String, String>>, axum::extract::rejection::JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let sensor = sensor_param(&principal, &sensor)?;
    let Json(labels) = body.map_err(|e| {
        ApiError::bad_request(format!(
            "the body must be a JSON object of label names to string values: {}",
            e.body_text()
        ))
    })?;
    let labels = Labels::parse(labels).map_err(|e| ApiError::bad_request(e.to_string()))?;
    // A registry entry the write may create is a new series to the guard.
    state
        .intake
        .admit_sensors(&[&sensor], principal.token_name())
        .map_err(|refused| ApiError::from(crate::journal::IntakeError::NewSeries(refused)))?;
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

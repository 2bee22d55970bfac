//! `POST /api/v1/readings`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::descriptions as text;
use super::error::ErrorBody;
use super::{ApiError, AppState};
use crate::auth::Principal;
use crate::domain::{BucketKey, Granularity, Reading};
use crate::ingest::decode::csv::{CsvFormat, TsUnit, decode_csv};
use crate::ingest::decode::{DecodeContext, DecodeError, Detail, decode_ndjson, decode_readings};
use crate::journal::{IntakeError, NotSafe, Wait};
use crate::telemetry::metrics::{Rejection, Source};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestParams {
    /// Answer 202 once queued instead of 200 once safe.
    #[serde(rename = "async", default)]
    pub async_: bool,
    /// `stored`: answer once in MongoDB rather than once in the journal.
    pub wait: Option<WaitFor>,
    /// CSV: how integer timestamps count.
    pub ts_unit: Option<TsUnit>,
    /// CSV: the columns holding fields not in columns of their own names.
    #[serde(rename = "column.sensor")]
    pub column_sensor: Option<String>,
    #[serde(rename = "column.metric")]
    pub column_metric: Option<String>,
    #[serde(rename = "column.ts")]
    pub column_ts: Option<String>,
    #[serde(rename = "column.value")]
    pub column_value: Option<String>,
    /// CSV: columns left out, separated by commas.
    pub ignore: Option<String>,
}

impl IngestParams {
    /// How a CSV body is read; `None` when no CSV parameter is given.
    fn csv(&self) -> Option<CsvFormat> {
        let mapping: Vec<(String, String)> = [
            ("sensor", &self.column_sensor),
            ("metric", &self.column_metric),
            ("ts", &self.column_ts),
            ("value", &self.column_value),
        ]
        .into_iter()
        .filter_map(|(f, c)| Some((f.to_owned(), c.clone()?)))
        .collect();
        let ignore: Vec<String> = self
            .ignore
            .iter()
            .flat_map(|i| i.split(','))
            .map(str::to_owned)
            .collect();
        (self.ts_unit.is_some() || !mapping.is_empty() || !ignore.is_empty()).then(|| CsvFormat {
            mapping,
            ignore,
            ts_unit: self.ts_unit.unwrap_or_default(),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitFor {
    Stored,
}

/// The answer to a write that was taken.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Accepted {
    /// How many readings the request carried, all taken.
    pub accepted: usize,
}

/// A body's format, by its `Content-Type`: JSON (a reading or an array of
/// them), NDJSON (a reading with its `ts` per line: the export's format,
/// which `hourglass import` sends as it reads it), or CSV with a header row
/// (what `hourglass import` sends of a CSV file).
enum Body {
    Json,
    Ndjson,
    Csv(CsvFormat),
}

impl Body {
    fn of(headers: &HeaderMap, params: &IngestParams) -> Option<Result<Self, ApiError>> {
        let mime = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())?
            .trim();
        let csv = params.csv();
        let csv_params = csv.is_some();
        let body = if mime.eq_ignore_ascii_case("text/csv") {
            Body::Csv(csv.unwrap_or_default())
        } else if mime.eq_ignore_ascii_case("application/json") {
            Body::Json
        } else if mime.eq_ignore_ascii_case("application/x-ndjson") {
            Body::Ndjson
        } else {
            return None;
        };
        if csv_params && !matches!(body, Body::Csv(_)) {
            return Some(Err(ApiError::bad_request(
                "ts_unit, column.<field> and ignore apply to a text/csv body",
            )));
        }
        Some(Ok(body))
    }

    fn decode<'a>(
        &self,
        body: &'a [u8],
        ctx: &DecodeContext,
    ) -> Result<Vec<Reading<'a>>, DecodeError> {
        match self {
            Body::Json => decode_readings(body, ctx),
            Body::Ndjson => decode_ndjson(body, ctx),
            Body::Csv(format) => decode_csv(body, format, ctx),
        }
    }
}

impl From<DecodeError> for ApiError {
    fn from(e: DecodeError) -> Self {
        let message = e.to_string();
        match e {
            DecodeError::TooMany { .. } => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message),
            DecodeError::Invalid { details, .. } => ApiError {
                details,
                ..ApiError::bad_request(message)
            },
            DecodeError::Malformed(_) | DecodeError::NotReadings | DecodeError::Csv(_) => {
                ApiError::bad_request(message)
            }
        }
    }
}

impl From<IntakeError> for ApiError {
    fn from(e: IntakeError) -> Self {
        match e {
            IntakeError::Full(_) | IntakeError::Busy => {
                ApiError::unavailable("the service is at capacity; retry later")
            }
            IntakeError::JournalFull { .. } => {
                ApiError::unavailable("the journal is full while storage catches up; retry later")
            }
            IntakeError::Closed => ApiError::unavailable("the service is shutting down"),
            // Not a 503: retrying soon cannot help; the next hour can.
            IntakeError::NewSeries(refused) => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, refused.to_string())
            }
        }
    }
}

/// Takes readings as JSON, NDJSON or CSV; 200 once journaled (or stored, with ?wait=stored).
#[utoipa::path(post, path = "/api/v1/readings",
    params(
        ("wait" = Option<String>, Query, description = "`stored`: answer once the readings are stored in MongoDB rather than once in the journal (fsync'd; the default); not with `async`"),
        ("async" = Option<bool>, Query, description = "`true`: answer 202 as soon as the readings are queued, before they are safe; `false` by default; not with `wait`"),
        ("ts_unit" = Option<String>, Query, description = "`text/csv` only: how `ts` is written: `auto` (RFC 3339, or integer epoch milliseconds as in JSON; the default), `s`, `ms`, `us` or `ns` (integer epoch seconds, milli-, micro- or nanoseconds); kept in whole seconds"),
        ("column.sensor" = Option<String>, Query, description = "`text/csv` only: the header name of the column holding the sensor id, when it is not `sensor`"),
        ("column.metric" = Option<String>, Query, description = "`text/csv` only: the column holding the metric, when it is not `metric` (no such column: every reading of the default metric, `value`)"),
        ("column.ts" = Option<String>, Query, description = "`text/csv` only: the column holding the timestamp, when it is not `ts`"),
        ("column.value" = Option<String>, Query, description = "`text/csv` only: the column holding the value, when it is not `value`"),
        ("ignore" = Option<String>, Query, description = "`text/csv` only: header names of columns to leave out, separated by commas (any other column that holds no field refuses the body; an unnamed one is left out)")),
    request_body(description = "A reading `{sensor, metric?, ts, value}` or an array of them (`application/json`); one reading with its `ts` per line (`application/x-ndjson`, the export's format); or a header row naming sensor, metric?, ts and value, then a reading per row (`text/csv`). `Content-Encoding: gzip` is decompressed",
        content((Object = "application/json"), (String = "application/x-ndjson"), (String = "text/csv"))),
    responses(
        (status = 200, body = Accepted, description = "The readings are safe: in the journal, fsync'd (the default), or stored in MongoDB with `wait=stored` or `journal.enabled = false`"),
        (status = 202, body = Accepted, description = "With `async=true`: the readings are queued (for the journal, or the next flush without it), not yet safe"),
        (status = 400, body = ErrorBody, description = "A reading is invalid (each listed with its index in `details`), the body is not what its `Content-Type` says, or a parameter is wrong (`async` with `wait`, CSV parameters with another type); nothing was stored"),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = "With `auth.enabled`: the token lacks the `ingest` scope, or is a device token and a reading names a sensor outside its `sensors`; or a browser sent the request from another site (`Origin`, `Sec-Fetch-Site`), whatever `auth.enabled` says. Nothing was stored"),
        (status = 413, body = ErrorBody, description = "The body is larger than `http.max_body_bytes` (8 MiB by default; a gzipped body counts decompressed), or holds more than `ingest.max_readings_per_request` (50 000 by default) readings; nothing was stored"),
        (status = 415, body = ErrorBody, description = "`Content-Type` is not `application/json`, `application/x-ndjson` or `text/csv`; or `Content-Encoding` is not `gzip` (then an empty body, with `Accept-Encoding`)"),
        (status = 422, body = ErrorBody, description = "Storage can never apply the bucket update of some readings: those, listed by index in `details`, are in the dead-letter collection; every other reading was stored"),
        (status = 429, body = ErrorBody, description = "The readings would create more new series (sensor and metric pairs) this clock hour than `cardinality.max_new_series_per_hour` or the token's share allows; nothing was stored; `Retry-After` is the seconds to the next hour"),
        (status = 503, body = ErrorBody, description = "Retry later (a retry is always safe): at a bound (the journal is full; without it, `batcher.max_buffered_readings` or `batcher.max_buckets`), the journal write failed, shutting down, not confirmed within `http.write_timeout` (with `wait=stored` or the journal off; the readings stay queued), more than `http.max_concurrent_requests` API requests in progress, or the request took longer than `http.request_timeout` (an empty body)")))]
pub async fn post_readings(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    params: Result<Query<IngestParams>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if params.async_ && params.wait.is_some() {
        return Err(ApiError::bad_request(
            "async=true answers before anything is stored; it cannot be combined with wait",
        ));
    }
    let wait = match (params.async_, params.wait) {
        (true, _) => Wait::Queued,
        (false, Some(WaitFor::Stored)) => Wait::Stored,
        (false, None) => Wait::Safe,
    };
    let metrics = &state.metrics;
    let Some(body_format) = Body::of(&headers, &params) else {
        metrics.rejected(Source::Http, Rejection::ContentType, 1);
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json, application/x-ndjson for one reading with its ts per line, or text/csv with a header row",
        ));
    };
    let body_format = body_format?;
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => {
            metrics.rejected(Source::Http, Rejection::TooLarge, 1);
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body is larger than {} bytes",
                    state.settings.http.max_body_bytes
                ),
            )
        }
        status => {
            metrics.rejected(Source::Http, Rejection::Malformed, 1);
            ApiError::new(status, e.body_text())
        }
    })?;
    let ctx = state
        .settings
        .ingest
        .decode_context(jiff::Timestamp::now().as_second());
    let readings = body_format.decode(&body, &ctx).inspect_err(|e| {
        let (reason, n) = e.rejection();
        metrics.rejected(Source::Http, reason, n);
    })?;
    // A device token writes only its own sensors; one stranger refuses all.
    principal.check_sensors(readings.iter().map(|r| r.sensor.as_str()))?;
    let accepted = readings.len();
    if accepted == 0 {
        let status = if params.async_ {
            StatusCode::ACCEPTED
        } else {
            StatusCode::OK
        };
        return Ok((status, Json(Accepted { accepted })));
    }
    match submit(&state, readings, wait, principal.token_name()).await? {
        Outcome::Queued => Ok((StatusCode::ACCEPTED, Json(Accepted { accepted }))),
        Outcome::Safe => Ok((StatusCode::OK, Json(Accepted { accepted }))),
        Outcome::DeadLettered(buckets) => Err(dead_lettered(
            body_format.decode(&body, &ctx),
            &buckets,
            state.settings.granularity,
        )),
    }
}

/// What became of readings handed to the intake.
pub(super) enum Outcome {
    /// Queued, not waited for (`Wait::Queued`).
    Queued,
    /// Journaled, or stored (as `wait` asked).
    Safe,
    /// Storage can never apply these buckets: their readings are in the
    /// dead-letter collection, the others stored.
    DeadLettered(Vec<BucketKey>),
}

/// Hands decoded readings to the intake and waits as `wait` says, within
/// `http.write_timeout`. Every refusal is a 503: storage problems are never
/// the client's fault.
pub(super) async fn submit(
    state: &AppState,
    readings: Vec<Reading<'_>>,
    wait: Wait,
    token: Option<&str>,
) -> Result<Outcome, ApiError> {
    let metrics = &state.metrics;
    let accepted = readings.len();
    let ack = state
        .intake
        .submit(readings, wait, token)
        .inspect_err(|e| {
            let reason = match e {
                IntakeError::Closed => Rejection::ShuttingDown,
                IntakeError::NewSeries(_) => Rejection::NewSeries,
                _ => Rejection::Overloaded,
            };
            metrics.rejected(Source::Http, reason, accepted);
        })?;
    metrics.received(Source::Http, accepted);
    if wait == Wait::Queued {
        return Ok(Outcome::Queued);
    }
    match tokio::time::timeout(state.settings.http.write_timeout, ack.safe()).await {
        Ok(Ok(())) => Ok(Outcome::Safe),
        Ok(Err(NotSafe::DeadLettered(buckets))) => Ok(Outcome::DeadLettered(buckets)),
        Ok(Err(NotSafe::Journal(_))) => Err(ApiError::unavailable(
            "the readings could not be written to the journal; nothing was stored; retry",
        )),
        Ok(Err(NotSafe::Stopped)) => Err(ApiError::unavailable(
            "the service stopped before the readings were stored; retry",
        )),
        Err(_) => {
            warn!(
                readings = accepted,
                "A write waited longer than http.write_timeout; answering 503."
            );
            // The readings stay queued and are stored when storage allows; a
            // retry by the client is harmless (last write wins per second).
            Err(ApiError::unavailable(
                "the readings were not confirmed stored in time; retrying is safe",
            ))
        }
    }
}

/// A 422 naming the readings whose buckets storage can never apply: the
/// body decoded again (a cold path) rather than kept as readings.
fn dead_lettered(
    decoded: Result<Vec<Reading<'_>>, DecodeError>,
    buckets: &[BucketKey],
    granularity: Granularity,
) -> ApiError {
    let details: Vec<Detail> = decoded
        .map(|readings| {
            readings
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    let start = granularity.bucket_start(r.ts);
                    buckets.iter().any(|k| {
                        k.start == start
                            && k.sensor.as_str() == r.sensor.as_str()
                            && k.metric.as_str() == r.metric.as_str()
                    })
                })
                .map(|(index, _)| Detail {
                    index,
                    reason: "storage can never apply this reading's bucket update; the reading is in the dead-letter collection".into(),
                })
                .collect()
        })
        .unwrap_or_default();
    ApiError {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        message: format!(
            "{} reading(s) could not be stored in their buckets and were written to the dead-letter collection; the others are stored",
            details.len()
        ),
        details,
        retry_after: None,
    }
}

//! InfluxDB's write API, so Telegraf, Node-RED and the InfluxDB client
//! libraries write to Hourglass unchanged: `POST /write` (1.x),
//! `POST /api/v2/write` (2.x), `GET|HEAD /ping`, and the two `POST /query`
//! statements Telegraf's 1.x output sends before writing.
//!
//! The answers are InfluxDB's, because the clients act on them: 204 when
//! every line is safe; 400 with a partial-write message when some lines were
//! refused (the others are stored, so a client that drops the batch loses
//! nothing valid); 413 over a size limit (Telegraf splits the batch); 503
//! with `Retry-After` at a bound or when storage is in the way (clients retry).
//! A storage problem is never a 4xx, which would make Telegraf drop the batch.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bumpalo::Bump;
use serde_json::json;
use tracing::warn;

use super::AppState;
use super::ingest::{Outcome, submit};
use crate::auth::Principal;
use crate::ingest::line_protocol::{Precision, decode};
use crate::journal::Wait;
use crate::telemetry::metrics::{Rejection, Source};

/// The version `/ping` reports: InfluxDB 1.8 has both write APIs.
pub const INFLUXDB_VERSION: &str = "1.8.10";

/// Which API a request came through: it decides the error body's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// `{"error": "…"}`
    V1,
    /// `{"code": "…", "message": "…"}`
    V2,
}

/// An answer in InfluxDB's error format.
struct InfluxError {
    api: Api,
    status: StatusCode,
    message: String,
}

impl InfluxError {
    fn new(api: Api, status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            api,
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for InfluxError {
    fn into_response(self) -> Response {
        let body = match self.api {
            Api::V1 => json!({ "error": self.message }),
            Api::V2 => {
                let code = match self.status {
                    StatusCode::BAD_REQUEST => "invalid",
                    StatusCode::UNAUTHORIZED => "unauthorized",
                    StatusCode::FORBIDDEN => "forbidden",
                    StatusCode::PAYLOAD_TOO_LARGE => "request too large",
                    StatusCode::SERVICE_UNAVAILABLE => "unavailable",
                    _ => "internal error",
                };
                json!({ "code": code, "message": self.message })
            }
        };
        // Every 503 gets its Retry-After from the API's limits layer.
        (self.status, Json(body)).into_response()
    }
}

/// `POST /write?db=&rp=&precision=&u=&p=`: `db` and `rp` are accepted and
/// ignored (Hourglass has one store); `u`/`p` were checked by the middleware.
pub async fn write_v1(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Query(params): Query<HashMap<String, String>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    write(&state, &principal, Api::V1, &params, body).await
}

/// `POST /api/v2/write?org=&bucket=&precision=`: `org` and `bucket` are
/// accepted and ignored.
pub async fn write_v2(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Query(params): Query<HashMap<String, String>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    write(&state, &principal, Api::V2, &params, body).await
}

/// The body's precision: nanoseconds unless `precision` names another of
/// the API's units.
fn precision(api: Api, params: &HashMap<String, String>) -> Result<Precision, InfluxError> {
    let (parse, units): (fn(&str) -> Option<Precision>, _) = match api {
        Api::V1 => (Precision::v1, "ns, n, u, µ, ms, s, m, h"),
        Api::V2 => (Precision::v2, "ns, us, ms, s"),
    };
    match params.get("precision").map(String::as_str) {
        None | Some("") => Ok(Precision::Nanoseconds),
        Some(p) => parse(p).ok_or_else(|| {
            InfluxError::new(
                api,
                StatusCode::BAD_REQUEST,
                format!("precision must be one of {units}"),
            )
        }),
    }
}

async fn write(
    state: &AppState,
    principal: &Principal,
    api: Api,
    params: &HashMap<String, String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // Long: InfluxDB's write in order: parameters, body, decode, intake, answer in its format.
    let precision = match precision(api, params) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let metrics = &state.metrics;
    let body = match body {
        Ok(body) => body,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            metrics.rejected(Source::Http, Rejection::TooLarge, 1);
            return InfluxError::new(
                api,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body (decompressed) is larger than {} bytes; send smaller batches",
                    state.settings.http.max_body_bytes
                ),
            )
            .into_response();
        }
        Err(e) => {
            metrics.rejected(Source::Http, Rejection::Malformed, 1);
            return InfluxError::new(api, StatusCode::BAD_REQUEST, e.body_text()).into_response();
        }
    };
    let ctx = state
        .settings
        .ingest
        .decode_context(jiff::Timestamp::now().as_second());
    let arena = Bump::new();
    let mut decoded = match decode(
        &body,
        precision,
        &ctx,
        &state.settings.line_protocol.sensor_tags,
        &arena,
    ) {
        Ok(decoded) => decoded,
        Err(e) => {
            metrics.rejected(Source::Http, Rejection::TooLarge, 1);
            return InfluxError::new(
                api,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("{e} (ingest.max_readings_per_request); send smaller batches"),
            )
            .into_response();
        }
    };
    if decoded.refused > 0 {
        metrics.rejected(Source::Http, Rejection::Invalid, decoded.refused);
    }
    metrics.line_protocol_strings.inc_by(decoded.strings as u64);
    let readings = decoded.take_grouped();
    // A device token writes only its own sensors; one stranger refuses all.
    if let Err(e) = principal.check_sensors(readings.iter().map(|r| r.sensor.as_str())) {
        return InfluxError::new(api, StatusCode::FORBIDDEN, e.to_string()).into_response();
    }
    let partial = (decoded.refused > 0).then(|| decoded.partial_write_message());
    if !readings.is_empty() {
        match submit(state, readings, Wait::Safe, principal.token_name()).await {
            // The taken lines' tags, once their readings passed the token's
            // check and the new-series guard: a label write is a write.
            Ok(Outcome::Safe | Outcome::Queued) => state.labels.offer(&decoded.labels),
            // As over MQTT: the readings are in the dead-letter collection
            // and retrying cannot help, so the write is not failed.
            Ok(Outcome::DeadLettered(buckets)) => warn!(
                buckets = buckets.len(),
                "Line-protocol readings went to the dead-letter collection; answering as stored."
            ),
            Err(e) => return InfluxError::new(api, e.status, e.message).into_response(),
        }
    }
    match partial {
        Some(message) => InfluxError::new(api, StatusCode::BAD_REQUEST, message).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// `GET|HEAD /ping`: what InfluxDB clients check before writing.
pub async fn ping() -> impl IntoResponse {
    (
        StatusCode::NO_CONTENT,
        [
            ("X-Influxdb-Version", INFLUXDB_VERSION),
            ("X-Influxdb-Build", "OSS"),
        ],
    )
}

/// `GET|POST /query?q=…`: answers `CREATE DATABASE …` (there is one store, so
/// nothing to create) and `SHOW DATABASES`, so Telegraf's 1.x output starts
/// cleanly. Queries go through `/api/v1` or `/prometheus`.
pub async fn query(RawQuery(query): RawQuery, headers: HeaderMap, body: Bytes) -> Response {
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let q = query
        .iter()
        .flat_map(|q| url::form_urlencoded::parse(q.as_bytes()))
        .chain(
            form.then(|| url::form_urlencoded::parse(&body))
                .into_iter()
                .flatten(),
        )
        .find(|(k, _)| k == "q")
        .map(|(_, v)| v.into_owned());
    let Some(q) = q else {
        return InfluxError::new(
            Api::V1,
            StatusCode::BAD_REQUEST,
            "missing required parameter \"q\"",
        )
        .into_response();
    };
    let mut results = Vec::new();
    for (id, statement) in q
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .enumerate()
    {
        let words: Vec<String> = statement
            .split_whitespace()
            .take(2)
            .map(str::to_ascii_uppercase)
            .collect();
        match words
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["CREATE", "DATABASE"] => results.push(json!({ "statement_id": id })),
            ["SHOW", "DATABASES"] => results.push(json!({
                "statement_id": id,
                "series": [{ "name": "databases", "columns": ["name"], "values": [["hourglass"]] }],
            })),
            _ => {
                return InfluxError::new(
                    Api::V1,
                    StatusCode::BAD_REQUEST,
                    "Hourglass answers only CREATE DATABASE and SHOW DATABASES here; query through /api/v1 or /prometheus",
                )
                .into_response();
            }
        }
    }
    Json(json!({ "results": results })).into_response()
}

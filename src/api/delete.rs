//! `DELETE /api/v1/readings`: readings of a selection of series in a range
//! removed from their buckets, rollups and registry (see `store::delete`).

use axum::Json;
use axum::extract::{Extension, RawQuery, State};
use axum::http::StatusCode;
use serde::Serialize;
use tracing::{info, warn};

use super::descriptions as text;
use super::error::ErrorBody;
use super::params::Params;
use super::query::{parse_instant, sensor_glob, store_error};
use super::{ApiError, AppState};
use crate::auth::Principal;
use crate::domain::MetricName;
use crate::store::SensorQuery;
use crate::store::delete::{DeleteError, Deleted, Selection};

/// Sensors one delete may cover: its record names each.
pub const MAX_SENSORS: usize = 100_000;

/// The answer: what was removed (or would be, with `dry_run`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeleteResponse {
    /// Whether nothing was changed (`dry_run=true`): the figures are what
    /// would be removed.
    pub dry_run: bool,
    /// Sensors the selection covers.
    pub sensors: usize,
    /// Readings removed.
    pub readings: u64,
    /// Buckets that keep other readings.
    pub buckets_edited: u64,
    /// Buckets left with nothing, deleted.
    pub buckets_deleted: u64,
    /// Series left with nothing, taken out of their sensor's metrics.
    pub series_emptied: u64,
}

/// Deletes readings by sensor (or label) and range, everywhere they are held.
#[utoipa::path(delete, path = "/api/v1/readings",
    params(("sensor" = Option<String>, Query, description = "A sensor id or a glob of one (`*`, `?`), at most 128 characters; this or a `label.<name>` filter is required. An id named exactly is covered whether the registry lists it yet or not"),
        ("label.<name>" = Option<String>, Query, description = "Only sensors whose label `<name>` has this value (not empty); any number of filters (each name once), all of which must match; this or `sensor` is required"),
        ("metric" = Option<String>, Query, description = "One metric (1 to 64 characters of A-Z a-z 0-9 _ -); every metric when absent"),
        ("from" = String, Query, description = "Start of the range, included: an RFC 3339 timestamp or integer epoch milliseconds, between 0000-01-01 and 9999-12-30; before `to`"),
        ("to" = String, Query, description = "End of the range, excluded: RFC 3339 or epoch milliseconds, as `from`; the range may be of any length"),
        ("dry_run" = Option<bool>, Query, description = "`true`: answer what would be deleted and change nothing; `false` by default")),
    responses(
        (status = 200, body = DeleteResponse, description = "What was removed (with `dry_run=true`, what would be)"),
        (status = 400, body = ErrorBody, description = "No `sensor` nor `label.<name>` filter, no `from` or `to`, a malformed or unknown parameter, or a selection of more than 100 000 sensors; nothing was deleted"),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = "With `auth.enabled`: the token lacks the `admin` scope; or a browser sent the request from another site (`Origin`, `Sec-Fetch-Site`), whatever `auth.enabled` says"),
        (status = 500, body = ErrorBody, description = "The delete failed (storage refused an operation for good, or its task stopped); sending it again is safe"),
        (status = 503, body = ErrorBody, description = "Retry later (sending the delete again finishes it): storage is unavailable or too slow; another running instance has not taken the delete in within 30 s (the tombstone stands); more than `http.max_concurrent_requests` API requests are in progress; or the request took longer than `http.request_timeout` (an empty body; the delete goes on)")))]
pub async fn delete_readings(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> Result<Json<DeleteResponse>, ApiError> {
    // Long: the request's steps in order: parameters checked, sensors listed, the store's delete; each a few lines.
    let params = Params::parse(
        raw.as_deref(),
        &["sensor", "metric", "from", "to", "dry_run"],
        true,
    )?;
    if params.get("sensor").is_none() && params.labels().is_empty() {
        return Err(ApiError::bad_request(
            "a delete needs sensor= (an id or a glob) or label.<name>= filters; nothing was deleted",
        ));
    }
    for (name, value) in params.labels() {
        if value.is_empty() {
            return Err(ApiError::bad_request(format!("label.{name} needs a value")));
        }
    }
    let (Some(from), Some(to)) = (params.get("from"), params.get("to")) else {
        return Err(ApiError::bad_request(
            "a delete needs from= and to=; nothing was deleted",
        ));
    };
    let (from, to) = (parse_instant("from", from)?, parse_instant("to", to)?);
    if from >= to {
        return Err(ApiError::bad_request("from must be before to"));
    }
    let metric = params
        .get("metric")
        .map(|m| {
            MetricName::parse(m)
                .map(|m| m.to_string())
                .map_err(|e| ApiError::bad_request(e.to_string()))
        })
        .transpose()?;
    let dry_run = match params.get("dry_run") {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::bad_request("dry_run must be true or false")),
    };
    let (prefix, glob) = sensor_glob(&params)?;
    let mut sensors = Vec::new();
    let mut after: Option<String> = None;
    // One sensor named exactly: itself, registered yet or not (a sensor is
    // registered shortly after its first readings are accepted). Otherwise
    // the sensors the registry lists.
    let named = params
        .get("sensor")
        .filter(|s| !s.contains(['*', '?']) && params.labels().is_empty());
    if let Some(id) = named {
        crate::domain::SensorId::parse(id).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if principal.may_access(id) {
            sensors.push(id.to_owned());
        }
    }
    while named.is_none() {
        let query = SensorQuery {
            after: after.as_deref(),
            prefix,
            labels: params.labels(),
            metric: metric.as_deref(),
            through: None,
        };
        let page = state
            .store
            .sensors(query, 1000, |s| {
                glob.matches(&s.sensor) && principal.may_access(&s.sensor)
            })
            .await
            .map_err(store_error)?;
        let full = page.len() == 1000;
        after = page.last().map(|s| s.sensor.clone());
        sensors.extend(page.into_iter().map(|s| s.sensor));
        if sensors.len() > MAX_SENSORS {
            return Err(ApiError::bad_request(format!(
                "the selection covers more than {MAX_SENSORS} sensors; delete in parts"
            )));
        }
        if !full {
            break;
        }
    }
    let count = sensors.len();
    let selection = Selection {
        sensors,
        metric,
        // Stored seconds s with from ≤ s·1000 < to.
        from: from.div_euclid(1000) + i64::from(from.rem_euclid(1000) != 0),
        to: to.div_euclid(1000) + i64::from(to.rem_euclid(1000) != 0),
    };
    let deleted = if count == 0 {
        Deleted::default()
    } else {
        // On its own task: a client that goes away (or the request
        // timeout) does not stop a delete halfway.
        let store = state.store.clone();
        let work = tokio::spawn(async move { store.delete_readings(&selection, dry_run).await });
        match work.await {
            Ok(Ok(d)) => d,
            Ok(Err(DeleteError::Store(e))) => return Err(store_error(e)),
            Ok(Err(e @ DeleteError::NotSeen(_))) => {
                warn!(error = %e, "A delete waits for another instance.");
                return Err(ApiError::unavailable(e.to_string()));
            }
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the delete failed; send it again",
                ));
            }
        }
    };
    if !dry_run {
        info!(
            token = principal.name(),
            sensors = count,
            readings = deleted.readings,
            buckets_edited = deleted.buckets_edited,
            buckets_deleted = deleted.buckets_deleted,
            "Deleted readings."
        );
    }
    Ok(Json(DeleteResponse {
        dry_run,
        sensors: count,
        readings: deleted.readings,
        buckets_edited: deleted.buckets_edited,
        buckets_deleted: deleted.buckets_deleted,
        series_emptied: deleted.series_emptied,
    }))
}

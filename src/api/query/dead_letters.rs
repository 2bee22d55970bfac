//! `GET /api/v1/dead_letters`: the newest dead letters, for operators and
//! the console's ingest health.

use axum::Json;
use axum::extract::{Extension, RawQuery, State};
use serde::Serialize;

use super::admission::{admit, store_error};
use super::range::format_start;
use crate::api::descriptions as text;
use crate::api::error::ErrorBody;
use crate::api::params::Params;
use crate::api::{ApiError, AppState};
use crate::auth::Principal;
use crate::query::Cost;
use crate::store::mongo::MAX_LISTED_DEAD_LETTERS;

const DEFAULT_LISTED: usize = 10;

/// One dead letter: the readings of one bucket update that could not be
/// stored, and why (`hourglass redrive` writes them back).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeadLetterEntry {
    pub sensor: String,
    pub metric: String,
    /// Start of the bucket the update was for, RFC 3339.
    pub bucket_start: String,
    /// How many readings it holds.
    pub readings: usize,
    /// Why storage refused the update.
    pub reason: String,
    /// When it was written, RFC 3339.
    pub at: String,
}

/// `GET /api/v1/dead_letters`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeadLetterList {
    /// Dead letters stored in all; `null` for a token limited to some
    /// sensors (the count would tell of the others).
    pub total: Option<u64>,
    /// The newest first.
    pub dead_letters: Vec<DeadLetterEntry>,
}

/// The newest dead letters: readings storage refused for good, with the reason.
#[utoipa::path(get, path = "/api/v1/dead_letters",
    params(("limit" = Option<usize>, Query, description = "Dead letters to list, newest first: 1 to 100; 10 when absent")),
    responses(
        (status = 200, body = DeadLetterList, description = "The newest dead letters the token may read"),
        (status = 400, body = ErrorBody, description = text::BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY),
        (status = 500, body = ErrorBody, description = text::QUERY_FAILED),
        (status = 503, body = ErrorBody, description = text::QUERY_UNAVAILABLE)))]
pub async fn list_dead_letters(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> Result<Json<DeadLetterList>, ApiError> {
    let params = Params::parse(raw.as_deref(), &["limit"], false)?;
    let limit = match params.get("limit") {
        None => DEFAULT_LISTED,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|&n| (1..=MAX_LISTED_DEAD_LETTERS).contains(&n))
            .ok_or_else(|| {
                ApiError::bad_request(format!("limit must be 1 to {MAX_LISTED_DEAD_LETTERS}"))
            })?,
    };
    let admitted = admit(&state).await?;
    let work = state
        .store
        .dead_letters(limit, |sensor| principal.may_access(sensor));
    let (found, total) = admitted
        .within(async { work.await.map_err(store_error) })
        .await?;
    admitted.done(
        &state,
        "dead_letters",
        Cost {
            documents: found.len() as u64,
            round_trips: 2,
        },
    );
    let dead_letters = found
        .into_iter()
        .map(|d| {
            Ok(DeadLetterEntry {
                bucket_start: format_start(d.bucket_start, None)?,
                at: format_start(d.at, None)?,
                sensor: d.sensor,
                metric: d.metric,
                readings: d.readings,
                reason: d.reason,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(Json(DeadLetterList {
        total: principal.sees_all_sensors().then_some(total),
        dead_letters,
    }))
}

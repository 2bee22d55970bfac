//! The error every handler answers with: a status and a message safe to
//! show (internal causes are logged where they happen, never sent).

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::ingest::decode::Detail;

/// How long a client is asked to wait before retrying a 503.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// An error answer: a status and a message safe to show to clients.
/// Internal causes are logged where they happen, never sent.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub details: Vec<Detail>,
    /// With a 503: when to retry, if not [`RETRY_AFTER`].
    pub retry_after: Option<u64>,
}

/// The body of an error answer: what went wrong, safe to show.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub(crate) struct ErrorBody<'a> {
    /// What went wrong and, where it helps, what to do.
    error: &'a str,
    /// `POST /api/v1/readings` (400, 422): each reading concerned, as
    /// `{"index": <its place in the body, from 0>, "reason": <text>}`.
    #[serde(skip_serializing_if = "<[Detail]>::is_empty")]
    #[schema(value_type = Vec<Object>)]
    details: &'a [Detail],
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            details: Vec::new(),
            retry_after: None,
        }
    }

    /// A 503 to retry in `seconds`.
    pub fn unavailable_for(message: impl Into<String>, seconds: u64) -> Self {
        Self {
            retry_after: Some(seconds),
            ..Self::unavailable(message)
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: &self.message,
            details: &self.details,
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(self.retry_after.unwrap_or(RETRY_AFTER.as_secs())),
            );
        }
        response
    }
}

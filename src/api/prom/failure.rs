//! A Prometheus error answer: the classes its clients know, and what each
//! of the service's errors is told as.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tracing::warn;

use super::answer;
use crate::api::RETRY_AFTER;
use crate::query::promql::PromError;
use crate::store::StoreError;

/// A Prometheus error answer.
#[derive(Debug)]
pub struct Failure {
    status: StatusCode,
    kind: &'static str,
    message: String,
    /// With a 503: when to retry, if not [`RETRY_AFTER`].
    retry_after: Option<u64>,
}

impl Failure {
    pub(super) fn bad_data(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "bad_data",
            message: message.into(),
            retry_after: None,
        }
    }

    pub(super) fn timeout() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "timeout",
            message: "the query took longer than its timeout (query.timeout or timeout=)".into(),
            retry_after: None,
        }
    }

    pub(super) fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "unavailable",
            message: message.into(),
            retry_after: None,
        }
    }
}

impl From<PromError> for Failure {
    fn from(e: PromError) -> Self {
        match e {
            PromError::BadData(m) => Failure::bad_data(m),
            PromError::Timeout => Failure::timeout(),
            PromError::Busy(m) => Failure::unavailable(m),
            PromError::Execution(m) => Self {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                kind: "execution",
                message: m,
                retry_after: None,
            },
            PromError::Storage(e) => {
                match &e {
                    StoreError::Timeout(_) => return Failure::timeout(),
                    StoreError::CatchingUp(seconds) => {
                        return Self {
                            retry_after: Some(*seconds),
                            ..Failure::unavailable(format!(
                                "hours of this range were written late (a backfill) and are being rolled up; reading them before then would take longer than the query's timeout: retry in about {seconds} s"
                            ))
                        };
                    }
                    StoreError::Outage(_) | StoreError::Unclassed(_) => {
                        return Failure::unavailable("storage is unavailable; retry later");
                    }
                    _ => {}
                }
                warn!(error = %e, "A PromQL query could not read its documents.");
                Self {
                    status: StatusCode::UNPROCESSABLE_ENTITY,
                    kind: "execution",
                    message: "the query failed reading its documents".into(),
                    retry_after: None,
                }
            }
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = answer::Error {
            status: "error",
            kind: self.kind,
            error: &self.message,
        };
        let mut r = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            let after = self.retry_after.unwrap_or(RETRY_AFTER.as_secs());
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(after));
        }
        r
    }
}

//! A Prometheus error answer: the classes its clients know, and what each
//! of the service's errors is told as.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tracing::warn;

use super::answer;
use crate::query::promql::PromError;
use crate::store::StoreError;

/// A Prometheus error answer.
#[derive(Debug)]
pub struct Failure {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl Failure {
    pub(super) fn bad_data(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "bad_data",
            message: message.into(),
        }
    }

    pub(super) fn timeout() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "timeout",
            message: "the query took longer than its timeout (query.timeout or timeout=)".into(),
        }
    }

    pub(super) fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "unavailable",
            message: message.into(),
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
            },
            PromError::Storage(e) => {
                match &e {
                    StoreError::Timeout(_) => return Failure::timeout(),
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
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    }
}

//! The HTTP surface: routes, shared state and the error type every handler
//! answers with.

pub mod query;

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use tower_http::trace::TraceLayer;

use crate::batcher::driver::BatcherHandle;
use crate::config::Settings;
use crate::ingest;
use crate::ingest::decode::Detail;
use crate::store::BucketStore;

/// What every handler shares. Cheap to clone.
pub struct AppState<S> {
    pub store: Arc<S>,
    pub batcher: BatcherHandle,
    pub settings: Arc<Settings>,
}

impl<S> Clone for AppState<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            batcher: self.batcher.clone(),
            settings: self.settings.clone(),
        }
    }
}

pub fn router<S: BucketStore>(state: AppState<S>) -> Router {
    Router::new()
        .route("/api/v1/readings", post(ingest::http::post_readings::<S>))
        .route("/api/v1/sensors/{sensor}/average", get(query::average::<S>))
        .route("/api/v1/sensors/{sensor}/series", get(query::series::<S>))
        .layer(axum::extract::DefaultBodyLimit::max(
            state.settings.http.max_body_bytes,
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// How long a client is asked to wait before retrying a 503.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// An error answer: a status and a message safe to show to clients.
/// Internal causes are logged where they happen, never sent.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub details: Vec<Detail>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    #[serde(skip_serializing_if = "<[Detail]>::is_empty")]
    details: &'a [Detail],
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            details: Vec::new(),
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
                HeaderValue::from(RETRY_AFTER.as_secs()),
            );
        }
        response
    }
}

//! The routes: which handler answers which path, behind which scope, and
//! the layers every request passes (limits, deadline, metrics, tracing).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use tokio::time::Instant;
use tower::ServiceBuilder;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower_http::compression::CompressionLayer;
use tower_http::decompression::RequestDecompressionLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tracing::Span;

use super::auth::{Forms, Require, authorize};
use super::cache::cache_control;
use super::{
    ApiError, AppState, RETRY_AFTER, console, delete, export, health, influx, ingest, openapi,
    prom, query, unread,
};
use crate::auth::Scope;
use crate::telemetry::metrics::Metrics;

pub fn router(state: AppState) -> Router {
    // Long: the route table, and the layers every route goes through.
    let trace = TraceLayer::new_for_http()
        .make_span_with(|req: &Request| {
            let route = req
                .extensions()
                .get::<MatchedPath>()
                .map_or("unmatched", MatchedPath::as_str);
            tracing::info_span!(
                "http",
                method = %req.method(),
                route,
                status = tracing::field::Empty,
                duration_ms = tracing::field::Empty,
            )
        })
        .on_response(|res: &Response, latency: Duration, span: &Span| {
            span.record("status", res.status().as_u16());
            span.record("duration_ms", latency.as_secs_f64() * 1000.0);
            tracing::debug!("Answered an HTTP request.");
        });
    let require_from = |scope, forms| {
        middleware::from_fn_with_state(
            Require {
                auth: state.auth.clone(),
                scope,
                forms,
            },
            authorize,
        )
    };
    let require = |scope| require_from(scope, Forms::Bearer);
    let ingest = Router::new()
        .route("/api/v1/readings", post(ingest::post_readings))
        .route("/api/v1/sensors/{sensor}/labels", put(query::put_labels))
        .route_layer(require(Scope::Ingest))
        // Bodies may be gzipped (Telegraf's and Vector's HTTP outputs); the
        // body limit counts decompressed bytes; other codings answer 415.
        .layer(RequestDecompressionLayer::new());
    // InfluxDB's write API. Its 1.x clients may send the token as `p`; bodies
    // may be gzipped, and the body limit counts decompressed bytes.
    let admin = Router::new()
        .route(
            "/api/v1/readings",
            axum::routing::delete(delete::delete_readings),
        )
        .route_layer(require(Scope::Admin));
    let influx_v1 = Router::new()
        .route("/write", post(influx::write_v1))
        .route("/query", get(influx::query).post(influx::query))
        .route_layer(require_from(Scope::Ingest, Forms::InfluxV1));
    let influx = Router::new()
        .route("/api/v2/write", post(influx::write_v2))
        .route_layer(require_from(Scope::Ingest, Forms::Influx))
        .merge(influx_v1)
        .layer(RequestDecompressionLayer::new());
    let queries = Router::new()
        .route("/api/v1/sensors", get(query::list_sensors))
        .route("/api/v1/sensors/{sensor}/average", get(query::average))
        .route("/api/v1/sensors/{sensor}/series", get(query::series))
        .route("/api/v1/sensors/{sensor}/latest", get(query::latest))
        .route("/api/v1/sensors/{sensor}/at", get(query::at))
        .route("/api/v1/sensors/{sensor}/uptime", get(query::uptime))
        .route("/api/v1/average", get(query::group_average))
        .route("/api/v1/series", get(query::group_series))
        .route("/api/v1/dead_letters", get(query::list_dead_letters))
        .merge(prom::routes())
        .route(
            "/api/v1/export",
            get(export::export).layer(CompressionLayer::new()),
        )
        .route_layer(require(Scope::Query))
        .route_layer(middleware::from_fn(cache_control));
    let http = &state.settings.http;
    // The API shares one concurrency limit (a request beyond it is shed with
    // 503 at once, never queued) and a deadline for the whole request, body
    // upload included. One semaphore for every route: a per-route layer would
    // multiply the limit.
    let limits = ServiceBuilder::new()
        .map_response(with_retry_after)
        .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
            ApiError::unavailable("too many requests in progress; retry later")
        }))
        .load_shed()
        .layer(GlobalConcurrencyLimitLayer::new(
            http.max_concurrent_requests,
        ))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            http.request_timeout,
        ));
    let api = Router::new()
        .merge(ingest)
        .merge(admin)
        .merge(influx)
        .merge(queries)
        .layer(middleware::from_fn(super::cross_site::refuse_cross_site))
        .layer(axum::extract::DefaultBodyLimit::max(http.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            http.max_body_bytes,
            refuse_announced_excess,
        ))
        .route_layer(limits);
    // Health and metrics stay open (probes and scrapers carry no tokens) and
    // outside the API's limits and timeouts: they must answer exactly when
    // ingest is saturated.
    Router::new()
        .merge(api)
        .route("/api/v1/openapi.json", get(openapi::document))
        .route("/ping", get(influx::ping))
        .route("/health/live", get(health::live))
        .route("/health/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .merge(console::routes())
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no such route; the API is listed at /api/v1/openapi.json",
            )
        })
        .route_layer(middleware::from_fn_with_state(state.metrics.clone(), track))
        .layer(middleware::from_fn(unread::close_after_unread_body))
        .layer(trace)
        .with_state(state)
}

/// A body announced (`Content-Length`) as larger than the limit is refused
/// before it is read: the client learns at once, and no connection is held
/// open waiting for bytes that would be refused anyway. (A gzip body's wire
/// size is at most what it decompresses to, which the limit also bounds.)
async fn refuse_announced_excess(State(max): State<usize>, req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max as u64) {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {max} bytes (http.max_body_bytes)"),
        )
        .into_response();
    }
    next.run(req).await
}

/// Every 503 says when to retry, the timeout layer's included.
fn with_retry_after(mut response: Response) -> Response {
    let after = match response.status() {
        StatusCode::SERVICE_UNAVAILABLE => RETRY_AFTER.as_secs(),
        // New series are bounded per clock hour: the next one takes them.
        StatusCode::TOO_MANY_REQUESTS => {
            let second_of_hour = jiff::Timestamp::now().as_second().rem_euclid(3600);
            u64::try_from(3600 - second_of_hour).unwrap_or(3600)
        }
        _ => return response,
    };
    response
        .headers_mut()
        .entry(header::RETRY_AFTER)
        .or_insert(HeaderValue::from(after));
    response
}

/// Counts requests and their latency by route pattern: never the raw path,
/// which would make a label per sensor.
async fn track(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = match *req.method() {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::HEAD => "HEAD",
        _ => "other",
    };
    let started = Instant::now();
    let response = next.run(req).await;
    metrics
        .http_requests
        .with_label_values(&[route.as_str(), method, response.status().as_str()])
        .inc();
    metrics
        .http_duration
        .with_label_values(&[route.as_str(), method])
        .observe(started.elapsed().as_secs_f64());
    response
}

//! The Prometheus HTTP query API under `/prometheus`, answered from the
//! buckets: Grafana's Prometheus data source, `promtool` and Prometheus
//! clients work unchanged. Under a prefix because `/api/v1/series` is
//! already Hourglass' own group series route.
//!
//! Answers have Prometheus' exact shape ([`answer`]: sample values as
//! strings, timestamps as seconds) and its error classes: `bad_data` 400,
//! `execution` 422, `timeout` and `unavailable` 503.

mod admission;
mod answer;
mod failure;
mod listing;
mod params;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use self::admission::admitted;
use self::answer::{Success, query_data};
use self::failure::Failure;
use self::listing::{label_values, labels, series};
use self::params::Form;
pub use self::params::{parse_duration, parse_time};
use super::AppState;
use crate::auth::Principal;
use crate::query::promql::{self, Context, LabelSet, Outcome, Steps, Value};

/// The routes, relative to the data source URL `…/prometheus`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/prometheus/api/v1/query", get(instant).post(instant))
        .route("/prometheus/api/v1/query_range", get(range).post(range))
        .route("/prometheus/api/v1/labels", get(labels).post(labels))
        .route("/prometheus/api/v1/label/{name}/values", get(label_values))
        .route("/prometheus/api/v1/series", get(series).post(series))
        .route("/prometheus/api/v1/status/buildinfo", get(buildinfo))
        .route("/prometheus/api/v1/metadata", get(metadata))
        .route(
            "/prometheus/api/v1/query_exemplars",
            get(exemplars).post(exemplars),
        )
}

async fn evaluate(
    state: &AppState,
    principal: &Principal,
    form: &Form,
    steps: Steps,
    endpoint: &str,
) -> Result<(Outcome, tokio::time::Instant), Failure> {
    let query = form.required("query")?;
    let admitted = admitted(state, form).await?;
    let may_access = |s: &str| principal.may_access(s);
    let ctx = Context {
        store: state.store.as_ref(),
        batcher: &state.batcher,
        granularity: state.settings.granularity,
        max_series: state.settings.query.max_series,
        max_range_ms: i64::try_from(state.settings.query.max_range.as_millis()).unwrap_or(i64::MAX),
        max_time: admitted.max_time(),
        may_access: &may_access,
        limits: state.settings.query.limits(),
        max_samples: state.settings.query.max_samples,
        max_memory: state.settings.query.max_memory_per_query,
        pool: Some(state.query_memory.clone()),
        cache: crate::api::cache_use(state),
        sketch_quantiles: match form.get("quantile_sketches") {
            None | Some("false") => false,
            Some("true") => true,
            Some(_) => {
                return Err(Failure::bad_data("quantile_sketches is true or false"));
            }
        },
    };
    let outcome = tokio::time::timeout_at(admitted.deadline, promql::evaluate(&ctx, query, steps))
        .await
        .map_err(|_| Failure::timeout())??;
    let deadline = admitted.deadline;
    admitted.done(state, endpoint, outcome.cost);
    Ok((outcome, deadline))
}

/// Writes an answer out on the blocking pool (its JSON text can be large),
/// within the query's deadline, and only then gives its memory back.
async fn answered(
    state: &AppState,
    outcome: Outcome,
    deadline: tokio::time::Instant,
    steps: Steps,
    instant: bool,
) -> Result<Response, Failure> {
    let state = state.clone();
    let write = tokio::task::spawn_blocking(move || {
        let Outcome {
            mut value,
            sorted,
            earliest_ms,
            memory,
            ..
        } = outcome;
        if let (Some(ascending), Value::Vector(series)) = (sorted, &mut value) {
            sort_by_value(series, ascending);
        }
        let empty = LabelSet::new();
        let response = query_success(
            &state,
            earliest_ms,
            query_data(&value, &steps, instant, &empty),
        );
        drop(value);
        drop(memory);
        response
    });
    tokio::time::timeout_at(deadline, write)
        .await
        .map_err(|_| Failure::timeout())?
        .map_err(|_| Failure::unavailable("the answer could not be written; retry later"))
}

/// `sort`/`sort_desc` of an instant answer: by the value, NaN last.
fn sort_by_value(series: &mut [promql::Series], ascending: bool) {
    let key = |s: &promql::Series| s.values.first().copied().flatten().unwrap_or(f64::NAN);
    series.sort_by(|a, b| {
        let (x, y) = (key(a), key(b));
        match (x.is_nan(), y.is_nan()) {
            (true, true) => std::cmp::Ordering::Equal,
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            _ if ascending => x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal),
            _ => y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal),
        }
    });
}

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

pub async fn instant(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Result<Response, Failure> {
    let form = Form::new(raw.as_deref(), &body);
    let t = match form.get("time").filter(|t| !t.is_empty()) {
        Some(t) => parse_time("time", t)?,
        None => now_ms(),
    };
    let steps = Steps::new(t, t, 1);
    let (outcome, deadline) = evaluate(&state, &principal, &form, steps, "promql_instant").await?;
    answered(&state, outcome, deadline, steps, true).await
}

pub async fn range(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Result<Response, Failure> {
    let form = Form::new(raw.as_deref(), &body);
    let start = parse_time("start", form.required("start")?)?;
    let end = parse_time("end", form.required("end")?)?;
    let step = parse_duration("step", form.required("step")?)?;
    if end < start {
        return Err(Failure::bad_data(
            "end timestamp must not be before start time",
        ));
    }
    if step <= 0 {
        return Err(Failure::bad_data(
            "zero or negative query resolution step widths are not accepted. Try a positive integer",
        ));
    }
    let q = &state.settings.query;
    let points = (i128::from(end) - i128::from(start)) / i128::from(step) + 1;
    if points > q.max_points as i128 {
        return Err(Failure::bad_data(format!(
            "exceeded maximum resolution of {} points per timeseries (query.max_points). Try decreasing the query resolution (?step=XX)",
            q.max_points
        )));
    }
    if (i128::from(end) - i128::from(start)).unsigned_abs() > q.max_range.as_millis() {
        return Err(Failure::bad_data(format!(
            "the range from start to end is longer than {} (query.max_range)",
            humantime::format_duration(q.max_range)
        )));
    }
    let steps = Steps::new(start, end, step);
    let (outcome, deadline) = evaluate(&state, &principal, &form, steps, "promql_range").await?;
    answered(&state, outcome, deadline, steps, false).await
}

/// A success answer.
fn success<T: Serialize>(data: T) -> Response {
    Json(Success::new(data)).into_response()
}

/// What answers reaching back past `retention.buckets` are told: only
/// rollup slots are kept there, so a window must cover whole ones.
const COARSE_WARNING: &str = "the query reads readings older than retention.buckets, which are kept only as rollup figures: windows that do not cover whole rollup slots there miss readings";

/// A query answer, with [`COARSE_WARNING`] when its earliest read (from the
/// parsed query: steps, ranges, lookbacks, offsets) reaches past the
/// buckets' retention.
fn query_success<T: Serialize>(state: &AppState, earliest_ms: Option<i64>, data: T) -> Response {
    let mut answer = Success::new(data);
    if let (Some(kept), Some(earliest)) = (state.settings.retention.buckets, earliest_ms) {
        let kept_s = i64::try_from(kept.as_secs()).unwrap_or(i64::MAX);
        let horizon = (now_ms() / 1000)
            .saturating_sub(kept_s)
            .saturating_add(state.settings.granularity.seconds());
        if earliest.div_euclid(1000) < horizon {
            answer.warnings.push(COARSE_WARNING);
        }
    }
    Json(answer).into_response()
}

/// Grafana reads the version to pick features; Hourglass answers like the
/// Prometheus release its semantics are checked against.
pub async fn buildinfo() -> Response {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct BuildInfo {
        version: &'static str,
        revision: String,
        branch: &'static str,
        build_user: &'static str,
        build_date: &'static str,
        go_version: &'static str,
    }
    success(BuildInfo {
        version: "2.42.0",
        revision: format!("hourglass-{}", env!("CARGO_PKG_VERSION")),
        branch: "",
        build_user: "",
        build_date: "",
        go_version: "",
    })
}

pub async fn metadata() -> Response {
    success(serde_json::Map::new())
}

pub async fn exemplars() -> Response {
    success(Vec::<()>::new())
}

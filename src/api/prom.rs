//! The Prometheus HTTP query API under `/prometheus`, answered from the
//! buckets: Grafana's Prometheus data source, `promtool` and Prometheus
//! clients work unchanged. Under a prefix because `/api/v1/series` is
//! already Hourglass' own group series route.
//!
//! Answers have Prometheus' exact shape (sample values as strings,
//! timestamps as seconds) and its error classes: `bad_data` 400,
//! `execution` 422, `timeout` and `unavailable` 503.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use promql_parser::label::Matcher;
use promql_parser::parser::Expr;
use tracing::warn;

use super::AppState;
use super::query::{Admitted, admit};
use crate::auth::Principal;
use crate::query::promql::{self, Context, LabelSet, PromError, Steps, Value, format_value};
use crate::store::{BucketStore, SensorQuery, StoreError};

/// The routes, relative to the data source URL `…/prometheus`.
pub fn routes<S: BucketStore>() -> Router<AppState<S>> {
    Router::new()
        .route(
            "/prometheus/api/v1/query",
            get(instant::<S>).post(instant::<S>),
        )
        .route(
            "/prometheus/api/v1/query_range",
            get(range::<S>).post(range::<S>),
        )
        .route(
            "/prometheus/api/v1/labels",
            get(labels::<S>).post(labels::<S>),
        )
        .route(
            "/prometheus/api/v1/label/{name}/values",
            get(label_values::<S>),
        )
        .route(
            "/prometheus/api/v1/series",
            get(series::<S>).post(series::<S>),
        )
        .route("/prometheus/api/v1/status/buildinfo", get(buildinfo))
        .route("/prometheus/api/v1/metadata", get(metadata))
        .route(
            "/prometheus/api/v1/query_exemplars",
            get(exemplars).post(exemplars),
        )
}

/// A Prometheus error answer.
#[derive(Debug)]
pub struct Failure {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl Failure {
    fn bad_data(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "bad_data",
            message: message.into(),
        }
    }

    fn timeout() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "timeout",
            message: "the query took longer than its timeout (query.timeout or timeout=)".into(),
        }
    }

    fn unavailable(message: impl Into<String>) -> Self {
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
            PromError::Execution(m) => Self {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                kind: "execution",
                message: m,
            },
            PromError::Storage(e) => {
                match &e {
                    StoreError::Poison(m)
                        if m.contains("MaxTimeMSExpired") || m.contains("code 50") =>
                    {
                        return Failure::timeout();
                    }
                    StoreError::Outage(_) => {
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
        let body = serde_json::json!({
            "status": "error",
            "errorType": self.kind,
            "error": self.message,
        });
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    }
}

/// Parameters from the query string and, for POST, the form body (Grafana
/// sends both kinds).
struct Form(Vec<(String, String)>);

impl Form {
    fn new(raw: Option<&str>, body: &[u8]) -> Self {
        let mut pairs: Vec<(String, String)> =
            url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
                .into_owned()
                .collect();
        pairs.extend(url::form_urlencoded::parse(body).into_owned());
        Self(pairs)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn required(&self, name: &str) -> Result<&str, Failure> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| Failure::bad_data(format!("invalid parameter {name:?}: missing")))
    }
}

/// A timestamp: Unix seconds with a fraction, or RFC 3339; milliseconds.
pub fn parse_time(name: &str, s: &str) -> Result<i64, Failure> {
    let bad = || {
        Failure::bad_data(format!(
            "invalid parameter {name:?}: cannot parse {s:?} to a valid timestamp"
        ))
    };
    if let Some((int, frac)) = s.split_once('.').or(Some((s, "")))
        && !int.is_empty()
        && int
            .trim_start_matches('-')
            .bytes()
            .all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
    {
        let secs: i64 = int.parse().map_err(|_| bad())?;
        let mut ms: i64 = 0;
        for (i, b) in frac.bytes().take(3).enumerate() {
            ms += i64::from(b - b'0') * 10_i64.pow(2 - i as u32);
        }
        let ms = if int.starts_with('-') { -ms } else { ms };
        return secs
            .checked_mul(1000)
            .and_then(|x| x.checked_add(ms))
            .ok_or_else(bad);
    }
    s.parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .map_err(|_| bad())
}

/// A duration: seconds with a fraction, or Prometheus' `1h30m`; milliseconds.
pub fn parse_duration(name: &str, s: &str) -> Result<i64, Failure> {
    let bad = || {
        Failure::bad_data(format!(
            "invalid parameter {name:?}: cannot parse {s:?} to a valid duration"
        ))
    };
    if let Ok(secs) = s.parse::<f64>() {
        let ms = (secs * 1000.0).round();
        if !ms.is_finite() || ms.abs() > 1e15 {
            return Err(bad());
        }
        return Ok(ms as i64);
    }
    promql_parser::util::duration::parse_duration(s)
        .ok()
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .ok_or_else(bad)
}

/// A timestamp as Prometheus writes it: seconds, and milliseconds if any.
fn write_ts(out: &mut String, ms: i64) {
    let (secs, frac) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    if ms < 0 && frac != 0 {
        // -1.5 s: write the magnitude with a sign, as Go does.
        let m = -ms;
        let _ = write!(out, "-{}.{:03}", m / 1000, m % 1000);
        return;
    }
    let _ = write!(out, "{secs}");
    if frac != 0 {
        let _ = write!(out, ".{frac:03}");
    }
}

fn write_json_str(out: &mut String, s: &str) {
    out.push_str(&serde_json::Value::from(s).to_string());
}

fn write_labels(out: &mut String, labels: &LabelSet) {
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_json_str(out, k);
        out.push(':');
        write_json_str(out, v);
    }
    out.push('}');
}

fn write_point(out: &mut String, ms: i64, v: f64) {
    out.push('[');
    write_ts(out, ms);
    out.push_str(",\"");
    out.push_str(&format_value(v));
    out.push_str("\"]");
}

fn json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn success(data: &str) -> Response {
    json(format!(r#"{{"status":"success","data":{data}}}"#))
}

/// `resultType` and `result` of an evaluation.
fn result_json(value: &Value, steps: &Steps, instant: bool) -> String {
    let mut out = String::new();
    match (value, instant) {
        (Value::Scalar(v), true) => {
            out.push_str(r#"{"resultType":"scalar","result":"#);
            write_point(
                &mut out,
                steps.at(0),
                v.first().copied().unwrap_or(f64::NAN),
            );
            out.push('}');
        }
        (Value::Vector(series), true) => {
            out.push_str(r#"{"resultType":"vector","result":["#);
            let mut first = true;
            for s in series {
                let Some(Some(v)) = s.values.first() else {
                    continue;
                };
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(r#"{"metric":"#);
                write_labels(&mut out, &s.labels);
                out.push_str(r#","value":"#);
                write_point(&mut out, steps.at(0), *v);
                out.push('}');
            }
            out.push_str("]}");
        }
        (value, false) => {
            let scalar;
            let series: &[promql::Series] = match value {
                Value::Vector(s) => s,
                Value::Scalar(v) => {
                    scalar = [promql::Series {
                        labels: LabelSet::new(),
                        values: v.iter().map(|&x| Some(x)).collect(),
                    }];
                    &scalar
                }
            };
            out.push_str(r#"{"resultType":"matrix","result":["#);
            for (i, s) in series.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(r#"{"metric":"#);
                write_labels(&mut out, &s.labels);
                out.push_str(r#","values":["#);
                let mut first = true;
                for (k, v) in s.values.iter().enumerate() {
                    if let Some(v) = v {
                        if !first {
                            out.push(',');
                        }
                        first = false;
                        write_point(&mut out, steps.at(k), *v);
                    }
                }
                out.push_str("]}");
            }
            out.push_str("]}");
        }
    }
    out
}

async fn admitted<'a, S>(state: &'a AppState<S>, form: &Form) -> Result<Admitted<'a>, Failure> {
    let timeout = form
        .get("timeout")
        .filter(|t| !t.is_empty())
        .map(|t| parse_duration("timeout", t))
        .transpose()?;
    let mut a = admit(state)
        .await
        .map_err(|e| Failure::unavailable(e.message))?;
    if let Some(t) = timeout {
        a.shorten(Duration::from_millis(t.max(1).unsigned_abs()));
    }
    Ok(a)
}

async fn evaluate<S: BucketStore>(
    state: &AppState<S>,
    principal: &Principal,
    form: &Form,
    steps: Steps,
    endpoint: &str,
) -> Result<Value, Failure> {
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
    };
    let outcome = tokio::time::timeout_at(admitted.deadline, promql::evaluate(&ctx, query, steps))
        .await
        .map_err(|_| Failure::timeout())??;
    admitted.done(state, endpoint, outcome.cost);
    Ok(outcome.value)
}

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

pub async fn instant<S: BucketStore>(
    State(state): State<AppState<S>>,
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
    let value = evaluate(&state, &principal, &form, steps, "promql_instant").await?;
    Ok(success(&result_json(&value, &steps, true)))
}

pub async fn range<S: BucketStore>(
    State(state): State<AppState<S>>,
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
    let value = evaluate(&state, &principal, &form, steps, "promql_range").await?;
    Ok(success(&result_json(&value, &steps, false)))
}

/// The matchers of each `match[]`: each must be a plain selector.
fn match_sets(form: &Form) -> Result<Vec<Vec<Matcher>>, Failure> {
    form.all("match[]")
        .map(|m| {
            let expr = promql_parser::parser::parse(m)
                .map_err(|e| Failure::bad_data(format!("invalid parameter \"match[]\": {e}")))?;
            let Expr::VectorSelector(vs) = expr else {
                return Err(Failure::bad_data(format!(
                    "invalid parameter \"match[]\": {m:?} is not a series selector"
                )));
            };
            Ok(promql::compile::matchers(&vs)?)
        })
        .collect()
}

/// Checks `start`/`end` parse (they do not narrow listings: the registry
/// keeps series, not their time ranges).
fn check_times(form: &Form) -> Result<(), Failure> {
    for name in ["start", "end"] {
        if let Some(t) = form.get(name).filter(|t| !t.is_empty()) {
            parse_time(name, t)?;
        }
    }
    Ok(())
}

fn limit_of(form: &Form, max: usize) -> Result<usize, Failure> {
    match form.get("limit").filter(|l| !l.is_empty()) {
        None => Ok(max),
        Some(l) => match l.parse::<usize>() {
            Ok(0) => Ok(max),
            Ok(n) => Ok(n.min(max)),
            Err(_) => Err(Failure::bad_data(format!(
                "invalid parameter \"limit\": {l:?} is not a number"
            ))),
        },
    }
}

/// Every label set the `match[]` sets select (all series without any), at
/// most `limit`; whether more were left out.
async fn listed<S: BucketStore>(
    state: &AppState<S>,
    principal: &Principal,
    form: &Form,
    limit: usize,
) -> Result<(Vec<LabelSet>, bool), Failure> {
    let sets = match_sets(form)?;
    let admitted = admitted(state, form).await?;
    let may_access = |s: &str| principal.may_access(s);
    let work = async {
        let mut out: BTreeSet<LabelSet> = BTreeSet::new();
        let mut truncated = false;
        if sets.is_empty() {
            state
                .store
                // Keeping a sensor ends the scan: only once the limit is hit.
                .sensors(SensorQuery::default(), 1, |info| {
                    if !may_access(&info.sensor) {
                        return false;
                    }
                    for m in &info.metrics {
                        if out.len() >= limit {
                            truncated = true;
                            return true;
                        }
                        out.insert(promql::labels_of(info, m));
                    }
                    false
                })
                .await
                .map_err(PromError::from)?;
        }
        for matchers in &sets {
            let found = promql::select(state.store.as_ref(), matchers, limit, &may_access).await?;
            truncated |= found.len() > limit;
            out.extend(found.into_iter().map(|f| f.labels));
        }
        if out.len() > limit {
            truncated = true;
            out = out.into_iter().take(limit).collect();
        }
        Ok::<_, PromError>((out.into_iter().collect(), truncated))
    };
    let got = tokio::time::timeout_at(admitted.deadline, work)
        .await
        .map_err(|_| Failure::timeout())??;
    admitted.done(state, "promql_listing", crate::query::Cost::default());
    Ok(got)
}

fn with_warning(data: String, truncated: bool) -> Response {
    if truncated {
        json(format!(
            r#"{{"status":"success","data":{data},"warnings":["results truncated due to limit"]}}"#
        ))
    } else {
        success(&data)
    }
}

fn listing_limit<S>(state: &AppState<S>) -> usize {
    state.settings.query.max_listed
}

/// A sorted list of names from every listed series, at most `limit=`.
async fn names_of<S: BucketStore>(
    state: &AppState<S>,
    principal: &Principal,
    form: &Form,
    pick: impl Fn(&LabelSet) -> Vec<&str>,
) -> Result<Response, Failure> {
    check_times(form)?;
    let limit = limit_of(form, listing_limit(state))?;
    let (sets, truncated) = listed(state, principal, form, listing_limit(state)).await?;
    let names: BTreeSet<&str> = sets.iter().flat_map(&pick).collect();
    let cut = truncated || names.len() > limit;
    let names: Vec<&str> = names.into_iter().take(limit).collect();
    Ok(with_warning(
        serde_json::Value::from(names).to_string(),
        cut,
    ))
}

pub async fn labels<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Result<Response, Failure> {
    let form = Form::new(raw.as_deref(), &body);
    names_of(&state, &principal, &form, |l| {
        l.keys().map(String::as_str).collect()
    })
    .await
}

pub async fn label_values<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, Failure> {
    let form = Form::new(raw.as_deref(), &[]);
    names_of(&state, &principal, &form, |l| {
        l.get(&name).map(String::as_str).into_iter().collect()
    })
    .await
}

pub async fn series<S: BucketStore>(
    State(state): State<AppState<S>>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Result<Response, Failure> {
    let form = Form::new(raw.as_deref(), &body);
    if form.get("match[]").is_none() {
        return Err(Failure::bad_data("no match[] parameter provided"));
    }
    check_times(&form)?;
    let limit = limit_of(&form, listing_limit(&state))?;
    let (sets, truncated) = listed(&state, &principal, &form, limit).await?;
    let mut out = String::from("[");
    for (i, l) in sets.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_labels(&mut out, l);
    }
    out.push(']');
    Ok(with_warning(out, truncated))
}

/// Grafana reads the version to pick features; Hourglass answers like the
/// Prometheus release its semantics are checked against.
pub async fn buildinfo() -> Response {
    success(&format!(
        r#"{{"version":"2.42.0","revision":"hourglass-{}","branch":"","buildUser":"","buildDate":"","goVersion":""}}"#,
        env!("CARGO_PKG_VERSION")
    ))
}

pub async fn metadata() -> Response {
    success("{}")
}

pub async fn exemplars() -> Response {
    success("[]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_prometheus_takes_them() {
        assert_eq!(parse_time("t", "1700000000").ok(), Some(1_700_000_000_000));
        assert_eq!(
            parse_time("t", "1700000000.5").ok(),
            Some(1_700_000_000_500)
        );
        assert_eq!(
            parse_time("t", "1700000000.1239").ok(),
            Some(1_700_000_000_123)
        );
        assert_eq!(parse_time("t", "-1.5").ok(), Some(-1_500));
        assert_eq!(
            parse_time("t", "2023-11-14T22:13:20.25Z").ok(),
            Some(1_700_000_000_250)
        );
        assert!(parse_time("t", "yesterday").is_err());
        assert_eq!(parse_duration("s", "15").ok(), Some(15_000));
        assert_eq!(parse_duration("s", "0.5").ok(), Some(500));
        assert_eq!(parse_duration("s", "1h30m").ok(), Some(5_400_000));
        assert!(parse_duration("s", "soon").is_err());
    }

    #[test]
    fn timestamps_are_written_as_prometheus_writes_them() {
        let mut s = String::new();
        write_ts(&mut s, 1_700_000_000_000);
        s.push(' ');
        write_ts(&mut s, 1_700_000_000_050);
        s.push(' ');
        write_ts(&mut s, -1_500);
        assert_eq!(s, "1700000000 1700000000.050 -1.500");
    }

    #[test]
    fn results_have_prometheus_shapes() {
        let steps = Steps::new(1000, 3000, 1000);
        let labels: LabelSet = [("sensor".to_owned(), "a".to_owned())].into();
        let v = Value::Vector(vec![promql::Series {
            labels,
            values: vec![Some(1.5), None, Some(2.0)],
        }]);
        assert_eq!(
            result_json(&v, &steps, false),
            r#"{"resultType":"matrix","result":[{"metric":{"sensor":"a"},"values":[[1,"1.5"],[3,"2"]]}]}"#
        );
        let one = Steps::new(1000, 1000, 1);
        assert_eq!(
            result_json(&Value::Scalar(vec![2.0]), &one, true),
            r#"{"resultType":"scalar","result":[1,"2"]}"#
        );
    }
}

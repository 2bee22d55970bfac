//! `GET /api/v1/export`: the stored readings of a selection of series, or
//! their step series, as NDJSON or CSV, streamed.
//!
//! Sensors are read from the registry a page at a time (the `sensor` glob,
//! `label.<name>` filters, the metric, and what the token may read), and
//! each page's buckets through one cursor sorted by sensor, metric and
//! start. Rows leave in chunks through a small channel, so a slow client
//! slows the cursor down instead of filling memory: a year of a fleet
//! costs what one page and a few chunks cost. The NDJSON rows are readings
//! `POST /api/v1/readings` and `hourglass import` take back unchanged.

use std::io::Write;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tracing::warn;

use super::descriptions as text;
use super::error::ErrorBody;
use super::params::Params;
use super::query::{
    Range, Weighing, admit, coarse, coarse_header, evaluate, metric, range, sensor_glob,
    series_grid, store_error, weighing, weighted_points,
};
use super::{ApiError, AppState};
use crate::auth::Principal;
use crate::domain::{Agg, Weighted};
use crate::query::{Grid, Series};
use crate::store::SensorQuery;

const PARAMS: [&str; 8] = [
    "sensor",
    "metric",
    "from",
    "to",
    "step",
    "format",
    "weighting",
    "staleness",
];

/// Sensors read from the registry per page: one bucket cursor each.
const RAW_PAGE: usize = 1_000;

/// Aggregates a step export evaluates at once (page of sensors × points).
const STEP_CELLS: usize = 200_000;

/// Bytes gathered before a chunk is sent on.
const CHUNK: usize = 64 << 10;

/// Chunks in flight between the reader and the client.
const IN_FLIGHT: usize = 4;

/// How rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Ndjson,
    Csv,
}

impl Format {
    fn parse(s: Option<&str>) -> Result<Self, ApiError> {
        match s {
            None | Some("ndjson") => Ok(Format::Ndjson),
            Some("csv") => Ok(Format::Csv),
            Some(other) => Err(ApiError::bad_request(format!(
                "format {other:?} is neither ndjson nor csv"
            ))),
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::Ndjson => "application/x-ndjson",
            Format::Csv => "text/csv; charset=utf-8",
        }
    }
}

/// The rows of an export, written into a buffer. Sensor ids and metric
/// names never hold a character JSON or CSV would have to escape (see
/// `domain::reading`), so they are written as they are.
pub(crate) struct Rows {
    format: Format,
    pub(crate) buf: Vec<u8>,
}

pub(crate) const READING_COLUMNS: &str = "sensor,metric,ts,value\n";
pub(crate) const POINT_COLUMNS: &str = "sensor,metric,start,count,sum,avg,min,max\n";
/// With `weighting=`: `avg` weighted by time, and the seconds held.
pub(crate) const WEIGHTED_POINT_COLUMNS: &str =
    "sensor,metric,start,count,sum,avg,min,max,held_seconds\n";

impl Rows {
    pub(crate) fn new(format: Format) -> Self {
        Self {
            format,
            buf: Vec::with_capacity(CHUNK + 4096),
        }
    }

    fn header(&mut self, columns: &str) {
        if self.format == Format::Csv {
            self.buf.extend_from_slice(columns.as_bytes());
        }
    }

    fn instant(&mut self, secs: i64) {
        // Stored seconds are within the representable years.
        let _ = match crate::domain::format_secs(secs) {
            Some(text) => write!(self.buf, "{text}"),
            None => write!(self.buf, "{secs}"),
        };
    }

    fn number(&mut self, x: f64) {
        // serde_json writes the shortest text that reads back as the same
        // double (ryu), with an exponent where one is shorter.
        let _ = serde_json::to_writer(&mut self.buf, &x);
    }

    /// One reading: `{"sensor":…,"metric":…,"ts":…,"value":…}` or a CSV row.
    pub(crate) fn reading(&mut self, sensor: &str, metric: &str, ts: i64, value: f64) {
        match self.format {
            Format::Ndjson => {
                self.buf.extend_from_slice(b"{\"sensor\":\"");
                self.buf.extend_from_slice(sensor.as_bytes());
                self.buf.extend_from_slice(b"\",\"metric\":\"");
                self.buf.extend_from_slice(metric.as_bytes());
                self.buf.extend_from_slice(b"\",\"ts\":\"");
                self.instant(ts);
                self.buf.extend_from_slice(b"\",\"value\":");
                self.number(value);
                self.buf.extend_from_slice(b"}\n");
            }
            Format::Csv => {
                self.buf.extend_from_slice(sensor.as_bytes());
                self.buf.push(b',');
                self.buf.extend_from_slice(metric.as_bytes());
                self.buf.push(b',');
                self.instant(ts);
                self.buf.push(b',');
                self.number(value);
                self.buf.push(b'\n');
            }
        }
    }

    /// One point of a step series (only points holding readings, or with
    /// `weighting=` time held, are written): `avg` weighted by time and the
    /// seconds held last when `weighted` is given.
    pub(crate) fn point(
        &mut self,
        (sensor, metric): (&str, &str),
        start: i64,
        a: &Agg,
        weighted: Option<&Weighted>,
    ) {
        let count = a.count;
        let avg = weighted.map_or(a.avg(), Weighted::average);
        match self.format {
            Format::Ndjson => {
                self.buf.extend_from_slice(b"{\"sensor\":\"");
                self.buf.extend_from_slice(sensor.as_bytes());
                self.buf.extend_from_slice(b"\",\"metric\":\"");
                self.buf.extend_from_slice(metric.as_bytes());
                self.buf.extend_from_slice(b"\",\"start\":\"");
                self.instant(start);
                let _ = write!(self.buf, "\",\"count\":{count},\"sum\":");
                self.number(a.sum);
                for (name, x) in [("avg", avg), ("min", a.min()), ("max", a.max())] {
                    let _ = write!(self.buf, ",\"{name}\":");
                    match x {
                        Some(x) => self.number(x),
                        None => self.buf.extend_from_slice(b"null"),
                    }
                }
                if let Some(w) = weighted {
                    let _ = write!(self.buf, ",\"held_seconds\":{}", w.held);
                }
                self.buf.extend_from_slice(b"}\n");
            }
            Format::Csv => {
                self.buf.extend_from_slice(sensor.as_bytes());
                self.buf.push(b',');
                self.buf.extend_from_slice(metric.as_bytes());
                self.buf.push(b',');
                self.instant(start);
                let _ = write!(self.buf, ",{count},");
                self.number(a.sum);
                for x in [avg, a.min(), a.max()] {
                    self.buf.push(b',');
                    if let Some(x) = x {
                        self.number(x);
                    }
                }
                if let Some(w) = weighted {
                    let _ = write!(self.buf, ",{}", w.held);
                }
                self.buf.push(b'\n');
            }
        }
    }
}

/// What an export covers, checked before the answer starts.
struct Selection {
    prefix: String,
    glob: wildmatch::WildMatch,
    labels: Vec<(String, String)>,
    /// `None`: every metric (raw exports only).
    metric: Option<String>,
    range: Range,
    grid: Option<Grid>,
    /// Step exports: the time weighting and staleness limit, if asked.
    weighing: Option<Weighing>,
    format: Format,
}

/// Streams stored readings (or step series) as NDJSON or CSV.
#[utoipa::path(get, path = "/api/v1/export",
    params(("sensor" = Option<String>, Query, description = text::SENSOR_GLOB),
        ("label.<name>" = Option<String>, Query, description = "Only sensors whose label `<name>` has this value (not empty); any number of filters (each name once), all of which must match"),
        ("metric" = Option<String>, Query, description = "One metric (1 to 64 characters of A-Z a-z 0-9 _ -); every metric when absent for readings, `value` for step series"),
        ("from" = String, Query, description = text::FROM), ("to" = String, Query, description = text::TO),
        ("step" = Option<String>, Query, description = "Export the step series at this step (as for series; at most `query.max_points` points), one row per sensor and point holding readings, instead of the readings"),
        ("format" = Option<String>, Query, description = "`ndjson` (the default: a JSON object per line, readings as `POST /api/v1/readings` takes them back) or `csv` (a header row: `sensor,metric,ts,value`, or `sensor,metric,start,count,sum,avg,min,max` for step series)"),
        ("weighting" = Option<String>, Query, description = "Step exports only: `time` or `linear` weigh each point's `avg` by time and add `held_seconds`; `readings` (the default) takes the mean of the readings"),
        ("staleness" = Option<String>, Query, description = text::STALENESS)),
    responses(
        (status = 200, description = "The rows, streamed as an attachment (gzipped with `Accept-Encoding: gzip`). An error after the answer started cuts the transfer short: a body that ends cleanly is complete",
            content((String = "application/x-ndjson"), (String = "text/csv"))),
        (status = 400, body = ErrorBody, description = text::BAD_QUERY),
        (status = 401, body = ErrorBody, description = text::UNAUTHORIZED),
        (status = 403, body = ErrorBody, description = text::FORBIDDEN_QUERY),
        (status = 503, body = ErrorBody, description = text::API_UNAVAILABLE)))]
pub async fn export(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    // Long: the request's steps in order: parameters, selection, the streaming response.
    let params = Params::parse(raw.as_deref(), &PARAMS, true)?;
    let format = Format::parse(params.get("format"))?;
    let (prefix, glob) = sensor_glob(&params)?;
    for (name, value) in params.labels() {
        if value.is_empty() {
            return Err(ApiError::bad_request(format!("label.{name} needs a value")));
        }
    }
    let weighing = weighing(&state, &params)?;
    let mut r = range(&state, &params)?;
    let grid = match params.get("step") {
        Some(_) => Some(series_grid(&state, &params, &r, None)?),
        None if weighing.is_some() => {
            return Err(ApiError::bad_request(
                "weighting applies to step exports (step=): raw readings are exported as they are",
            ));
        }
        None => None,
    };
    // Step series over readings past retention.buckets cover whole kept
    // slots (see docs/src/operating/retention.md); raw readings are
    // what the buckets still hold.
    let coarse = match &grid {
        Some(grid) => coarse(&state, &mut r, Some(grid))?,
        None => None,
    };
    let metric = match (params.get("metric"), &grid) {
        (None, None) => None,
        _ => Some(metric(&params)?.to_string()),
    };
    let selection = Selection {
        prefix: prefix.to_owned(),
        glob,
        labels: params.labels().to_vec(),
        metric,
        range: r,
        grid,
        weighing,
        format,
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(IN_FLIGHT);
    // Set when the producer stopped early and could not queue its error
    // item (a client that stopped reading): the body then ends in an error.
    let aborted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = aborted.clone();
    tokio::spawn(async move {
        if let Err(e) = produce(&state, &principal, &selection, &tx).await {
            warn!(error = %e.message, "An export stopped before its end; the client sees the answer cut off.");
            // An error item aborts the body: the client sees a transfer cut
            // short, never a file that looks complete.
            if tx.try_send(Err(std::io::Error::other(e.message))).is_err() {
                stopped.store(true, std::sync::atomic::Ordering::Release);
            }
        }
    });
    // `poll_recv` answers `None` again after the end (the compression layer
    // polls once more), where `unfold` would panic.
    let mut rx = rx;
    let body = Body::from_stream(futures_util::stream::poll_fn(move |cx| {
        match rx.poll_recv(cx) {
            std::task::Poll::Ready(None)
                if aborted.swap(false, std::sync::atomic::Ordering::AcqRel) =>
            {
                std::task::Poll::Ready(Some(Err(std::io::Error::other(
                    "the export stopped before its end",
                ))))
            }
            other => other,
        }
    }));
    let name = match format {
        Format::Ndjson => "attachment; filename=\"hourglass-export.ndjson\"",
        Format::Csv => "attachment; filename=\"hourglass-export.csv\"",
    };
    let mut response = (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::CONTENT_DISPOSITION, name),
        ],
        body,
    )
        .into_response();
    coarse_header(&mut response, coarse.as_ref());
    Ok(response)
}

/// Sends `rows` on once a chunk has gathered (or at the end); `false` when
/// the client is gone. A client that takes nothing for `query.timeout`
/// stops the export: a raw page holds a query permit and a cursor while it
/// waits, which a client that stopped reading must not keep.
async fn flush(
    state: &AppState,
    rows: &mut Rows,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
    at_least: usize,
) -> Result<bool, ApiError> {
    if rows.buf.len() < at_least || rows.buf.is_empty() {
        return Ok(true);
    }
    let chunk = Bytes::from(std::mem::replace(
        &mut rows.buf,
        Vec::with_capacity(CHUNK + 4096),
    ));
    let wait = state.settings.query.timeout;
    match tokio::time::timeout(wait, tx.send(Ok(chunk))).await {
        Ok(sent) => Ok(sent.is_ok()),
        Err(_) => Err(ApiError::unavailable(format!(
            "the client read nothing for {} (query.timeout)",
            humantime::format_duration(wait)
        ))),
    }
}

async fn produce(
    state: &AppState,
    principal: &Principal,
    sel: &Selection,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> Result<(), ApiError> {
    // Long: the export's pages in order: header, each page of series read and written, with the client's pace checked between.
    let mut rows = Rows::new(sel.format);
    let page = match &sel.grid {
        None => RAW_PAGE,
        Some(grid) => (STEP_CELLS / grid.points().max(1)).clamp(1, RAW_PAGE),
    };
    rows.header(match (&sel.grid, sel.weighing) {
        (None, _) => READING_COLUMNS,
        (Some(_), None) => POINT_COLUMNS,
        (Some(_), Some(_)) => WEIGHTED_POINT_COLUMNS,
    });
    let mut after: Option<String> = None;
    loop {
        let query = SensorQuery {
            after: after.as_deref(),
            prefix: &sel.prefix,
            labels: &sel.labels,
            metric: sel.metric.as_deref(),
            through: None,
        };
        let sensors = state
            .store
            .sensors(query, page, |s| {
                sel.glob.matches(&s.sensor) && principal.may_access(&s.sensor)
            })
            .await
            .map_err(store_error)?;
        let Some(last) = sensors.last() else {
            break;
        };
        after = Some(last.sensor.clone());
        let ids: Vec<String> = sensors.iter().map(|s| s.sensor.clone()).collect();
        match &sel.grid {
            None => {
                // A page's cursor counts as one query (query.max_concurrency):
                // exports share the database with dashboards, not crowd them.
                let _admitted = admit(state).await?;
                let mut buckets = state
                    .store
                    .stored(&ids, sel.metric.as_deref(), sel.range.from, sel.range.to)
                    .await
                    .map_err(store_error)?;
                while let Some(b) = buckets.next().await {
                    let b = b.map_err(store_error)?;
                    for &(offset, value) in &b.bucket.values {
                        let ts = b.bucket.start + i64::from(offset);
                        if (sel.range.from..sel.range.to).contains(&ts) {
                            rows.reading(&b.sensor, &b.metric, ts, value);
                        }
                    }
                    if !flush(state, &mut rows, tx, CHUNK).await? {
                        return Ok(());
                    }
                }
            }
            Some(grid) => {
                let metric =
                    crate::domain::MetricName::trusted(sel.metric.as_deref().unwrap_or_default());
                let series: Vec<(Series<'_>, usize)> = ids
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (Series::of(s), i))
                    .collect();
                let limited: Vec<(Series<'_>, usize, i64)> = match sel.weighing {
                    Some(how) => series
                        .iter()
                        .zip(&sensors)
                        .map(|((s, i), info)| (*s, *i, how.limit(&info.labels)))
                        .collect(),
                    None => Vec::new(),
                };
                let figures: Vec<Vec<(Option<Weighted>, Agg)>> = match sel.weighing {
                    Some(how) => weighted_points(
                        state,
                        "export",
                        &metric,
                        &sel.range,
                        grid,
                        &limited,
                        ids.len(),
                        how.weighting,
                    )
                    .await?
                    .into_iter()
                    .map(|points| points.into_iter().map(|(w, a)| (Some(w), a)).collect())
                    .collect(),
                    None => evaluate(
                        state,
                        "export",
                        &metric,
                        &sel.range,
                        grid.clone(),
                        &series,
                        ids.len(),
                    )
                    .await?
                    .into_iter()
                    .map(|points| points.into_iter().map(|a| (None, a)).collect())
                    .collect(),
                };
                for (sensor, points) in ids.iter().zip(&figures) {
                    for (i, (w, a)) in points.iter().enumerate() {
                        if a.count == 0 && w.is_none_or(|w| w.held == 0) {
                            continue;
                        }
                        let start = grid.start(i).ok_or_else(|| {
                            ApiError::bad_request("the range lies beyond the representable times")
                        })?;
                        rows.point((sensor, metric.as_str()), start, a, w.as_ref());
                    }
                    if !flush(state, &mut rows, tx, CHUNK).await? {
                        return Ok(());
                    }
                }
            }
        }
        if sensors.len() < page {
            break;
        }
    }
    flush(state, &mut rows, tx, 0).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndjson_rows_are_readings_the_json_decoder_takes_back_exactly() {
        let mut rows = Rows::new(Format::Ndjson);
        let values = [21.5, -0.1, 1e300, 5e-324, 0.1 + 0.2, -0.0, 3.0];
        for (i, v) in values.iter().enumerate() {
            rows.reading("plant-1.line:3", "temp_c", 1_764_000_000 + i as i64, *v);
        }
        let text = String::from_utf8(rows.buf).expect("UTF-8");
        let body = format!("[{}]", text.trim_end().replace('\n', ","));
        let ctx = crate::ingest::decode::DecodeContext {
            now: 1_764_000_000,
            window: crate::domain::TimeWindow {
                max_age: std::time::Duration::from_secs(86400),
                max_future: std::time::Duration::from_secs(86400),
            },
            max_readings: 100,
        };
        let back = crate::ingest::decode::decode_readings(body.as_bytes(), &ctx).expect("valid");
        assert_eq!(back.len(), values.len());
        for (i, (r, v)) in back.iter().zip(values).enumerate() {
            assert_eq!(r.sensor.as_str(), "plant-1.line:3");
            assert_eq!(r.metric.as_str(), "temp_c");
            assert_eq!(r.ts, 1_764_000_000 + i as i64);
            assert_eq!(r.value.to_bits(), v.to_bits(), "{v}");
        }
    }

    #[test]
    fn csv_rows_have_the_header_and_points_leave_empty_figures_empty() {
        let mut rows = Rows::new(Format::Csv);
        rows.header(READING_COLUMNS);
        rows.reading("s1", "value", 60, 2.5);
        let mut a = Agg::default();
        a.add(1.0);
        a.add(2.0);
        rows.point(("s1", "value"), 0, &a, None);
        rows.point(("s1", "value"), 60, &Agg::default(), None);
        // Weighted by time: the average over the held time, which is last.
        let w = Weighted {
            integral: 90.0,
            held: 60,
        };
        rows.point(("s1", "value"), 120, &Agg::default(), Some(&w));
        let text = String::from_utf8(rows.buf).expect("UTF-8");
        assert_eq!(
            text,
            "sensor,metric,ts,value\ns1,value,1970-01-01T00:01:00Z,2.5\n\
             s1,value,1970-01-01T00:00:00Z,2,3.0,1.5,1.0,2.0\n\
             s1,value,1970-01-01T00:01:00Z,0,0.0,,,\n\
             s1,value,1970-01-01T00:02:00Z,0,0.0,1.5,,,60\n"
        );
    }

    #[test]
    fn unknown_formats_are_refused() {
        assert!(Format::parse(Some("xml")).is_err());
        assert_eq!(Format::parse(None).ok(), Some(Format::Ndjson));
    }
}

//! CSV answers for spreadsheets: `Accept: text/csv` or `format=csv`.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tracing::warn;

use super::Point;
use super::quantiles::Quantiles;
use crate::api::ApiError;
use crate::api::params::Params;

/// Whether the client asked for CSV (`Accept: text/csv` or `format=csv`).
pub(crate) fn wants_csv(headers: &HeaderMap, params: &Params) -> Result<bool, ApiError> {
    match params.get("format") {
        Some("csv") => return Ok(true),
        Some("json") => return Ok(false),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "format {other:?} is neither json nor csv"
            )));
        }
        None => {}
    }
    Ok(headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/csv")))
}

pub(crate) fn csv_response(
    rows: impl FnOnce(&mut csv::Writer<Vec<u8>>) -> csv::Result<()>,
) -> Response {
    let mut w = csv::Writer::from_writer(Vec::new());
    match rows(&mut w).and_then(|()| w.into_inner().map_err(|e| e.into_error().into())) {
        Ok(body) => ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], body).into_response(),
        Err(e) => {
            warn!(error = %e, "A CSV answer could not be written.");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the query failed").into_response()
        }
    }
}

pub(crate) fn opt(x: Option<f64>) -> String {
    x.map(|v| v.to_string()).unwrap_or_default()
}

pub(crate) fn csv_point(prefix: &[String], p: &Point) -> Vec<String> {
    let mut row = prefix.to_vec();
    row.extend([
        p.start.clone().unwrap_or_default(),
        p.count.to_string(),
        p.sum.to_string(),
        opt(p.avg),
        opt(p.min),
        opt(p.max),
    ]);
    row.extend(p.held_seconds.map(|h| h.to_string()));
    if let Some(q) = &p.quantiles {
        row.extend(q.0.iter().map(|(_, v)| opt(*v)));
    }
    row
}

/// The columns of [`csv_point`]'s rows: `held_seconds` for a time-weighted
/// series, then a `q<quantile>` for each quantile asked.
pub(crate) fn point_columns(weighted: bool, quantiles: Option<&Quantiles>) -> Vec<String> {
    const COLUMNS: [&str; 7] = ["start", "count", "sum", "avg", "min", "max", "held_seconds"];
    let mut columns: Vec<String> = COLUMNS[..if weighted { 7 } else { 6 }]
        .iter()
        .map(|c| (*c).to_owned())
        .collect();
    columns.extend(quantiles.map(Quantiles::columns).unwrap_or_default());
    columns
}

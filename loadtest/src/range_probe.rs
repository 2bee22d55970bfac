//! What the range scenarios (`ranges`, and the `exception` and
//! `percentile` parts it runs) share: the paths they ask, how a query is
//! timed with the documents it read, the table's row, and the held-time
//! model of a time-weighted average.

use std::collections::BTreeMap;

use crate::dataset::rfc3339;
use crate::procs::{scrape, timed};
use crate::report::f;

const DOCS_SUM: &str = "hourglass_query_documents_read_sum";

/// Runs `path` `n` times in a row; latencies (ms), documents read per query
/// and the last answer.
pub async fn measure(
    url: &str,
    path: &str,
    n: usize,
) -> anyhow::Result<(Vec<f64>, f64, serde_json::Value)> {
    let before = scrape(url).await?.get(DOCS_SUM).copied().unwrap_or(0.0);
    let (ms, last) = timed(&reqwest::Client::new(), &format!("{url}{path}"), n).await?;
    let after = scrape(url).await?.get(DOCS_SUM).copied().unwrap_or(0.0);
    Ok((ms, (after - before) / n as f64, last))
}

/// The first second of the `span`-day average ending at `end`: unaligned, so
/// every level's edges are read.
pub fn span_from(end: i64, span: u32) -> i64 {
    end - i64::from(span) * 86_400 + 3600 + 61
}

/// A row of the cost table: the query, how often it ran, its latency, its
/// ratio to the 1-day average, the documents it read and whether it was exact.
pub fn timing_row(
    name: impl Into<String>,
    ms: &[f64],
    (p50, p99): (f64, f64),
    ratio: String,
    documents: String,
    exact: String,
) -> Vec<String> {
    vec![
        name.into(),
        ms.len().to_string(),
        f(p50),
        f(p99),
        ratio,
        documents,
        exact,
    ]
}

/// One sensor's average over `[from, to)`, with `extra` parameters.
pub fn average_path(sensor: &str, metric: &str, from: i64, to: i64, extra: &str) -> String {
    format!(
        "/api/v1/sensors/{sensor}/average?metric={metric}&from={}&to={}{extra}",
        rfc3339(from),
        rfc3339(to)
    )
}

/// The seconds of `[from, to)` a reading's value held and the integral over
/// them: each reading holds until the next, or `staleness` after it.
pub fn held_time(truth: &BTreeMap<i64, f64>, from: i64, to: i64, staleness: i64) -> (i64, f64) {
    let points: Vec<(i64, f64)> = truth
        .range(..from)
        .next_back()
        .into_iter()
        .chain(truth.range(from..to))
        .map(|(&t, &v)| (t, v))
        .collect();
    let (mut held, mut integral) = (0, 0.0);
    for (k, &(t, v)) in points.iter().enumerate() {
        let until = points
            .get(k + 1)
            .map_or(t + staleness, |n| n.0.min(t + staleness));
        let (a, b) = (t.max(from), until.min(to));
        if a < b {
            held += b - a;
            integral += v * (b - a) as f64;
        }
    }
    (held, integral)
}

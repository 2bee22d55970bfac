//! A query timed as a dashboard sees it: cold (the results cache
//! bypassed) and on refresh, with the documents read and round trips of
//! each, from the service's own metrics. Shared by `history` and
//! `backfill`.

use crate::procs::scrape;
use crate::report::{f, percentiles};

const DOCS: &str = "hourglass_query_documents_read_sum";
const TRIPS: &str = "hourglass_query_round_trips_sum";

/// One query timed cold (the results cache bypassed) and on refresh, with
/// the documents and round trips of each (means over the repeats).
pub(crate) struct Timed {
    pub cold_ms: f64,
    pub refresh_ms: f64,
    pub cold: (f64, f64),
    pub refresh: (f64, f64),
}

impl Timed {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "cold_ms": self.cold_ms, "refresh_ms": self.refresh_ms,
            "documents": self.cold.0, "round_trips": self.cold.1,
            "refresh_documents": self.refresh.0, "refresh_round_trips": self.refresh.1,
        })
    }

    /// The table's cells after the query's name.
    pub fn cells(&self) -> Vec<String> {
        vec![
            f(self.cold_ms),
            f(self.refresh_ms),
            format!("{} / {}", f(self.cold.0), f(self.cold.1)),
            format!("{} / {}", f(self.refresh.0), f(self.refresh.1)),
        ]
    }
}

pub const TIMED_COLUMNS: [&str; 4] = [
    "cold ms",
    "refresh ms",
    "documents / round trips (cold)",
    "documents / round trips (refresh)",
];

pub(crate) async fn cold_and_refresh(
    url: &str,
    path: &str,
    repeats: usize,
) -> anyhow::Result<Timed> {
    let cold = no_cache_client()?;
    let warm = reqwest::Client::new();
    let cost = |before: &std::collections::HashMap<String, f64>,
                after: &std::collections::HashMap<String, f64>| {
        let per = |k: &str| {
            (after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0))
                / repeats as f64
        };
        (per(DOCS), per(TRIPS))
    };
    let before = scrape(url).await?;
    let (cold_ms, answer) = timed_or_nan(&cold, &format!("{url}{path}"), repeats).await;
    let between = scrape(url).await?;
    // The first refresh fills the cache; the figures are the next ones'.
    let _ = timed_or_nan(&warm, &format!("{url}{path}"), 1).await;
    let warmed = scrape(url).await?;
    let (refresh_ms, refreshed) = timed_or_nan(&warm, &format!("{url}{path}"), repeats).await;
    let after = scrape(url).await?;
    anyhow::ensure!(
        refreshed == answer,
        "{path}: the refresh answered differently"
    );
    Ok(Timed {
        cold_ms,
        refresh_ms,
        cold: cost(&before, &between),
        refresh: cost(&warmed, &after),
    })
}

/// A client whose requests bypass Hourglass' results cache: cold figures.
pub(crate) fn no_cache_client() -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::CACHE_CONTROL,
        reqwest::header::HeaderValue::from_static("no-cache"),
    );
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .build()?)
}

/// [`timed_median`], with a failure reported as a missing figure rather than ending the run.
pub(crate) async fn timed_or_nan(
    client: &reqwest::Client,
    url: &str,
    n: usize,
) -> (f64, serde_json::Value) {
    match timed_median(client, url, n).await {
        Ok(x) => x,
        Err(e) => {
            eprintln!("A query failed: {e:#}");
            (f64::NAN, serde_json::Value::Null)
        }
    }
}

/// Median latency (ms) of `n` runs of one range query, and its last answer.
pub(crate) async fn timed_median(
    client: &reqwest::Client,
    url: &str,
    n: usize,
) -> anyhow::Result<(f64, serde_json::Value)> {
    let (ms, last) = crate::procs::timed(client, url, n).await?;
    let (p50, _, _) = percentiles(ms);
    Ok((p50, last))
}

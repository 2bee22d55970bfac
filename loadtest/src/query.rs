//! `query`: a mix of average and series queries at a given concurrency.

use std::time::Instant;

use futures_util::StreamExt;

use crate::ctx::Ctx;
use crate::dataset::{Dataset, rfc3339};
use crate::report::{Plot, Report, Section, f, percentiles};

/// The query mix: (kind, path) over ranges that end at the dataset's end.
pub fn mix(data: &Dataset, n: usize) -> Vec<(&'static str, String)> {
    let end = data.end();
    (0..n)
        .map(|k| {
            let i = (k as u32 * 7919) % data.args.sensors.max(1);
            let j = (k as u32) % data.args.metrics.max(1);
            let (s, m) = (Dataset::sensor(i), Dataset::metric(j));
            match k % 4 {
                0 => (
                    "average 1h",
                    format!(
                        "/api/v1/sensors/{s}/average?metric={m}&from={}&to={}",
                        rfc3339(end - 3600),
                        rfc3339(end)
                    ),
                ),
                1 => (
                    "average 24h",
                    format!(
                        "/api/v1/sensors/{s}/average?metric={m}&from={}&to={}",
                        rfc3339(end - 86_400 + 17),
                        rfc3339(end)
                    ),
                ),
                2 => (
                    "series 24h / 1h",
                    format!(
                        "/api/v1/sensors/{s}/series?metric={m}&from={}&to={}&step=1h",
                        rfc3339(end - 86_400),
                        rfc3339(end)
                    ),
                ),
                _ => (
                    "series 1h / 1m",
                    format!(
                        "/api/v1/sensors/{s}/series?metric={m}&from={}&to={}&step=1m",
                        rfc3339(end - 3600),
                        rfc3339(end)
                    ),
                ),
            }
        })
        .collect()
}

/// Runs the mix against `url`; latencies in ms per kind.
pub async fn measure(
    ctx: &Ctx,
    url: &str,
    queries: Vec<(&'static str, String)>,
    concurrency: usize,
) -> anyhow::Result<Vec<(&'static str, Vec<f64>)>> {
    let client = reqwest::Client::new();
    let bar = ctx.bar(queries.len() as u64, "queries");
    let results: Vec<anyhow::Result<(&'static str, f64)>> = futures_util::stream::iter(queries)
        .map(|(kind, path)| {
            let (client, bar) = (client.clone(), bar.clone());
            let url = format!("{url}{path}");
            async move {
                let t = Instant::now();
                let r = client.get(&url).send().await?;
                anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
                let _ = r.bytes().await?;
                bar.inc(1);
                Ok((kind, t.elapsed().as_secs_f64() * 1000.0))
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    bar.finish_and_clear();
    let mut by_kind: Vec<(&'static str, Vec<f64>)> = Vec::new();
    for r in results {
        let (kind, ms) = r?;
        match by_kind.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, v)) => v.push(ms),
            None => by_kind.push((kind, vec![ms])),
        }
    }
    by_kind.sort_by_key(|(k, _)| *k);
    Ok(by_kind)
}

pub fn section(title: &str, by_kind: &[(&'static str, Vec<f64>)]) -> Section {
    let mut s = Section::new(title, &["query", "n", "p50 ms", "p99 ms", "max ms"]);
    for (kind, v) in by_kind {
        let (p50, p99, max) = percentiles(v.clone());
        s.row(vec![
            (*kind).into(),
            v.len().to_string(),
            f(p50),
            f(p99),
            f(max),
        ]);
    }
    s
}

pub async fn run(
    ctx: &Ctx,
    data: &Dataset,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<Report> {
    let target = ctx.target("query", "minute", false, false).await?;
    if ctx.global.url.is_none() {
        // A fresh instance has nothing to read: load the dataset first.
        crate::send::send_all(ctx, &target, data, 5000, 4).await?;
    }
    let by_kind = measure(ctx, &target.url, mix(data, n), concurrency).await?;
    let mut report = Report::new("Hourglass queries");
    report.sections.push(section(
        &format!("Queries: {n} at concurrency {concurrency}"),
        &by_kind,
    ));
    report.plots.push(Plot::Bars {
        file: "query-latency.svg".into(),
        title: "Query latency percentiles (ms)".into(),
        y: "ms".into(),
        bars: by_kind
            .iter()
            .flat_map(|(kind, v)| {
                let (p50, p99, _) = percentiles(v.clone());
                [(format!("{kind} p50"), p50), (format!("{kind} p99"), p99)]
            })
            .collect(),
    });
    let json: serde_json::Map<String, serde_json::Value> = by_kind
        .iter()
        .map(|(k, v)| {
            let (p50, p99, max) = percentiles(v.clone());
            (
                (*k).to_owned(),
                serde_json::json!({ "n": v.len(), "p50_ms": p50, "p99_ms": p99, "max_ms": max }),
            )
        })
        .collect();
    report.set("queries", json);
    Ok(report)
}

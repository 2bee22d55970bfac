//! Readings sent over HTTP in batches, as fast as the service takes them:
//! how most scenarios load their data.

use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::ctx::{Ctx, Target};
use crate::dataset::{Dataset, Row};
use crate::procs::scrape;

pub struct Outcome {
    pub readings: u64,
    pub seconds: f64,
    pub latencies_ms: Vec<f64>,
    pub retries: u64,
    pub service_cpu: Option<f64>,
    pub bucket_updates: f64,
    pub round_trips: f64,
}

/// POSTs every reading in batches of `batch`, `concurrency` at a time,
/// retrying 503s; returns when all are stored (200).
pub async fn send_all(
    ctx: &Ctx,
    target: &Target,
    data: &Dataset,
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<Outcome> {
    let rows: Vec<Row> = data.rows().collect();
    send_rows(ctx, target, &rows, batch, concurrency).await
}

/// [`send_all`] of any readings.
pub async fn send_rows(
    ctx: &Ctx,
    target: &Target,
    rows: &[Row],
    batch: usize,
    concurrency: usize,
) -> anyhow::Result<Outcome> {
    let client = reqwest::Client::new();
    let url = format!("{}/api/v1/readings", target.url);
    let bodies: Vec<(usize, Vec<u8>)> = rows
        .chunks(batch.max(1))
        .map(|c| (c.len(), Dataset::json(c)))
        .collect();
    let before = scrape(&target.url).await.unwrap_or_default();
    let cpu0 = target.cpu();
    let bar = ctx.bar(rows.len() as u64, "backfill");
    let started = Instant::now();
    let results: Vec<anyhow::Result<(f64, u64)>> = futures_util::stream::iter(bodies)
        .map(|(n, body)| {
            let (client, url, bar) = (client.clone(), url.clone(), bar.clone());
            async move {
                let mut retries = 0;
                loop {
                    let t = Instant::now();
                    let r = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await?;
                    match r.status().as_u16() {
                        200 => {
                            bar.inc(n as u64);
                            return Ok((t.elapsed().as_secs_f64() * 1000.0, retries));
                        }
                        503 => {
                            retries += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        s => {
                            anyhow::bail!("unexpected {s}: {}", r.text().await.unwrap_or_default())
                        }
                    }
                }
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let mut latencies = Vec::new();
    let mut retries = 0;
    for r in results {
        let (l, n) = r?;
        latencies.push(l);
        retries += n;
    }
    let after = scrape(&target.url).await.unwrap_or_default();
    let delta =
        |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    Ok(Outcome {
        readings: rows.len() as u64,
        seconds,
        latencies_ms: latencies,
        retries,
        service_cpu: cpu0.zip(target.cpu()).map(|(a, b)| b - a),
        bucket_updates: delta("hourglass_bucket_updates_total"),
        round_trips: delta("hourglass_write_round_trips_total"),
    })
}

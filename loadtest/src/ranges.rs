//! `ranges`: what a query costs as its range grows. One series of minute
//! data written through the service over `--days` days, and 100 sensors
//! over the last hours; averages over 1, 7, 60 and 400 days (unaligned
//! ends, so every level's edges are read) and group queries over the 100
//! sensors. Reports latency and documents read per query, and checks each
//! long average against the dataset's truth.

use std::time::Instant;

use crate::ctx::Ctx;
use crate::dataset::{Dataset, DatasetArgs, rfc3339};
use crate::procs::scrape;
use crate::report::{Report, Section, f, percentiles};

const DOCS_SUM: &str = "hourglass_query_documents_read_sum";

/// Runs `path` `n` times in a row; latencies (ms) and documents read per query.
async fn measure(
    url: &str,
    path: &str,
    n: usize,
) -> anyhow::Result<(Vec<f64>, f64, serde_json::Value)> {
    let client = reqwest::Client::new();
    let before = scrape(url).await?.get(DOCS_SUM).copied().unwrap_or(0.0);
    let mut ms = Vec::with_capacity(n);
    let mut last = serde_json::Value::Null;
    for _ in 0..n {
        let t = Instant::now();
        let r = client.get(format!("{url}{path}")).send().await?;
        anyhow::ensure!(r.status().is_success(), "{path}: {}", r.status());
        last = r.json().await?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let after = scrape(url).await?.get(DOCS_SUM).copied().unwrap_or(0.0);
    Ok((ms, (after - before) / n as f64, last))
}

pub async fn run(
    ctx: &Ctx,
    days: u32,
    repeats: usize,
    fleet_sensors: u32,
    interval: u32,
) -> anyhow::Result<(Report, bool)> {
    let target = ctx
        .target_with(
            "ranges",
            "minute",
            false,
            false,
            crate::ctx::long_running(days + 2),
        )
        .await?;
    // The fleet for group queries goes first: its sensor 0 is the long
    // series' sensor, whose last hours the long series then overwrites
    // where both have a reading (the truth below does the same).
    let fleet = Dataset::recent(
        DatasetArgs {
            sensors: fleet_sensors + 1,
            metrics: 1,
            seconds: 6 * 3600,
            interval: 60,
            seed: 9,
        },
        3600,
    );
    crate::backfill::send_all(ctx, &target, &fleet, 5000, 2).await?;
    let long = Dataset::recent(
        DatasetArgs {
            sensors: 1,
            metrics: 1,
            seconds: days * 86_400,
            interval,
            seed: 7,
        },
        3600,
    );
    let started = Instant::now();
    crate::backfill::send_all(ctx, &target, &long, 5000, 2).await?;
    let backfill_s = started.elapsed().as_secs_f64();

    let truth: std::collections::BTreeMap<i64, f64> = fleet
        .rows()
        .filter(|r| r.0 == 0)
        .chain(long.rows())
        .map(|(_, _, ts, v)| (ts, v))
        .collect();
    let sensor = Dataset::sensor(0);
    let metric = Dataset::metric(0);
    let end = long.end() - 7;
    let mut s = Section::new(
        &format!(
            "Query cost by range: one series, a reading every {interval} s over {days} days (written in {backfill_s:.0} s)"
        ),
        &["query", "n", "p50 ms", "p99 ms", "documents read", "exact"],
    );
    let mut ok = true;
    let mut json = serde_json::Map::new();
    let mut base = None;
    for span in [1u32, 7, 60, 400].into_iter().filter(|&d| d <= days) {
        let from = end - i64::from(span) * 86_400 + 3600 + 61;
        let path = format!(
            "/api/v1/sensors/{sensor}/average?metric={metric}&from={}&to={}",
            rfc3339(from),
            rfc3339(end)
        );
        let (ms, docs, got) = measure(&target.url, &path, repeats).await?;
        // The truth (values are multiples of 1/8: sums are exact): the
        // long series over the fleet's sensor 0 where both have a second.
        let (mut want_count, mut want_sum) = (0u64, 0.0);
        for (_, v) in truth.range(from..end) {
            want_count += 1;
            want_sum += v;
        }
        let exact =
            got["count"].as_u64() == Some(want_count) && got["sum"].as_f64() == Some(want_sum);
        ok &= exact;
        let (p50, p99, _) = percentiles(ms.clone());
        let ratio = match base {
            None => {
                base = Some(p50);
                1.0
            }
            Some(b) => p50 / b,
        };
        s.row(vec![
            format!("average {span}d"),
            ms.len().to_string(),
            f(p50),
            f(p99),
            f(docs),
            exact.to_string(),
        ]);
        json.insert(
            format!("average_{span}d"),
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs, "exact": exact, "vs_1d": ratio }),
        );
    }
    let fend = fleet.end();
    for (name, path) in [
        (
            "group average 6h over the fleet",
            format!(
                "/api/v1/average?metric={metric}&sensor=lt-000*&from={}&to={}",
                rfc3339(fend - 6 * 3600),
                rfc3339(fend)
            ),
        ),
        (
            "group series 6h / 1h by sensor over the fleet",
            format!(
                "/api/v1/series?metric={metric}&sensor=lt-000*&from={}&to={}&step=1h&group_by=sensor",
                rfc3339(fend - 6 * 3600),
                rfc3339(fend)
            ),
        ),
    ] {
        let (ms, docs, _) = measure(&target.url, &path, repeats).await?;
        let (p50, p99, _) = percentiles(ms.clone());
        s.row(vec![
            name.into(),
            ms.len().to_string(),
            f(p50),
            f(p99),
            f(docs),
            "-".into(),
        ]);
        json.insert(
            name.into(),
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs }),
        );
    }
    let mut report = Report::new("Hourglass query cost by range");
    report.sections.push(s);
    report.set("ranges", json);
    Ok((report, ok))
}

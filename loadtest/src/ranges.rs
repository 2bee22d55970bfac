//! `ranges`: what a query costs as its range grows. One series of minute
//! data written through the service over `--days` days, and 100 sensors
//! over the last hours; averages over 1, 7, 60 and 400 days (unaligned
//! ends, so every level's edges are read) and group queries over the 100
//! sensors. Reports latency and documents read per query, and checks each
//! long average against the dataset's truth; then the same series goes as
//! line protocol into VictoriaMetrics and InfluxDB 1.x, which answer the same
//! averages, timed and checked the same way.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::ctx::Ctx;
use crate::dataset::{Dataset, DatasetArgs, Row, rfc3339};
use crate::peers::{send_rows, start_influx, start_victoria};
use crate::procs::scrape;
use crate::report::{Report, Section, f, percentiles};

const DOCS_SUM: &str = "hourglass_query_documents_read_sum";

/// Runs `path` `n` times in a row; latencies (ms), documents read per query
/// and the last answer.
async fn measure(
    url: &str,
    path: &str,
    n: usize,
) -> anyhow::Result<(Vec<f64>, f64, serde_json::Value)> {
    let before = scrape(url).await?.get(DOCS_SUM).copied().unwrap_or(0.0);
    let (ms, last) = timed(&format!("{url}{path}"), n).await?;
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

    let truth: BTreeMap<i64, f64> = fleet
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
        &[
            "query",
            "n",
            "p50 ms",
            "p99 ms",
            "vs 1d",
            "documents read",
            "exact",
        ],
    );
    let mut ok = true;
    let mut json = serde_json::Map::new();
    let mut base = None;
    let spans: Vec<u32> = [1u32, 7, 60, 400]
        .into_iter()
        .filter(|&d| d <= days)
        .collect();
    let mut hourglass_p50 = Vec::new();
    for &span in &spans {
        let from = span_from(end, span);
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
        hourglass_p50.push(p50);
        s.row(vec![
            format!("average {span}d"),
            ms.len().to_string(),
            f(p50),
            f(p99),
            format!("{ratio:.2}×"),
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
            "-".into(),
            f(docs),
            "-".into(),
        ]);
        json.insert(
            name.into(),
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs }),
        );
    }
    drop(target);
    let rows: Vec<Row> = truth.iter().map(|(&ts, &v)| (0, 0, ts, v)).collect();
    let (peers, peers_ok) = peers(ctx, &rows, &truth, &spans, end, repeats, &hourglass_p50).await?;
    json.insert("peers".into(), peers.1);
    let mut report = Report::new("Hourglass query cost by range");
    report.sections.push(s);
    report.sections.push(peers.0);
    report.set("ranges", json);
    Ok((report, ok && peers_ok))
}

/// The first second of the `span`-day average ending at `end`: unaligned, so
/// every level's edges are read.
fn span_from(end: i64, span: u32) -> i64 {
    end - i64::from(span) * 86_400 + 3600 + 61
}

/// `url` `n` times in a row: latencies (ms) and the last answer.
async fn timed(url: &str, n: usize) -> anyhow::Result<(Vec<f64>, serde_json::Value)> {
    let client = reqwest::Client::new();
    let mut ms = Vec::with_capacity(n);
    let mut last = serde_json::Value::Null;
    for _ in 0..n {
        let t = Instant::now();
        let r = client.get(url).send().await?;
        anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
        last = r.json().await?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((ms, last))
}

/// The mean of the truth's readings at `from <= ts < to` (`left_open`:
/// `from < ts <= to`, PromQL's window).
fn mean(truth: &BTreeMap<i64, f64>, from: i64, to: i64, left_open: bool) -> f64 {
    let range = if left_open {
        truth.range(from + 1..to + 1)
    } else {
        truth.range(from..to)
    };
    let (n, sum) = range.fold((0u64, 0.0), |(n, s), (_, v)| (n + 1, s + v));
    sum / n as f64
}

/// The same series in VictoriaMetrics and InfluxDB 1.x, the same averages.
async fn peers(
    ctx: &Ctx,
    rows: &[Row],
    truth: &BTreeMap<i64, f64>,
    spans: &[u32],
    end: i64,
    repeats: usize,
    hourglass_p50: &[f64],
) -> anyhow::Result<((Section, serde_json::Value), bool)> {
    // No result cache: every repeat computes, as Hourglass does.
    let vm = start_victoria(&["-search.disableCache"]).await?;
    send_rows(ctx, &format!("{}/write?precision=s", vm.url), rows, 5000, 2).await?;
    let _ = reqwest::get(format!("{}/internal/force_flush", vm.url)).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let mut vm_answers = Vec::new();
    for &span in spans {
        let from = span_from(end, span);
        let url = format!(
            "{}/api/v1/query?query=avg_over_time(m0_value%7Bsensor%3D%22lt-00000%22%7D%5B{}s%5D)&time={end}",
            vm.url,
            end - from
        );
        let (ms, got) = timed(&url, repeats).await?;
        let value = got["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok());
        vm_answers.push((ms, value == Some(mean(truth, from, end, true))));
    }
    vm.stop();

    let influx = start_influx().await?;
    send_rows(
        ctx,
        &format!("{}/write?db=hg&precision=s", influx.url),
        rows,
        5000,
        2,
    )
    .await?;
    let mut influx_answers = Vec::new();
    for &span in spans {
        let from = span_from(end, span);
        let sql = format!(
            "SELECT mean(value) FROM m0 WHERE sensor='lt-00000' AND time >= '{}' AND time < '{}'",
            rfc3339(from),
            rfc3339(end)
        );
        let url = format!(
            "{}/query?db=hg&q={}",
            influx.url,
            sql.replace(' ', "%20").replace('\'', "%27")
        );
        let (ms, got) = timed(&url, repeats).await?;
        let value = got["results"][0]["series"][0]["values"][0][1].as_f64();
        influx_answers.push((ms, value == Some(mean(truth, from, end, false))));
    }
    influx.stop();

    let mut s = Section::new(
        "The same averages in VictoriaMetrics and InfluxDB 1.x (the same series as line protocol; p50 ms, and each against its own 1-day figure)",
        &[
            "query",
            "Hourglass",
            "VictoriaMetrics",
            "exact",
            "InfluxDB 1.x",
            "exact",
        ],
    );
    let mut json = serde_json::Map::new();
    let mut ok = true;
    let p50 = |ms: &[f64]| percentiles(ms.to_vec()).0;
    let (vm1, in1) = (p50(&vm_answers[0].0), p50(&influx_answers[0].0));
    for (i, &span) in spans.iter().enumerate() {
        let (vm_ms, in_ms) = (p50(&vm_answers[i].0), p50(&influx_answers[i].0));
        let (vm_exact, in_exact) = (vm_answers[i].1, influx_answers[i].1);
        ok &= vm_exact && in_exact;
        let hg = hourglass_p50[i];
        s.row(vec![
            format!("average {span}d"),
            format!("{} ({:.2}×)", f(hg), hg / hourglass_p50[0]),
            format!("{} ({:.2}×)", f(vm_ms), vm_ms / vm1),
            vm_exact.to_string(),
            format!("{} ({:.2}×)", f(in_ms), in_ms / in1),
            in_exact.to_string(),
        ]);
        json.insert(
            format!("average_{span}d"),
            serde_json::json!({
                "victoria_metrics": { "p50_ms": vm_ms, "exact": vm_exact },
                "influxdb": { "p50_ms": in_ms, "exact": in_exact },
            }),
        );
    }
    Ok(((s, serde_json::Value::Object(json)), ok))
}

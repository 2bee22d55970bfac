//! `promql`: the same samples in Hourglass, Prometheus and VictoriaMetrics,
//! the same PromQL sent to each: a 24-hour range at a 1-minute step and a
//! 30-day range at a 1-hour step, for one sensor and for the whole fleet.
//! Reports latency (and Hourglass' documents read), and checks Hourglass'
//! answers against Prometheus'.
//!
//! The data: `--days − 1` days at one reading per `--sparse-interval`
//! (15 minutes), then one day at one per `--dense-interval` (a minute).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::dataset::{Dataset, DatasetArgs};
use crate::panel_timing::{no_cache_client, timed_median as timed, timed_or_nan};
use crate::peer_servers::{send_lines, start_victoria, which};
use crate::procs::{Proc, http_url, scrape};
use crate::report::{Report, Section, f};

const DOCS_SUM: &str = "hourglass_query_documents_read_sum";

async fn start_prometheus(data: &[&Dataset]) -> anyhow::Result<Proc> {
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("samples.om");
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(&input)?);
        writeln!(w, "# TYPE m0_value gauge")?;
        for d in data {
            for (i, _, ts, v) in d.rows() {
                writeln!(w, "m0_value{{sensor=\"{}\"}} {v} {ts}", Dataset::sensor(i))?;
            }
        }
        writeln!(w, "# EOF")?;
    }
    let tsdb = dir.path().join("data");
    let out = Command::new(which("promtool")?)
        .args(["tsdb", "create-blocks-from", "openmetrics", "-q"])
        .arg(&input)
        .arg(&tsdb)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "promtool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, "global: {}\n")?;
    let child = Command::new(which("prometheus")?)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", tsdb.display()))
        .arg("--web.listen-address=127.0.0.1:0")
        .arg("--storage.tsdb.retention.time=100y")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = child.id();
    let mut proc = Proc {
        pid,
        child,
        url: String::new(),
        dir: Some(dir),
    };
    proc.url = http_url(pid, "/-/ready", Duration::from_secs(120)).await?;
    Ok(proc)
}

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Per series (labels without `__name__`), per timestamp, the value.
fn points(answer: &serde_json::Value) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for s in answer["data"]["result"].as_array().into_iter().flatten() {
        let mut labels = s["metric"].clone();
        if let Some(m) = labels.as_object_mut() {
            m.remove("__name__");
        }
        let values = s["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p[0].to_string(), p[1].as_str()?.parse().ok()?)))
            .collect();
        out.insert(labels.to_string(), values);
    }
    out
}

fn agree(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    let (a, b) = (points(a), points(b));
    a.len() == b.len()
        && a.iter().all(|(k, av)| {
            b.get(k).is_some_and(|bv| {
                av.len() == bv.len()
                    && av.iter().all(|(t, x)| {
                        bv.get(t)
                            .is_some_and(|y| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0))
                    })
            })
        })
}

pub async fn run(
    ctx: &Ctx,
    sensors: u32,
    days: u32,
    repeats: usize,
    intervals: (u32, u32),
) -> anyhow::Result<(Report, bool)> {
    // Long: one row per query, each asked of Hourglass cold and on refresh, of Prometheus and of VictoriaMetrics, and compared.
    let (sparse_interval, dense_interval) = intervals;
    let days = days.max(2);
    let now = jiff::Timestamp::now().as_second();
    let end = now - now.rem_euclid(3600) - 3600;
    // Readings seven seconds past the minute: Grafana's aligned windows
    // (t − step, t] never have one on an end, where Prometheus 2.42 (left-
    // closed) and Prometheus 3 and Hourglass (left-open) differ. Edges are
    // tested against a brute-force model in the service's tests.
    let minute_start = end - 86_400 + 7;
    let sparse = Dataset::new(
        DatasetArgs {
            sensors,
            metrics: 1,
            seconds: (days - 1) * 86_400,
            interval: sparse_interval,
            seed: 11,
        },
        minute_start - i64::from(days - 1) * 86_400,
    );
    let dense = Dataset::new(
        DatasetArgs {
            sensors,
            metrics: 1,
            seconds: 86_400,
            interval: dense_interval,
            seed: 12,
        },
        minute_start,
    );
    let readings = sparse.len() + dense.len();

    let target = ctx
        .target_with(
            "promql",
            "minute",
            false,
            false,
            crate::ctx::long_running(days + 2),
        )
        .await?;
    let started = Instant::now();
    crate::send::send_all(ctx, &target, &sparse, 5000, 2).await?;
    crate::send::send_all(ctx, &target, &dense, 5000, 2).await?;
    let hourglass_load_s = started.elapsed().as_secs_f64();
    // The data lies in ended hours: queries are measured once those are
    // rolled up (until then they read the buckets).
    crate::waits::rolled_up(ctx, &target.database, std::time::Duration::from_secs(3600)).await?;

    let vm = start_victoria(&[]).await?;
    for d in [&sparse, &dense] {
        send_lines(ctx, &format!("{}/write?precision=s", vm.url), d, 5000, 4).await?;
    }
    let client = reqwest::Client::new();
    let cold = no_cache_client()?;
    let _ = client
        .get(format!("{}/internal/force_flush", vm.url))
        .send()
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let prom = start_prometheus(&[&sparse, &dense]).await?;

    let one = r#"sensor="lt-00000""#;
    let queries = [
        (
            "24h / 1m, 1 sensor",
            86_400,
            60,
            format!("avg_over_time(M{{{one}}}[1m])"),
        ),
        (
            "24h / 1m, whole fleet",
            86_400,
            60,
            "avg(avg_over_time(M[1m]))".to_owned(),
        ),
        (
            "30d / 1h, 1 sensor",
            i64::from(days) * 86_400,
            3600,
            format!("avg_over_time(M{{{one}}}[1h])"),
        ),
        (
            "30d / 1h, whole fleet",
            i64::from(days) * 86_400,
            3600,
            "avg(avg_over_time(M[1h]))".to_owned(),
        ),
    ];
    let mut s = Section::new(
        &format!(
            "PromQL range queries: {sensors} sensors, {readings} readings over {days} days (Hourglass loaded in {hourglass_load_s:.0} s), evaluation times aligned to the step as Grafana sends them"
        ),
        &[
            "query",
            "Hourglass ms, cold",
            "Hourglass ms, refresh",
            "documents read (cold)",
            "documents bound",
            "round trips",
            "Prometheus ms",
            "VictoriaMetrics ms",
            "Hourglass / Prometheus",
            "same answer as Prometheus",
        ],
    );
    let mut ok = true;
    let mut json = serde_json::Map::new();
    for (name, range, step, q) in &queries {
        // The issue's bound: 1.5 documents per series and day (plus two
        // days) at a 1 h step; at a 1 m step, the hour documents of a day.
        let series = if name.contains("fleet") {
            f64::from(sensors)
        } else {
            1.0
        };
        let days = (*range as f64 / 86_400.0).ceil();
        let bound = if *step >= 3600 {
            1.5 * series * (days + 2.0)
        } else {
            1.5 * series * (days * 24.0 + 2.0)
        };
        let start = end - range;
        let args = |expr: String| {
            format!(
                "query={}&start={start}&end={end}&step={step}",
                encode(&expr)
            )
        };
        // Hourglass' metric is `m0`; line protocol made it `m0_value` in the peers.
        let hq = q.replace('M', r#"{__name__="m0"}"#).replace("}{", ",");
        let pq = q.replace('M', "m0_value");
        let before = scrape(&target.url).await?;
        let hurl = format!("{}/prometheus/api/v1/query_range?{}", target.url, args(hq));
        // Cold: from storage (the results cache bypassed; it is filled).
        let (h_ms, h) = timed_or_nan(&cold, &hurl, repeats).await;
        let after = scrape(&target.url).await?;
        // A dashboard's refresh: the closed hours from the cache.
        let (refresh_ms, refreshed) = timed_or_nan(&client, &hurl, repeats).await;
        ok &= refreshed == h;
        let per_query = |k: &str| {
            (after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0))
                / repeats as f64
        };
        let docs = per_query(DOCS_SUM);
        let trips = per_query("hourglass_query_round_trips_sum");
        ok &= docs <= bound;
        let (p_ms, p) = timed(
            &client,
            &format!("{}/api/v1/query_range?{}", prom.url, args(pq.clone())),
            repeats,
        )
        .await?;
        let (v_ms, _) = timed_or_nan(
            &client,
            &format!("{}/api/v1/query_range?{}", vm.url, args(pq)),
            repeats,
        )
        .await;
        let same = agree(&h, &p);
        if !same && std::env::var_os("LOADTEST_DEBUG").is_some() {
            eprintln!("{name}\nHourglass: {h}\nPrometheus: {p}");
        }
        ok &= same;
        s.row(vec![
            (*name).into(),
            f(h_ms),
            f(refresh_ms),
            f(docs),
            f(bound),
            f(trips),
            f(p_ms),
            f(v_ms),
            f(h_ms / p_ms.max(1e-9)),
            same.to_string(),
        ]);
        json.insert(
            (*name).into(),
            serde_json::json!({"hourglass_ms": h_ms, "hourglass_refresh_ms": refresh_ms, "documents": docs, "documents_bound": bound,
                "round_trips": trips, "prometheus_ms": p_ms,
                "victoriametrics_ms": v_ms, "same_as_prometheus": same}),
        );
    }
    prom.stop();
    vm.stop();
    let mut report = Report::new("PromQL: Hourglass, Prometheus and VictoriaMetrics");
    report.sections.push(s);
    report.notes.push(
        "Hourglass reads through the Python stand-in SecantusDB, whose cost per document dominates its latency; Prometheus and VictoriaMetrics read their own files. The documents and round-trips columns are what a real MongoDB would do; the documents bound is 1.5 per series and day plus two days (1 h steps), or 1.5 per series and hour (1 m steps).".into(),
    );
    report.set("promql", json);
    Ok((report, ok))
}

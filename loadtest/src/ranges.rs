//! `ranges`: what a query costs as its range grows. One series of minute
//! data written through the service over `--days` days, and 100 sensors
//! over the last hours; averages over 1, 7, 60 and 400 days (unaligned
//! ends, so every level's edges are read) and group queries over the 100
//! sensors. Reports latency and documents read per query, and checks each
//! long average and the group average against the dataset's truth, and the
//! same spans' time-weighted averages (`weighting=time`) against a model of
//! the held time, and those of a sensor reporting by exception
//! (`exception`); then the
//! same readings go as line protocol into VictoriaMetrics and InfluxDB 1.x,
//! which answer the same averages, timed and checked the same way.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::ctx::Ctx;
use crate::dataset::{Dataset, DatasetArgs, Row, rfc3339};
use crate::peer_servers::{send_rows, start_influx, start_victoria};
use crate::procs::timed;
use crate::range_probe::{average_path, held_time, measure, span_from, timing_row};
use crate::report::{Report, Section, f, percentiles};

pub async fn run(
    ctx: &Ctx,
    days: u32,
    repeats: usize,
    fleet_sensors: u32,
    interval: u32,
) -> anyhow::Result<(Report, bool)> {
    // Long: the scenario's steps in order (data and its truth, averages, percentiles, by exception, the day panel, groups, bytes, peers), each a call.
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
    crate::send::send_all(ctx, &target, &fleet, 5000, 2).await?;
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
    crate::send::send_all(ctx, &target, &long, 5000, 2).await?;
    let backfill_s = started.elapsed().as_secs_f64();
    // The data lies in ended hours: queries are measured once those are
    // rolled up (until then they read the buckets).
    crate::waits::rolled_up(ctx, &target.database, std::time::Duration::from_secs(3600)).await?;

    // Every stored reading, by sensor and second: the long series written
    // after the fleet replaces the fleet's sensor 0 where both have a second.
    let all: BTreeMap<(u32, i64), f64> = fleet
        .rows()
        .chain(long.rows())
        .map(|(i, _, ts, v)| ((i, ts), v))
        .collect();
    let truth: BTreeMap<i64, f64> = all
        .range((0, i64::MIN)..(1, i64::MIN))
        .map(|(&(_, ts), &v)| (ts, v))
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
    let r = Series {
        url: &target.url,
        sensor: &sensor,
        metric: &metric,
        truth: &truth,
        end,
        days,
        repeats,
    };
    let mut json = serde_json::Map::new();
    let mut asked = Vec::new();
    let mut ok = averages(&r, &mut s, &mut json, &mut asked).await?;
    // Percentiles from the rollups' sketches, over the same data.
    let quantile_spans: Vec<u32> = [1u32, 30, 400].into_iter().filter(|&d| d <= days).collect();
    ok &= crate::percentile::measure(
        &target.url,
        (&sensor, &metric),
        &truth,
        (&quantile_spans, end),
        repeats,
        ("p50, p95, p99", "quantiles"),
        &mut s,
        &mut json,
    )
    .await?;
    // A sensor reporting by exception over the same span.
    ok &= crate::exception::measure_all(
        ctx,
        &target,
        (long.start, long.end()),
        days,
        repeats,
        &mut s,
        &mut json,
    )
    .await?;
    ok &= day_panel(&r, &mut s, &mut json).await?;
    ok &= group_queries(&r, &fleet, &all, &mut s, &mut json, &mut asked).await?;
    let bytes = rollup_bytes(ctx, &target.database, &r, &long, &mut json).await?;
    drop(target);
    let rows: Vec<Row> = all.iter().map(|(&(i, ts), &v)| (i, 0, ts, v)).collect();
    let (peers, peers_ok) = peers(ctx, &rows, &all, &asked, repeats).await?;
    json.insert("peers".into(), peers.1);
    let mut report = Report::new("Hourglass query cost by range");
    report.sections.push(s);
    report.sections.push(bytes);
    report.sections.push(peers.0);
    report.set("ranges", json);
    Ok((report, ok && peers_ok))
}

/// The long series and its truth: what each step's queries ask and check.
struct Series<'a> {
    url: &'a str,
    sensor: &'a str,
    metric: &'a str,
    /// Every stored reading of the series, by second.
    truth: &'a BTreeMap<i64, f64>,
    /// Where the queries' windows end.
    end: i64,
    days: u32,
    repeats: usize,
}

/// Averages over 1, 7, 60 and 400 days (those within the data), plain and
/// weighted by time, against the truth. Whether all were exact.
async fn averages(
    r: &Series<'_>,
    s: &mut Section,
    json: &mut serde_json::Map<String, serde_json::Value>,
    asked: &mut Vec<Asked>,
) -> anyhow::Result<bool> {
    // Long: two loops over the spans, plain then time-weighted, each a query, its truth and its row.
    let Series {
        url,
        sensor,
        metric,
        truth,
        end,
        days,
        repeats,
    } = *r;
    let mut ok = true;
    let mut base = None;
    let spans: Vec<u32> = [1u32, 7, 60, 400]
        .into_iter()
        .filter(|&d| d <= days)
        .collect();
    for &span in &spans {
        let from = span_from(end, span);
        let path = average_path(sensor, metric, from, end, "");
        let (ms, docs, got) = measure(url, &path, repeats).await?;
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
        let window = end - from;
        asked.push(Asked {
            name: format!("average {span}d"),
            hourglass_ms: p50,
            promql: format!(r#"avg_over_time(m0_value{{sensor="{sensor}"}}[{window}s])"#),
            sql: format!("SELECT mean(value) FROM m0 WHERE sensor='{sensor}'"),
            from,
            to: end,
            sensors: Box::new(|i| i == 0),
        });
        s.row(timing_row(
            format!("average {span}d"),
            &ms,
            (p50, p99),
            format!("{ratio:.2}×"),
            f(docs),
            exact.to_string(),
        ));
        json.insert(
            format!("average_{span}d"),
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs, "exact": exact, "vs_1d": ratio }),
        );
    }
    // The same spans weighted by time, against the held time of the truth.
    for &span in &spans {
        let from = span_from(end, span);
        let path = average_path(sensor, metric, from, end, "&weighting=time");
        let (ms, docs, got) = measure(url, &path, repeats).await?;
        let (held, integral) = held_time(truth, from, end, 86_400);
        let want = integral / held.max(1) as f64;
        let exact = got["held_seconds"].as_i64() == Some(held)
            && got["avg"]
                .as_f64()
                .is_some_and(|a| (a - want).abs() <= 1e-9 * want.abs().max(1.0));
        ok &= exact;
        let (p50, p99, _) = percentiles(ms.clone());
        let name = format!("time-weighted {span}d");
        s.row(timing_row(
            name.clone(),
            &ms,
            (p50, p99),
            base.map_or("-".into(), |b| format!("{:.2}×", p50 / b)),
            f(docs),
            exact.to_string(),
        ));
        json.insert(
            format!("time_weighted_{span}d"),
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs, "exact": exact }),
        );
    }
    Ok(ok)
}

/// A Grafana panel over the whole span at a 1 d step, aligned to days:
/// each window (t − 1d, t] the rest of a day slot and the first second of
/// the next, from the 30-day documents alone (the issue's bound: 1.5 per
/// thirty days plus two).
async fn day_panel(
    r: &Series<'_>,
    s: &mut Section,
    json: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<bool> {
    let Series {
        url,
        sensor,
        metric,
        truth,
        end,
        days,
        repeats,
    } = *r;
    let mut ok = true;
    let last = end - end.rem_euclid(86_400);
    let first = last - i64::from(days.saturating_sub(1)) * 86_400;
    let q = format!(r#"sum_over_time({{__name__="{metric}",sensor="{sensor}"}}[1d])"#);
    let q: String = url::form_urlencoded::byte_serialize(q.as_bytes()).collect();
    let path =
        format!("/prometheus/api/v1/query_range?query={q}&start={first}&end={last}&step=86400");
    let (ms, docs, got) = measure(url, &path, repeats).await?;
    let values: BTreeMap<i64, f64> = got["data"]["result"][0]["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p[0].as_i64()?, p[1].as_str()?.parse().ok()?)))
        .collect();
    let want: BTreeMap<i64, f64> = (first..=last)
        .step_by(86_400)
        .filter_map(|t| {
            let inside: Vec<f64> = truth
                .range(t - 86_400 + 1..t + 1)
                .map(|(_, v)| *v)
                .collect();
            (!inside.is_empty()).then(|| (t, inside.iter().sum()))
        })
        .collect();
    let exact = values == want;
    let bound = 1.5 * (f64::from(days) / 30.0 + 2.0);
    ok &= exact && docs <= bound;
    let (p50, p99, _) = percentiles(ms.clone());
    let name = format!("PromQL {days}d / 1d panel");
    s.row(timing_row(
        name.clone(),
        &ms,
        (p50, p99),
        "-".into(),
        format!("{} (bound {})", f(docs), f(bound)),
        exact.to_string(),
    ));
    json.insert(
        name,
        serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs, "documents_bound": bound, "exact": exact }),
    );
    Ok(ok)
}

/// The group average and series over the fleet's `lt-000*` sensors; the
/// average against the truth. Whether it was exact.
async fn group_queries(
    r: &Series<'_>,
    fleet: &Dataset,
    all: &BTreeMap<(u32, i64), f64>,
    s: &mut Section,
    json: &mut serde_json::Map<String, serde_json::Value>,
    asked: &mut Vec<Asked>,
) -> anyhow::Result<bool> {
    // Long: two queries in one loop, each timed, checked and offered to the peers.
    let Series {
        url,
        metric,
        repeats,
        ..
    } = *r;
    let mut ok = true;
    let fend = fleet.end();
    let in_glob = |i: u32| Dataset::sensor(i).starts_with("lt-000");
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
        let (ms, docs, got) = measure(url, &path, repeats).await?;
        let (p50, p99, _) = percentiles(ms.clone());
        // The group average's one group against the truth; the series by
        // sensor is timed only.
        let exact = got["groups"][0].get("count").map(|count| {
            let (n, sum) = totals(all, &in_glob, fend - 6 * 3600, fend, false);
            count.as_u64() == Some(n) && got["groups"][0]["sum"].as_f64() == Some(sum)
        });
        ok &= exact.unwrap_or(true);
        s.row(timing_row(
            name,
            &ms,
            (p50, p99),
            "-".into(),
            f(docs),
            exact.map_or("-".into(), |e| e.to_string()),
        ));
        json.insert(
            name.into(),
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99, "documents": docs, "exact": exact }),
        );
        if exact.is_some() {
            let window = 6 * 3600;
            asked.push(Asked {
                name: name.into(),
                hourglass_ms: p50,
                promql: format!(
                    r#"sum(sum_over_time(m0_value{{sensor=~"lt-000.*"}}[{window}s])) / sum(count_over_time(m0_value{{sensor=~"lt-000.*"}}[{window}s]))"#
                ),
                sql: "SELECT mean(value) FROM m0 WHERE sensor =~ /^lt-000/".into(),
                from: fend - window,
                to: fend,
                sensors: Box::new(in_glob),
            });
        }
    }
    Ok(ok)
}

/// What the sketches and time integrals add to the rollups, per reading:
/// of the dense series and of the one reporting by exception.
async fn rollup_bytes(
    ctx: &Ctx,
    database: &str,
    r: &Series<'_>,
    long: &Dataset,
    json: &mut serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<Section> {
    let Series {
        sensor,
        metric,
        truth,
        ..
    } = *r;
    // What the sketches and time integrals add to the rollups, per reading.
    let mut bytes = Section::new(
        "Rollup bytes per reading (sketches at the default 1 % accuracy)",
        &[
            "series",
            "readings",
            "rollup documents",
            "rollup bytes",
            "per reading",
            "of which sketches",
            "of which time integrals",
        ],
    );
    let exception_sensor = Dataset::sensor(crate::exception::SENSOR);
    let exception_readings = crate::exception::readings(long.start, long.end(), 66).len();
    for (name, who, readings) in [
        ("dense", sensor, truth.len()),
        (
            "by exception",
            exception_sensor.as_str(),
            exception_readings,
        ),
    ] {
        let b = crate::percentile::rollup_bytes(ctx, database, (who, metric)).await?;
        bytes.row(crate::percentile::bytes_row(name, b, readings));
        let per = |x: u64| x as f64 / readings.max(1) as f64;
        json.insert(
            format!("rollup_bytes_{}", name.replace(' ', "_")),
            serde_json::json!({
                "readings": readings, "documents": b.documents, "bytes": b.total,
                "per_reading": per(b.total), "sketches_per_reading": per(b.sketches),
                "integrals_per_reading": per(b.integrals),
            }),
        );
    }
    Ok(bytes)
}

/// One query asked of Hourglass and then of its peers: the mean of
/// metric 0 over `sensors` at `from <= ts < to`.
struct Asked {
    name: String,
    hourglass_ms: f64,
    /// Evaluated at `to` (PromQL's window: `from < ts <= to`).
    promql: String,
    /// Completed with the time condition.
    sql: String,
    from: i64,
    to: i64,
    sensors: Box<dyn Fn(u32) -> bool>,
}

/// Readings and their sum over `sensors` at `from <= ts < to` (`left_open`:
/// `from < ts <= to`, PromQL's window).
fn totals(
    all: &BTreeMap<(u32, i64), f64>,
    sensors: &dyn Fn(u32) -> bool,
    from: i64,
    to: i64,
    left_open: bool,
) -> (u64, f64) {
    let (from, to) = if left_open {
        (from + 1, to + 1)
    } else {
        (from, to)
    };
    all.iter()
        .filter(|&(&(i, ts), _)| ts >= from && ts < to && sensors(i))
        .fold((0, 0.0), |(n, sum), (_, v)| (n + 1, sum + v))
}

/// A peer's mean against the truth's. Hourglass answers the count and the
/// sum, compared exactly; a peer answers only the mean, which it may
/// accumulate in another order or per shard, so it agrees within rounding.
fn agrees(got: Option<f64>, want: f64) -> bool {
    got.is_some_and(|g| (g - want).abs() <= 1e-12 * want.abs().max(1.0))
}

/// The same readings in VictoriaMetrics and InfluxDB 1.x, the same queries.
async fn peers(
    ctx: &Ctx,
    rows: &[Row],
    all: &BTreeMap<(u32, i64), f64>,
    asked: &[Asked],
    repeats: usize,
) -> anyhow::Result<((Section, serde_json::Value), bool)> {
    // Long: the peers' loads and then one row per query asked of each, against the truth.
    let client = reqwest::Client::new();
    let mean = |a: &Asked, left_open: bool| {
        let (n, sum) = totals(all, &a.sensors, a.from, a.to, left_open);
        sum / n as f64
    };
    // No result cache: every repeat computes, as Hourglass does.
    let vm = start_victoria(&["-search.disableCache"]).await?;
    send_rows(ctx, &format!("{}/write?precision=s", vm.url), rows, 5000, 2).await?;
    let _ = reqwest::get(format!("{}/internal/force_flush", vm.url)).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let mut vm_answers = Vec::new();
    for a in asked {
        let mut url = reqwest::Url::parse(&format!("{}/api/v1/query", vm.url))?;
        url.query_pairs_mut()
            .append_pair("query", &a.promql)
            .append_pair("time", &a.to.to_string());
        let (ms, got) = timed(&client, url.as_str(), repeats).await?;
        let value = got["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok());
        vm_answers.push((ms, agrees(value, mean(a, true))));
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
    for a in asked {
        let sql = format!(
            "{} AND time >= '{}' AND time < '{}'",
            a.sql,
            rfc3339(a.from),
            rfc3339(a.to)
        );
        let mut url = reqwest::Url::parse(&format!("{}/query", influx.url))?;
        url.query_pairs_mut()
            .append_pair("db", "hg")
            .append_pair("q", &sql);
        let (ms, got) = timed(&client, url.as_str(), repeats).await?;
        let value = got["results"][0]["series"][0]["values"][0][1].as_f64();
        influx_answers.push((ms, agrees(value, mean(a, false))));
    }
    influx.stop();

    let mut s = Section::new(
        "The same queries in VictoriaMetrics and InfluxDB 1.x (the same readings as line protocol; p50 ms, and each long average against its own 1-day figure)",
        &[
            "query",
            "Hourglass",
            "VictoriaMetrics",
            "agrees",
            "InfluxDB 1.x",
            "agrees",
        ],
    );
    let mut json = serde_json::Map::new();
    let mut ok = true;
    let p50 = |ms: &[f64]| percentiles(ms.to_vec()).0;
    let (hg1, vm1, in1) = (
        asked[0].hourglass_ms,
        p50(&vm_answers[0].0),
        p50(&influx_answers[0].0),
    );
    for (i, a) in asked.iter().enumerate() {
        let (vm_ms, in_ms) = (p50(&vm_answers[i].0), p50(&influx_answers[i].0));
        let (vm_exact, in_exact) = (vm_answers[i].1, influx_answers[i].1);
        ok &= vm_exact && in_exact;
        // Ratios only along the growing ranges.
        let cell = |ms: f64, base: f64| {
            if a.name.starts_with("average") {
                format!("{} ({:.2}×)", f(ms), ms / base)
            } else {
                f(ms)
            }
        };
        s.row(vec![
            a.name.clone(),
            cell(a.hourglass_ms, hg1),
            cell(vm_ms, vm1),
            vm_exact.to_string(),
            cell(in_ms, in1),
            in_exact.to_string(),
        ]);
        json.insert(
            a.name.replace(' ', "_"),
            serde_json::json!({
                "victoria_metrics": { "p50_ms": vm_ms, "agrees": vm_exact },
                "influxdb": { "p50_ms": in_ms, "agrees": in_exact },
            }),
        );
    }
    Ok(((s, serde_json::Value::Object(json)), ok))
}

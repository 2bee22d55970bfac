//! The Prometheus-compatible API against Prometheus itself: the same samples
//! loaded into a real Prometheus (`promtool tsdb create-blocks-from
//! openmetrics`) and written to Hourglass, then many generated queries sent
//! to both and every value and timestamp compared. Plus `promtool` against
//! Hourglass, the listings Grafana uses, and the provisioned dashboard.
//!
//! Prometheus 2.42 (Debian's) includes a window's left end, Prometheus 3
//! and Hourglass do not: samples never fall on a whole or half minute and
//! every window starts on one (subqueries, whose inner times are whole
//! minutes, are evaluated at half minutes), so that one difference never
//! shows. Edges are tested against a brute-force model in the unit tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;

const SENSORS: [(&str, &str, &str); 3] =
    [("s-a", "x", "t1"), ("s-b", "x", "t2"), ("s-c", "y", "t1")];
/// `energy` is a counter (with resets); the others are gauges.
const METRICS: [&str; 3] = ["temp", "hum", "energy"];

/// `(sensor, metric, ts, value)`: every 20–60 s with a gap of some
/// minutes, never on a whole or half minute, values multiples of 1/8 (sums
/// are exact in any order). The counter climbs from over a thousand and
/// sometimes resets to a lower value (so Prometheus 2's and 3's zero-point
/// rules, which differ, never come into play).
fn samples(base: i64, seconds: i64, seed: u64) -> Vec<(&'static str, &'static str, i64, f64)> {
    let mut g = Gen(seed);
    let mut out = Vec::new();
    for (sensor, _, _) in SENSORS {
        for metric in METRICS {
            let mut ts = base + 1 + g.below(29) as i64;
            let mut counter = 1000.0 + g.below(8000) as f64 / 8.0;
            let gap = base + 600 + 60 * g.below(150) as i64;
            while ts < base + seconds {
                if ts % 30 != 0 && !(gap..gap + 420).contains(&ts) {
                    let v = if metric == "energy" {
                        counter += g.below(40) as f64 / 8.0;
                        if g.below(40) == 0 {
                            counter = 1000.0 + g.below(800) as f64 / 8.0;
                        }
                        counter
                    } else {
                        (g.below(1601) as f64 - 800.0) / 8.0
                    };
                    out.push((sensor, metric, ts, v));
                }
                ts += 20 + g.below(41) as i64;
            }
        }
    }
    out.sort_by_key(|&(s, m, ts, _)| (ts, s, m));
    out
}

/// A private Prometheus holding exactly `samples`, stopped on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

pub(crate) fn binary(name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_uppercase());
    std::env::var_os(&var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("/usr/bin/{name}")))
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} could not start ({e}); `make test` installs it"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` off the test's runtime thread: the service under test answers
/// on that thread while the command waits for it.
async fn run_off_thread(mut cmd: Command, what: &'static str) -> String {
    tokio::task::spawn_blocking(move || run(&mut cmd, what))
        .await
        .expect("the command's thread")
}

async fn prometheus_with(samples: &[(&str, &str, i64, f64)]) -> Prometheus {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut text = String::new();
    for m in METRICS {
        text.push_str(&format!("# TYPE {m} gauge\n"));
        for &(sensor, metric, ts, v) in samples.iter().filter(|s| s.1 == m) {
            let (_, site, kind) = SENSORS.iter().find(|s| s.0 == sensor).expect("known");
            text.push_str(&format!(
                "{metric}{{sensor=\"{sensor}\",site=\"{site}\",type=\"{kind}\"}} {v} {ts}\n"
            ));
        }
    }
    text.push_str("# EOF\n");
    let input = dir.path().join("samples.om");
    std::fs::write(&input, text).expect("write samples");
    let data = dir.path().join("data");
    run(
        Command::new(binary("promtool"))
            .args(["tsdb", "create-blocks-from", "openmetrics", "-q"])
            .arg(&input)
            .arg(&data),
        "promtool tsdb create-blocks-from openmetrics",
    );
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, "global: {}\n").expect("write config");
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let child = Command::new(binary("prometheus"))
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--storage.tsdb.retention.time=3650d")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prometheus starts; `make test` installs it");
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    eventually(Duration::from_secs(60), "Prometheus is ready", || {
        let r = client.get(format!("{url}/-/ready")).send();
        async move { r.await.is_ok_and(|r| r.status() == 200) }
    })
    .await;
    Prometheus {
        child,
        url,
        _dir: dir,
    }
}

/// Hourglass with the same samples, flushed and registered with labels.
async fn hourglass_with(samples: &[(&str, &str, i64, f64)]) -> TestApp {
    let mut s = test_settings();
    s.ingest.max_age = Duration::from_secs(2 * 86_400);
    let app = spawn_app_with(s).await;
    // Some seconds first written with another value: the later write wins.
    let overwritten: Vec<Value> = samples
        .iter()
        .step_by(17)
        .map(|&(sensor, metric, ts, v)| reading(sensor, metric, ts, v + 500.0))
        .collect();
    let r = app.post_readings(&Value::Array(overwritten)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    for chunk in samples.chunks(500) {
        let body: Vec<Value> = chunk
            .iter()
            .map(|&(sensor, metric, ts, v)| reading(sensor, metric, ts, v))
            .collect();
        let r = app.post_readings(&Value::Array(body)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
    for (sensor, site, kind) in SENSORS {
        let r = app
            .client
            .put(format!("{}/api/v1/sensors/{sensor}/labels", app.address))
            .json(&json!({"site": site, "type": kind}))
            .send()
            .await
            .expect("PUT labels");
        assert!(
            r.status().is_success(),
            "{}",
            r.text().await.unwrap_or_default()
        );
    }
    eventually(
        Duration::from_secs(60),
        "every series is registered",
        || {
            let get = app.get_json("/prometheus/api/v1/series?match[]={__name__=~\".%2B\"}");
            async move {
                let body = get.await;
                if std::env::var_os("TEST_LOG").is_some() {
                    eprintln!("{body}");
                }
                body["data"]
                    .as_array()
                    .is_some_and(|a| a.len() == SENSORS.len() * METRICS.len())
            }
        },
    )
    .await;
    app
}

/// Result type and, per label set, the points `(ts, value)`.
type Normal = (String, BTreeMap<String, Vec<(f64, f64)>>);

fn normalize(body: &Value) -> Result<Normal, String> {
    if body["status"] != "success" {
        return Err(body["errorType"].as_str().unwrap_or("?").to_owned());
    }
    let data = &body["data"];
    let kind = data["resultType"].as_str().expect("resultType").to_owned();
    let point = |p: &Value| -> (f64, f64) {
        (
            p[0].as_f64().expect("a timestamp"),
            p[1].as_str()
                .expect("a value string")
                .parse()
                .expect("a number"),
        )
    };
    let mut out = BTreeMap::new();
    match kind.as_str() {
        "scalar" => {
            out.insert(String::new(), vec![point(&data["result"])]);
        }
        _ => {
            for s in data["result"].as_array().expect("result") {
                let points = match s.get("values") {
                    Some(v) => v.as_array().expect("values").iter().map(point).collect(),
                    None => vec![point(&s["value"])],
                };
                out.insert(s["metric"].to_string(), points);
            }
        }
    }
    Ok((kind, out))
}

/// Functions computed another way may differ in the last bits: Prometheus
/// 2.42 averages by an incremental mean (Hourglass, as Prometheus 3, by sum
/// / count), fits and variances from sums kept in the rollups, extrapolates
/// in another order, and Go's `exp` and `log` are not Rust's.
fn same(query: &str, a: f64, b: f64) -> bool {
    const ROUNDED: [&str; 11] = [
        "avg", "rate", "increase", "delta", "deriv", "stddev", "stdvar", "quantile", "exp", "ln(",
        "log",
    ];
    a == b
        || (a.is_nan() && b.is_nan())
        || (ROUNDED.iter().any(|f| query.contains(f))
            && (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0))
}

/// Compares, and answers whether Prometheus' answer held any sample.
fn compare(query: &str, what: &str, got: &Value, want: &Value) -> bool {
    let (g, w) = (normalize(got), normalize(want));
    match (&g, &w) {
        (Ok((gk, gs)), Ok((wk, ws))) => {
            assert_eq!(gk, wk, "{what} {query}: result types\n{got}\n{want}");
            assert_eq!(
                gs.keys().collect::<Vec<_>>(),
                ws.keys().collect::<Vec<_>>(),
                "{what} {query}: series\n{got}\n{want}"
            );
            for (k, gp) in gs {
                let wp = &ws[k];
                assert_eq!(
                    gp.len(),
                    wp.len(),
                    "{what} {query} {k}: points\n{got}\n{want}"
                );
                for (a, b) in gp.iter().zip(wp) {
                    assert_eq!(a.0, b.0, "{what} {query} {k}: timestamps\n{got}\n{want}");
                    assert!(
                        same(query, a.1, b.1),
                        "{what} {query} {k} at {}: {} vs Prometheus {}",
                        a.0,
                        a.1,
                        b.1
                    );
                }
            }
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "{what} {query}: error types");
            // Both refusing must be Prometheus' own refusal, not a gap in Hourglass.
            assert_ne!(a, "bad_data", "{what} {query}: both refused\n{got}\n{want}");
            if std::env::var_os("TEST_LOG").is_some() {
                eprintln!("{what} {query}: both failed: {got}");
            }
        }
        _ => panic!("{what} {query}: Hourglass {got}\nPrometheus {want}"),
    }
    w.is_ok_and(|(_, series)| !series.is_empty())
}

/// Queries of the issue's idioms: counters, vector matching, comparisons,
/// set operators, the new aggregations, functions, subqueries and `@`.
/// Their evaluation times are at half minutes when `true` (subqueries).
fn generate_more(g: &mut Gen, at: i64) -> (String, bool) {
    let gauge = *g.pick(&["temp", "hum", r#"temp{site="x"}"#, r#"hum{sensor!="s-b"}"#]);
    let range = *g.pick(&["2m", "5m", "10m", "1h"]);
    let offset = if g.below(5) == 0 { " offset 5m" } else { "" };
    let query = match g.below(7) {
        0 => {
            let f = *g.pick(&[
                "rate", "increase", "delta", "irate", "idelta", "deriv", "resets", "changes",
            ]);
            // A gauge only where Prometheus 2 and 3 agree: their rules
            // for a counter's zero point differ (a unit test has the case).
            let sel = if ["rate", "increase"].contains(&f) {
                *g.pick(&["energy", r#"energy{site="x"}"#])
            } else {
                *g.pick(&["energy", r#"energy{site="x"}"#, "temp"])
            };
            let inner = format!("{f}({sel}[{range}]{offset})");
            match g.below(3) {
                0 => format!("sum by (site) ({inner})"),
                1 => format!("{inner} * 3600"),
                _ => inner,
            }
        }
        1 => match g.below(6) {
            0 => format!("stddev_over_time({gauge}[{range}]{offset})"),
            1 => format!("stdvar_over_time({gauge}[{range}])"),
            2 => format!(
                "quantile_over_time({}, {gauge}[{range}])",
                g.pick(&["0", "0.25", "0.5", "0.9", "1"])
            ),
            3 => format!("present_over_time({gauge}[{range}])"),
            4 => format!(r#"absent_over_time(temp{{sensor="s-a"}}[{range}])"#),
            _ => format!(r#"absent_over_time(temp{{sensor="nope",site="x"}}[{range}])"#),
        },
        2 => g
            .pick(&[
                "temp - hum",
                "temp / on(sensor) hum",
                "temp * ignoring(type) hum",
                "avg_over_time(temp[5m]) / on(site) group_left sum by (site) (avg_over_time(hum[5m]))",
                "max by (site) (hum) - on(site) group_right temp",
                "temp * on(site) group_left(kind) label_replace(max by (site) (hum), \"kind\", \"$1\", \"site\", \"(.)\")",
                r#"temp{site="x"} + hum"#,
                r#"temp + hum{sensor="s-a"}"#,
                "temp / on(site) hum",
                "sum(sum_over_time(temp[1h])) / sum(count_over_time(temp[1h]))",
                "sum by (site) (increase(energy[1h])) / on(site) count by (site) (energy)",
            ])
            .to_string(),
        3 => g
            .pick(&[
                "temp > 30",
                "temp > bool 30",
                "30 < temp",
                "avg_over_time(temp[5m]) <= -10",
                "temp > hum",
                "temp >= bool hum",
                "temp < on(sensor) hum",
                "temp == bool temp",
                "temp != 0",
                "temp and hum > 0",
                r#"temp or hum{site="y"}"#,
                "temp unless temp > 50",
                r#"temp and on(site) hum{sensor="s-a"}"#,
                r#"hum unless ignoring(type) temp{type="t1"}"#,
            ])
            .to_string(),
        4 => {
            let inner = *g.pick(&["temp", "count_over_time(temp[10m])", "avg_over_time(hum[15m])"]);
            let by = *g.pick(&["", " by (site)", " without (sensor)"]);
            match g.below(7) {
                0 => format!("topk{by} ({}, {inner})", g.pick(&["1", "2", "5"])),
                1 => format!("bottomk{by} ({}, {inner})", g.pick(&["1", "2"])),
                2 => format!("quantile{by} ({}, {inner})", g.pick(&["0.5", "0.9", "0"])),
                3 => format!("stddev{by} ({inner})"),
                4 => format!("stdvar{by} ({inner})"),
                5 => format!("group{by} ({inner})"),
                _ => format!("count_values{by} (\"v\", {inner})"),
            }
        }
        5 => g
            .pick(&[
                "abs(temp)",
                "ceil(temp / 3)",
                "floor(temp / 3)",
                "round(temp / 3)",
                "round(temp, 5)",
                "clamp(temp, -10, 10)",
                "clamp(temp, 10, -10)",
                "clamp_min(temp, 0)",
                "clamp_max(hum, 0)",
                "sqrt(abs(temp))",
                "exp(temp / 100)",
                "ln(abs(temp))",
                "log2(abs(temp) + 1)",
                "log10(abs(hum))",
                "sgn(temp)",
                "timestamp(temp)",
                "timestamp(avg_over_time(temp[5m]))",
                "time()",
                "vector(time())",
                r#"scalar(temp{sensor="s-a"})"#,
                "scalar(temp)",
                r#"label_replace(temp, "s", "$1", "sensor", "s-(.*)")"#,
                r#"label_replace(temp, "sensor", "", "sensor", "s-a")"#,
                r#"label_join(temp, "id", "/", "site", "type")"#,
                "sort(temp)",
                "sort_desc(hum)",
                "day_of_week()",
                "hour(timestamp(temp))",
                "minute()",
                "month()",
                "year()",
                "days_in_month()",
                "day_of_month()",
                "day_of_year()",
                r#"absent(temp{sensor="nope"})"#,
                "absent(temp)",
                "vector(1) + scalar(temp{sensor=\"s-b\"})",
            ])
            .to_string(),
        _ => {
            return match g.below(5) {
                0 => ("max_over_time(temp[10m:1m])".to_owned(), true),
                1 => ("avg_over_time(rate(energy[5m])[30m:5m])".to_owned(), true),
                2 => ("min_over_time(sum(temp)[15m:])".to_owned(), true),
                3 => (format!("temp @ {at}"), false),
                _ => (format!("avg_over_time(hum[10m] @ {at}) - hum"), false),
            };
        }
    };
    (query, false)
}

fn generate(g: &mut Gen) -> String {
    let selector = *g.pick(&[
        "temp",
        "hum",
        r#"temp{sensor="s-a"}"#,
        r#"temp{site="x"}"#,
        r#"{__name__=~"temp|hum",sensor!="s-b"}"#,
        r#"hum{site!~"y"}"#,
        r#"temp{type=~"t.*"}"#,
        r#"{__name__="hum"}"#,
    ]);
    let range = *g.pick(&["1m", "2m", "5m", "10m", "15m", "1h"]);
    let offset = if g.below(5) == 0 { " offset 5m" } else { "" };
    let inner = match g.below(7) {
        0 => format!("{selector}{offset}"),
        k => {
            let f = [
                "avg_over_time",
                "sum_over_time",
                "min_over_time",
                "max_over_time",
                "count_over_time",
                "last_over_time",
            ][k as usize - 1];
            format!("{f}({selector}[{range}]{offset})")
        }
    };
    let aggregated = match g.below(7) {
        0 => format!("avg by (site) ({inner})"),
        1 => format!("sum({inner})"),
        2 => format!("min without (sensor) ({inner})"),
        3 => format!("max by (type) ({inner})"),
        4 => format!("count({inner})"),
        _ => inner,
    };
    match g.below(6) {
        0 => format!("{aggregated} * 1.8 + 32"),
        1 => format!("2 * ({aggregated})"),
        2 => format!("-{aggregated}"),
        _ => aggregated,
    }
}

async fn get(client: &reqwest::Client, url: &str, query: &[(&str, String)]) -> Value {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in query {
        form.append_pair(k, v);
        if *k == "query" {
            crate::helpers::fuzz_seed("promql", v);
        }
    }
    client
        .get(format!("{url}?{}", form.finish()))
        .send()
        .await
        .expect("a request")
        .json()
        .await
        .expect("a JSON body")
}

#[tokio::test]
async fn promql_answers_equal_prometheus_on_the_same_samples() {
    let now = jiff::Timestamp::now().as_second();
    let base = now - now.rem_euclid(60) - 4 * 3600;
    let data = samples(base, 3 * 3600, 42);
    let prom = prometheus_with(&data).await;
    let app = hourglass_with(&data).await;
    let client = reqwest::Client::new();
    let mut g = Gen(7);
    let mut with_samples = 0;
    const QUERIES: usize = 320;
    for i in 0..QUERIES {
        let (query, half) = if i % 8 < 3 {
            (generate(&mut g), false)
        } else {
            let at = base + 60 * (30 + g.below(120) as i64);
            generate_more(&mut g, at)
        };
        let half = if half { 30 } else { 0 };
        let hg = format!("{}/prometheus/api/v1", app.address);
        let pr = format!("{}/api/v1", prom.url);
        if i % 3 == 0 {
            let t = (base + 60 * g.below(200) as i64 + half).to_string();
            let params = [("query", query.clone()), ("time", t)];
            let got = get(&client, &format!("{hg}/query"), &params).await;
            let want = get(&client, &format!("{pr}/query"), &params).await;
            with_samples += usize::from(compare(&query, "instant", &got, &want));
        } else {
            let start = base + 60 * g.below(200) as i64 + half;
            let end = start + 60 * (5 + g.below(90) as i64);
            let step = *g.pick(&[60, 120, 300, 900]);
            let params = [
                ("query", query.clone()),
                ("start", start.to_string()),
                ("end", end.to_string()),
                ("step", step.to_string()),
            ];
            let got = get(&client, &format!("{hg}/query_range"), &params).await;
            let want = get(&client, &format!("{pr}/query_range"), &params).await;
            with_samples += usize::from(compare(&query, "range", &got, &want));
        }
    }
    // The comparison means something only if most answers hold samples.
    assert!(
        with_samples >= QUERIES * 3 / 4,
        "only {with_samples} of {QUERIES} answers held samples"
    );
    // Literals, and the listings Grafana's query builder uses.
    for query in ["1 + 1", "2 ^ 10 % 7", "-(3 * 0.5)"] {
        let params = [("query", query.to_owned()), ("time", base.to_string())];
        let got = get(
            &client,
            &format!("{}/prometheus/api/v1/query", app.address),
            &params,
        )
        .await;
        let want = get(&client, &format!("{}/api/v1/query", prom.url), &params).await;
        compare(query, "instant", &got, &want);
    }
    for path in [
        "labels",
        "label/site/values",
        "label/__name__/values",
        "label/sensor/values",
    ] {
        let got = app.get_json(&format!("/prometheus/api/v1/{path}")).await;
        let want = get(&client, &format!("{}/api/v1/{path}", prom.url), &[]).await;
        assert_eq!(got["data"], want["data"], "{path}");
    }
    let sel = [("match[]", r#"temp{site="x"}"#.to_owned())];
    let got = get(
        &client,
        &format!("{}/prometheus/api/v1/series", app.address),
        &sel,
    )
    .await;
    let want = get(&client, &format!("{}/api/v1/series", prom.url), &sel).await;
    assert_eq!(got["data"], want["data"]);
    app.stop().await.expect("stops");
}

#[tokio::test]
async fn promtool_queries_hourglass() {
    let now = jiff::Timestamp::now().as_second();
    let base = now - now.rem_euclid(60) - 4 * 3600;
    let data = samples(base, 1800, 3);
    let app = hourglass_with(&data).await;
    let url = format!("{}/prometheus", app.address);
    let promtool = || Command::new(binary("promtool"));
    let mut cmd = promtool();
    cmd.args(["query", "instant", "--time"])
        .arg((base + 1800).to_string())
        .arg(&url)
        .arg(r#"last_over_time(temp{sensor="s-a"}[1h])"#);
    let out = run_off_thread(cmd, "promtool query instant").await;
    let last = data
        .iter()
        .rfind(|s| s.0 == "s-a" && s.1 == "temp")
        .expect("samples");
    assert!(out.contains(&format!("=> {} @[", last.3)), "{out}");
    let mut cmd = promtool();
    cmd.args(["query", "range", "--start"])
        .arg(base.to_string())
        .arg("--end")
        .arg((base + 1800).to_string())
        .args(["--step", "5m"])
        .arg(&url)
        .arg("count_over_time(hum[5m])");
    let out = run_off_thread(cmd, "promtool query range").await;
    assert_eq!(
        out.lines().filter(|l| l.contains("sensor=")).count(),
        3,
        "{out}"
    );
    let mut cmd = promtool();
    cmd.args(["query", "labels"]).arg(&url).arg("site");
    let out = run_off_thread(cmd, "promtool query labels").await;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["x", "y"],
        "{out}"
    );
    let mut cmd = promtool();
    cmd.args(["query", "series", "--match", "temp"]).arg(&url);
    let out = run_off_thread(cmd, "promtool query series").await;
    assert_eq!(out.lines().count(), 3, "{out}");
    app.stop().await.expect("stops");
}

#[tokio::test]
async fn unsupported_promql_and_limits_are_clear_bad_data_errors() {
    let mut s = test_settings();
    s.query.max_points = 100;
    let app = spawn_app_with(s).await;
    for (query, extra, needle) in [
        (
            "histogram_quantile(0.9, rate(temp[5m]))",
            "",
            "function histogram_quantile",
        ),
        ("temp[5m]", "", "range vector"),
        (
            "max_over_time(temp[1h:1500ms])",
            "",
            "whole number of seconds",
        ),
        ("quantile_over_time(0.5, temp[40d])", "", "31 days"),
        ("temp{", "", "parse error"),
        ("temp", "&start=0&end=100000&step=1", "query.max_points"),
        ("temp", "&start=100&end=0&step=1", "before start"),
        ("temp", "&start=0&end=100&step=0", "positive"),
        ("temp", "&start=zero&end=100&step=1", "\"start\""),
        ("avg_over_time(temp[1000y])", "", "query.max_range"),
    ] {
        let path = format!(
            "/prometheus/api/v1/query_range?query={}{}",
            url_encode(query),
            if extra.is_empty() {
                "&start=0&end=60&step=15"
            } else {
                extra
            }
        );
        let r = app.get(&path).await;
        assert_eq!(r.status(), 400, "{query} {extra}");
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["status"], "error");
        assert_eq!(body["errorType"], "bad_data");
        let msg = body["error"].as_str().expect("error");
        assert!(msg.contains(needle), "{query}: {msg}");
    }
    let body = app.get_json("/prometheus/api/v1/status/buildinfo").await;
    assert!(body["data"]["version"].is_string());
    let r = app.get("/prometheus/api/v1/series").await;
    assert_eq!(r.status(), 400);
    app.stop().await.expect("stops");
}

#[tokio::test]
async fn metric_names_that_are_not_identifiers_are_reachable_by_name_matcher() {
    let mut s = test_settings();
    s.ingest.max_age = Duration::from_secs(86_400);
    let app = spawn_app_with(s).await;
    let now = jiff::Timestamp::now().as_second();
    let t = now - now.rem_euclid(60) - 120;
    let r = app
        .post_readings(&json!([reading("dev-1", "power-kw", t + 1, 2.5)]))
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    eventually(Duration::from_secs(30), "registered", || {
        let get = app.get_json("/prometheus/api/v1/label/__name__/values");
        async move { get.await["data"] == json!(["power-kw"]) }
    })
    .await;
    let q = url_encode(r#"max_over_time({__name__="power-kw"}[5m])"#);
    let body = app
        .get_json(&format!(
            "/prometheus/api/v1/query?query={q}&time={}",
            t + 60
        ))
        .await;
    assert_eq!(
        body["data"]["result"],
        json!([{"metric": {"sensor": "dev-1"}, "value": [t + 60, "2.5"]}])
    );
    // Form bodies, as Grafana posts them.
    let r = app
        .client
        .post(format!("{}/prometheus/api/v1/query", app.address))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "query={}&time={}",
            url_encode(r#"{__name__="power-kw"}"#),
            t + 60
        ))
        .send()
        .await
        .expect("POST");
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["data"]["result"][0]["value"][1], "2.5", "{body}");
    app.stop().await.expect("stops");
}

#[tokio::test]
async fn too_many_series_is_a_clear_error_and_listings_say_when_they_are_cut() {
    let mut s = test_settings();
    s.ingest.max_age = Duration::from_secs(86_400);
    s.query.max_series = 2;
    let app = spawn_app_with(s).await;
    let now = jiff::Timestamp::now().as_second();
    let t = now - now.rem_euclid(60) - 120;
    let body: Vec<Value> = ["d-1", "d-2", "d-3"]
        .iter()
        .map(|d| reading(d, "temp", t + 1, 1.0))
        .collect();
    let r = app.post_readings(&Value::Array(body)).await;
    assert_eq!(r.status(), 200);
    eventually(Duration::from_secs(30), "registered", || {
        let get = app.get_json("/prometheus/api/v1/label/sensor/values");
        async move { get.await["data"].as_array().is_some_and(|a| a.len() == 3) }
    })
    .await;
    let r = app
        .get(&format!(
            "/prometheus/api/v1/query?query=temp&time={}",
            t + 60
        ))
        .await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["errorType"], "bad_data");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("query.max_series")),
        "{body}"
    );
    let body = app
        .get_json("/prometheus/api/v1/query?query=temp%7Bsensor%21%3D%22d-3%22%7D&time=0")
        .await;
    assert_eq!(body["status"], "success", "two series are within the limit");
    let body = app
        .get_json("/prometheus/api/v1/series?match[]=temp&limit=2")
        .await;
    assert_eq!(body["data"].as_array().map(Vec::len), Some(2), "{body}");
    assert_eq!(body["warnings"][0], "results truncated due to limit");
    let body = app
        .get_json("/prometheus/api/v1/label/sensor/values?limit=2")
        .await;
    assert_eq!(body["data"], json!(["d-1", "d-2"]), "{body}");
    assert_eq!(body["warnings"][0], "results truncated due to limit");
    let body = app.get_json("/prometheus/api/v1/label/sensor/values").await;
    assert!(body.get("warnings").is_none(), "{body}");
    app.stop().await.expect("stops");
}

fn url_encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Every query of the provisioned Grafana dashboard parses and is answered.
#[tokio::test]
async fn the_provisioned_dashboard_queries_are_answered() {
    let now = jiff::Timestamp::now().as_second();
    let base = now - now.rem_euclid(60) - 4 * 3600;
    let data = samples(base, 1800, 5);
    let app = hourglass_with(&data).await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/grafana/dashboards/sensors.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard"))
            .expect("json");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().expect("expr").to_owned());
            crate::helpers::fuzz_seed("promql", target["expr"].as_str().unwrap_or_default());
        }
    }
    assert!(queries.len() >= 3, "{queries:?}");
    // Its panels use the provisioned Hourglass data source, which points at
    // the service's /prometheus.
    let sources: serde_norway::Value = serde_norway::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("config/grafana/provisioning/datasources/prometheus.yml"),
        )
        .expect("the data sources"),
    )
    .expect("yaml");
    let hourglass = sources["datasources"]
        .as_sequence()
        .expect("a list")
        .iter()
        .find(|d| d["uid"].as_str() == Some("hourglass"))
        .expect("the Hourglass data source");
    assert_eq!(hourglass["type"].as_str(), Some("prometheus"));
    assert_eq!(
        hourglass["url"].as_str(),
        Some("http://hourglass:8080/prometheus")
    );
    for panel in dashboard["panels"].as_array().expect("panels") {
        assert_eq!(
            panel["datasource"]["uid"], "hourglass",
            "{}",
            panel["title"]
        );
    }
    for v in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap_or_default();
        assert!(q.starts_with("label_values("), "{q}");
        let label = q.trim_start_matches("label_values(").trim_end_matches(')');
        let body = app
            .get_json(&format!("/prometheus/api/v1/label/{label}/values"))
            .await;
        assert!(!body["data"].as_array().expect("values").is_empty(), "{q}");
    }
    for q in queries {
        // Grafana's variables, as Grafana would fill them in.
        let q = q
            .replace("$metric", "temp")
            .replace("$sensor", "s-a")
            .replace("$__interval", "1m")
            .replace("$__rate_interval", "1m")
            .replace("$__range", "30m");
        let path = format!(
            "/prometheus/api/v1/query_range?query={}&start={}&end={}&step=60",
            url_encode(&q),
            base,
            base + 1800
        );
        let body = app.get_json(&path).await;
        assert_eq!(body["status"], "success", "{q}: {body}");
        assert!(
            !body["data"]["result"]
                .as_array()
                .expect("result")
                .is_empty(),
            "{q}: {body}"
        );
    }
    app.stop().await.expect("stops");
}

/// Grafana's "current value": a bare selector at now, over readings held in
/// the journal and not yet stored, from a sensor seen for the first time.
#[tokio::test]
async fn an_instant_bare_selector_sees_journaled_readings_of_a_new_sensor() {
    let mut s = journal_settings();
    s.ingest.max_age = Duration::from_secs(86_400);
    // Held well past the test: nothing of it is stored while it asks.
    s.batcher.hold_grace = Duration::from_secs(600);
    s.batcher.max_hold = Duration::from_secs(600);
    s.buckets.rollup_after = Duration::from_secs(660);
    let app = spawn_app_with(s).await;
    let now = jiff::Timestamp::now().as_second();
    let body = json!([
        reading("fresh-1", "temp", now - 100, 6.0),
        reading("fresh-1", "temp", now - 40, 7.0),
    ]);
    assert_eq!(app.post_readings(&body).await.status(), 200);
    for query in ["temp", "last_over_time(temp[5m])"] {
        let got = app
            .get_json(&format!(
                "/prometheus/api/v1/query?query={}&time={now}",
                url_encode(query)
            ))
            .await;
        assert_eq!(got["data"]["result"][0]["value"][1], "7", "{query}: {got}");
        assert_eq!(
            got["data"]["result"][0]["metric"]["sensor"], "fresh-1",
            "{query}"
        );
    }
    let end = now - now.rem_euclid(60) + 60;
    let got = app
        .get_json(&format!(
            "/prometheus/api/v1/query_range?query=temp&start={}&end={end}&step=60",
            end - 600
        ))
        .await;
    let values = got["data"]["result"][0]["values"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        values.iter().any(|v| v[1] == "7"),
        "a range query sees them too: {got}"
    );
    app.stop().await.expect("stops");
}

//! Generated queries answered by Hourglass and by Prometheus over the same
//! samples, every value and timestamp compared; `promtool` querying Hourglass.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

use crate::helpers::*;

use super::{
    binary, four_hours_ago, get, hourglass_with, prometheus_with, run_off_thread, samples,
};

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

#[tokio::test]
async fn promql_answers_equal_prometheus_on_the_same_samples() {
    let base = four_hours_ago();
    let data = samples(base, 3 * 3600, 42);
    let prom = prometheus_with(&data).await;
    let app = hourglass_with(&data).await;
    let client = crate::helpers::http_client();
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
    let base = four_hours_ago();
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

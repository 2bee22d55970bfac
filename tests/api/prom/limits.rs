//! What the Prometheus API refuses or cuts, and says so: unsupported PromQL,
//! limits, too many series, listings cut; names reachable only by matcher.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;

use super::url_encode;

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

//! Reads end to end: calendar days in time zones, the latest reading, the
//! sensor registry, groups, CSV, a query's timeout, the OpenAPI document.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::doc;
use serde_json::{Value, json};

use crate::database::Database;
use crate::helpers::*;

use super::{every_ten_minutes, long_settings, post_all, ts};
use crate::rollup_checks::*;

#[tokio::test]
async fn days_across_daylight_saving_changes_have_23_and_25_hours_of_readings() {
    let app = spawn_app_with(long_settings(Granularity::Minute)).await;
    let cases = [
        // (zone, local days around the change, the day, hours, offsets of the day and the next)
        (
            "Europe/Berlin",
            "2026-03-28T00:00:00Z",
            "2026-03-29T00:00:00+01:00",
            23,
            "+02:00",
        ),
        (
            "Europe/Berlin",
            "2025-10-25T00:00:00Z",
            "2025-10-26T00:00:00+02:00",
            25,
            "+01:00",
        ),
        (
            "America/New_York",
            "2026-03-07T12:00:00Z",
            "2026-03-08T00:00:00-05:00",
            23,
            "-04:00",
        ),
        (
            "America/New_York",
            "2025-11-01T12:00:00Z",
            "2025-11-02T00:00:00-04:00",
            25,
            "-05:00",
        ),
    ];
    for (i, (zone, around, day, hours, next_offset)) in cases.into_iter().enumerate() {
        let sensor = format!("dst-{i}");
        let from = ts(around);
        let to = from + 3 * 86_400;
        post_all(&app, &every_ten_minutes(&sensor, from, to)).await;
        let path = format!(
            "/api/v1/sensors/{sensor}/series?metric=power&from={}&to={}&step=1d&tz={zone}",
            rfc3339(from),
            rfc3339(to)
        );
        let got = app.get_json(&path).await;
        assert_eq!(got["tz"], zone);
        let points = got["points"].as_array().expect("points");
        let at = points
            .iter()
            .position(|p| p["start"] == day)
            .unwrap_or_else(|| panic!("{zone}: no point starts at {day}: {got}"));
        assert_eq!(points[at]["count"], hours * 6, "{zone} {day}");
        assert!(
            points[at + 1]["start"]
                .as_str()
                .is_some_and(|s| s.ends_with(next_offset)),
            "{zone}: the next day is at {next_offset}: {got}"
        );
        // Weeks start on Monday at local midnight; months on the first.
        for step in ["1w", "1mo"] {
            let got = app
                .get_json(&path.replace("step=1d", &format!("step={step}")))
                .await;
            let first = got["points"][0]["start"]
                .as_str()
                .expect("a start")
                .to_owned();
            assert!(first.contains("T00:00:00"), "{zone} {step}: {first}");
            let total: u64 = got["points"]
                .as_array()
                .expect("points")
                .iter()
                .filter_map(|p| p["count"].as_u64())
                .sum();
            assert_eq!(total, 3 * 144, "{zone} {step}");
        }
    }
    let r = app
        .get("/api/v1/sensors/dst-0/series?metric=power&from=0&to=86400000&step=1d&tz=Mars/Olympus")
        .await;
    assert_eq!(r.status(), 400);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_latest_reading_comes_from_the_newest_bucket_or_from_memory() {
    let app = spawn_app_with(journal_settings()).await;
    let t = base_time();
    assert_eq!(
        app.get("/api/v1/sensors/l1/latest?metric=t").await.status(),
        404
    );
    post_all(
        &app,
        &[
            reading("l1", "t", t + 10, 1.0),
            reading("l1", "t", t + 70, 2.0),
        ],
    )
    .await;
    // Journaled and held in memory, not yet in a bucket: still the latest.
    let got = app.get_json("/api/v1/sensors/l1/latest?metric=t").await;
    assert_eq!(
        got,
        json!({ "sensor": "l1", "metric": "t", "ts": rfc3339(t + 70), "value": 2.0 })
    );
    let mut s = app.settings.clone();
    app.stop().await.expect("clean stop");
    s.journal.enabled = false;
    let app = spawn_app_with(s).await;
    // A late reading for an older time does not change the latest.
    post_all(&app, &[reading("l1", "t", t - 3600, 9.0)]).await;
    let got = app.get_json("/api/v1/sensors/l1/latest?metric=t").await;
    assert_eq!(got["ts"], rfc3339(t + 70));
    assert_eq!(got["value"], 2.0);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn sensors_are_listed_with_metrics_labels_and_pages() {
    let app = spawn_app().await;
    let t = base_time();
    let mut batch = Vec::new();
    for i in 0..5 {
        batch.push(reading(&format!("site-{i}"), "temp", t + i, 1.0));
        batch.push(reading(&format!("site-{i}"), "hum", t + i, 1.0));
    }
    batch.push(reading("other", "temp", t, 1.0));
    post_all(&app, &batch).await;
    for i in 0..5 {
        let site = if i < 3 { "berlin" } else { "paris" };
        let r = put_labels(
            &app,
            &format!("site-{i}"),
            json!({ "site": site, "type": "ht" }),
        )
        .await;
        assert_eq!(r.status(), 204);
    }
    for bad in [
        json!({ "__name__": "x" }),
        json!({ "site": "" }),
        json!({ "site": 3 }),
        json!(["site"]),
    ] {
        let r = put_labels(&app, "site-0", bad.clone()).await;
        assert_eq!(r.status(), 400, "{bad}");
    }
    let got = app
        .get_json("/api/v1/sensors?prefix=site-&label.site=berlin")
        .await;
    let sensors = got["sensors"].as_array().expect("sensors");
    assert_eq!(sensors.len(), 3);
    assert_eq!(sensors[0]["sensor"], "site-0");
    assert_eq!(
        sensors[0]["labels"],
        json!({ "site": "berlin", "type": "ht" }),
        "bad labels changed nothing"
    );
    let mut metrics: Vec<&str> = sensors[0]["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    metrics.sort_unstable();
    assert_eq!(metrics, ["hum", "temp"]);
    assert_eq!(sensors[0]["last_seen"], rfc3339(t));
    // Pages of two over six sensors.
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let page = app
            .get_json(&format!("/api/v1/sensors?limit=2{after}"))
            .await;
        seen.extend(
            page["sensors"]
                .as_array()
                .expect("sensors")
                .iter()
                .map(|s| s["sensor"].as_str().expect("id").to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(
        seen,
        ["other", "site-0", "site-1", "site-2", "site-3", "site-4"]
    );
    assert_eq!(app.get("/api/v1/sensors?limit=0").await.status(), 400);
    assert_eq!(app.get("/api/v1/sensors?colour=red").await.status(), 400);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn groups_sum_every_matching_sensor_exactly() {
    let mut s = settings_with(Granularity::Minute);
    s.query.max_series = 5;
    let app = spawn_app_with(s).await;
    let t = base_time();
    let mut model: BTreeMap<String, BTreeMap<i64, f64>> = BTreeMap::new();
    let mut batch = Vec::new();
    for i in 0..6 {
        let sensor = format!("g-{i}");
        for k in 0..(20 + 10 * i) {
            let at = t + k * 113;
            let v = (k * (i + 1)) as f64 / 2.0;
            model.entry(sensor.clone()).or_default().insert(at, v);
            batch.push(reading(&sensor, "flow", at, v));
        }
    }
    post_all(&app, &batch).await;
    for i in 0..5 {
        let site = if i % 2 == 0 { "a" } else { "b" };
        assert_eq!(
            put_labels(&app, &format!("g-{i}"), json!({ "site": site }))
                .await
                .status(),
            204
        );
    }
    let (from, to) = (t + 50, t + 3000);
    let range = format!("metric=flow&from={}&to={}", rfc3339(from), rfc3339(to));
    let want = |sensors: &[usize]| {
        let mut all = BTreeMap::new();
        for &i in sensors {
            for (k, v) in &model[&format!("g-{i}")] {
                all.insert((i, *k), *v);
            }
        }
        let vals: Vec<f64> = all
            .iter()
            .filter(|((_, k), _)| *k >= from && *k < to)
            .map(|(_, v)| *v)
            .collect();
        (
            vals.len() as u64,
            vals.iter().sum::<f64>(),
            vals.iter().copied().reduce(f64::min),
            vals.iter().copied().reduce(f64::max),
        )
    };
    let got = app
        .get_json(&format!("/api/v1/average?{range}&label.site=a"))
        .await;
    let groups = got["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["sensors"], 3);
    assert_aggregates(&groups[0], want(&[0, 2, 4]), "site a");
    let got = app
        .get_json(&format!(
            "/api/v1/average?{range}&sensor=g-*&label.site=b&group_by=sensor"
        ))
        .await;
    let groups = got["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0]["group"], json!({ "sensor": "g-1" }));
    assert_aggregates(&groups[1], want(&[3]), "g-3 alone");
    let got = app
        .get_json(&format!(
            "/api/v1/series?{range}&sensor=g-?&label.site=a&group_by=label.site&step=15m"
        ))
        .await;
    let points = got["groups"][0]["points"].as_array().expect("points");
    let total: u64 = points.iter().filter_map(|p| p["count"].as_u64()).sum();
    assert_eq!(total, want(&[0, 2, 4]).0);
    // Six sensors match g-*: over query.max_series.
    let r = app
        .get(&format!("/api/v1/average?{range}&sensor=g-*"))
        .await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_series")),
        "{body}"
    );
    assert_eq!(
        app.get(&format!("/api/v1/average?{range}&group_by=site"))
            .await
            .status(),
        400
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn series_answer_csv_for_spreadsheets() {
    let app = spawn_app().await;
    let t = base_time();
    post_all(
        &app,
        &[
            reading("c1", "t", t + 5, 1.5),
            reading("c1", "t", t + 65, 2.5),
        ],
    )
    .await;
    let path = format!(
        "/api/v1/sensors/c1/series?metric=t&from={}&to={}&step=1m",
        rfc3339(t),
        rfc3339(t + 180)
    );
    let r = app
        .client
        .get(format!("{}{path}", app.address))
        .header("Accept", "text/csv")
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("text")
            .starts_with("text/csv")
    );
    let body = r.text().await.expect("text");
    let want = format!(
        "start,count,sum,avg,min,max\n{},1,1.5,1.5,1.5,1.5\n{},1,2.5,2.5,2.5,2.5\n{},0,0,,,\n",
        rfc3339(t),
        rfc3339(t + 60),
        rfc3339(t + 120)
    );
    assert_eq!(body, want);
    let r = app.get(&format!("{path}&format=csv")).await;
    assert_eq!(r.text().await.expect("text"), want);
    assert_eq!(app.get(&format!("{path}&format=xml")).await.status(), 400);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_query_slower_than_its_timeout_answers_503_and_ingest_goes_on() {
    let mut db = Database::start().await;
    let mut s = test_settings();
    s.mongodb.uri = secrecy::SecretString::from(db.uri());
    s.query.timeout = Duration::from_millis(500);
    let app = spawn_app_with(s).await;
    let t = base_time();
    post_all(&app, &[reading("slow", "t", t, 1.0)]).await;
    app.db
        .client()
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "blockConnection": true, "blockTimeMS": 3000 },
        })
        .await
        .expect("the server takes the fail point");
    let r = app.get(&average_path("slow", "t", t - 60, t + 60)).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("query.timeout")),
        "{body}"
    );
    // Writes do not queue behind queries.
    post_all(&app, &[reading("slow", "t", t + 1, 2.0)]).await;
    let got = app
        .get_json(&average_path("slow", "t", t - 60, t + 60))
        .await;
    assert_eq!(got["count"], 2);
    let metrics = app.get("/metrics").await.text().await.expect("metrics");
    assert!(
        metrics.contains("hourglass_query_documents_read_count{endpoint=\"average\"}"),
        "documents read are recorded"
    );
    app.stop().await.expect("clean stop");
    db.stop();
}

#[tokio::test]
async fn the_openapi_document_lists_every_route() {
    let app = spawn_app().await;
    let doc = app.get_json("/api/v1/openapi.json").await;
    let paths = doc["paths"].as_object().expect("paths");
    let mut listed: Vec<(String, String)> = Vec::new();
    for (path, item) in paths {
        for method in item.as_object().expect("an item").keys() {
            listed.push((method.to_uppercase(), path.clone()));
        }
    }
    listed.sort();
    let mut routes: Vec<(String, String)> = [
        ("POST", "/api/v1/readings"),
        ("DELETE", "/api/v1/readings"),
        ("PUT", "/api/v1/sensors/{sensor}/labels"),
        ("GET", "/api/v1/sensors"),
        ("GET", "/api/v1/sensors/{sensor}/at"),
        ("GET", "/api/v1/sensors/{sensor}/average"),
        ("GET", "/api/v1/sensors/{sensor}/series"),
        ("GET", "/api/v1/sensors/{sensor}/latest"),
        ("GET", "/api/v1/sensors/{sensor}/uptime"),
        ("GET", "/api/v1/average"),
        ("GET", "/api/v1/series"),
        ("GET", "/api/v1/dead_letters"),
        ("GET", "/api/v1/export"),
        ("GET", "/api/v1/openapi.json"),
        ("GET", "/health/live"),
        ("GET", "/health/ready"),
        ("GET", "/metrics"),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_owned(), p.to_owned()))
    .collect();
    routes.sort();
    assert_eq!(listed, routes);
    // And every listed route is served: none answers 404 or 405.
    for (method, path) in &listed {
        let url = format!("{}{}", app.address, path.replace("{sensor}", "x"));
        let r = app
            .client
            .request(method.parse().expect("a method"), url)
            .send()
            .await
            .expect("request");
        assert!(
            r.status() != 404 || path.ends_with("/latest"),
            "{method} {path}: {}",
            r.status()
        );
        assert_ne!(r.status(), 405, "{method} {path}");
    }
    app.stop().await.expect("clean stop");
}

//! The web console in a real headless Chromium (Debian's, through Selenium:
//! `tests/browser/console.py`), against the service with seeded sensors. The
//! script reports what the page drew and did; these tests judge it against
//! the API and against the readings they wrote.

use std::collections::BTreeMap;
use std::path::PathBuf;

use hourglass::Settings;
use mongodb::bson::{DateTime, Document, doc};
use serde_json::{Value, json};

use crate::auth::{DASHBOARD, INGESTER, TRUCK, secured};
use crate::broker::{Broker, Publisher};
use crate::helpers::*;
use crate::mqtt::mqtt_settings;
use crate::python::{last_json, python};

const METRIC: &str = "temp";

/// Screenshots of each run: `target/console-screenshots/<scenario>/`.
fn artifacts(scenario: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/console-screenshots")
        .join(scenario)
}

/// Runs the browser script and answers what it saw.
async fn drive(app: &TestApp, scenario: &str, args: Value) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser/console.py");
    let out = tokio::process::Command::new(python())
        .arg(script)
        .arg(&app.address)
        .arg(artifacts(scenario))
        .arg(scenario)
        .arg(args.to_string())
        .env("SE_OFFLINE", "true")
        .output()
        .await
        .expect("the browser script runs (make test installs Chromium and Selenium)");
    last_json("the browser script", &out)
}

/// Browser log entries that are errors, leaving out the refusals `allowed`
/// names (a 401 or 403 the scenario provokes is logged by Chromium itself)
/// and a busy server's 503s, which the console asks again (a 503 it could
/// not get past leaves the page incomplete, which the scenarios check).
fn errors(seen: &Value, allowed: &[&str]) -> Vec<Value> {
    let allowed: Vec<&str> = allowed.iter().copied().chain(["status of 503"]).collect();
    seen["log"]
        .as_array()
        .expect("a log")
        .iter()
        .filter(|e| e["level"] == "SEVERE" || e["level"] == "WARNING")
        .filter(|e| {
            let m = e["message"].as_str().unwrap_or_default();
            !(m.contains("Failed to load resource") && allowed.iter().any(|a| m.contains(a)))
        })
        .cloned()
        .collect()
}

fn epoch(rfc: &str) -> i64 {
    time::OffsetDateTime::parse(rfc, &time::format_description::well_known::Rfc3339)
        .expect("an RFC 3339 start")
        .unix_timestamp()
}

fn step_seconds(step: &str) -> Option<i64> {
    let (n, unit) = step.split_at(step.len() - 1);
    let n: i64 = n.parse().ok()?;
    match unit {
        "m" => Some(n * 60),
        "h" => Some(n * 3600),
        _ => None,
    }
}

async fn get_as(app: &TestApp, token: Option<&str>, path: &str) -> reqwest::Response {
    let mut req = app.client.get(format!("{}{path}", app.address));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("sent")
}

/// A drawn series as numbers (JavaScript writes 2.0 as 2); gaps are `None`.
fn numbers(series: &Value) -> Vec<Option<f64>> {
    series
        .as_array()
        .expect("a series")
        .iter()
        .map(Value::as_f64)
        .collect()
}

/// A chart's drawn data equals the API's answer to the request it made:
/// every point's time, average, minimum and maximum.
async fn assert_chart_is_the_api(app: &TestApp, token: Option<&str>, chart: &Value) -> Value {
    let url = chart["url"].as_str().expect("the chart's request");
    let r = get_as(app, token, url).await;
    assert_eq!(r.status(), 200, "{url}");
    let body: Value = r.json().await.expect("json");
    let data = chart["data"].as_array().expect("the chart's data");
    let points = match body.get("points") {
        Some(p) => vec![p.as_array().expect("points").clone()],
        None => body["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .map(|g| g["points"].as_array().expect("points").clone())
            .collect(),
    };
    let xs: Vec<Value> = points[0]
        .iter()
        .map(|p| json!(epoch(p["start"].as_str().expect("start"))))
        .collect();
    assert_eq!(data[0].as_array().expect("xs"), &xs, "the times of {url}");
    if body.get("points").is_some() {
        for (i, field) in ["avg", "min", "max"].iter().enumerate() {
            let want: Vec<Option<f64>> = points[0].iter().map(|p| p[*field].as_f64()).collect();
            assert_eq!(numbers(&data[i + 1]), want, "the {field} of {url}");
        }
    } else {
        for (g, pts) in points.iter().enumerate() {
            let want: Vec<Option<f64>> = pts.iter().map(|p| p["avg"].as_f64()).collect();
            assert_eq!(numbers(&data[g + 1]), want, "group {g} of {url}");
        }
    }
    // The step keeps the points within the chart's width.
    let width = chart["width"].as_f64().expect("width");
    assert!(
        (xs.len() as f64) <= (width / 3.0).max(10.0) + 1.0,
        "{} points for {width} pixels: {url}",
        xs.len()
    );
    body
}

/// The readings of one query parameter of a chart's URL.
fn param(url: &str, name: &str) -> String {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or_default();
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// The averages of the seeded readings per step of a chart with a fixed
/// step, computed here: an answer independent of the service.
fn brute_force(readings: &BTreeMap<i64, f64>, url: &str, xs: &[Value]) -> Vec<Value> {
    let step = step_seconds(&param(url, "step")).expect("a fixed step");
    xs.iter()
        .map(|x| {
            let x = x.as_i64().expect("x");
            let vs: Vec<f64> = readings.range(x..x + step).map(|(_, v)| *v).collect();
            if vs.is_empty() {
                Value::Null
            } else {
                json!(vs.iter().sum::<f64>() / vs.len() as f64)
            }
        })
        .collect()
}

/// A bucket no update can merge into, so the reading sent to it is
/// dead-lettered (the console lists it).
async fn plant_broken_bucket(app: &TestApp, sensor: &str, start: i64) {
    app.db
        .collection::<Document>(&app.settings.mongodb.collection)
        .insert_one(doc! {
            "sensor": sensor, "metric": METRIC, "start": DateTime::from_millis(start * 1000),
            "v": "not an object", "count": 0, "schema_version": 1,
        })
        .await
        .expect("insert");
}

/// A `datetime-local` value in UTC.
fn minute_text(t: i64) -> String {
    let d = time::OffsetDateTime::from_unix_timestamp(t).expect("a time");
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}",
        d.year(),
        u8::from(d.month()),
        d.day(),
        d.hour(),
        d.minute()
    )
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[tokio::test]
async fn the_console_shows_the_fleet_a_sensor_chart_and_ingest_health_in_a_real_chromium() {
    // MQTT with a route, so the health lists it with its counts.
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.ingest.max_age = std::time::Duration::from_secs(420 * 86_400);
    settings.mqtt.routes = vec![hourglass::RouteSettings {
        preset: Some("zigbee2mqtt".into()),
        ..Default::default()
    }];
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;
    let mut device = Publisher::connect(&broker, "device").await;
    for (topic, payload) in [
        ("zigbee2mqtt/zz-plug", r#"{"power":98}"#),
        ("zigbee2mqtt/zz-plug/availability", "online"),
        ("zigbee2mqtt/zz-odd", "not json"),
    ] {
        device.publish(topic, payload.to_owned()).await;
    }
    device.flushed().await;
    eventually(
        std::time::Duration::from_secs(60),
        "the route counted the three messages",
        || async {
            let line = |o: &str| {
                format!(
                    "hourglass_mqtt_route_messages_total{{outcome=\"{o}\",route=\"zigbee2mqtt\"}}"
                )
            };
            app.metric(&line("stored")).await
                + app.metric(&line("ignored")).await
                + app.metric(&line("dead_lettered")).await
                == 3.0
        },
    )
    .await;
    let now = now();
    let hour = now - now.rem_euclid(3600);
    // 60 sensors (two pages of 50), half at each of two sites, one reading
    // each (seconds ago for the even ones after the first, half an hour ago
    // for the others: silent at the fleet's 5 minutes); the first also has
    // 400 days of history.
    let mut body = Vec::new();
    let mut latest = BTreeMap::new();
    let mut silent = Vec::new();
    for i in 0..60 {
        let sensor = format!("con-{i:03}");
        let v = f64::from(i) + 0.5;
        let current = i % 2 == 0 && i > 0;
        let ts = if current {
            now - 10
        } else {
            hour - 1800 + i64::from(i)
        };
        body.push(reading(&sensor, METRIC, ts, v));
        if !current && i < 50 {
            silent.push(sensor.clone());
        }
        latest.insert(sensor, v);
    }
    let mut history = BTreeMap::new();
    for k in 0..130 {
        history.insert(
            hour - 2 * 3600 - k * 3 * 86_400 - k * 977,
            (k % 17) as f64 * 0.5,
        );
    }
    for k in 0..144 {
        history.insert(hour - 3600 - k * 600 + 7, (k % 11) as f64 - 3.0);
    }
    history.insert(hour - 1800, 0.5);
    for (&ts, &v) in &history {
        body.push(reading("con-000", METRIC, ts, v));
    }
    let r = app.post_readings(&Value::Array(body)).await;
    assert_eq!(r.status(), 200);
    for i in 0..60 {
        let site = if i % 2 == 0 { "a" } else { "b" };
        let r = app
            .client
            .put(format!("{}/api/v1/sensors/con-{i:03}/labels", app.address))
            .json(&json!({ "site": site }))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 204);
    }
    // One dead letter.
    plant_broken_bucket(&app, "zz-broken", hour - 3600).await;
    let r = app
        .post_readings(&json!([reading("zz-broken", METRIC, hour - 3590, 1.0)]))
        .await;
    assert_eq!(r.status(), 422);

    let seen = drive(
        &app,
        "open",
        json!({
            "glob": "con-01*", "label": "site=b", "sensor": "con-000", "tz": "Asia/Kolkata",
            "custom": [minute_text(hour - 6 * 3600), minute_text(hour - 3600)],
        }),
    )
    .await;

    // The fleet, paged as the API pages it, with each sensor's last value.
    let all: Vec<String> = app.get_json("/api/v1/sensors?limit=1000").await["sensors"]
        .as_array()
        .expect("sensors")
        .iter()
        .map(|s| s["sensor"].as_str().expect("id").to_owned())
        .collect();
    let page1: Vec<&str> = seen["page1"]
        .as_array()
        .expect("page 1")
        .iter()
        .map(|r| r[0].as_str().expect("id"))
        .collect();
    assert_eq!(
        page1,
        all[..50].iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert_eq!(seen["page2"], json!(all[50..]));
    assert_eq!(
        seen["silent_check"], "checked",
        "the silent listing answered"
    );
    assert_eq!(seen["silent"], json!(silent), "the silent sensors marked");
    assert_eq!(seen["next_disabled_on_last"], true);
    for row in seen["page1"].as_array().expect("rows") {
        let sensor = row[0].as_str().expect("id");
        assert_eq!(
            row[1].as_str(),
            Some(latest[sensor].to_string().as_str()),
            "the last value of {sensor}"
        );
    }
    let glob: Vec<String> = (10..20).map(|i| format!("con-{i:03}")).collect();
    assert_eq!(seen["glob"], json!(glob));
    let site_b: Vec<String> = (1..60).step_by(2).map(|i| format!("con-{i:03}")).collect();
    assert_eq!(seen["label"], json!(site_b));

    // Each chart drew what the API answers for its request, over every
    // preset and both time zones; fixed steps also match a brute-force
    // average of the readings written.
    let charts = seen["charts"].as_object().expect("charts");
    for (name, chart) in charts {
        assert_chart_is_the_api(&app, None, chart).await;
        let url = chart["url"].as_str().expect("url");
        assert_eq!(param(url, "metric"), METRIC);
        // Chromium names India's zone by its older alias.
        let tz = param(url, "tz");
        if name.ends_with("utc") {
            assert_eq!(tz, "UTC", "{name}");
        } else {
            assert!(
                ["Asia/Kolkata", "Asia/Calcutta"].contains(&tz.as_str()),
                "{name}: {tz}"
            );
        }
        assert_eq!(chart["dataset"]["tz"], tz.as_str());
        let xs = chart["data"][0].as_array().expect("xs").clone();
        assert!(xs.len() > 2, "{name} drew points");
        if step_seconds(&param(url, "step")).is_some() {
            // Whole steps only: the first and last may be cut by the range.
            let want = brute_force(&history, url, &xs);
            let drawn = chart["data"][1].as_array().expect("avg");
            for i in 1..xs.len() - 1 {
                match (drawn[i].as_f64(), want[i].as_f64()) {
                    (Some(g), Some(w)) => {
                        assert!((g - w).abs() < 1e-9, "{name} at {}: {g} vs {w}", xs[i])
                    }
                    _ => assert_eq!(drawn[i], want[i], "{name} at {}", xs[i]),
                }
            }
        }
    }
    // The custom range is the one typed, read in the chosen zone.
    let custom = charts["custom-utc"]["url"].as_str().expect("url");
    assert_eq!(
        param(custom, "from"),
        ((hour - 6 * 3600) * 1000).to_string()
    );
    assert_eq!(param(custom, "to"), ((hour - 3600) * 1000).to_string());
    assert_eq!(charts.len(), 7, "every preset and the custom range");

    // The long range steps by calendar weeks, which start at midnight of the
    // chosen zone: switching zones moves every point.
    let (local, utc) = (&charts["400d"], &charts["400d-utc"]);
    assert_eq!(param(local["url"].as_str().expect("url"), "step"), "1w");
    assert_ne!(local["data"][0], utc["data"][0], "the zone moves the weeks");
    for x in &utc["data"][0].as_array().expect("xs")[1..] {
        assert_eq!(
            x.as_i64().expect("x").rem_euclid(86_400),
            0,
            "UTC midnights"
        );
    }
    for x in &local["data"][0].as_array().expect("xs")[1..] {
        assert_eq!(
            (x.as_i64().expect("x") + 19_800).rem_euclid(86_400),
            0,
            "Kolkata midnights"
        );
    }
    // The 400-day chart counts every reading of the sensor.
    let total: u64 = assert_chart_is_the_api(&app, None, utc).await["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| p["count"].as_u64().expect("count"))
        .sum();
    assert_eq!(total, history.len() as u64, "every reading of con-000");

    // The group chart: one line per site, as the API groups them.
    let group = &seen["group"];
    let body = assert_chart_is_the_api(&app, None, group).await;
    assert_eq!(
        param(group["url"].as_str().expect("url"), "group_by"),
        "label.site"
    );
    // Site a, site b, and the one sensor without a site.
    let groups: Vec<(Value, Value)> = body["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| (g["group"]["site"].clone(), g["sensors"].clone()))
        .collect();
    assert_eq!(
        groups,
        vec![
            (Value::Null, json!(1)),
            (json!("a"), json!(30)),
            (json!("b"), json!(30))
        ]
    );

    // Weighted by time, both charts draw the API's time-weighted averages
    // of the same range and step.
    for (name, before) in [("weighted", "custom-utc"), ("weighted_group", "")] {
        let chart = &seen[name];
        let url = chart["url"].as_str().expect("url");
        assert_eq!(param(url, "weighting"), "time", "{name}");
        let body = assert_chart_is_the_api(&app, None, chart).await;
        let first = body["points"]
            .as_array()
            .or_else(|| body["groups"][0]["points"].as_array())
            .expect("points");
        assert!(first.iter().all(|p| p["held_seconds"].is_i64()), "{name}");
        if !before.is_empty() {
            let was = charts[before]["url"].as_str().expect("url");
            for key in ["from", "to", "step"] {
                assert_eq!(param(url, key), param(was, key), "{name} {key}");
            }
        }
    }
    assert!(
        seen["weighted_caption"]
            .as_str()
            .is_some_and(|c| c.contains("weighted by time")),
        "{}",
        seen["weighted_caption"]
    );

    // The CSV is the API's CSV of the chart's series.
    let csv = &seen["csv"];
    let url = format!("{}&format=csv", csv["url"].as_str().expect("url"));
    let want = app.get(&url).await.text().await.expect("csv");
    assert_eq!(csv["text"].as_str(), Some(want.as_str()));
    assert_eq!(csv["name"], "con-000-temp.csv");

    // Ingest health from the service's own endpoints.
    let health = &seen["health"];
    assert!(
        health["stat-rate"]
            .as_str()
            .is_some_and(|s| s.parse::<f64>().is_ok()),
        "{health}"
    );
    assert_eq!(health["stat-pending"], "0");
    // The hours the upkeep has yet to roll up again, from its gauge.
    assert!(
        health["stat-late"]
            .as_str()
            .is_some_and(|s| s.parse::<f64>().is_ok()),
        "{health}"
    );
    assert_eq!(health["stat-mqtt"], "connected");
    assert_eq!(
        seen["routes"],
        json!([["zigbee2mqtt", "1", "1", "1"]]),
        "the route with its stored, ignored and dead-lettered messages"
    );
    assert_eq!(health["stat-ready"], "yes");
    assert_eq!(health["stat-dead"], "1");
    let letters = seen["dead_letters"].as_array().expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0]
            .as_str()
            .is_some_and(|l| l.starts_with("zz-broken temp") && l.contains("1 readings")),
        "{letters:?}"
    );

    // Accessible basics and a phone-sized layout.
    assert_eq!(seen["unlabelled_controls"], json!([]));
    assert_eq!(seen["sensor_link_tag"], json!([true, "BUTTON"]));
    assert!(
        seen["phone_overflow"].as_i64().is_some_and(|o| o <= 0),
        "the page scrolls sideways on a phone: {}",
        seen["phone_overflow"]
    );
    // The one sensor without a stored reading answers 404 to its last
    // value (the page shows "–"); Chromium logs that refusal itself.
    assert_eq!(
        errors(&seen, &["zz-broken/latest"]),
        Vec::<Value>::new(),
        "browser errors"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn with_auth_the_console_asks_for_a_token_and_a_device_token_sees_only_its_sensors() {
    let settings: Settings = secured();
    let app = spawn_app_with(settings).await;
    let t = now() - 7200;
    let body = json!([
        reading("truck-17", METRIC, t, 1.5),
        reading("truck-17.engine", METRIC, t + 1, 80.0),
        reading("ship-3", METRIC, t + 2, 12.0),
    ]);
    let r = app
        .client
        .post(format!("{}/api/v1/readings", app.address))
        .bearer_auth(INGESTER)
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    // The static files need no token; the API does.
    assert_eq!(app.get("/").await.status(), 200);
    assert_eq!(app.get("/console/app.js").await.status(), 200);
    assert_eq!(app.get("/api/v1/sensors").await.status(), 401);

    let seen = drive(
        &app,
        "auth",
        json!({ "wrong_token": "not-a-token", "device_token": TRUCK, "own": "truck-17", "other": "ship-3" }),
    )
    .await;
    assert_eq!(seen["prompted"], true);
    assert_eq!(
        seen["rows_before_token"], 0,
        "nothing listed before a token"
    );
    assert!(
        seen["refused"]
            .as_str()
            .is_some_and(|s| s.contains("refused"))
    );
    assert_eq!(seen["rows"], json!(["truck-17", "truck-17.engine"]));
    assert_eq!(
        seen["token_kept_in"],
        json!([true, 0]),
        "session storage only"
    );
    assert_chart_is_the_api(&app, Some(TRUCK), &seen["own_chart"]).await;
    assert!(
        seen["other_error"]
            .as_str()
            .is_some_and(|s| s.contains("ship-3")),
        "{}",
        seen["other_error"]
    );
    // The refusal the page showed is the API's.
    assert_eq!(
        get_as(
            &app,
            Some(TRUCK),
            "/api/v1/sensors/ship-3/latest?metric=temp"
        )
        .await
        .status(),
        403
    );
    assert_eq!(
        get_as(
            &app,
            Some(DASHBOARD),
            "/api/v1/sensors/ship-3/latest?metric=temp"
        )
        .await
        .status(),
        200
    );
    assert_eq!(
        errors(&seen, &["401", "403"]),
        Vec::<Value>::new(),
        "browser errors"
    );
    app.stop().await.expect("clean stop");
}

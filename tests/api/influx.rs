//! InfluxDB line protocol: the official Python client libraries (v2
//! `influxdb-client` with gzip, v1 `influxdb`) writing to Hourglass over real
//! sockets, then the stored readings checked exactly; InfluxDB's answers,
//! auth forms, limits, labels from tags, and line protocol over MQTT.

use std::io::Write as _;
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;

use crate::auth::{DASHBOARD, INGESTER, TRUCK, secured};
use crate::broker::{Broker, Publisher};
use crate::helpers::*;
use crate::mqtt::mqtt_settings;
use crate::python::{python, stdout_of};

/// Runs a Python script (with the InfluxDB clients `make test` installs).
async fn run_python(script: &'static str, args: Vec<String>) -> String {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(python())
            .arg("-c")
            .arg(script)
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("python could not start ({e}); `make test` installs it"));
        stdout_of("the client script", &out)
    })
    .await
    .expect("the script's thread")
}

/// (count, sum) of a sensor's metric over a day around `t`.
async fn stored(app: &TestApp, sensor: &str, metric: &str, t: i64) -> (u64, f64) {
    let got = app
        .get_json(&format!(
            "/api/v1/sensors/{sensor}/average?metric={metric}&from={}&to={}",
            rfc3339(t - 86_400),
            rfc3339(t + 86_400)
        ))
        .await;
    (
        got["count"]
            .as_u64()
            .unwrap_or_else(|| panic!("count: {got}")),
        got["sum"].as_f64().unwrap_or_else(|| panic!("sum: {got}")),
    )
}

async fn post_lines(
    app: &TestApp,
    path: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    app.client
        .post(format!("{}{path}", app.address))
        .body(body)
        .send()
        .await
        .expect("sent")
}

const V2_CLIENT: &str = r#"
import sys
from datetime import datetime, timezone
from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
url, t = sys.argv[1], int(sys.argv[2])
# The client gives a write 10 s by default; a write waits for its readings to
# be stored, and a stand-in busy with the heavy suites took longer in CI.
# 120 s, like the tests' own write timeout.
with InfluxDBClient(url=url, token="unused", org="acme", enable_gzip=True, timeout=120_000) as client:
    assert client.ping()
    write = client.write_api(write_options=SYNCHRONOUS)
    for name, unit, scale in [("ns", WritePrecision.NS, 10**9), ("us", WritePrecision.US, 10**6),
                              ("ms", WritePrecision.MS, 10**3), ("s", WritePrecision.S, 1)]:
        points = []
        for i in range(120):
            points.append(Point("temperature").tag("sensor", "v2-" + name).tag("site", "Berlin Mitte")
                          .field("value", 20.0 + i * 0.25).time((t + i) * scale + scale // 2, unit))
            points.append(Point("engine").tag("device", "v2-" + name).field("rpm", i * 10)
                          .field("on", i % 2 == 0).field("note", "text").time((t + i) * scale, unit))
        write.write(bucket="fleet", record=points, write_precision=unit)
    # Line protocol as text, with the time of receipt.
    write.write(bucket="fleet", record="temperature,sensor=v2-now value=7")
print("ok")
"#;

#[tokio::test]
async fn the_influxdb_v2_client_writes_gzipped_in_every_precision_and_is_stored_exactly() {
    let app = spawn_app().await;
    let t = base_time();
    run_python(V2_CLIENT, vec![app.address.clone(), t.to_string()]).await;
    for unit in ["ns", "us", "ms", "s"] {
        let sensor = format!("v2-{unit}");
        let sum: f64 = (0..120).map(|i| 20.0 + f64::from(i) * 0.25).sum();
        assert_eq!(
            stored(&app, &sensor, "temperature", t).await,
            (120, sum),
            "{unit}"
        );
        let rpm: f64 = (0..120).map(|i| f64::from(i) * 10.0).sum();
        assert_eq!(
            stored(&app, &sensor, "engine_rpm", t).await,
            (120, rpm),
            "{unit}"
        );
        assert_eq!(
            stored(&app, &sensor, "engine_on", t).await,
            (120, 60.0),
            "{unit}"
        );
        // The half-second offsets land in the same whole second.
        let series = app
            .get_json(&format!(
                "/api/v1/sensors/{sensor}/latest?metric=temperature"
            ))
            .await;
        assert_eq!(
            series["ts"],
            Value::from(rfc3339(t + 119)),
            "{unit}: {series}"
        );
    }
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    assert_eq!(stored(&app, "v2-now", "temperature", now).await, (1, 7.0));
    // String fields are skipped, not stored as a metric.
    let sensors = app.get_json("/api/v1/sensors?prefix=v2-ns").await;
    let metrics = &sensors["sensors"][0]["metrics"];
    assert!(!metrics.to_string().contains("note"), "{sensors}");
    app.stop().await.expect("clean stop");
}

const V1_CLIENT: &str = r#"
import sys
from influxdb import InfluxDBClient
host, port, token, t = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
client = InfluxDBClient(host=host, port=port, username="telegraf", password=token, database="telegraf")
client.create_database("telegraf")
assert {"name": "hourglass"} in client.get_list_database()
scale = {"n": 10**9, "u": 10**6, "ms": 10**3, "s": 1, "m": 1 / 60, "h": 1 / 3600}
for p in ["n", "u", "ms", "s", "m", "h"]:
    points = []
    for i in range(3):
        ts = t + i * 3600
        points.append({"measurement": "power", "tags": {"host": "v1-" + p, "rack": "r1"},
                       "time": int(ts * scale[p]), "fields": {"value": float(i + 1), "phases": 3}})
    assert client.write_points(points, time_precision=p, database="telegraf", retention_policy="autogen")
print("ok")
"#;

#[tokio::test]
async fn the_influxdb_v1_client_creates_its_database_and_writes_in_every_precision() {
    let app = spawn_app_with(secured()).await;
    let t = base_time();
    let port = app.address.rsplit(':').next().expect("port").to_owned();
    // The v1 client sends its credentials as u/p.
    run_python(
        V1_CLIENT,
        vec!["127.0.0.1".into(), port, INGESTER.into(), t.to_string()],
    )
    .await;
    for p in ["n", "u", "ms", "s", "m", "h"] {
        let sensor = format!("v1-{p}");
        let got = app
            .client
            .get(format!(
                "{}/api/v1/sensors/{sensor}/average?metric=power&from={}&to={}",
                app.address,
                rfc3339(t - 60),
                rfc3339(t + 3 * 3600)
            ))
            .bearer_auth(DASHBOARD)
            .send()
            .await
            .expect("sent")
            .json::<Value>()
            .await
            .expect("json");
        assert_eq!(
            (got["count"].as_u64(), got["sum"].as_f64()),
            (Some(3), Some(6.0)),
            "{p}: {got}"
        );
    }
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_partial_write_stores_the_valid_lines_and_answers_influxdbs_400() {
    let app = spawn_app().await;
    let t = base_time();
    let body = format!(
        "m,sensor=ok1 value=1 {t}\nm value=2 {t}\nm,sensor=ok2 value=3,x=\"s\" {t}\nm,sensor=bad v=abc {t}\n# comment\nm,sensor=ok3 value=4 {t}\n"
    );
    let r = post_lines(
        &app,
        "/api/v2/write?org=o&bucket=b&precision=s",
        body.clone(),
    )
    .await;
    assert_eq!(r.status(), 400);
    let answer: Value = r.json().await.expect("json");
    assert_eq!(answer["code"], "invalid");
    let message = answer["message"].as_str().expect("message");
    assert!(
        message.starts_with("partial write: 2 of 5 lines refused; line 2: no sensor tag"),
        "{message}"
    );
    assert!(
        message.contains("line 4: field \"v\" has an invalid value \"abc\""),
        "{message}"
    );
    for (sensor, v) in [("ok1", 1.0), ("ok2", 3.0), ("ok3", 4.0)] {
        assert_eq!(stored(&app, sensor, "m", t).await, (1, v), "{sensor}");
    }
    assert_eq!(stored(&app, "bad", "m_v", t).await, (0, 0.0));
    // v1 answers in its own shape.
    let r = post_lines(&app, "/write?db=x&precision=s", body).await;
    assert_eq!(r.status(), 400);
    let answer: Value = r.json().await.expect("json");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|m| m.starts_with("partial write")),
        "{answer}"
    );
    // A body of valid lines only: 204, and nothing counted twice on a resend.
    let good = format!("m,sensor=ok1 value=1 {t}\n");
    assert_eq!(
        post_lines(&app, "/write?precision=s", good.clone())
            .await
            .status(),
        204
    );
    assert_eq!(
        post_lines(&app, "/write?precision=s", good).await.status(),
        204
    );
    assert_eq!(stored(&app, "ok1", "m", t).await, (1, 1.0));
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn escaped_tags_become_labels_and_names_are_validated() {
    let app = spawn_app().await;
    let t = base_time();
    let body = format!(
        "weather,sensor=st-1,site=Berlin\\ Mitte\\,\\ Halle\\=2,kind=roof temp=21.5,hum=40i {t}000000000\n\
         weather,host=st-2,room=a\\ b value=1 {t}000000000\n\
         we\\ ather,sensor=st-3 value=1 {t}000000000\n\
         weather,sensor=st\\ 4 value=1 {t}000000000\n"
    );
    let r = post_lines(&app, "/api/v2/write", body).await;
    assert_eq!(r.status(), 400);
    let message = r.json::<Value>().await.expect("json")["message"].to_string();
    assert!(
        message.contains("line 3: field \\\"value\\\": the metric \\\"we ather\\\""),
        "{message}"
    );
    assert!(
        message.contains("line 4: tag \\\"sensor\\\": sensor must be"),
        "{message}"
    );
    assert_eq!(stored(&app, "st-1", "weather_temp", t).await, (1, 21.5));
    assert_eq!(stored(&app, "st-1", "weather_hum", t).await, (1, 40.0));
    assert_eq!(stored(&app, "st-2", "weather", t).await, (1, 1.0));
    // Labels are written in the background, after the answer.
    eventually(
        Duration::from_secs(30),
        "the tags are the sensors' labels",
        || async {
            let s = app.get_json("/api/v1/sensors?prefix=st-").await;
            s["sensors"][0]["labels"]
                == serde_json::json!({ "site": "Berlin Mitte, Halle=2", "kind": "roof" })
                && s["sensors"][1]["labels"] == serde_json::json!({ "room": "a b" })
        },
    )
    .await;
    // Labels from tags are added to those set by PUT, which stay.
    let r = app
        .client
        .put(format!("{}/api/v1/sensors/st-2/labels", app.address))
        .json(&serde_json::json!({ "owner": "ops" }))
        .send()
        .await
        .expect("sent");
    assert!(r.status().is_success());
    let body = format!("weather,host=st-2,floor=3 value=2 {t}000000000\n");
    assert_eq!(post_lines(&app, "/write", body).await.status(), 204);
    eventually(
        Duration::from_secs(30),
        "tags are merged into the labels",
        || async {
            let s = app.get_json("/api/v1/sensors?prefix=st-2").await;
            s["sensors"][0]["labels"] == serde_json::json!({ "owner": "ops", "floor": "3" })
        },
    )
    .await;
    app.stop().await.expect("clean stop");
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

#[tokio::test]
async fn influxdbs_other_answers_gzip_and_limits() {
    let mut settings = test_settings();
    settings.http.max_body_bytes = 64 * 1024;
    settings.ingest.max_readings_per_request = 100;
    let app = spawn_app_with(settings).await;
    let t = base_time();
    // /ping, as clients check it (HEAD too).
    for method in [reqwest::Method::GET, reqwest::Method::HEAD] {
        let r = app
            .client
            .request(method, format!("{}/ping", app.address))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 204);
        assert!(r.headers().contains_key("x-influxdb-version"));
    }
    // Telegraf's v1 output creates its database first (a form POST).
    let r = app
        .client
        .post(format!("{}/query", app.address))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("q=CREATE+DATABASE+%22telegraf%22")
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.expect("json"),
        serde_json::json!({ "results": [{ "statement_id": 0 }] })
    );
    let r = app.get("/query?q=SELECT%20*%20FROM%20cpu").await;
    assert_eq!(r.status(), 400);
    // gzip and identity alike.
    let body = format!("m,sensor=gz value=5 {t}\n");
    let r = app
        .client
        .post(format!("{}/api/v2/write?precision=s", app.address))
        .header("content-encoding", "gzip")
        .body(gzip(body.as_bytes()))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 204);
    assert_eq!(stored(&app, "gz", "m", t).await, (1, 5.0));
    // Bad precision; bad gzip.
    let r = post_lines(&app, "/api/v2/write?precision=m", body.clone()).await;
    assert_eq!(r.status(), 400);
    let r = app
        .client
        .post(format!("{}/write", app.address))
        .header("content-encoding", "gzip")
        .body(body.clone())
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 400);
    // Over the body limit counted decompressed (a small gzip of a large body): 413.
    let large = format!("m,sensor=big value=1 {t}\n").repeat(4000);
    let packed = gzip(large.as_bytes());
    assert!(packed.len() < 64 * 1024);
    let r = app
        .client
        .post(format!("{}/api/v2/write?precision=s", app.address))
        .header("content-encoding", "gzip")
        .body(packed)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 413);
    assert_eq!(
        r.json::<Value>().await.expect("json")["code"],
        "request too large"
    );
    // Over the readings limit: 413 and nothing stored.
    let many: String = (0..101)
        .map(|i| format!("m,sensor=many value={i} {}\n", t + i))
        .collect();
    let r = post_lines(&app, "/write?precision=s", many).await;
    assert_eq!(r.status(), 413);
    assert_eq!(stored(&app, "many", "m", t).await, (0, 0.0));
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn every_influxdb_auth_form_maps_onto_hourglass_tokens() {
    let app = spawn_app_with(secured()).await;
    let t = base_time();
    let body = |sensor: &str| format!("m,sensor={sensor} value=1 {t}\n");
    let send = |path: String, auth: Option<String>, sensor: &'static str| {
        let req = app
            .client
            .post(format!("{}{path}", app.address))
            .body(body(sensor));
        let req = match auth {
            Some(a) => req.header("authorization", a),
            None => req,
        };
        async move { req.send().await.expect("sent").status().as_u16() }
    };
    let basic = |user: &str, pass: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
    };
    let p = "/api/v2/write?precision=s".to_owned();
    assert_eq!(
        send(p.clone(), Some(format!("Token {INGESTER}")), "a1").await,
        204
    );
    assert_eq!(
        send(p.clone(), Some(format!("Bearer {INGESTER}")), "a2").await,
        204
    );
    assert_eq!(
        send(p.clone(), Some(basic("telegraf", INGESTER)), "a3").await,
        204
    );
    assert_eq!(
        send(
            format!("/write?precision=s&u=telegraf&p={INGESTER}"),
            None,
            "a4"
        )
        .await,
        204
    );
    assert_eq!(send(p.clone(), None, "x").await, 401);
    assert_eq!(send(p.clone(), Some("Token wrong".into()), "x").await, 401);
    // The p parameter is InfluxDB 1.x's: not taken on the v2 route.
    assert_eq!(send(format!("{p}&p={INGESTER}"), None, "x").await, 401);
    assert_eq!(
        send(p.clone(), Some(format!("Token {DASHBOARD}")), "x").await,
        403
    );
    // A device token writes its own sensors only; one stranger refuses all.
    assert_eq!(
        send(p.clone(), Some(format!("Token {TRUCK}")), "truck-17").await,
        204
    );
    assert_eq!(
        send(p.clone(), Some(format!("Token {TRUCK}")), "truck-18").await,
        403
    );
    let count = |sensor: &'static str| {
        let app = &app;
        async move {
            app.client
                .get(format!(
                    "{}/api/v1/sensors/{sensor}/average?metric=m&from={}&to={}",
                    app.address,
                    rfc3339(t - 60),
                    rfc3339(t + 60)
                ))
                .bearer_auth(DASHBOARD)
                .send()
                .await
                .expect("sent")
                .json::<Value>()
                .await
                .expect("json")["count"]
                .as_u64()
        }
    };
    for sensor in ["a1", "a2", "a3", "a4", "truck-17"] {
        assert_eq!(count(sensor).await, Some(1), "{sensor}");
    }
    assert_eq!(count("truck-18").await, Some(0));
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn line_protocol_over_mqtt_is_stored_and_its_refused_lines_dead_lettered() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.mqtt.dead_letter_topic = "hourglass/dead".into();
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;
    let mut watcher =
        Publisher::connect_subscribed(&broker, "lp-watcher", Some("hourglass/dead")).await;
    let mut dead = watcher.messages();
    let t = base_time();
    let ns = |s: i64| s * 1_000_000_000;
    let mut p = Publisher::connect(&broker, "telegraf").await;
    // Telegraf's outputs.mqtt: telegraf/{host}/{plugin}, nanoseconds.
    p.publish(
        "telegraf/gw-1/cpu",
        format!(
            "cpu,cpu=cpu0,host=gw-1 usage_idle=90.5,usage_user=9.5 {}\ncpu,cpu=cpu0,host=gw-1 usage_idle=80.5,usage_user=19.5 {}\n",
            ns(t),
            ns(t + 10)
        ),
    )
    .await;
    p.publish(
        "telegraf/gw-2/mem",
        format!(
            "mem,host=gw-2 used_percent=42 {}\nmem used_percent=1 {}\n",
            ns(t),
            ns(t)
        ),
    )
    .await;
    p.flushed().await;
    eventually(
        Duration::from_secs(90),
        "the line-protocol readings are stored",
        || async {
            stored(&app, "gw-1", "cpu_usage_idle", t).await == (2, 171.0)
                && stored(&app, "gw-2", "mem_used_percent", t).await == (1, 42.0)
        },
    )
    .await;
    assert_eq!(stored(&app, "gw-1", "cpu_usage_user", t).await, (2, 29.0));
    let (topic, letter) = tokio::time::timeout(Duration::from_secs(90), dead.recv())
        .await
        .expect("a dead letter in time")
        .expect("open");
    assert_eq!(topic, "hourglass/dead");
    let letter: Value = serde_json::from_slice(&letter).expect("json");
    assert_eq!(letter["topic"], "telegraf/gw-2/mem");
    let reason = letter["reason"].as_str().expect("reason");
    assert!(reason.contains("line 2: no sensor tag"), "{reason}");
    app.stop().await.expect("clean stop");
}

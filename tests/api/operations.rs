use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::TryStreamExt;
use hourglass::Granularity;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::broker::{Broker, Publisher};
use crate::database::Database;
use crate::helpers::*;

const WAIT: Duration = Duration::from_secs(60);

/// `{series as printed (name{labels}) → value}` from the Prometheus text format.
async fn scrape(app: &TestApp) -> BTreeMap<String, f64> {
    let r = app.get("/metrics").await;
    assert_eq!(r.status(), 200);
    let ct = r.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(ct.starts_with("text/plain"), "{ct}");
    let text = r.text().await.expect("text");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(series, value)| (series.to_owned(), value.parse::<f64>().expect("a number")))
        .collect()
}

/// The value of the series named `name` with all of `labels`, or 0.
fn metric(m: &BTreeMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    m.iter()
        .filter(|(series, _)| series.split('{').next() == Some(name))
        .filter(|(series, _)| {
            labels
                .iter()
                .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| *v)
        .sum()
}

#[tokio::test]
async fn metrics_follow_readings_from_ingest_to_storage() {
    let app = spawn_app().await;
    let before = scrape(&app).await;
    let t = base_time();
    let good: Vec<Value> = (0..10)
        .map(|i| reading("metered-sensor", "m", t + i * 7, 1.0))
        .collect();
    assert_eq!(app.post_readings(&Value::Array(good)).await.status(), 200);
    let bad = json!([reading("s", "m", t, 1.0), { "sensor": "s", "value": "x" }, reading("s", "m", t, 2.0)]);
    assert_eq!(app.post_readings(&bad).await.status(), 400);
    assert_eq!(
        app.post_raw("text/plain", b"1".to_vec(), "").await.status(),
        415
    );
    let q = format!(
        "/api/v1/sensors/metered-sensor/average?metric=m&from={}&to={}",
        rfc3339(t),
        rfc3339(t + 120)
    );
    app.get_json(&q).await;
    let after = scrape(&app).await;
    let delta = |name: &str, labels: &[(&str, &str)]| {
        metric(&after, name, labels) - metric(&before, name, labels)
    };

    assert_eq!(
        delta("hourglass_readings_received_total", &[("source", "http")]),
        10.0
    );
    assert_eq!(delta("hourglass_readings_stored_total", &[]), 10.0);
    assert_eq!(
        delta("hourglass_bucket_updates_total", &[]),
        2.0,
        "10 readings in 2 minutes: 2 updates"
    );
    assert!(delta("hourglass_write_round_trips_total", &[]) >= 1.0);
    assert_eq!(
        delta(
            "hourglass_readings_rejected_total",
            &[("source", "http"), ("reason", "invalid")]
        ),
        3.0
    );
    assert_eq!(
        delta(
            "hourglass_readings_rejected_total",
            &[("reason", "content_type")]
        ),
        1.0
    );
    assert!(delta("hourglass_flush_duration_seconds_count", &[]) >= 1.0);
    assert_eq!(delta("hourglass_flush_readings_sum", &[]), 10.0);
    assert_eq!(
        delta(
            "hourglass_http_requests_total",
            &[
                ("route", "/api/v1/readings"),
                ("method", "POST"),
                ("status", "200")
            ]
        ),
        1.0
    );
    assert_eq!(
        delta(
            "hourglass_http_requests_total",
            &[
                ("route", "/api/v1/sensors/{sensor}/average"),
                ("status", "200")
            ]
        ),
        1.0
    );
    assert_eq!(
        delta(
            "hourglass_query_duration_seconds_count",
            &[("endpoint", "average")]
        ),
        1.0
    );
    assert_eq!(metric(&after, "hourglass_pending_readings", &[]), 0.0);
    assert!(
        after
            .keys()
            .all(|series| !series.contains("metered-sensor")),
        "no sensor ids in labels"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn mqtt_metrics_show_the_connection_and_the_messages() {
    let broker = Broker::start().await;
    let mut settings = test_settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = broker.url();
    settings.mqtt.client_id = format!("hg-{}", uuid::Uuid::new_v4().simple());
    let app = spawn_app_with(settings).await;
    let stats = app.mqtt.clone().expect("mqtt");
    subscribed(&app).await;
    let mut p = Publisher::connect(&broker, "metered").await;
    let t = base_time();
    p.publish(
        "sensors/m1/temp",
        json!([{ "value": 1, "ts": t * 1000 }, { "value": 2, "ts": (t + 1) * 1000 }]).to_string(),
    )
    .await;
    p.publish("sensors/m1/temp", "not a number").await;
    p.flushed().await;
    let s = stats.clone();
    eventually(WAIT, "both messages acknowledged", || {
        let s = s.clone();
        async move { s.acked.load(Ordering::Acquire) >= 2 }
    })
    .await;
    let m = scrape(&app).await;
    assert_eq!(metric(&m, "hourglass_mqtt_connected", &[]), 1.0);
    assert_eq!(metric(&m, "hourglass_mqtt_connections_total", &[]), 1.0);
    assert_eq!(metric(&m, "hourglass_mqtt_acks_total", &[]), 2.0);
    assert_eq!(
        metric(
            &m,
            "hourglass_readings_received_total",
            &[("source", "mqtt")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &m,
            "hourglass_readings_rejected_total",
            &[("source", "mqtt"), ("reason", "malformed")]
        ),
        1.0
    );
    app.stop().await.expect("clean stop");
}

async fn ready(app: &TestApp) -> (u16, Value) {
    let r = app.get("/health/ready").await;
    let status = r.status().as_u16();
    (status, r.json().await.expect("a JSON body"))
}

#[tokio::test]
async fn readiness_follows_the_storage_server_down_and_back() {
    let mut db = Database::start().await;
    let settings = db.settings();
    let app = spawn_app_with(settings).await;
    let (status, body) = ready(&app).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["checks"]["storage"]["ok"], true);

    db.stop();
    eventually(WAIT, "not ready without storage", || async {
        ready(&app).await.0 == 503
    })
    .await;
    let (_, last) = ready(&app).await;
    assert_eq!(last["ready"], false);
    assert_eq!(last["checks"]["storage"]["ok"], false, "{last}");
    assert_eq!(last["checks"]["capacity"]["ok"], true, "{last}");
    assert_eq!(app.get("/health/live").await.status(), 200, "still live");

    db.restart().await;
    eventually(WAIT, "ready again", || async { ready(&app).await.0 == 200 }).await;
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn readiness_requires_the_mqtt_subscription_when_mqtt_is_on() {
    let mut broker = Broker::start().await;
    let mut settings = test_settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = broker.url();
    settings.mqtt.client_id = format!("hg-{}", uuid::Uuid::new_v4().simple());
    let app = spawn_app_with(settings).await;
    eventually(WAIT, "ready with MQTT", || async {
        ready(&app).await.0 == 200
    })
    .await;
    broker.terminate();
    eventually(WAIT, "not ready without the broker", || async {
        let (status, body) = ready(&app).await;
        status == 503 && body["checks"]["mqtt"]["ok"] == false
    })
    .await;
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn sigterm_stores_every_accepted_reading_and_exits_zero() {
    let mut settings = test_settings();
    settings.mqtt.enabled = false;
    let reader = spawn_app_with(settings.clone()).await;
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("hourglass.log");
    // An hour-long flush interval: only the shutdown drain can store them.
    let mut child = spawn_binary(
        &settings,
        &[("HOURGLASS__BATCHER__FLUSH_INTERVAL", "1h")],
        &log,
    );
    let address = binary_address(&log).await;
    let http = crate::helpers::http_client();
    let t = base_time();
    for k in 0..3 {
        let body: Vec<Value> = (0..50)
            .map(|i| reading("drain", "m", t + k * 50 + i, 1.0))
            .collect();
        let r = http
            .post(format!("{address}/api/v1/readings?async=true"))
            .json(&body)
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 202);
    }
    assert!(
        reader.buckets().await.is_empty(),
        "nothing flushed before the signal"
    );
    let status = terminate(&mut child);
    assert!(status.success(), "exit status {status:?}");
    let stored: usize = reader
        .buckets()
        .await
        .iter()
        .map(|d| d.get_i32("count").expect("count") as usize)
        .sum();
    assert_eq!(stored, 150);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.contains("every accepted reading was stored"), "{text}");
    reader.stop().await.expect("clean stop");
}

#[tokio::test]
async fn shutdown_without_storage_logs_the_unstored_readings_and_exits_nonzero() {
    let mut db = Database::start().await;
    let settings = db.settings();
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("hourglass.log");
    let extra = [
        ("HOURGLASS__BATCHER__FLUSH_INTERVAL", "1h"),
        ("HOURGLASS__SHUTDOWN__TIMEOUT", "3s"),
    ];
    let mut child = spawn_binary(&settings, &extra, &log);
    let address = binary_address(&log).await;
    let body: Vec<Value> = (0..40)
        .map(|i| reading("lost", "m", base_time() + i, 1.0))
        .collect();
    let r = crate::helpers::http_client()
        .post(format!("{address}/api/v1/readings?async=true"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 202);
    db.stop();
    let status = terminate(&mut child);
    assert!(
        !status.success(),
        "a shutdown that loses readings must not exit 0"
    );
    let errors: Vec<Value> = std::fs::read_to_string(&log)
        .expect("log")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["level"] == "ERROR")
        .collect();
    assert!(
        errors.iter().any(|e| e["readings"] == 40),
        "an ERROR line says how many readings were not stored: {errors:?}"
    );
}

async fn ttl(app: &TestApp) -> Option<i64> {
    ttl_of(app, &app.settings.mongodb.collection).await
}

async fn ttl_of(app: &TestApp, collection: &str) -> Option<i64> {
    ttl_named(app, collection, "start_ttl").await
}

async fn ttl_named(app: &TestApp, collection: &str, name: &str) -> Option<i64> {
    let coll = app.db.collection::<Document>(collection);
    let indexes: Vec<_> = coll
        .list_indexes()
        .await
        .expect("indexes")
        .try_collect()
        .await
        .expect("list");
    indexes
        .into_iter()
        .find(|i| i.options.as_ref().and_then(|o| o.name.as_deref()) == Some(name))
        .map(|i| {
            assert_eq!(i.keys, doc! { "start": 1 });
            i.options
                .and_then(|o| o.expire_after)
                .expect("expireAfterSeconds")
                .as_secs() as i64
        })
}

#[tokio::test]
async fn retention_is_applied_to_the_ttl_index_at_each_start() {
    let mut settings = test_settings();
    settings.buckets.retention = Some(Duration::from_secs(90 * 86_400));
    let app = spawn_app_with(settings.clone()).await;
    assert_eq!(ttl(&app).await, Some(90 * 86_400));
    // Rollup levels inherit it, each counted from the end of its document.
    let rollups = app.settings.mongodb.rollup_collection.clone();
    assert_eq!(
        ttl_of(&app, &rollups).await,
        None,
        "one index per level instead"
    );
    for (name, period) in [("hour", 3600), ("day", 86_400), ("30d", 30 * 86_400)] {
        assert_eq!(
            ttl_named(&app, &rollups, &format!("start_ttl_{name}")).await,
            Some(90 * 86_400 + period),
            "a {name} document outlives its last slot by the retention"
        );
    }
    app.stop().await.expect("clean stop");

    settings.buckets.retention = Some(Duration::from_secs(45 * 86_400));
    let app = spawn_app_with(settings.clone()).await;
    assert_eq!(
        ttl(&app).await,
        Some(45 * 86_400),
        "changed in place at the next start"
    );
    assert_eq!(
        ttl_named(&app, &rollups, "start_ttl_30d").await,
        Some((45 + 30) * 86_400)
    );
    app.stop().await.expect("clean stop");

    settings.buckets.retention = None;
    let app = spawn_app_with(settings).await;
    assert_eq!(ttl(&app).await, None, "off drops it");
    assert_eq!(ttl_named(&app, &rollups, "start_ttl_day").await, None);
    app.stop().await.expect("clean stop");
}

/// The error of a start with `settings`, which must fail.
async fn refused(settings: hourglass::Settings) -> String {
    match hourglass::Application::build(settings).await {
        Ok(_) => panic!("the start should have been refused"),
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test]
async fn an_instance_of_another_granularity_or_an_older_format_refuses_to_start() {
    let app = spawn_app().await;
    let t = base_time() + 7;
    let r = app.post_readings(&json!([reading("g", "m", t, 1.5)])).await;
    assert_eq!(r.status(), 200);
    let database = app.settings.mongodb.database.clone();
    let mut hour = app.settings.clone();
    hour.buckets.granularity = Granularity::Hour;
    let before = app.buckets().await;

    let message = refused(hour.clone()).await;
    assert!(
        message.contains(r#"buckets.granularity is "hour""#)
            && message.contains(&format!(r#"database {database} holds "minute" buckets"#))
            && message.contains("recorded in its metadata document"),
        "{message}"
    );
    // A database from before the metadata document: judged by its buckets.
    let metadata = app.db.collection::<Document>("metadata");
    metadata
        .delete_many(doc! {})
        .await
        .expect("metadata deleted");
    let message = refused(hour).await;
    assert!(message.contains("judged by a stored bucket"), "{message}");
    assert_eq!(
        metadata.count_documents(doc! {}).await.expect("counted"),
        0,
        "nothing recorded for a refused start"
    );
    // A database a newer Hourglass wrote.
    let again = spawn_app_with(app.settings.clone()).await;
    again.stop().await.expect("stops");
    metadata
        .update_one(
            doc! { "_id": "format" },
            doc! { "$set": { "bucket_schema_version": 99 } },
        )
        .await
        .expect("updated");
    let message = refused(app.settings.clone()).await;
    assert!(
        message.contains("bucket schema_version 99") && message.contains("upgrade"),
        "{message}"
    );
    assert_eq!(app.buckets().await, before, "nothing written");
    app.stop().await.expect("stops");
}

//! The write path against the failures a real MongoDB returns, injected with
//! `configureFailPoint` / `failCommand` (as MongoDB's own driver tests do) on
//! a private server, and against real bucket documents that can never be
//! updated.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{Bson, DateTime, Document, doc};
use serde_json::{Value, json};

use crate::broker::{Broker, Publisher};
use crate::database::Database;
use crate::helpers::*;
use crate::mqtt::mqtt_settings;

const WAIT: Duration = Duration::from_secs(90);

async fn fail_point(app: &TestApp, mode: Bson, data: Document) {
    app.db
        .client()
        .database("admin")
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": mode, "data": data })
        .await
        .expect("the server takes the fail point");
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn metrics_text(app: &TestApp) -> String {
    app.get("/metrics").await.text().await.expect("metrics")
}

fn readings_for(sensor: &str, t: i64, n: i64) -> (Value, BTreeMap<(String, String, i64), f64>) {
    let mut model = BTreeMap::new();
    let body: Vec<Value> = (0..n)
        .map(|i| {
            // Two minutes, so every request spans two buckets.
            let ts = t + i * (120 / n.max(1));
            let v = (i % 13) as f64 + 0.25;
            model.insert((sensor.to_owned(), "m".to_owned(), ts), v);
            reading(sensor, "m", ts, v)
        })
        .collect();
    (Value::Array(body), model)
}

/// The stored values of `sensor`, leaving out buckets planted broken.
async fn values_of(app: &TestApp, sensor: &str) -> BTreeMap<(String, String, i64), f64> {
    let docs: Vec<Document> = app
        .buckets()
        .await
        .into_iter()
        .filter(|d| d.get_str("sensor") == Ok(sensor) && d.get_document("v").is_ok())
        .collect();
    all_values(&docs, Granularity::Minute)
}

async fn dead_letters(app: &TestApp) -> Vec<Document> {
    app.documents(&app.settings.mongodb.dead_letter_collection, doc! {})
        .await
}

/// `(sensor, ts) → value` of every dead-lettered reading.
fn dead_readings(letters: &[Document]) -> BTreeMap<(String, i64), f64> {
    letters
        .iter()
        .flat_map(|d| {
            let sensor = d.get_str("sensor").expect("sensor").to_owned();
            d.get_array("readings")
                .expect("readings")
                .iter()
                .map(move |r| {
                    let r = r.as_document().expect("a reading");
                    let ts = r.get_datetime("ts").expect("ts").timestamp_millis() / 1000;
                    ((sensor.clone(), ts), r.get_f64("value").expect("value"))
                })
        })
        .collect()
}

/// A private server and an app on it that waits out an outage, however
/// long: after a "node is shutting down" the driver rediscovers the server
/// before it sends again.
async fn spawn_patient_app() -> (Database, TestApp) {
    let db = Database::start().await;
    let mut s = db.settings();
    s.http.write_timeout = Duration::from_secs(120);
    s.http.request_timeout = Duration::from_secs(121);
    let app = spawn_app_with(s).await;
    (db, app)
}

async fn outages(app: &TestApp) -> f64 {
    metric(
        &metrics_text(app).await,
        "hourglass_storage_errors_total{kind=\"outage\"}",
    )
}

#[tokio::test]
async fn outage_codes_during_synchronous_writes_end_with_everything_stored_once() {
    let (_db, app) = spawn_patient_app().await;
    let t = base_time();
    // One representative of each kind of outage MongoDB reports, each failing
    // the next two `update` commands.
    let cases: Vec<(&str, Document)> = vec![
        ("unauthorized", doc! { "errorCode": 13 }),
        ("interrupted", doc! { "errorCode": 11601 }),
        ("stale config", doc! { "errorCode": 13388 }),
        ("shutdown in progress", doc! { "errorCode": 91 }),
        ("not primary", doc! { "errorCode": 10107 }),
        (
            "a poison code with a retryable label",
            doc! { "errorCode": 2, "errorLabels": ["RetryableWriteError"] },
        ),
        ("a closed connection", doc! { "closeConnection": true }),
        (
            "an unsatisfiable write concern",
            doc! { "writeConcernError": { "code": 100, "errmsg": "not enough data-bearing nodes" } },
        ),
    ];
    for (i, (what, data)) in cases.into_iter().enumerate() {
        let sensor = format!("outage-{i}");
        let mut data = data;
        data.insert("failCommands", vec!["update"]);
        fail_point(&app, doc! { "times": 2 }.into(), data).await;
        let (body, model) = readings_for(&sensor, t + i as i64 * 600, 12);
        let r = app.post_readings(&body).await;
        assert_eq!(r.status(), 200, "{what}: answered stored");
        assert_eq!(values_of(&app, &sensor).await, model, "{what}: stored once");
    }
    let text = metrics_text(&app).await;
    assert!(
        metric(&text, "hourglass_storage_errors_total{kind=\"outage\"}") >= 8.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "hourglass_readings_dead_lettered_total"),
        0.0,
        "no outage dead-letters anything"
    );
    assert!(dead_letters(&app).await.is_empty());
    assert_invariants(&app.buckets().await, Granularity::Minute);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn outages_of_the_rollup_writes_send_the_batch_again_until_rollups_are_exact() {
    let (_db, app) = spawn_patient_app().await;
    let t = base_time();
    // Hours that ended are marked late before the batch counts as stored.
    // A new sensor's `update`s: its registration ahead of storage, the
    // flush's registry entry, its buckets, then the marker. The first three
    // go through, the marker's fails, and the batch is sent again until the
    // hour is marked; its roll-up then makes the rollups catch up with it.
    let cases: Vec<(&str, Document)> = vec![
        (
            "an unsatisfiable write concern",
            doc! { "writeConcernError": { "code": 100, "errmsg": "not enough data-bearing nodes" } },
        ),
        ("shutdown in progress", doc! { "errorCode": 91 }),
        ("a closed connection", doc! { "closeConnection": true }),
    ];
    for (i, (what, mut data)) in cases.into_iter().enumerate() {
        // The upkeep's own writes would take the failure otherwise.
        app.late_rolled_up().await;
        let before = outages(&app).await;
        let sensor = format!("rollup-outage-{i}");
        data.insert("failCommands", vec!["update"]);
        fail_point(&app, doc! { "skip": 3, "times": 1 }.into(), data).await;
        let (body, model) = readings_for(&sensor, t + i as i64 * 600, 12);
        let r = app.post_readings(&body).await;
        assert_eq!(r.status(), 200, "{what}: answered stored");
        assert_eq!(values_of(&app, &sensor).await, model, "{what}: stored once");
        assert!(outages(&app).await > before, "{what}: counted as an outage");
    }
    crate::rollup_checks::assert_rollups_match_buckets(&app, Granularity::Minute).await;
    assert!(dead_letters(&app).await.is_empty());
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_registry_update_not_confirmed_sends_the_batch_again() {
    let (_db, app) = spawn_patient_app().await;
    // The series is known from an hour before, so no registration ahead of
    // storage races the flush: the flush's registry entry for the new hour
    // is the first `update` of the new readings.
    let (first, mut model) = readings_for("registry-unconfirmed", base_time() - 3600, 1);
    assert_eq!(app.post_readings(&first).await.status(), 200);
    let earlier = model.clone();
    eventually(WAIT, "the earlier hour is stored", || async {
        values_of(&app, "registry-unconfirmed").await == earlier
    })
    .await;
    let before = outages(&app).await;
    // Every `update` from now on is applied but not confirmed, until
    // lifted: no bucket of the new hour is written before it is registered.
    fail_point(
        &app,
        "alwaysOn".into(),
        doc! {
            "failCommands": ["update"],
            "writeConcernError": { "code": 100, "errmsg": "not enough data-bearing nodes" },
        },
    )
    .await;
    let (body, later) = readings_for("registry-unconfirmed", base_time(), 12);
    model.extend(later);
    let lift = async {
        let deadline = tokio::time::Instant::now() + WAIT;
        while outages(&app).await <= before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the unconfirmed registry update is an outage"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            values_of(&app, "registry-unconfirmed").await,
            earlier,
            "no bucket is written before its hour is registered"
        );
        fail_point(&app, "off".into(), doc! {}).await;
    };
    let (r, ()) = tokio::join!(app.post_readings(&body), lift);
    assert_eq!(r.status(), 200, "answered stored once confirmed");
    assert_eq!(values_of(&app, "registry-unconfirmed").await, model);
    let listed = app.get_json("/api/v1/sensors?prefix=registry-").await;
    assert_eq!(
        listed["sensors"][0]["sensor"], "registry-unconfirmed",
        "{listed}"
    );
    assert!(dead_letters(&app).await.is_empty());
    app.stop().await.expect("clean stop");
}

/// A bucket document that no update pipeline can merge into: `v` is not an object.
async fn plant_broken_bucket(app: &TestApp, sensor: &str, start: i64) {
    app.db
        .collection::<Document>(&app.settings.mongodb.collection)
        .insert_one(doc! {
            "sensor": sensor, "metric": "m", "start": DateTime::from_millis(start * 1000),
            "v": "not an object", "count": 0, "schema_version": 1,
        })
        .await
        .expect("insert");
}

#[tokio::test]
async fn a_poison_bucket_dead_letters_its_readings_and_the_others_are_stored() {
    let app = spawn_app().await;
    let t = base_time();
    plant_broken_bucket(&app, "broken", t).await;
    let body = json!([
        reading("fine", "m", t + 1, 1.5),
        reading("broken", "m", t + 2, 2.5),
        reading("fine", "m", t + 61, 3.5),
        reading("broken", "m", t + 3, 4.5),
        reading("broken", "m", t + 62, 5.5),
    ]);
    let r = app.post_readings(&body).await;
    assert_eq!(r.status(), 422);
    let answer: Value = r.json().await.expect("json");
    let indexes: Vec<u64> = answer["details"]
        .as_array()
        .expect("details")
        .iter()
        .map(|d| d["index"].as_u64().expect("index"))
        .collect();
    assert_eq!(
        indexes,
        vec![1, 3],
        "the readings of the broken bucket: {answer}"
    );
    // Every other reading is stored, the broken minute's are dead-lettered.
    let fine = values_of(&app, "fine").await;
    assert_eq!(fine.len(), 2);
    let broken_next_minute = values_of(&app, "broken").await;
    assert_eq!(
        broken_next_minute.into_iter().collect::<Vec<_>>(),
        vec![(("broken".into(), "m".into(), t + 62), 5.5)]
    );
    let letters = dead_letters(&app).await;
    assert_eq!(letters.len(), 1);
    assert!(!letters[0].get_str("reason").expect("reason").is_empty());
    assert_eq!(
        dead_readings(&letters),
        BTreeMap::from([
            (("broken".into(), t + 2), 2.5),
            (("broken".into(), t + 3), 4.5)
        ])
    );
    let text = metrics_text(&app).await;
    assert_eq!(metric(&text, "hourglass_readings_dead_lettered_total"), 2.0);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_read_the_server_stops_at_its_time_limit_answers_as_a_timeout() {
    let (_db, app) = spawn_patient_app().await;
    let t = base_time();
    let (body, _) = readings_for("slow", t, 6);
    assert_eq!(app.post_readings(&body).await.status(), 200);
    // MaxTimeMSExpired for the next reads: the query's time is up.
    fail_point(
        &app,
        doc! { "times": 2 }.into(),
        doc! { "failCommands": ["find"], "errorCode": 50 },
    )
    .await;
    let r = app
        .get(&format!(
            "/api/v1/sensors/slow/average?metric=m&from={}&to={}",
            rfc3339(t - 86_400),
            rfc3339(t + 60)
        ))
        .await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("query.timeout")),
        "a timeout, not an outage: {body}"
    );
    let r = app
        .get(&format!(
            "/prometheus/api/v1/query?query=max_over_time(m%5B1h%5D)&time={}",
            t + 60
        ))
        .await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["errorType"], "timeout", "{body}");
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn dead_letters_are_written_once_and_redriven_into_their_buckets_once_fixed() {
    let app = spawn_app().await;
    let t = base_time();
    plant_broken_bucket(&app, "mend", t).await;
    let body = json!([
        reading("mend", "m", t + 2, 2.5),
        reading("mend", "m", t + 3, 4.5)
    ]);
    // Sent twice (a client retry, a replay): one dead letter.
    for _ in 0..2 {
        assert_eq!(app.post_readings(&body).await.status(), 422);
    }
    assert_eq!(dead_letters(&app).await.len(), 1, "idempotent");
    // Not fixed yet: re-driven and refused again, kept with the reason.
    let r = hourglass::redrive(&app.settings, Some("mend"), false)
        .await
        .expect("redrives");
    assert_eq!((r.letters, r.refused), (0, 1));
    assert_eq!(dead_letters(&app).await.len(), 1);
    // The cause fixed (the broken bucket removed): a dry run counts,
    // the re-drive stores and deletes.
    app.db
        .collection::<Document>(&app.settings.mongodb.collection)
        .delete_one(doc! { "sensor": "mend" })
        .await
        .expect("deleted");
    let r = hourglass::redrive(&app.settings, Some("mend*"), true)
        .await
        .expect("counts");
    assert_eq!((r.letters, r.readings), (1, 2));
    assert_eq!(
        dead_letters(&app).await.len(),
        1,
        "a dry run changes nothing"
    );
    let r = hourglass::redrive(&app.settings, None, false)
        .await
        .expect("redrives");
    assert_eq!((r.letters, r.readings, r.refused), (1, 2, 0));
    assert!(dead_letters(&app).await.is_empty());
    assert_eq!(
        values_of(&app, "mend").await,
        BTreeMap::from([
            (("mend".to_owned(), "m".to_owned(), t + 2), 2.5),
            (("mend".to_owned(), "m".to_owned(), t + 3), 4.5),
        ])
    );
    crate::rollup_checks::assert_rollups_match_buckets(&app, Granularity::Minute).await;
    let again = hourglass::redrive(&app.settings, None, false)
        .await
        .expect("redrives");
    assert_eq!(again.letters, 0, "nothing left");
    app.stop().await.expect("clean stop");
}

/// An error code no list names: sent again a few times (a transient one
/// ends stored), then dead-lettered rather than retried for ever while the
/// journal fills and every retry costs a round trip.
#[tokio::test]
async fn an_unclassed_command_error_is_retried_a_bounded_number_of_times_then_dead_lettered() {
    let db = Database::start().await;
    let app = spawn_app_with(db.settings()).await;
    let t = base_time();
    let unknown = doc! { "failCommands": ["update"], "errorCode": 54321 };
    fail_point(&app, doc! { "times": 2 }.into(), unknown.clone()).await;
    let (body, model) = readings_for("flaky", t, 12);
    assert_eq!(app.post_readings(&body).await.status(), 200);
    assert_eq!(values_of(&app, "flaky").await, model, "stored once");
    assert!(dead_letters(&app).await.is_empty());

    fail_point(&app, "alwaysOn".into(), unknown).await;
    let (body, model) = readings_for("refused", t + 600, 12);
    let r = app.post_readings(&body).await;
    assert_eq!(r.status(), 422, "{}", r.text().await.unwrap_or_default());
    fail_point(&app, "off".into(), doc! {}).await;
    assert!(values_of(&app, "refused").await.is_empty());
    let letters = dead_letters(&app).await;
    let dead: BTreeMap<(String, String, i64), f64> = dead_readings(&letters)
        .into_iter()
        .map(|((s, ts), v)| ((s, "m".to_owned(), ts), v))
        .collect();
    assert_eq!(dead, model, "each reading in the dead letters");
    assert!(
        letters.iter().all(|d| d
            .get_str("reason")
            .is_ok_and(|r| r.contains("after 5 attempts"))),
        "{letters:?}"
    );
    let text = metrics_text(&app).await;
    // The retries before giving up (the transient error's are a fail point
    // the registry's update may have taken first).
    let retried = metric(&text, "hourglass_storage_errors_total{kind=\"unknown\"}");
    assert!((4.0..=6.0).contains(&retried), "{text}");
    app.stop().await.expect("clean stop");
}

/// The one `aggregate` the service sends (the registry part of
/// `rebuild-rollups`): an unclassed error ends the rebuild with the error,
/// once, instead of retrying it for ever; the next rebuild completes.
#[tokio::test]
async fn an_unclassed_error_on_the_rebuilds_aggregate_ends_it_with_the_error() {
    let db = Database::start().await;
    let app = spawn_app_with(db.settings()).await;
    let (body, _) = readings_for("rebuilt", base_time(), 12);
    assert_eq!(app.post_readings(&body).await.status(), 200);
    fail_point(
        &app,
        "alwaysOn".into(),
        doc! { "failCommands": ["aggregate"], "errorCode": 54321 },
    )
    .await;
    let e = hourglass::rebuild_rollups(&app.settings, None, None, None)
        .await
        .expect_err("the rebuild fails");
    assert!(format!("{e:#}").contains("54321"), "{e:#}");
    fail_point(&app, "off".into(), doc! {}).await;
    let days = hourglass::rebuild_rollups(&app.settings, None, None, None)
        .await
        .expect("the rebuild completes");
    assert!(days > 0);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_command_refused_as_poison_is_split_until_the_statement_is_found() {
    let db = Database::start().await;
    let s = db.settings();
    let app = spawn_app_with(s).await;
    let t = base_time();
    // BadValue for every update while it is on: each statement ends up alone
    // and refused, so every reading goes to the dead-letter collection.
    fail_point(
        &app,
        "alwaysOn".into(),
        doc! { "failCommands": ["update"], "errorCode": 2 },
    )
    .await;
    let (body, model) = readings_for("poisoned", t, 12);
    let r = app.post_readings(&body).await;
    assert_eq!(r.status(), 422);
    fail_point(&app, "off".into(), doc! {}).await;
    let (body, stored) = readings_for("after", t, 12);
    assert_eq!(app.post_readings(&body).await.status(), 200);
    assert_eq!(values_of(&app, "after").await, stored);
    assert!(values_of(&app, "poisoned").await.is_empty());
    let dead: BTreeMap<(String, String, i64), f64> = dead_readings(&dead_letters(&app).await)
        .into_iter()
        .map(|((s, ts), v)| ((s, "m".to_owned(), ts), v))
        .collect();
    assert_eq!(
        dead, model,
        "each reading in its bucket or in the dead letters"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn mqtt_streams_through_an_outage_and_a_poison_bucket_end_exact() {
    let broker = Broker::start().await;
    let db = Database::start().await;
    let mut s = mqtt_settings(&broker);
    s.mongodb.uri = db.uri().into();
    let app = spawn_app_with(s).await;
    subscribed(&app).await;
    let t = base_time();
    plant_broken_bucket(&app, "mq-broken", t).await;
    let mut publisher = Publisher::connect(&broker, "writer").await;
    let mut model = BTreeMap::new();
    let mut dead = BTreeMap::new();
    // Outages on the next four update commands while the stream flows.
    fail_point(
        &app,
        doc! { "times": 4 }.into(),
        doc! { "failCommands": ["update"], "errorCode": 11602 },
    )
    .await;
    for i in 0..60i64 {
        let ts = t + i;
        let v = (i % 17) as f64;
        publisher
            .publish(
                "sensors/mq-fine/m",
                json!({ "value": v, "ts": ts * 1000 }).to_string(),
            )
            .await;
        model.insert(("mq-fine".to_owned(), "m".to_owned(), ts), v);
        if i % 10 == 0 {
            publisher
                .publish(
                    "sensors/mq-broken/m",
                    json!({ "value": v, "ts": ts * 1000 }).to_string(),
                )
                .await;
            dead.insert(("mq-broken".to_owned(), ts), v);
        }
    }
    publisher.flushed().await;
    let stats = app.mqtt.clone().expect("mqtt");
    eventually(WAIT, "every message is acknowledged", || {
        let stats = stats.clone();
        async move { stats.acked.load(Ordering::Acquire) >= 66 }
    })
    .await;
    assert_eq!(values_of(&app, "mq-fine").await, model);
    assert!(values_of(&app, "mq-broken").await.is_empty());
    assert_eq!(dead_readings(&dead_letters(&app).await), dead);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_worst_case_hour_request_is_stored_in_commands_within_the_limits() {
    let mut s = settings_with(Granularity::Hour);
    s.batcher.max_pending_readings = 50_000;
    // The stand-in server is slow with 3 600-value documents: give it time.
    s.http.write_timeout = Duration::from_secs(300);
    s.http.request_timeout = Duration::from_secs(301);
    let app = spawn_app_with(s).await;
    let t = base_time();
    // 833 sensors × one reading in each of 60 minutes: 49 980 readings, whose
    // single command used to be about 21 MiB.
    let body: Vec<Value> = (0..833)
        .flat_map(|s| (0..60).map(move |m| (s, m)))
        .map(|(s, m)| reading(&format!("w{s:03}"), "m", t + m * 60 + 7, 1.0))
        .collect();
    let r = app.post_readings(&Value::Array(body)).await;
    assert_eq!(r.status(), 200);
    let text = metrics_text(&app).await;
    assert!(
        metric(&text, "hourglass_write_round_trips_total") >= 2.0,
        "cut into several commands: {text}"
    );
    let docs = app.buckets().await;
    assert_eq!(docs.len(), 833);
    assert_eq!(all_values(&docs, Granularity::Hour).len(), 49_980);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn liveness_and_metrics_answer_while_ingest_is_saturated_and_storage_is_down() {
    let mut db = Database::start().await;
    let mut s = db.settings();
    s.http.max_concurrent_requests = 2;
    s.http.write_timeout = Duration::from_secs(60);
    s.http.request_timeout = Duration::from_secs(61);
    s.shutdown.timeout = Duration::from_secs(2);
    let app = spawn_app_with(s).await;
    db.stop();
    let t = base_time();
    let mut writers = Vec::new();
    for i in 0..2 {
        let client = app.client.clone();
        let url = format!("{}/api/v1/readings", app.address);
        let body = json!([reading(&format!("held{i}"), "m", t, 1.0)]);
        writers.push(tokio::spawn(async move {
            client
                .post(url)
                .json(&body)
                .send()
                .await
                .map(|r| r.status())
        }));
    }
    eventually(WAIT, "both writes hold the API's slots", || async {
        let r = app
            .post_readings(&json!([reading("third", "m", t, 1.0)]))
            .await;
        r.status() == 503 && r.headers().contains_key("retry-after")
    })
    .await;
    assert_eq!(app.get("/health/live").await.status(), 200);
    assert_eq!(app.get("/metrics").await.status(), 200);
    assert_eq!(
        app.get("/health/ready").await.status(),
        503,
        "storage is down"
    );
    // The held readings cannot be stored: the stop reports it.
    assert!(app.stop().await.is_err());
    for w in writers {
        let _ = w.await;
    }
}

#[tokio::test]
async fn a_retained_message_is_stored_once() {
    let broker = Broker::start().await;
    let first = spawn_app_with(mqtt_settings(&broker)).await;
    subscribed(&first).await;
    let mut publisher = Publisher::connect(&broker, "retainer").await;
    publisher
        .publish_retained("sensors/ret1/temp", "21.5")
        .await;
    publisher.flushed().await;
    eventually(WAIT, "the live message is stored", || async {
        all_values(&first.buckets().await, Granularity::Minute).len() == 1
    })
    .await;
    // A second instance subscribes and is handed the retained copy.
    let mut s = mqtt_settings(&broker);
    s.mongodb.database = first.settings.mongodb.database.clone();
    let second = spawn_app_with(s).await;
    subscribed(&second).await;
    eventually(WAIT, "the retained copy is skipped", || async {
        metric(
            &metrics_text(&second).await,
            "hourglass_mqtt_retained_skipped_total",
        ) == 1.0
    })
    .await;
    assert_eq!(
        all_values(&first.buckets().await, Granularity::Minute).len(),
        1,
        "not stored a second time"
    );
    second.stop().await.expect("clean stop");
    first.stop().await.expect("clean stop");
}

#[tokio::test]
async fn sigterm_with_a_stuck_upload_exits_within_the_deadline() {
    let settings = test_settings();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("hourglass.log");
    let mut child = spawn_binary(&settings, &[("HOURGLASS__SHUTDOWN__TIMEOUT", "2s")], &log);
    let address = binary_address(&log).await;
    let host = address.trim_start_matches("http://").to_owned();
    // An upload that announces 1000 bytes and sends 10, then stalls.
    let mut stuck = std::net::TcpStream::connect(&host).expect("connect");
    write!(
        stuck,
        "POST /api/v1/readings HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n[{{\"sensor\""
    )
    .expect("send the start");
    stuck.flush().expect("flush");
    eventually(WAIT, "the request is in progress", || async {
        reqwest::get(format!("{address}/metrics"))
            .await
            .map(|r| r.status() == 200)
            .unwrap_or(false)
    })
    .await;
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    // A failure bound, far above the 2 s deadline: without one shared
    // deadline the server waits for the upload for ever.
    let mut status = None;
    eventually(Duration::from_secs(20), "the process exits", || {
        status = child.try_wait().expect("wait");
        let done = status.is_some();
        async move { done }
    })
    .await;
    assert!(
        status.expect("exited").success(),
        "nothing accepted was lost"
    );
    drop(stuck);
}

/// A scripted MQTT 3.1.1 peer for what Mosquitto never does: refuse a
/// subscription with SUBACK 0x80 (as EMQX or HiveMQ do when authorization
/// denies it). It refuses every SUBSCRIBE until `accept` is set.
async fn refusing_broker(
    accept: std::sync::Arc<std::sync::atomic::AtomicBool>,
    subscribes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (accept, subscribes) = (accept.clone(), subscribes.clone());
            tokio::spawn(async move {
                loop {
                    let Ok(kind) = socket.read_u8().await else {
                        return;
                    };
                    // Remaining length: a variable-length integer.
                    let (mut length, mut shift) = (0usize, 0);
                    loop {
                        let Ok(b) = socket.read_u8().await else {
                            return;
                        };
                        length |= usize::from(b & 0x7f) << shift;
                        shift += 7;
                        if b & 0x80 == 0 {
                            break;
                        }
                    }
                    let mut body = vec![0u8; length];
                    if socket.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let reply: Vec<u8> = match kind >> 4 {
                        1 => vec![0x20, 0x02, 0x00, 0x00], // CONNACK, no session
                        8 => {
                            subscribes.fetch_add(1, Ordering::SeqCst);
                            let code = if accept.load(Ordering::SeqCst) {
                                0x01
                            } else {
                                0x80
                            };
                            vec![0x90, 0x03, body[0], body[1], code]
                        }
                        12 => vec![0xd0, 0x00], // PINGRESP
                        14 => return,           // DISCONNECT
                        _ => continue,
                    };
                    if socket.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn a_refused_subscription_keeps_the_service_unready_and_is_retried() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    let accept = Arc::new(AtomicBool::new(false));
    let subscribes = Arc::new(AtomicUsize::new(0));
    let port = refusing_broker(accept.clone(), subscribes.clone()).await;
    let mut s = test_settings();
    s.mqtt.enabled = true;
    s.mqtt.url = format!("mqtt://127.0.0.1:{port}");
    s.mqtt.reconnect_min = Duration::from_millis(50);
    s.mqtt.reconnect_max = Duration::from_millis(200);
    let app = spawn_app_with(s).await;
    eventually(WAIT, "the refused subscription is sent again", || {
        let subscribes = subscribes.clone();
        async move { subscribes.load(Ordering::SeqCst) >= 2 }
    })
    .await;
    let r = app.get("/health/ready").await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["checks"]["mqtt"]["ok"], false, "{body}");
    accept.store(true, Ordering::SeqCst);
    subscribed(&app).await;
    eventually(WAIT, "ready once the broker accepts", || async {
        app.get("/health/ready").await.status() == 200
    })
    .await;
    app.stop().await.expect("clean stop");
}

/// Readiness probes from every balancer at once cost the storage server one
/// ping: one ping held past readiness's timeout answers the whole crowd
/// (which, pinging each, would have seen one slow ping among successes), and
/// the next second's probes ping again.
#[tokio::test]
async fn a_crowd_of_readiness_probes_shares_one_storage_ping() {
    let (_db, app) = spawn_patient_app().await;
    eventually(WAIT, "ready", || async {
        app.get("/health/ready").await.status() == 200
    })
    .await;
    // Past the last ping's second of reuse.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    fail_point(
        &app,
        doc! { "times": 1 }.into(),
        doc! { "failCommands": ["ping"], "errorCode": 2, "blockConnection": true, "blockTimeMS": 2000 },
    )
    .await;
    let probes = (0..40).map(|_| async {
        let r = app.get("/health/ready").await;
        let status = r.status().as_u16();
        let body: Value = r.json().await.expect("json");
        (status, body["checks"]["storage"]["reason"].clone())
    });
    let answers = futures_util::future::join_all(probes).await;
    assert!(
        answers
            .iter()
            .all(|a| *a == (503, json!("storage did not answer in time"))),
        "{answers:?}"
    );
    eventually(WAIT, "ready again once a new ping answers", || async {
        app.get("/health/ready").await.status() == 200
    })
    .await;
    app.stop().await.expect("clean stop");
}

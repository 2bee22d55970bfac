//! Outages and errors the server answers mid-write: every batch sent again
//! until stored once, rollups and the registry included; what is never
//! classed is retried a bounded number of times.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::broker::{Broker, Publisher};
use crate::database::Database;
use crate::helpers::*;
use crate::mqtt::mqtt_settings;

use super::{
    WAIT, dead_letters, dead_readings, fail_point, metric, metrics_text, outages,
    plant_broken_bucket, readings_for, spawn_patient_app, values_of,
};

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
async fn mqtt_streams_through_an_outage_and_a_poison_bucket_end_exact() {
    let broker = Broker::start().await;
    let db = Database::start().await;
    let mut s = mqtt_settings(&broker);
    s.mongodb.uri = db.uri().into();
    let app = spawn_app_with(s).await;
    subscribed(&app).await;
    let t = plant_broken_bucket(&app, "mq-broken").await;
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

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hourglass::Granularity;
use hourglass::Settings;
use serde_json::{Value, json};

use crate::broker::{Broker, Publisher};
use crate::helpers::*;

const WAIT: Duration = Duration::from_secs(90);

pub(crate) type Model = BTreeMap<(String, String, i64), f64>;

pub fn mqtt_settings(broker: &Broker) -> Settings {
    let mut s = test_settings();
    s.mqtt.enabled = true;
    s.mqtt.url = broker.url();
    s.mqtt.client_id = format!("hg-{}", uuid::Uuid::new_v4().simple());
    s.mqtt.reconnect_max = Duration::from_secs(1);
    s
}

async fn stored_equals(app: &TestApp, model: &Model) {
    eventually(WAIT, "every published reading is stored", || async {
        all_values(&app.buckets().await, Granularity::Minute) == *model
    })
    .await;
    assert_invariants(&app.buckets().await, Granularity::Minute);
}

/// Message `i` of a stream: two readings of its own seconds, so every
/// (sensor, second) has exactly one value however often it is delivered.
fn stream_message(t: i64, i: i64, model: &mut Model) -> (String, Vec<u8>) {
    let sensor = format!("dev{}", i % 7);
    let readings: Vec<Value> = (0..2)
        .map(|k| {
            let ts = t + i * 2 + k;
            let v = ((i * 31 + k * 7) % 97) as f64;
            model.insert((sensor.clone(), "load".into(), ts), v);
            json!({ "value": v, "ts": ts * 1000 })
        })
        .collect();
    (
        format!("sensors/{sensor}/load"),
        serde_json::to_vec(&readings).expect("json"),
    )
}

#[tokio::test]
async fn every_topic_and_payload_form_is_stored_exactly() {
    let broker = Broker::start().await;
    let app = spawn_app_with(mqtt_settings(&broker)).await;
    subscribed(&app).await;
    let mut p = Publisher::connect(&broker, "forms").await;
    let t = base_time();
    let before = time::OffsetDateTime::now_utc().unix_timestamp();
    p.publish("sensors/s1/temp", " 21.5 ").await;
    p.publish(
        "sensors/s1/temp",
        json!({ "value": 1.0, "ts": rfc3339(t + 5) }).to_string(),
    )
    .await;
    p.publish(
        "sensors/s1/temp",
        json!([{ "value": 2, "ts": (t + 6) * 1000 }, { "value": 3, "ts": rfc3339(t + 65) }])
            .to_string(),
    )
    .await;
    p.publish(
        "sensors/s2",
        json!({ "metric": "rpm", "value": 100, "ts": rfc3339(t) }).to_string(),
    )
    .await;
    p.publish("sensors/s2", json!([{ "metric": "rpm", "value": 50, "ts": rfc3339(t + 1) }, { "sensor": "s2", "value": 7, "ts": rfc3339(t) }]).to_string()).await;
    p.flushed().await;

    eventually(WAIT, "seven readings stored", || async {
        all_values(&app.buckets().await, Granularity::Minute).len() == 7
    })
    .await;
    let after = time::OffsetDateTime::now_utc().unix_timestamp();
    let stored = all_values(&app.buckets().await, Granularity::Minute);
    let bare: Vec<_> = stored
        .iter()
        .filter(|((s, m, ts), _)| s == "s1" && m == "temp" && *ts >= before - 1)
        .collect();
    assert_eq!(bare.len(), 1, "the bare number is stamped on receipt");
    let ((_, _, ts), value) = bare[0];
    assert!(
        (before..=after).contains(ts),
        "stamped between publish and store"
    );
    assert_eq!(*value, 21.5);
    let key = |s: &str, m: &str, ts: i64| (s.to_owned(), m.to_owned(), ts);
    assert_eq!(stored.get(&key("s1", "temp", t + 5)), Some(&1.0));
    assert_eq!(stored.get(&key("s1", "temp", t + 6)), Some(&2.0));
    assert_eq!(stored.get(&key("s1", "temp", t + 65)), Some(&3.0));
    assert_eq!(stored.get(&key("s2", "rpm", t)), Some(&100.0));
    assert_eq!(stored.get(&key("s2", "rpm", t + 1)), Some(&50.0));
    assert_eq!(stored.get(&key("s2", "value", t)), Some(&7.0));
    assert_invariants(&app.buckets().await, Granularity::Minute);

    let avg = app
        .get_json(&format!(
            "/api/v1/sensors/s1/average?metric=temp&from={}&to={}",
            rfc3339(t),
            rfc3339(t + 120)
        ))
        .await;
    assert_eq!(
        (avg["count"].as_u64(), avg["sum"].as_f64()),
        (Some(3), Some(6.0))
    );
    let avg = app
        .get_json(&format!(
            "/api/v1/sensors/s2/average?metric=rpm&from={}&to={}",
            rfc3339(t),
            rfc3339(t + 60)
        ))
        .await;
    assert_eq!(
        (avg["count"].as_u64(), avg["avg"].as_f64()),
        (Some(2), Some(75.0))
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn duplicate_messages_and_redeliveries_leave_the_aggregates_unchanged() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    // Long enough that the first copies are still unacknowledged when the
    // broker restarts: it must deliver them again on the new connection.
    settings.batcher.flush_interval = Duration::from_secs(3);
    let app = spawn_app_with(settings).await;
    let stats = app.mqtt.clone().expect("mqtt");
    subscribed(&app).await;
    let t = base_time();
    let mut model = Model::new();
    let messages: Vec<_> = (0..30).map(|i| stream_message(t, i, &mut model)).collect();
    let mut p = Publisher::connect(&broker, "dups").await;
    for (topic, payload) in messages.iter().chain(messages.iter()) {
        p.publish(topic, payload.clone()).await;
    }
    p.flushed().await;
    drop(p);
    let s = stats.clone();
    eventually(WAIT, "all 60 messages received", || {
        let s = s.clone();
        async move { s.received.load(Ordering::Acquire) >= 60 }
    })
    .await;
    let mut broker = broker;
    broker.restart().await;
    stored_equals(&app, &model).await;
    let s = stats.clone();
    eventually(WAIT, "redelivered copies received", || {
        let s = s.clone();
        async move { s.received.load(Ordering::Acquire) > 60 }
    })
    .await;
    assert!(
        stats.connections.load(Ordering::Acquire) >= 2,
        "reconnected by itself"
    );
    // Redelivered copies are stored again; the buckets must not change.
    tokio::time::sleep(Duration::from_secs(4)).await;
    stored_equals(&app, &model).await;
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_broker_restart_mid_stream_loses_nothing_published_after_it() {
    let mut broker = Broker::start().await;
    let app = spawn_app_with(mqtt_settings(&broker)).await;
    let stats = app.mqtt.clone().expect("mqtt");
    subscribed(&app).await;
    let t = base_time();
    let mut model = Model::new();
    let mut p = Publisher::connect(&broker, "before").await;
    for i in 0..100 {
        let (topic, payload) = stream_message(t, i, &mut model);
        p.publish(&topic, payload).await;
    }
    p.flushed().await;
    drop(p);
    broker.restart().await;
    let mut p = Publisher::connect(&broker, "after").await;
    for i in 100..200 {
        let (topic, payload) = stream_message(t, i, &mut model);
        p.publish(&topic, payload).await;
    }
    p.flushed().await;
    stored_equals(&app, &model).await;
    assert!(stats.connections.load(Ordering::Acquire) >= 2);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn two_instances_in_a_shared_group_split_the_stream_and_store_each_reading_once() {
    let broker = Broker::start().await;
    let mut a_settings = mqtt_settings(&broker);
    a_settings.mqtt.shared_group = Some("hourglass".into());
    let mut b_settings = a_settings.clone();
    b_settings.mqtt.client_id = format!("hg-{}", uuid::Uuid::new_v4().simple());
    let a = spawn_app_with(a_settings).await;
    let b = spawn_app_with(b_settings).await;
    let (sa, sb) = (a.mqtt.clone().expect("mqtt"), b.mqtt.clone().expect("mqtt"));
    subscribed(&a).await;
    subscribed(&b).await;
    let t = base_time();
    let mut model = Model::new();
    let mut p = Publisher::connect(&broker, "shared").await;
    for i in 0..200 {
        let (topic, payload) = stream_message(t, i, &mut model);
        p.publish(&topic, payload).await;
    }
    p.flushed().await;
    stored_equals(&a, &model).await;
    let (ra, rb) = (
        sa.received.load(Ordering::Acquire),
        sb.received.load(Ordering::Acquire),
    );
    assert_eq!(ra + rb, 200, "each message went to one instance");
    assert!(ra > 0 && rb > 0, "both instances took part: {ra} and {rb}");
    a.stop().await.expect("clean stop");
    b.stop().await.expect("clean stop");
}

#[tokio::test]
async fn unusable_messages_are_dead_lettered_and_do_not_stop_the_stream() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.mqtt.dead_letter_topic = "hourglass/dead".into();
    settings.mqtt.max_payload_bytes = 2048;
    let app = spawn_app_with(settings).await;
    let stats = app.mqtt.clone().expect("mqtt");
    subscribed(&app).await;
    let mut watcher =
        Publisher::connect_subscribed(&broker, "watcher", Some("hourglass/dead")).await;
    let mut dead = watcher.messages();
    let t = base_time();
    let poison: Vec<(&str, String)> = vec![
        ("sensors/a/b/c", "1".into()),
        ("sensors/s1/temp", "abc".into()),
        ("sensors/s1/temp", "NaN".into()),
        (
            "sensors/s1/temp",
            json!({ "value": { "$gt": 1 } }).to_string(),
        ),
        ("sensors/bad$/temp", "1".into()),
        ("sensors/s1", "1e400".into()),
        (
            "sensors/s1/temp",
            json!([{ "value": 1, "ts": "2000-01-01T00:00:00Z" }]).to_string(),
        ),
        (
            "sensors/s1/temp",
            json!({ "sensor": "other", "value": 1 }).to_string(),
        ),
        (
            "sensors/s1/temp",
            format!("[{}]", vec![r#"{"value":1}"#; 200].join(",")),
        ),
        ("sensors/s1/temp", "".into()),
    ];
    let mut model = Model::new();
    let mut p = Publisher::connect(&broker, "poison").await;
    for (i, (topic, payload)) in poison.iter().enumerate() {
        p.publish(topic, payload.clone()).await;
        let (topic, payload) = stream_message(t, i as i64, &mut model);
        p.publish(&topic, payload).await;
    }
    p.flushed().await;
    stored_equals(&app, &model).await;
    let mut letters = Vec::new();
    while letters.len() < poison.len() {
        let (topic, body) = tokio::time::timeout(WAIT, dead.recv())
            .await
            .expect("a dead letter in time")
            .expect("open");
        assert_eq!(topic, "hourglass/dead");
        letters.push(serde_json::from_slice::<Value>(&body).expect("a JSON dead letter"));
    }
    for (letter, (topic, _)) in letters.iter().zip(&poison) {
        assert_eq!(letter["topic"], *topic);
        assert!(
            letter["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{letter}"
        );
    }
    assert_eq!(stats.unusable.load(Ordering::Acquire), poison.len() as u64);
    app.stop().await.expect("clean stop");
}

/// A message of a stream: its topic and payload, its readings in `model`.
type Shape = fn(i64, i64, &mut Model) -> (String, Vec<u8>);

/// Message `i` of a Tasmota device stream (tasmota preset, UTC): its
/// readings at the device's own `Time`, so a redelivery is the same reading.
fn tasmota_message(t: i64, i: i64, model: &mut Model) -> (String, Vec<u8>) {
    let sensor = format!("th{}", i % 7);
    let ts = t + i;
    let time = jiff::Timestamp::from_second(ts)
        .expect("a time")
        .strftime("%Y-%m-%dT%H:%M:%S")
        .to_string();
    let (temp, hum) = (((i * 31) % 97) as f64 / 2.0, (i % 100) as f64);
    model.insert((sensor.clone(), "AM2301_Temperature".into(), ts), temp);
    model.insert((sensor.clone(), "AM2301_Humidity".into(), ts), hum);
    (
        format!("tele/{sensor}/SENSOR"),
        format!(
            r#"{{"Time":"{time}","AM2301":{{"Temperature":{temp},"Humidity":{hum}}},"TempUnit":"C"}}"#
        )
        .into_bytes(),
    )
}

/// Publishes messages `range` of the stream, pausing now and then like a fleet.
pub(crate) async fn publish_stream(
    p: &mut Publisher,
    t: i64,
    range: std::ops::Range<i64>,
    model: &mut Model,
) {
    publish_shaped(p, t, range, model, stream_message).await;
}

async fn publish_shaped(
    p: &mut Publisher,
    t: i64,
    range: std::ops::Range<i64>,
    model: &mut Model,
    shape: Shape,
) {
    for i in range {
        let (topic, payload) = shape(t, i, model);
        p.publish(&topic, payload).await;
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
}

#[tokio::test]
async fn a_service_killed_mid_stream_loses_nothing_and_counts_nothing_twice() {
    killed_mid_stream(false).await;
}

#[tokio::test]
async fn with_the_journal_a_service_killed_mid_stream_loses_nothing_and_counts_nothing_twice() {
    killed_mid_stream(true).await;
}

/// Through a route (a device's own topics and payloads), the same promise.
#[tokio::test]
async fn a_service_killed_mid_stream_of_routed_messages_loses_nothing_and_stores_nothing_twice() {
    killed_mid_stream_shaped(true, tasmota_message).await;
}

async fn killed_mid_stream(journal: bool) {
    killed_mid_stream_shaped(journal, stream_message).await;
}

async fn killed_mid_stream_shaped(journal: bool, shape: Shape) {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.journal.enabled = journal;
    // The test reads the database through an in-process app with MQTT off.
    let mut reader_settings = settings.clone();
    reader_settings.mqtt.enabled = false;
    reader_settings.journal.enabled = false;
    reader_settings.journal.dir = journal_dir();
    let reader = spawn_app_with(reader_settings).await;
    let logs = tempfile::tempdir().expect("temp dir");
    // Without the journal, over MQTT 3.1.1 (with it, MQTT 5, as `auto`
    // picks with Mosquitto): both versions keep the promise.
    let protocol = if journal { "auto" } else { "3.1.1" };
    let extra = [
        ("HOURGLASS__BATCHER__FLUSH_INTERVAL", "200ms"),
        ("HOURGLASS__MQTT__PROTOCOL", protocol),
    ];
    // The shipped configuration with a route (which leaves the default
    // topics as they are).
    let config = logs.path().join("hourglass.toml");
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml"),
    )
    .expect("the shipped configuration");
    std::fs::write(
        &config,
        format!("{shipped}\n[[mqtt.routes]]\npreset = \"tasmota\"\ntimezone = \"UTC\"\n"),
    )
    .expect("written");
    let mut first =
        spawn_binary_with_config(&config, &settings, &extra, &logs.path().join("first.log"));

    let t = base_time();
    let mut model = Model::new();
    let mut p = Publisher::connect(&broker, "stream").await;
    let first_log = logs.path().join("first.log");
    eventually(WAIT, "the first instance subscribed", || {
        let log = first_log.clone();
        async move {
            std::fs::read_to_string(log).is_ok_and(|l| l.contains("Subscribed to MQTT topics."))
        }
    })
    .await;
    let total = 1500;
    publish_shaped(&mut p, t, 0..total / 2, &mut model, shape).await;
    // Killed once it is storing (on a loaded machine its first flush may
    // come after the first half is published).
    eventually(WAIT, "the first instance stores", || async {
        !reader.buckets().await.is_empty()
    })
    .await;
    // SIGKILL: no drain, no goodbye; some messages stored but unacknowledged.
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");
    publish_shaped(&mut p, t, total / 2..total, &mut model, shape).await;
    p.flushed().await;
    let mut second =
        spawn_binary_with_config(&config, &settings, &extra, &logs.path().join("second.log"));
    stored_equals(&reader, &model).await;
    let status = terminate(&mut second);
    assert!(status.success(), "a graceful stop exits 0: {status:?}");
    reader.stop().await.expect("clean stop");
}

/// Past `cardinality.max_new_series_per_hour`, a message with a new series
/// is dead-lettered with the reason; messages to known series carry on.
#[tokio::test]
async fn new_series_past_the_hourly_bound_are_dead_lettered() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.cardinality.max_new_series_per_hour = 3;
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;
    let address = app.address.clone();
    eventually(WAIT, "the guard is seeded", || {
        let address = address.clone();
        async move { metric(&address, "hourglass_new_series_guard_seeded").await == 1.0 }
    })
    .await;
    let mut watcher =
        Publisher::connect_subscribed(&broker, "watcher", Some("hourglass/dead-letters")).await;
    let mut dead = watcher.messages();
    let t = base_time();
    let mut p = Publisher::connect(&broker, "minting").await;
    for i in 0..5 {
        let body = json!({ "value": 1.0, "ts": (t + i) * 1000 }).to_string();
        p.publish(&format!("sensors/s{i}/temp"), body).await;
    }
    let body = json!({ "value": 2.0, "ts": (t + 9) * 1000 }).to_string();
    p.publish("sensors/s0/temp", body).await;
    p.flushed().await;
    for i in [3, 4] {
        let (_, body) = tokio::time::timeout(WAIT, dead.recv())
            .await
            .expect("a dead letter in time")
            .expect("open");
        let letter: Value = serde_json::from_slice(&body).expect("a JSON dead letter");
        assert_eq!(letter["topic"], format!("sensors/s{i}/temp"), "{letter}");
        assert!(
            letter["reason"]
                .as_str()
                .is_some_and(|r| r.contains("cardinality.max_new_series_per_hour")),
            "{letter}"
        );
    }
    // The known series' messages are taken (journaled: stored as any
    // other reading, which the rest of this file checks).
    eventually(WAIT, "the known series' readings are taken", || async {
        app.metric("hourglass_readings_received_total{source=\"mqtt\"}")
            .await
            == 4.0
    })
    .await;
    assert_eq!(app.metric("hourglass_new_series_refused_total").await, 2.0);
    app.stop().await.expect("clean stop");
}

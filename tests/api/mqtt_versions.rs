//! MQTT 5 and 3.1.1: the binary connects with MQTT 5 where the broker
//! speaks it (Mosquitto), asking for a Receive Maximum the broker holds to,
//! and falls back to 3.1.1 with a broker that speaks only that (amqtt).

use std::sync::atomic::Ordering;
use std::time::Duration;

use hourglass::Granularity;

use crate::broker::{Broker, Publisher};
use crate::database::Database;
use crate::helpers::*;
use crate::mqtt::mqtt_settings;

const WAIT: Duration = Duration::from_secs(90);

type Model = std::collections::BTreeMap<(String, String, i64), f64>;

/// `n` one-reading messages on `sensors/{sensor}/load`, one a second from
/// `t`; their readings in `model`.
async fn publish_readings(p: &mut Publisher, sensor: &str, t: i64, n: i64, model: &mut Model) {
    for i in 0..n {
        let v = (i % 13) as f64 + 0.5;
        model.insert((sensor.to_owned(), "load".into(), t + i), v);
        p.publish(
            &format!("sensors/{sensor}/load"),
            format!(r#"{{"value":{v},"ts":{}}}"#, (t + i) * 1000),
        )
        .await;
    }
}

async fn stored_equals(app: &TestApp, model: &Model) {
    eventually(WAIT, "every published reading is stored", || async {
        all_values(&app.buckets().await, Granularity::Minute) == *model
    })
    .await;
}

/// With MQTT 5 the broker holds to the Receive Maximum the binary asks for
/// (`mqtt.max_unacked`): with storage down and the journal off, no PUBACK
/// goes out, and the broker sends that many messages and no more (Mosquitto
/// would send 1 000 under 3.1.1). Once storage is back every one is stored.
#[tokio::test]
async fn with_mqtt_5_the_broker_sends_no_more_unacknowledged_messages_than_max_unacked() {
    let broker = Broker::start().await;
    let mut db = Database::start().await;
    let mut settings = db.settings();
    settings.mqtt = mqtt_settings(&broker).mqtt;
    settings.journal.enabled = false;
    settings.mqtt.max_unacked = 5;
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;
    assert_eq!(
        app.metric("hourglass_mqtt_protocol{version=\"5\"}").await,
        1.0,
        "Mosquitto speaks MQTT 5"
    );
    assert_eq!(
        app.metric("hourglass_mqtt_protocol{version=\"3.1.1\"}")
            .await,
        0.0
    );
    let stats = app.mqtt.clone().expect("mqtt");
    let before = stats.received.load(Ordering::Acquire);
    db.stop_gracefully();
    let t = base_time();
    let mut model = Model::new();
    let mut p = Publisher::connect(&broker, "window").await;
    publish_readings(&mut p, "rm", t, 40, &mut model).await;
    p.flushed().await;
    eventually(WAIT, "the window's five messages arrived", || {
        let stats = stats.clone();
        async move { stats.received.load(Ordering::Acquire) - before >= 5 }
    })
    .await;
    // The broker holds the other 35 for as long as none is acknowledged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        stats.received.load(Ordering::Acquire) - before,
        5,
        "no more than the Receive Maximum in flight"
    );
    assert_eq!(stats.acked.load(Ordering::Acquire), 0);
    db.restart_gracefully().await;
    stored_equals(&app, &model).await;
    app.stop().await.expect("clean stop");
}

/// A broker that speaks only MQTT 3.1.1 refuses the MQTT 5 connect; the
/// binary connects again with 3.1.1, says so, and stores what is published.
#[tokio::test]
async fn a_broker_that_speaks_only_3_1_1_gets_a_3_1_1_connection_and_every_reading() {
    let broker = Broker::start_311().await;
    let app = spawn_app_with(mqtt_settings(&broker)).await;
    subscribed(&app).await;
    assert_eq!(
        app.metric("hourglass_mqtt_protocol{version=\"3.1.1\"}")
            .await,
        1.0,
        "amqtt speaks 3.1.1 only"
    );
    let t = base_time();
    let mut model = Model::new();
    let mut p = Publisher::connect(&broker, "old-broker").await;
    publish_readings(&mut p, "old", t, 30, &mut model).await;
    p.flushed().await;
    stored_equals(&app, &model).await;
    app.stop().await.expect("clean stop");
}

/// `mqtt.protocol = "5"` insists: against a 3.1.1 broker it never connects,
/// and readiness says MQTT is down.
#[tokio::test]
async fn told_mqtt_5_the_binary_does_not_fall_back_and_is_not_ready() {
    let broker = Broker::start_311().await;
    let mut settings = mqtt_settings(&broker);
    settings.mqtt.protocol = hourglass::MqttProtocol::V5;
    let app = spawn_app_with(settings).await;
    let stats = app.mqtt.clone().expect("mqtt");
    // Many attempts (the backoff starts at 100 ms), each refused: one
    // fallback would have connected within the first second.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(app.get("/health/ready").await.status(), 503);
    assert_eq!(
        stats.connections.load(Ordering::Acquire),
        0,
        "never connected"
    );
    assert_eq!(
        app.metric("hourglass_mqtt_protocol{version=\"3.1.1\"}")
            .await,
        0.0
    );
    app.stop().await.expect("clean stop");
}

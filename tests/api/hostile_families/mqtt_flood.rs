//! MQTT: no task awaits a queue whose consumer can be waiting on it. The
//! flood that once wedged ingestion for good (150 000 unusable QoS 0
//! messages: the processor waited on rumqttc's request queue to publish
//! their dead letters while the event loop waited on the processor's
//! queue) is taken, a QoS 1 reading after it is stored, health says what
//! is true, and SIGTERM ends the process within its shutdown timeout.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use super::{latest_temp, live, readiness, stops_within};
use crate::broker::{Broker, Publisher};
use crate::helpers::*;

/// The flood: as many QoS 0 messages as the issue's.
const FLOOD: usize = 150_000;

/// Publishes `n` copies of `payload` on `topic` at `qos` with Mosquitto's
/// own client, as fast as it goes (one message a line).
fn flood(broker: &Broker, topic: &str, payload: &str, n: usize, qos: u8) {
    let mut child = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &broker.port.to_string()])
        .args(["-q", &qos.to_string(), "-t", topic, "-l"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("mosquitto_pub runs (make test installs mosquitto-clients)");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        let line = format!("{payload}\n");
        let mut all = String::with_capacity(line.len() * n);
        for _ in 0..n {
            all.push_str(&line);
        }
        stdin.write_all(all.as_bytes()).expect("lines written");
    }
    let status = wait_at_most(&mut child, Duration::from_secs(300)).expect("mosquitto_pub ends");
    assert!(status.success(), "mosquitto_pub: {status}");
}

#[tokio::test]
async fn a_flood_of_unusable_qos0_messages_neither_wedges_mqtt_nor_the_stop() {
    let broker = Broker::start().await;
    let mut settings = test_settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = broker.url();
    settings.mqtt.client_id = format!("hg-{}", uuid::Uuid::new_v4().simple());
    let logs = tempfile::tempdir().expect("a temporary directory");
    let log = logs.path().join("service.log");
    let timeout = Duration::from_secs(5);
    let mut service = spawn_binary_capped(
        2048,
        &settings,
        &[
            ("HOURGLASS__SHUTDOWN__TIMEOUT", "5s"),
            ("HOURGLASS__MQTT__KEEP_ALIVE", "5s"),
        ],
        &log,
    );
    let address = binary_address(&log).await;
    eventually(Duration::from_secs(60), "the service subscribed", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move { text.contains("Subscribed to MQTT topics.") }
    })
    .await;
    let client = http_client();
    flood(&broker, "sensors/dev1/temp", "not a number", FLOOD, 0);
    live(&client, &address, "the flood").await;
    // A reading at QoS 1 after the flood is stored: ingestion goes on.
    let mut device = Publisher::connect(&broker, "device-after-flood").await;
    let t = base_time();
    device
        .publish(
            "sensors/after-flood/temp",
            json!({ "value": 21.5, "ts": t * 1000 }).to_string(),
        )
        .await;
    eventually(
        Duration::from_secs(120),
        "the QoS 1 reading after the flood is stored",
        || async { latest_temp(&address, "after-flood").await.is_some() },
    )
    .await;
    device.flushed().await;
    // Health is truthful: the connection lives, so it says so, and the
    // unusable messages were counted (taken or dropped, none wedged).
    let (status, body) = readiness(&client, &address).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["checks"]["mqtt"]["ok"], true, "{body}");
    assert_eq!(metric(&address, "hourglass_mqtt_connected").await, 1.0);
    let unusable = metric_with(&address, "hourglass_readings_rejected_total", "mqtt").await;
    let dropped = metric_with(&address, "hourglass_mqtt_dropped_total", "queue_full").await;
    eprintln!("flood: {unusable} unusable, {dropped} dropped");
    assert!(
        unusable + dropped > 0.0 && unusable + dropped <= FLOOD as f64 + 1.0,
        "every message of the flood is counted once at most: {unusable} unusable, {dropped} dropped"
    );
    // The stop ends within its timeout (plus the process's own exit).
    let status = stops_within(&mut service, timeout + Duration::from_secs(10));
    assert!(status.success(), "{status}");
}

/// The sum of the series of `name` whose labels mention `label`.
async fn metric_with(address: &str, name: &str, label: &str) -> f64 {
    let text = reqwest::get(format!("{address}/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("text");
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(&format!("\"{label}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A QoS 1 message whose dead letter finds no room is left for the broker,
/// which delivers it again only on a new connection; until then it holds a
/// place in the broker's in-flight window. A flood of unusable QoS 1
/// messages with little room for letters is taken whole: every message is
/// acknowledged in the end (the connection renewed as often as some were
/// left), and a reading after it is stored.
#[tokio::test]
async fn a_flood_of_unusable_qos1_messages_is_acknowledged_whole_whatever_was_left() {
    const MESSAGES: usize = 30_000;
    let broker = Broker::start().await;
    let mut settings = test_settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = broker.url();
    settings.mqtt.client_id = format!("hg-{}", uuid::Uuid::new_v4().simple());
    let logs = tempfile::tempdir().expect("a temporary directory");
    let log = logs.path().join("service.log");
    let mut service = spawn_binary_capped(
        2048,
        &settings,
        &[
            // Room for few letters: a quarter of this, or two letters.
            ("HOURGLASS__MQTT__MAX_QUEUED_BYTES", "65536"),
            ("HOURGLASS__MQTT__MAX_DEAD_LETTER_BYTES", "8192"),
            ("HOURGLASS__MQTT__RECONNECT_MAX", "1s"),
        ],
        &log,
    );
    let address = binary_address(&log).await;
    eventually(Duration::from_secs(60), "the service subscribed", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move { text.contains("Subscribed to MQTT topics.") }
    })
    .await;
    flood(&broker, "sensors/dev1/temp", &"x".repeat(400), MESSAGES, 1);
    eventually(
        Duration::from_secs(180),
        "every unusable QoS 1 message is acknowledged",
        || async { metric(&address, "hourglass_mqtt_acks_total").await >= MESSAGES as f64 },
    )
    .await;
    let mut device = Publisher::connect(&broker, "device-after-qos1-flood").await;
    let t = base_time();
    device
        .publish(
            "sensors/after-qos1-flood/temp",
            json!({ "value": 7.5, "ts": t * 1000 }).to_string(),
        )
        .await;
    eventually(
        Duration::from_secs(60),
        "the reading after the flood is stored",
        || async { latest_temp(&address, "after-qos1-flood").await.is_some() },
    )
    .await;
    eprintln!(
        "qos1 flood: {} renewals, {} connections",
        metric(&address, "hourglass_mqtt_renewals_total").await,
        metric(&address, "hourglass_mqtt_connections_total").await
    );
    let (status, body) = readiness(&http_client(), &address).await;
    assert_eq!(status, 200, "{body}");
    assert!(stops_within(&mut service, Duration::from_secs(40)).success());
}

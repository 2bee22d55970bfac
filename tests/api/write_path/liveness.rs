//! The service alive and honest about readiness while the write path is in
//! trouble: liveness and metrics under saturation, a refused subscription,
//! a crowd of probes, a stop with an upload stuck, a retained message.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::doc;
use serde_json::{Value, json};

use crate::broker::{Broker, Publisher};
use crate::database::Database;
use crate::helpers::*;
use crate::mqtt::mqtt_settings;

use super::{WAIT, fail_point, metric, metrics_text, spawn_patient_app};

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

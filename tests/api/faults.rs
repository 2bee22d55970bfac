//! Faults with real processes and sockets: storage outages, SIGKILL, clients
//! that retry everything, overload. Acknowledged means stored, exactly once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hourglass::Granularity;
use serde_json::Value;

use crate::broker::{Broker, Publisher};
use crate::database::Database;
use crate::helpers::*;

const WAIT: Duration = Duration::from_secs(120);

type Model = BTreeMap<(String, String, i64), f64>;

fn body(sensor: &str, t: i64, from: i64, n: i64, model: &mut Model) -> Value {
    Value::Array(
        (from..from + n)
            .map(|o| {
                let v = ((o * 17) % 41) as f64;
                model.insert((sensor.to_owned(), "m".into(), t + o), v);
                reading(sensor, "m", t + o, v)
            })
            .collect(),
    )
}

/// POSTs until the service answers 200, however many 503s or timeouts that takes.
async fn post_until_stored(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    attempts: &AtomicUsize,
) {
    for _ in 0..500 {
        attempts.fetch_add(1, Ordering::Relaxed);
        match client.post(url).json(body).send().await {
            Ok(r) if r.status() == 200 => return,
            Ok(r) => assert!(
                r.status() == 503 || r.status() == 500,
                "only retryable answers expected, got {}",
                r.status()
            ),
            Err(_) => {} // a client-side timeout: retry
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a request was never acknowledged");
}

async fn stored_equals(app: &TestApp, model: &Model) {
    eventually(WAIT, "every acknowledged reading is stored", || async {
        all_values(&app.buckets().await, Granularity::Minute) == *model
    })
    .await;
    assert_invariants(&app.buckets().await, Granularity::Minute);
}

#[tokio::test]
async fn a_storage_outage_during_http_and_mqtt_streams_loses_nothing_acknowledged() {
    let mut db = Database::start().await;
    let broker = Broker::start().await;
    let mut settings = db.settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = broker.url();
    settings.mqtt.client_id = format!("hg-{}", uuid::Uuid::new_v4().simple());
    settings.http.write_timeout = Duration::from_secs(1);
    settings.batcher.flush_interval = Duration::from_millis(100);
    let app = spawn_app_with(settings).await;
    subscribed(&app).await;

    let t = base_time();
    let mut model = Model::new();
    let bodies: Vec<Value> = (0..40)
        .map(|i| body("http-outage", t, i * 10, 10, &mut model))
        .collect();
    let mut mqtt_messages = Vec::new();
    for i in 0..120i64 {
        let ts = t + 1000 + i;
        let v = (i % 13) as f64;
        model.insert(("mqtt-outage".into(), "m".into(), ts), v);
        mqtt_messages.push(serde_json::json!({ "value": v, "ts": ts * 1000 }).to_string());
    }

    let sent = Arc::new(AtomicUsize::new(0));
    let attempts = Arc::new(AtomicUsize::new(0));
    let url = format!("{}/api/v1/readings", app.address);
    let http_stream = {
        let (sent, attempts) = (sent.clone(), attempts.clone());
        tokio::spawn(async move {
            let client = crate::helpers::http_client();
            for b in &bodies {
                post_until_stored(&client, &url, b, &attempts).await;
                sent.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    let mut p = Publisher::connect(&broker, "outage").await;
    for m in &mqtt_messages[..40] {
        p.publish("sensors/mqtt-outage/m", m.clone()).await;
    }
    let s = sent.clone();
    eventually(WAIT, "the HTTP stream is under way", || {
        let s = s.clone();
        async move { s.load(Ordering::Relaxed) >= 10 }
    })
    .await;

    db.stop_gracefully();
    eventually(WAIT, "readiness reports the outage", || async {
        app.get("/health/ready").await.status() == 503
    })
    .await;
    for m in &mqtt_messages[40..80] {
        p.publish("sensors/mqtt-outage/m", m.clone()).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.restart_gracefully().await;
    for m in &mqtt_messages[80..] {
        p.publish("sensors/mqtt-outage/m", m.clone()).await;
    }
    p.flushed().await;
    http_stream.await.expect("the HTTP stream ends");
    stored_equals(&app, &model).await;
    assert!(
        attempts.load(Ordering::Relaxed) > 40,
        "the outage made the client retry"
    );
    eventually(WAIT, "ready again", || async {
        app.get("/health/ready").await.status() == 200
    })
    .await;
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn readings_acknowledged_before_a_sigkill_are_all_there_after_a_restart() {
    let settings = test_settings();
    let reader = spawn_app_with(settings.clone()).await;
    let logs = tempfile::tempdir().expect("temp dir");
    let extra = [("HOURGLASS__BATCHER__FLUSH_INTERVAL", "100ms")];
    let log = logs.path().join("first.log");
    let mut first = spawn_binary(&settings, &extra, &log);
    let url = format!("{}/api/v1/readings", binary_address(&log).await);

    let t = base_time();
    let acked = kill_mid_stream(url, &mut first, 10_000, 50, move |i, m| {
        body("killed", t, i * 5, 5, m)
    })
    .await;

    let log = logs.path().join("second.log");
    let mut second = spawn_binary(&settings, &extra, &log);
    binary_address(&log).await;
    let stored = all_values(&reader.buckets().await, Granularity::Minute);
    for (key, value) in &acked {
        assert_eq!(
            stored.get(key),
            Some(value),
            "acknowledged {key:?} is stored"
        );
    }
    assert_invariants(&reader.buckets().await, Granularity::Minute);
    assert!(terminate(&mut second).success());
    reader.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_client_that_retries_every_request_ends_with_exact_aggregates() {
    let mut settings = test_settings();
    // Longer than the client waits: requests time out on the client and are
    // sent again while the first copy is still on its way to storage.
    settings.batcher.flush_interval = Duration::from_millis(300);
    let app = spawn_app_with(settings).await;
    let t = base_time();
    let mut model = Model::new();
    let work: Vec<Vec<Value>> = (0..4)
        .map(|c| {
            (0..10)
                .map(|i| body(&format!("retry{c}"), t, i * 8, 8, &mut model))
                .collect()
        })
        .collect();
    let attempts = Arc::new(AtomicUsize::new(0));
    let url = format!("{}/api/v1/readings", app.address);
    let clients: Vec<_> = work
        .into_iter()
        .map(|bodies| {
            let (url, attempts) = (url.clone(), attempts.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_millis(200))
                    .build()
                    .expect("client");
                for b in &bodies {
                    post_until_stored(&client, &url, b, &attempts).await;
                }
            })
        })
        .collect();
    for c in clients {
        c.await.expect("client done");
    }
    assert!(
        attempts.load(Ordering::Relaxed) > 40,
        "requests were retried"
    );
    stored_equals(&app, &model).await;
    app.stop().await.expect("clean stop");
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("proc status")
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test]
async fn overload_is_refused_with_503_memory_stays_bounded_and_acknowledged_data_is_kept_on_one_worker_thread()
 {
    let settings = test_settings();
    let reader = spawn_app_with(settings.clone()).await;
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("overload.log");
    let extra = [
        ("HOURGLASS__BATCHER__FLUSH_INTERVAL", "1s"),
        ("HOURGLASS__BATCHER__MAX_PENDING_READINGS", "5000"),
        ("HOURGLASS__BATCHER__MAX_BUFFERED_READINGS", "5000"),
        ("HOURGLASS__INGEST__MAX_READINGS_PER_REQUEST", "1000"),
        ("HOURGLASS__SHUTDOWN__TIMEOUT", "60s"),
        // The smallest runtime keeps every promise too (see `runtime`).
        ("HOURGLASS__RUNTIME__WORKER_THREADS", "1"),
    ];
    let mut child = spawn_binary(&settings, &extra, &log);
    let address = binary_address(&log).await;
    assert_eq!(
        metric(&address, "hourglass_runtime_worker_threads").await,
        1.0,
        "one worker thread, as configured"
    );
    let url = format!("{address}/api/v1/readings?async=true");
    let t = base_time();
    let acked: Arc<Mutex<Model>> = Arc::new(Mutex::new(Model::new()));
    let refused = Arc::new(AtomicUsize::new(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let (url, acked, refused) = (url.clone(), acked.clone(), refused.clone());
            tokio::spawn(async move {
                let client = crate::helpers::http_client();
                let mut seq = 0;
                while tokio::time::Instant::now() < deadline {
                    let mut m = Model::new();
                    let b = body(&format!("ov{task}-{seq}"), t, 0, 1000, &mut m);
                    seq += 1;
                    let r = client
                        .post(&url)
                        .json(&b)
                        .send()
                        .await
                        .expect("the service stays up");
                    match r.status().as_u16() {
                        202 => acked.lock().expect("lock").extend(m),
                        503 => {
                            assert!(r.headers().contains_key("retry-after"));
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("unexpected {other}"),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("sender done");
    }
    let peak = peak_rss_kib(child.id());
    eprintln!(
        "overload: {} readings acknowledged, {} requests refused, peak RSS {} MiB",
        acked.lock().expect("lock").len(),
        refused.load(Ordering::Relaxed),
        peak / 1024
    );
    assert!(
        refused.load(Ordering::Relaxed) > 0,
        "input beyond the bound is refused"
    );
    assert!(peak < 256 * 1024, "peak RSS {peak} KiB stays bounded");
    assert!(terminate(&mut child).success(), "drains and exits 0");
    let acked = acked.lock().expect("lock").clone();
    let stored = all_values(&reader.buckets().await, Granularity::Minute);
    assert_eq!(
        stored.len(),
        acked.len(),
        "exactly the acknowledged readings"
    );
    for (key, value) in &acked {
        assert_eq!(stored.get(key), Some(value));
    }
    reader.stop().await.expect("clean stop");
}

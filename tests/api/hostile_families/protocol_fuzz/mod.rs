//! A protocol-level fuzz run through the binary: for a fixed time, hostile
//! but plausible HTTP requests (every route, body format, encoding and
//! nesting; PromQL from a grammar over the function dictionary) and MQTT
//! messages (reading topics, line protocol, Sparkplug births, data and
//! deaths, topics of no form) hit the release-configured binary under an
//! address-space cap, while good readings go in by HTTP JSON, line
//! protocol, MQTT and Sparkplug. It passes when the process lives and
//! answers throughout, no answer is a 5xx other than 503, its peak memory
//! stays bounded, nothing panics, health is truthful, every good reading is
//! stored exactly (no more, no less), and SIGTERM ends it in time.
//!
//! `HOURGLASS_PROTOCOL_FUZZ_SECONDS` sets the time (45 s by default) and
//! `HOURGLASS_PROTOCOL_FUZZ_SEED` the traffic (random, printed, by default).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prost::Message as _;
use rumqttc::{AsyncClient, MqttOptions, QoS};
use srad_types::payload::metric::Value as MetricValue;
use srad_types::payload::{Metric, Payload};
use tokio::sync::Mutex;

use super::{live, readiness, stops_within};
use crate::broker::{Broker, Publisher};
use crate::helpers::*;

mod promql;
mod traffic;

/// The binary's address space: past it an allocation fails, and the
/// process with it.
const CAP_MIB: u64 = 2048;
/// Peak resident memory the debug binary may reach under the whole run.
/// Queries get 64 MiB each and 128 MiB together here, Sparkplug births
/// 64 MiB; the rest is bounded by the body limit, the MQTT queue and the
/// batcher.
const MAX_PEAK_RSS_MIB: u64 = 640;
/// Hostile HTTP clients at once.
const HTTP_CLIENTS: u64 = 3;

/// What the good traffic stores: (sensor, ms) → value.
type Expected = BTreeMap<(String, i64), f64>;

fn seconds() -> u64 {
    std::env::var("HOURGLASS_PROTOCOL_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45)
}

fn seed() -> u64 {
    std::env::var("HOURGLASS_PROTOCOL_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// What the hostile traffic saw.
#[derive(Default)]
struct Seen {
    requests: AtomicU64,
    messages: AtomicU64,
    transport_errors: AtomicU64,
    /// Answers that are server errors other than 503: the first few.
    server_errors: Mutex<Vec<String>>,
    statuses: Mutex<BTreeMap<u16, u64>>,
}

async fn hostile_http(
    address: String,
    mut g: Gen,
    base_s: i64,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("a client");
    while !stop.load(Ordering::Relaxed) {
        let r = traffic::request(&mut g, base_s);
        let mut b = client.request(r.method.clone(), format!("{address}{}", r.path));
        for (k, v) in &r.headers {
            b = b.header(*k, v);
        }
        seen.requests.fetch_add(1, Ordering::Relaxed);
        if std::env::var_os("HOURGLASS_PROTOCOL_FUZZ_TRACE").is_some() {
            let path: String = r.path.chars().take(200).collect();
            let n = seen.requests.load(Ordering::Relaxed);
            let _ = std::fs::write(format!("/tmp/fuzz-trace-{n}"), &r.body);
            let _ = std::fs::write(format!("/tmp/fuzz-trace-{n}.path"), &r.path);
            eprintln!(
                "fuzz> #{n} {} {path} {:?} {} bytes",
                r.method,
                r.headers,
                r.body.len()
            );
        }
        match b.body(r.body).send().await {
            Ok(answer) => {
                let status = answer.status().as_u16();
                *seen.statuses.lock().await.entry(status).or_default() += 1;
                if status >= 500 && status != 503 {
                    let body = answer.text().await.unwrap_or_default();
                    let mut errors = seen.server_errors.lock().await;
                    if errors.len() < 10 {
                        let path: String = r.path.chars().take(300).collect();
                        errors.push(format!("{status} {} {path}: {body}", r.method));
                    }
                }
            }
            Err(_) => {
                seen.transport_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

async fn hostile_mqtt(
    broker_port: u16,
    mut g: Gen,
    base_s: i64,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
) {
    let mut options = MqttOptions::new("hostile-fuzz", "127.0.0.1", broker_port);
    options
        .set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(4 << 20, 4 << 20);
    let (client, mut eventloop) = AsyncClient::new(options, 64);
    let done = stop.clone();
    let events = tokio::spawn(async move {
        while !done.load(Ordering::Relaxed) {
            if eventloop.poll().await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    while !stop.load(Ordering::Relaxed) {
        let m = traffic::message(&mut g, base_s);
        if std::env::var_os("HOURGLASS_PROTOCOL_FUZZ_TRACE").is_some() {
            let topic: String = m.topic.chars().take(100).collect();
            let n = seen.messages.load(Ordering::Relaxed);
            let _ = std::fs::write(format!("/tmp/fuzz-trace-m{n}"), &m.payload);
            eprintln!("fuzz> #m{n} MQTT {topic} {} bytes", m.payload.len());
        }
        let qos = if m.qos1 {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        };
        // A topic rumqttc itself refuses is not sent; the broker sees the rest.
        if tokio::time::timeout(
            Duration::from_secs(5),
            client.publish(m.topic, qos, false, m.payload),
        )
        .await
        .is_ok()
        {
            seen.messages.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let _ = client.try_disconnect();
    events.abort();
}

/// The value the good traffic sends at step `i`: exact in binary.
fn good_value(i: i64) -> f64 {
    (i % 977) as f64 * 0.25 - 40.0
}

/// Good readings by HTTP JSON, line protocol, MQTT and Sparkplug, one of
/// each every 200 ms, until `stop`; what each stored is in the answer.
async fn good_traffic(
    address: String,
    broker: u16,
    base_s: i64,
    stop: Arc<AtomicBool>,
) -> Expected {
    let client = http_client();
    let mut expected = Expected::new();
    let mut device = Publisher::connect_port(broker, "good-devices").await;
    // The Sparkplug node's birth: a bdSeq and `temp` on alias 1.
    let mut birth = Payload {
        timestamp: Some((base_s * 1000) as u64),
        seq: Some(0),
        ..Payload::default()
    };
    birth.metrics.push(Metric {
        name: Some("bdSeq".into()),
        datatype: Some(4),
        value: Some(MetricValue::LongValue(0)),
        ..Metric::default()
    });
    birth.metrics.push(Metric {
        name: Some("temp".into()),
        alias: Some(1),
        datatype: Some(10),
        value: Some(MetricValue::DoubleValue(0.0)),
        timestamp: Some((base_s * 1000) as u64),
        ..Metric::default()
    });
    expected.insert(("good-spb".into(), base_s * 1000), 0.0);
    device
        .publish("spBv1.0/good/NBIRTH/good-spb", birth.encode_to_vec())
        .await;
    let mut i: i64 = 1;
    while !stop.load(Ordering::Relaxed) || i < 20 {
        let ts = base_s + i;
        let value = good_value(i);
        let k = i % 3;
        // HTTP JSON, retried on 503 (a retry is harmless: last write wins).
        let http = format!("good-http-{k}");
        let body = serde_json::json!([reading(&http, "temp", ts, value)]);
        let mut tries = 0;
        loop {
            tries += 1;
            let r = client
                .post(format!("{address}/api/v1/readings"))
                .json(&body)
                .send()
                .await
                .expect("the service answers a good write");
            let status = r.status().as_u16();
            if status == 200 {
                break;
            }
            assert!(
                status == 503 && tries < 20,
                "a good JSON write answered {status}: {}",
                r.text().await.unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        expected.insert((http, ts * 1000), value);
        // Line protocol.
        let lp = format!("good-lp-{k}");
        let mut tries = 0;
        loop {
            tries += 1;
            let r = client
                .post(format!("{address}/write?precision=s"))
                .body(format!("temp,sensor={lp} value={value} {ts}"))
                .send()
                .await
                .expect("the service answers a good write");
            let status = r.status().as_u16();
            if status == 204 || status == 200 {
                break;
            }
            assert!(
                status == 503 && tries < 20,
                "a good line-protocol write answered {status}: {}",
                r.text().await.unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        expected.insert((lp, ts * 1000), value);
        // MQTT, QoS 1.
        let mqtt = format!("good-mqtt-{k}");
        device
            .publish(
                &format!("sensors/{mqtt}/temp"),
                serde_json::json!({ "value": value, "ts": ts * 1000 }).to_string(),
            )
            .await;
        expected.insert((mqtt, ts * 1000), value);
        // Sparkplug: the node's data, in sequence.
        let data = Payload {
            timestamp: Some((ts * 1000) as u64),
            seq: Some((i % 256) as u64),
            metrics: vec![Metric {
                alias: Some(1),
                datatype: Some(10),
                timestamp: Some((ts * 1000) as u64),
                value: Some(MetricValue::DoubleValue(value)),
                ..Metric::default()
            }],
            ..Payload::default()
        };
        device
            .publish("spBv1.0/good/NDATA/good-spb", data.encode_to_vec())
            .await;
        expected.insert(("good-spb".into(), ts * 1000), value);
        i += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    device.flushed().await;
    expected
}

/// Every `temp` reading of the `good-*` sensors, by export.
async fn stored(address: &str, base_s: i64) -> Expected {
    let url = format!(
        "{address}/api/v1/export?sensor=good-*&metric=temp&from={}&to={}",
        base_s * 1000,
        (base_s + 86_400) * 1000
    );
    let Ok(r) = reqwest::get(&url).await else {
        return Expected::new();
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let ts: jiff::Timestamp = v["ts"].as_str()?.parse().ok()?;
            Some((
                (v["sensor"].as_str()?.to_owned(), ts.as_millisecond()),
                v["value"].as_f64()?,
            ))
        })
        .collect()
}

fn peak_rss_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

#[tokio::test]
async fn hostile_http_and_mqtt_traffic_for_a_fixed_time_leaves_the_process_alive_bounded_and_every_good_reading_stored()
 {
    let seed = seed();
    let seconds = seconds();
    eprintln!(
        "protocol fuzz: seed {seed} for {seconds} s (HOURGLASS_PROTOCOL_FUZZ_SEED={seed} replays the traffic)"
    );
    let broker = Broker::start().await;
    let mut settings = journal_settings();
    settings.journal.dir = journal_dir();
    settings.mqtt.enabled = true;
    settings.mqtt.url = broker.url();
    settings.mqtt.client_id = format!("hg-{}", uuid::Uuid::new_v4().simple());
    // Kept after the run: a failure's cause is in it.
    let logs = std::env::temp_dir().join("hourglass-tests");
    std::fs::create_dir_all(&logs).expect("a log directory");
    let log = logs.join(format!("protocol-fuzz-{seed}.log"));
    eprintln!("protocol fuzz: the service logs to {}", log.display());
    let shutdown = Duration::from_secs(10);
    let mut service = spawn_binary_capped(
        CAP_MIB,
        &settings,
        &[
            ("HOURGLASS__MQTT__SPARKPLUG__ENABLED", "true"),
            ("HOURGLASS__MQTT__KEEP_ALIVE", "5s"),
            ("HOURGLASS__QUERY__MAX_MEMORY_PER_QUERY", "67108864"),
            ("HOURGLASS__QUERY__MAX_MEMORY", "134217728"),
            ("HOURGLASS__QUERY__TIMEOUT", "5s"),
            ("HOURGLASS__MQTT__SPARKPLUG__MAX_STATE_BYTES", "67108864"),
            ("HOURGLASS__SHUTDOWN__TIMEOUT", "10s"),
        ],
        &log,
    );
    let pid = service.id();
    let address = binary_address(&log).await;
    eventually(Duration::from_secs(60), "the service subscribed", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move { text.contains("Subscribed to MQTT topics.") }
    })
    .await;
    let base_s = base_time();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    // The good traffic starts first: its series are known before the
    // hostile traffic can spend the new-series budget.
    let good = tokio::spawn(good_traffic(
        address.clone(),
        broker.port,
        base_s,
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut hostile = Vec::new();
    for k in 0..HTTP_CLIENTS {
        hostile.push(tokio::spawn(hostile_http(
            address.clone(),
            Gen(seed ^ (k + 1).wrapping_mul(0x9e37_79b9)),
            base_s,
            stop.clone(),
            seen.clone(),
        )));
    }
    hostile.push(tokio::spawn(hostile_mqtt(
        broker.port,
        Gen(seed ^ 0x5151),
        base_s,
        stop.clone(),
        seen.clone(),
    )));
    // The process answers throughout; the slowest answer is a figure.
    let client = http_client();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(seconds) {
        let t = Instant::now();
        live(&client, &address, "hostile traffic").await;
        slowest = slowest.max(t.elapsed());
        assert!(
            service.try_wait().expect("a status").is_none(),
            "the process died; seed {seed}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for h in hostile {
        h.await.expect("a hostile client ends");
    }
    let expected = good.await.expect("the good traffic ends");
    // Every good reading is stored exactly: the same readings, no more.
    let found = Arc::new(Mutex::new(Expected::new()));
    eventually(
        Duration::from_secs(120),
        "every good reading is stored",
        || {
            let (address, found, expected) = (address.clone(), found.clone(), &expected);
            async move {
                let now = stored(&address, base_s).await;
                let all = expected.keys().all(|k| now.contains_key(k));
                *found.lock().await = now;
                all
            }
        },
    )
    .await;
    let found = found.lock().await.clone();
    assert_eq!(found, expected, "the good readings, exactly; seed {seed}");
    // Health is truthful: the broker is up and the connection lives.
    let (status, body) = readiness(&client, &address).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["checks"]["mqtt"]["ok"], true, "{body}");
    let peak = peak_rss_mib(pid);
    let statuses = seen.statuses.lock().await.clone();
    eprintln!(
        "protocol fuzz: {} requests ({statuses:?}; {} transport errors), {} messages; {} good readings; peak RSS {peak} MiB; slowest /health/live {slowest:?}",
        seen.requests.load(Ordering::Relaxed),
        seen.transport_errors.load(Ordering::Relaxed),
        seen.messages.load(Ordering::Relaxed),
        expected.len(),
    );
    let errors = seen.server_errors.lock().await.clone();
    assert!(
        errors.is_empty(),
        "answers that are server errors (seed {seed}):\n{}",
        errors.join("\n")
    );
    assert!(
        peak > 0 && peak <= MAX_PEAK_RSS_MIB,
        "peak RSS {peak} MiB; seed {seed}"
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains("panicked"),
        "a panic was logged (seed {seed})"
    );
    let status = stops_within(&mut service, shutdown + Duration::from_secs(10));
    assert!(status.success(), "{status}");
}

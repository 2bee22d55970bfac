//! The edges a single hostile request or message once broke (issue 75):
//! labels built past any size, a range that overflows, an MQTT message that
//! looped the connection, clients that hold connections or a query permit
//! by not reading. Each through real sockets, the binary under a memory cap
//! where memory is the question, and liveness checked after each.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::broker::{Broker, Publisher};
use crate::helpers::*;

/// The address space the capped binary gets: the issue's query asked for
/// 3.2 GB in one allocation.
const CAP_MIB: u64 = 2048;

async fn live(client: &reqwest::Client, address: &str, after: &str) {
    let r = client
        .get(format!("{address}/health/live"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("the service died after {after}: {e}"));
    assert_eq!(r.status(), 200, "after {after}");
}

async fn promql(client: &reqwest::Client, address: &str, query: &str) -> (u16, Value) {
    let r = client
        .post(format!("{address}/prometheus/api/v1/query"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            url::form_urlencoded::Serializer::new(String::new())
                .append_pair("query", query)
                .finish(),
        )
        .send()
        .await
        .expect("an answer");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON"))
}

#[tokio::test]
async fn queries_that_would_build_gigabytes_or_overflow_a_range_are_answered_under_a_memory_cap() {
    let settings = test_settings();
    let logs = tempfile::tempdir().expect("a temporary directory");
    let log = logs.path().join("service.log");
    let mut child = spawn_binary_capped(
        CAP_MIB,
        &settings,
        &[("HOURGLASS__RETENTION__BUCKETS", "40d")],
        &log,
    );
    let address = binary_address(&log).await;
    let client = crate::helpers::http_client();
    // The issue's 15 103 bytes: 5 000 x's, then two levels of 2 500 `$1`.
    let bomb = format!(
        r#"label_replace(label_replace(label_replace(vector(1),"a","{}","",""),"a","{}","a","(.*)"),"a","{}","a","(.*)")"#,
        "x".repeat(5000),
        "$1".repeat(2500),
        "$1".repeat(2500)
    );
    assert_eq!(bomb.len(), 15_103);
    let join = format!(
        r#"label_join(label_replace(vector(1),"a","{}","",""),"b","{}","a","a","a","a","a","a","a","a")"#,
        "x".repeat(5000),
        "-".repeat(5000)
    );
    for (name, query) in [("label_replace", &bomb), ("label_join", &join)] {
        let (status, body) = promql(&client, &address, query).await;
        assert_eq!(status, 422, "{name}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("query.max_label_bytes")),
            "{name}: {body}"
        );
        live(&client, &address, name).await;
    }
    // A range in a comment once panicked the retention check; a real one
    // that large is refused.
    let (status, body) = promql(&client, &address, "vector(1) # [18446744073709551615s]").await;
    assert_eq!(status, 200, "{body}");
    live(&client, &address, "a huge range in a comment").await;
    let (status, body) = promql(
        &client,
        &address,
        "count_over_time(temp[18446744073709551615s])",
    )
    .await;
    assert!((400..500).contains(&status), "{status} {body}");
    live(&client, &address, "a huge range").await;
    // Regexes compile before anything is read, each up to 10 MiB: their
    // number is bounded first, in one query and across match[] selectors.
    let regex = |i: usize| format!(r#"temp{{site=~"\\w{{0,200}}{i}"}}"#);
    let many: Vec<String> = (0..100).map(regex).collect();
    let (status, body) = promql(&client, &address, &many.join(" or ")).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("query.max_regex_matchers"),
        "{body}"
    );
    let series = |sets: &[String]| {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        for m in sets {
            form.append_pair("match[]", m);
        }
        client
            .post(format!("{address}/prometheus/api/v1/series"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.finish())
            .send()
    };
    let r = series(&many).await.expect("an answer");
    assert_eq!(r.status(), 400);
    let text = r.text().await.expect("a body");
    assert!(text.contains("query.max_regex_matchers"), "{text}");
    let long: Vec<String> = (0..2000)
        .map(|i| format!("temp{{sensor=\"s{i}\"}}"))
        .collect();
    let r = series(&long).await.expect("an answer");
    assert_eq!(r.status(), 400);
    let text = r.text().await.expect("a body");
    assert!(text.contains("query.max_query_length"), "{text}");
    // A quoted label name would be a dotted document path.
    let (status, body) = promql(&client, &address, r#"temp{"a.b"="x"}"#).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("invalid label name"), "{body}");
    live(
        &client,
        &address,
        "regexes, long match[] and a quoted label",
    )
    .await;
    assert!(
        child.try_wait().expect("waitable").is_none(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(terminate(&mut child).success(), "a clean stop");
}

/// Waits for the dead letter of `topic`.
async fn letter_of(
    letters: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    topic: &str,
) -> Value {
    tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            let (_, body) = letters.recv().await.expect("the watcher runs");
            let v: Value = serde_json::from_slice(&body).expect("a JSON dead letter");
            if v["topic"] == topic {
                return v;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no dead letter for {topic}"))
}

async fn stored(address: &str, sensor: &str) -> bool {
    let Ok(r) = reqwest::get(format!(
        "{address}/api/v1/sensors/{sensor}/latest?metric=temp"
    ))
    .await
    else {
        return false;
    };
    r.status() == 200
        && r.json::<Value>()
            .await
            .is_ok_and(|v| v.to_string().contains("21.5"))
}

/// MQTT 3.1.1: a message over the client's packet limit fails the
/// connection; the next one takes it once.
#[tokio::test]
async fn an_oversized_mqtt_message_is_dead_lettered_once_without_a_reconnect_loop_even_across_restarts()
 {
    oversized_message("3.1.1", Some(2.0)).await;
}

/// MQTT 5: the client announces its packet limit, and the broker drops a
/// message over it (never sent, so never redelivered): no reconnect, and
/// what follows is stored.
#[tokio::test]
async fn with_mqtt_5_a_message_over_the_announced_limit_is_dropped_by_the_broker_with_no_reconnect()
{
    oversized_message("5", None).await;
}

/// Three runs of the binary speaking `protocol`, the second with a packet
/// limit below a waiting message's: `second_connections` is how many
/// connections it takes to dead-letter it, `None` where the broker drops
/// it.
async fn oversized_message(protocol: &str, second_connections: Option<f64>) {
    let broker = Broker::start().await;
    let mut settings = test_settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = broker.url();
    settings.mqtt.client_id = format!("hg-{}", uuid::Uuid::new_v4().simple());
    let mut watcher =
        Publisher::connect_subscribed(&broker, "watcher", Some("hourglass/dead-letters")).await;
    let mut letters = watcher.messages();
    let mut publisher = Publisher::connect(&broker, "device").await;
    let logs = tempfile::tempdir().expect("a temporary directory");
    let t = base_time();
    let reading = |k: i64| json!({ "value": 21.5, "ts": (t + k) * 1000 }).to_string();
    let connections =
        |address: String| async move { metric(&address, "hourglass_mqtt_connections_total").await };
    // 1. The issue's message with the shipped limits: its letter would be
    // 1.2 MB of escaped control characters; it is cut to its start.
    let first = logs.path().join("1.log");
    let speaks = [("HOURGLASS__MQTT__PROTOCOL", protocol)];
    let mut service = spawn_binary(&settings, &speaks, &first);
    let address = binary_address(&first).await;
    // A new session: what is published before it subscribes is not its.
    eventually(Duration::from_secs(60), "the service subscribed", || {
        let text = std::fs::read_to_string(&first).unwrap_or_default();
        async move { text.contains("Subscribed to MQTT topics.") }
    })
    .await;
    publisher.publish("sensors/a/b", vec![1u8; 200_000]).await;
    let letter = letter_of(&mut letters, "sensors/a/b").await;
    assert_eq!(letter["truncated"], true, "{letter}");
    assert_eq!(letter["payload_bytes"], 200_000, "{letter}");
    publisher.publish("sensors/ok1/temp", reading(1)).await;
    eventually(Duration::from_secs(60), "a later reading is stored", || {
        stored(&address, "ok1")
    })
    .await;
    assert_eq!(connections(address.clone()).await, 1.0, "no reconnect");
    assert!(terminate(&mut service).success());
    // 2. Over the client's own packet limit (100 000 bytes + 64 KiB): the
    // next connection takes it once, dead-letters and acknowledges it.
    let small = [
        ("HOURGLASS__MQTT__MAX_PAYLOAD_BYTES", "100000"),
        ("HOURGLASS__MQTT__PROTOCOL", protocol),
    ];
    publisher.publish("sensors/a/c", vec![1u8; 200_000]).await;
    let mut service = spawn_binary(&settings, &small, &logs.path().join("2.log"));
    let address = binary_address(&logs.path().join("2.log")).await;
    if second_connections.is_some() {
        let letter = letter_of(&mut letters, "sensors/a/c").await;
        assert_eq!(letter["truncated"], true, "{letter}");
    }
    publisher.publish("sensors/ok2/temp", reading(2)).await;
    eventually(Duration::from_secs(60), "a later reading is stored", || {
        stored(&address, "ok2")
    })
    .await;
    assert_eq!(
        connections(address.clone()).await,
        second_connections.unwrap_or(1.0),
        "{protocol}: the connections it takes to get past the message"
    );
    assert!(terminate(&mut service).success());
    // 3. After a restart nothing is delivered again and nothing loops.
    let mut service = spawn_binary(&settings, &small, &logs.path().join("3.log"));
    let address = binary_address(&logs.path().join("3.log")).await;
    publisher.publish("sensors/ok3/temp", reading(3)).await;
    eventually(Duration::from_secs(60), "a later reading is stored", || {
        stored(&address, "ok3")
    })
    .await;
    assert_eq!(connections(address.clone()).await, 1.0, "no reconnect");
    assert!(
        letters.try_recv().is_err(),
        "no message was dead-lettered twice"
    );
    assert!(terminate(&mut service).success());
}

#[tokio::test]
async fn an_export_client_that_stops_reading_gives_its_query_permit_back() {
    let mut settings = test_settings();
    settings.query.max_concurrency = 1;
    settings.query.timeout = Duration::from_secs(2);
    let app = spawn_app_with(settings).await;
    let t = base_time();
    // 30 000 readings: an export of about 2 MB, far more than the socket
    // buffers of a client that reads nothing.
    for sensor in 0..10 {
        let readings: Vec<Value> = (0..3000)
            .map(|k| json!({ "sensor": format!("s{sensor}"), "metric": "temp", "ts": (t + k) * 1000, "value": k }))
            .collect();
        let r = app.post_readings(&Value::Array(readings)).await;
        assert_eq!(r.status(), 200);
    }
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.set_recv_buffer_size(4096).expect("a small buffer");
    let addr: std::net::SocketAddr = app
        .address
        .trim_start_matches("http://")
        .parse()
        .expect("an address");
    let mut stalled = socket.connect(addr).await.expect("connected");
    let path = format!(
        "/api/v1/export?from={}&to={}",
        rfc3339(t),
        rfc3339(t + 3600)
    );
    stalled
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .expect("sent");
    // The answer has begun (its permit taken); then nothing more is read.
    let mut head = [0u8; 1024];
    let n = stalled.read(&mut head).await.expect("the answer begins");
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head[..n])
    );
    let query = format!(
        "/api/v1/sensors/s1/average?metric=temp&from={}&to={}",
        rfc3339(t),
        rfc3339(t + 3600)
    );
    eventually(
        Duration::from_secs(60),
        "a query answers while the export's client reads nothing",
        || async { app.get(&query).await.status() == 200 },
    )
    .await;
    drop(stalled);
}

#[tokio::test]
async fn slow_and_idle_connections_are_closed_and_capped_while_health_answers() {
    let mut settings = test_settings();
    settings.http.header_read_timeout = Duration::from_secs(1);
    settings.http.idle_timeout = Duration::from_secs(2);
    settings.http.max_connections = 20;
    settings.http.max_concurrent_requests = 16;
    let app = spawn_app_with(settings).await;
    let addr = app.address.trim_start_matches("http://").to_owned();
    // Twenty clients trickle a header line every 300 ms, never ending the head.
    let mut slow = Vec::new();
    for _ in 0..20 {
        let addr = addr.clone();
        slow.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(&addr).await.expect("connected");
            if s.write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")
                .await
                .is_err()
            {
                return true;
            }
            for _ in 0..200 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if s.write_all(b"X-Slow: 1\r\n").await.is_err() {
                    return true;
                }
                let mut buf = [0u8; 256];
                if let Ok(Ok(0) | Err(_)) =
                    tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await
                {
                    return true;
                }
            }
            false
        }));
    }
    // Every slot is taken by a trickler: health answers once they are cut.
    eventually(Duration::from_secs(60), "/health/live answers", || async {
        crate::helpers::http_client()
            .get(format!("{}/health/live", app.address))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    for task in slow {
        assert!(
            task.await.expect("the client ran"),
            "a trickler stayed open"
        );
    }
    // A keep-alive connection left idle is closed.
    let mut idle = TcpStream::connect(&addr).await.expect("connected");
    idle.write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("sent");
    let mut buf = vec![0u8; 4096];
    let n = idle.read(&mut buf).await.expect("an answer");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let closed = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match idle.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the idle connection was closed");
}

/// A device minting sensor ids: past `cardinality.max_new_series_per_hour`
/// its requests are refused whole with a 429 naming the setting, while
/// writes to existing series go on; a restart learns the registry's series
/// first, so they are not counted as new.
#[tokio::test]
async fn new_series_past_the_hourly_bound_are_refused_and_existing_ones_carry_on() {
    let mut settings = test_settings();
    settings.cardinality.max_new_series_per_hour = 5;
    let t = base_time();
    let batch = |sensors: &[String], k: i64| -> Value {
        Value::Array(
            sensors
                .iter()
                .map(|s| reading(s, "temp", t + k, 1.0))
                .collect(),
        )
    };
    let names = |prefix: &str, n: usize| -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    };
    let seeded = |app: &TestApp| {
        let app = app.address.clone();
        async move { metric(&app, "hourglass_new_series_guard_seeded").await == 1.0 }
    };
    // Four series from an earlier run.
    let first = spawn_app_with(settings.clone()).await;
    eventually(Duration::from_secs(60), "the guard is seeded", || {
        seeded(&first)
    })
    .await;
    let old = names("old-", 4);
    assert_eq!(first.post_readings(&batch(&old, 0)).await.status(), 200);
    first.stop().await.expect("clean stop");

    let app = spawn_app_with(settings).await;
    eventually(Duration::from_secs(60), "the guard is seeded", || {
        seeded(&app)
    })
    .await;
    // The old four and five new ones: exactly the bound.
    let mut mixed = old.clone();
    mixed.extend(names("new-", 5));
    assert_eq!(app.post_readings(&batch(&mixed, 1)).await.status(), 200);
    // One more new series: the whole request is refused.
    let mut over = old.clone();
    over.push("minted-0".into());
    let r = app.post_readings(&batch(&over, 2)).await;
    assert_eq!(r.status(), 429);
    // The bound is per clock hour: retry at the next one.
    let after: u64 = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((1..=3600).contains(&after), "{after}");
    let body = r.text().await.expect("a body");
    assert!(
        body.contains("cardinality.max_new_series_per_hour"),
        "{body}"
    );
    // Existing series carry on, old and new alike.
    assert_eq!(app.post_readings(&batch(&mixed, 3)).await.status(), 200);
    assert_eq!(app.metric("hourglass_new_series_total").await, 5.0);
    assert_eq!(app.metric("hourglass_new_series_refused_total").await, 1.0);
    let sensors = || async {
        app.buckets()
            .await
            .iter()
            .filter_map(|d| d.get_str("sensor").ok().map(str::to_owned))
            .collect::<Vec<String>>()
    };
    eventually(
        Duration::from_secs(120),
        "the accepted readings are stored",
        || async {
            let stored = sensors().await;
            stored.iter().any(|s| s == "old-3") && stored.iter().any(|s| s == "new-4")
        },
    )
    .await;
    let stored = sensors().await;
    assert!(
        !stored.iter().any(|s| s.starts_with("minted")),
        "{stored:?}"
    );
    app.stop().await.expect("clean stop");
}

//! Hostile input on every surface of the real binary: PromQL and the
//! Prometheus listings, the JSON query routes, every ingest format over
//! HTTP, MQTT and Sparkplug payloads, DELETE and export parameters, the
//! console's routes and import files. Each is refused with a clear 4xx (or
//! 503 and Retry-After for a timeout), the process lives after every one,
//! nothing is stored, and its memory stays bounded.

use std::time::Duration;

use mongodb::bson::doc;
use serde_json::Value;

use crate::broker::{Broker, Publisher};
use crate::database::Database;
use crate::helpers::*;

mod cases;
mod import_files;
mod ingest;
mod json_routes;
mod messages;
mod promql;

use cases::{Request, form, get};

/// Peak resident memory the debug binary may reach over the whole corpus
/// (120 MiB measured here).
const MAX_PEAK_RSS_MIB: u64 = 256;

/// What came back: the status, whether it says when to retry, the body.
struct Answer {
    status: u16,
    retry_after: bool,
    body: String,
}

async fn send(client: &reqwest::Client, address: &str, request: &Request) -> Answer {
    if let Request::Oversized(path, len) = request {
        return oversized(address, path, *len).await;
    }
    let r = match request {
        Request::Get(path) => client.get(format!("{address}{path}")),
        Request::Form(path, body) => client
            .post(format!("{address}{path}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.clone()),
        Request::Post(path, ct, body) => match path.strip_suffix("#gzip") {
            Some(path) => client
                .post(format!("{address}{path}"))
                .header("content-type", *ct)
                .header("content-encoding", "gzip")
                .body(body.clone()),
            None => client
                .post(format!("{address}{path}"))
                .header("content-type", *ct)
                .body(body.clone()),
        },
        Request::Put(path, ct, body) => client
            .put(format!("{address}{path}"))
            .header("content-type", *ct)
            .body(body.clone()),
        Request::Delete(path) => client.delete(format!("{address}{path}")),
        Request::Oversized(..) => unreachable!("sent above"),
    };
    let r = r.send().await.expect("the request is answered");
    Answer {
        status: r.status().as_u16(),
        retry_after: r.headers().contains_key("retry-after"),
        body: r.text().await.unwrap_or_default(),
    }
}

/// Announces `len` bytes of JSON, sends 64 KiB, and reads the answer.
async fn oversized(address: &str, path: &str, len: usize) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .expect("connects");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("headers sent");
    // The server may answer and close before taking all of this.
    let _ = stream.write_all(&vec![b' '; 64 * 1024]).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status,
        retry_after: headers.to_ascii_lowercase().contains("retry-after:"),
        body: body.to_owned(),
    }
}

/// VmHWM of a process, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmHWM")
        / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_on_every_surface_is_refused_and_the_service_lives_on() {
    let db = Database::start().await;
    let broker = Broker::start().await;
    let mut settings = db.settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = broker.url();
    settings.journal.enabled = true;
    settings.journal.dir = journal_dir();
    let logs = tempfile::tempdir().expect("a temporary directory");
    let log = logs.path().join("service.log");
    let mut child = spawn_binary(
        &settings,
        &[
            ("HOURGLASS__MQTT__SPARKPLUG__ENABLED", "true"),
            // 900 KiB: under the broker's max_packet_size (1 MiB) by less
            // than the 64 KiB the client allows for headers, so a payload
            // over it reaches Hourglass's own check.
            ("HOURGLASS__MQTT__MAX_PAYLOAD_BYTES", "921600"),
            // Timeouts are tried with the server holding a find for 3 s.
            ("HOURGLASS__QUERY__TIMEOUT", "2s"),
        ],
        &log,
    );
    let address = binary_address(&log).await;
    let pid = child.id();
    let client = crate::helpers::http_client();
    let mut watcher =
        Publisher::connect_subscribed(&broker, "watcher", Some("hourglass/dead-letters")).await;
    let mut dead_letters = watcher.messages();
    eventually(Duration::from_secs(60), "the service subscribed", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        async move { text.contains("Subscribed to MQTT topics.") }
    })
    .await;
    let alive = |child: &mut std::process::Child, after: &str| {
        assert!(
            child.try_wait().expect("waitable").is_none(),
            "the service died after {after}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let mut tried = 0;

    let mut cases = promql::cases();
    cases.extend(json_routes::cases());
    cases.extend(ingest::cases());
    for case in &cases {
        let Answer {
            status,
            retry_after,
            body: full,
        } = send(&client, &address, &case.request).await;
        let body: String = full.chars().take(300).collect();
        if case.timeout {
            assert!(
                status == 503 && retry_after,
                "{}: {status} {body}",
                case.name
            );
        } else {
            assert!(
                (400..500).contains(&status),
                "{}: {status} {body}",
                case.name
            );
        }
        assert!(!body.trim().is_empty(), "{}: an empty answer", case.name);
        for internal in ["panicked", "src/", "mongodb://", "backtrace"] {
            assert!(
                !full.contains(internal),
                "{}: leaks {internal:?}: {body}",
                case.name
            );
        }
        alive(&mut child, &case.name);
        assert_eq!(
            client
                .get(format!("{address}/health/live"))
                .send()
                .await
                .expect("live")
                .status(),
            200,
            "{}",
            case.name
        );
        tried += 1;
    }

    // Queries slower than their timeout: the registry's find is held by the
    // server for 3 s; PromQL allows 500 ms, the JSON API query.timeout (2 s).
    db.fail_point(doc! {
        "mode": "alwaysOn",
        "data": { "failCommands": ["find"], "blockConnection": true, "blockTimeMS": 3000 },
    })
    .await;
    let slow = form(
        "PromQL: a query past its timeout",
        "/prometheus/api/v1/query",
        &[("query", "temp"), ("timeout", "500ms")],
    );
    let r = send(&client, &address, &slow.request).await;
    assert!(
        r.status == 503 && r.retry_after,
        "{}: {}",
        slow.name,
        r.status
    );
    let r = send(
        &client,
        &address,
        &get(
            "JSON: an average past its timeout",
            format!(
                "/api/v1/average?metric=temp&from={}&to={}",
                rfc3339(base_time()),
                rfc3339(base_time() + 60)
            ),
        )
        .request,
    )
    .await;
    assert!(
        r.status == 503 && r.retry_after,
        "a group average past its timeout: {}",
        r.status
    );
    db.fail_point(doc! { "mode": "off" }).await;
    alive(&mut child, "the timeouts");
    tried += 2;

    // MQTT and Sparkplug: each message is dead-lettered with its topic.
    let mut publisher = Publisher::connect(&broker, "hostile").await;
    for (name, topic, payload) in messages::messages() {
        publisher.publish(&topic, payload).await;
        let letter = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let (_, body) = dead_letters.recv().await.expect("the watcher runs");
                let v: Value = serde_json::from_slice(&body).expect("a JSON dead letter");
                if v["topic"] == topic.as_str() {
                    return v;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{name}: no dead letter"));
        assert!(
            letter["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{name}: {letter}"
        );
        alive(&mut child, name);
        tried += 1;
    }

    // Import files, through the command-line client.
    let files = tempfile::tempdir().expect("a temporary directory");
    for (name, path) in import_files::files(files.path()) {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .current_dir(files.path())
            .args(["import", "--quiet"])
            .arg(&path)
            .env("HOURGLASS_URL", &address)
            .output()
            .await
            .expect("the import runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success() || text.contains(" 0 readings stored"),
            "{name}: {text}"
        );
        if name.contains("without a line end") {
            assert!(text.contains("longer than 1048576 bytes"), "{name}: {text}");
        }
        alive(&mut child, name);
        tried += 1;
    }

    assert!(tried >= 60, "at least 60 hostile inputs, not {tried}");
    let peak = peak_rss_mib(pid);
    assert!(
        peak < MAX_PEAK_RSS_MIB,
        "peak memory {peak} MiB, over {MAX_PEAK_RSS_MIB}"
    );
    // Nothing refused reached storage (a write is journaled first: the
    // journal holds nothing either).
    let hourglass = mongodb::Client::with_uri_str(db.uri())
        .await
        .expect("a client")
        .database(&settings.mongodb.database);
    for collection in ["buckets", "rollups", "sensors"] {
        let n = hourglass
            .collection::<mongodb::bson::Document>(collection)
            .count_documents(doc! {})
            .await
            .expect("counted");
        assert_eq!(n, 0, "{collection} holds what hostile input sent");
    }
    let received = metric(&address, "hourglass_journal_appended_bytes_total").await;
    assert_eq!(received, 0.0, "nothing was journaled");
    eprintln!("{tried} hostile inputs refused; peak memory {peak} MiB");
    assert!(terminate(&mut child).success(), "a clean stop");
}

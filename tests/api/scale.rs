//! Scale-out with real processes: three instances on one database, each
//! with its own journal, readings spread round robin over HTTP and through
//! an MQTT shared subscription, one instance SIGKILLed mid-stream and
//! restarted. Every acknowledged reading ends stored exactly once, and every
//! per-sensor and group answer (rollups included) equals the truth.

use std::time::Duration;

use hourglass::Granularity;
use serde_json::{Value, json};

use crate::broker::{Broker, Publisher};
use crate::helpers::*;
use crate::mqtt::{Model, mqtt_settings, publish_stream};

const WAIT: Duration = Duration::from_secs(150);

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

async fn subscribed_binary(log: &std::path::Path) {
    eventually(WAIT, "the instance subscribed", || {
        let log = log.to_owned();
        async move {
            std::fs::read_to_string(log).is_ok_and(|l| l.contains("Subscribed to MQTT topics."))
        }
    })
    .await;
}

#[tokio::test]
async fn three_instances_with_one_killed_mid_stream_store_every_acknowledged_reading_once() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.journal.enabled = true;
    settings.ingest.max_age = Duration::from_secs(7 * 86_400);
    let mut reader_settings = settings.clone();
    reader_settings.mqtt.enabled = false;
    reader_settings.journal.enabled = false;
    reader_settings.journal.dir = journal_dir();
    let reader = spawn_app_with(reader_settings).await;
    let logs = tempfile::tempdir().expect("temp dir");
    let extra = [
        ("HOURGLASS__MQTT__SHARED_GROUP", "hourglass"),
        ("HOURGLASS__BATCHER__FLUSH_INTERVAL", "200ms"),
    ];
    let mut instances: Vec<(hourglass::Settings, std::process::Child, String)> = Vec::new();
    for name in ["a", "b", "c"] {
        let mut s = settings.clone();
        s.mqtt.client_id = format!("hg-{name}-{}", uuid::Uuid::new_v4().simple());
        s.journal.dir = journal_dir();
        let log = logs.path().join(format!("{name}.log"));
        let child = spawn_binary(&s, &extra, &log);
        let url = format!("{}/api/v1/readings", binary_address(&log).await);
        subscribed_binary(&log).await;
        instances.push((s, child, url));
    }

    // HTTP: readings of this minute and the next (held in the journals when
    // the kill comes) and of two days ago, round robin over the instances.
    let client = crate::helpers::http_client();
    let (live, old) = (now() - 20, base_time());
    let mut model = Model::new();
    let urls: Vec<String> = instances.iter().map(|(_, _, url)| url.clone()).collect();
    let post = |i: i64, up: &[bool; 3]| {
        let target = (0..3)
            .map(|k| ((i + k) % 3) as usize)
            .find(|&k| up[k])
            .expect("an instance is up");
        let mut acked = Model::new();
        let body: Vec<Value> = (0..6)
            .map(|k| {
                // Live: two requests a second, each pair on its own sensors
                // (one value per second: no cross-instance overwrite).
                let (sensor, ts) = if k % 2 == 0 {
                    (format!("h{k}{}", i % 2), live + i / 2)
                } else {
                    (format!("h{k}"), old + 7 * i)
                };
                let v = ((i * 13 + k * 5) % 29) as f64 - 4.0;
                acked.insert((sensor.clone(), "m".into(), ts), v);
                json!({ "sensor": sensor, "metric": "m", "ts": rfc3339(ts), "value": v })
            })
            .collect();
        (urls[target].clone(), Value::Array(body), acked)
    };
    let mut publisher = Publisher::connect(&broker, "stream").await;
    let t = base_time() + 1800;
    let mut up = [true; 3];
    for i in 0..120 {
        if i == 60 {
            // SIGKILL: no drain, held readings only in its journal.
            let killed = &mut instances[1].1;
            killed.kill().expect("SIGKILL");
            killed.wait().expect("reaped");
            up[1] = false;
        }
        let (url, body, acked) = post(i, &up);
        let r = client.post(&url).json(&body).send().await.expect("sent");
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        model.extend(acked);
        publish_stream(&mut publisher, t, i * 5..i * 5 + 5, &mut model).await;
    }
    publisher.flushed().await;
    // The killed instance comes back on its journal and its MQTT session.
    let (s, _, _) = &instances[1];
    let log = logs.path().join("b-again.log");
    let again = spawn_binary(s, &extra, &log);
    binary_address(&log).await;
    instances[1].1 = again;
    // Held live minutes are written once they end (plus the grace).
    eventually(WAIT, "every acknowledged reading is stored", || async {
        all_values(&reader.buckets().await, Granularity::Minute) == model
    })
    .await;
    assert_invariants(&reader.buckets().await, Granularity::Minute);

    // Every sensor's average over all its readings, and the group's, exact
    // (old hours answered from rollups, the rest from buckets).
    let (from, to) = (rfc3339(old - 3600), rfc3339(now() + 120));
    let mut group = (0u64, 0.0);
    let sensors: std::collections::BTreeSet<String> = model
        .keys()
        .filter(|(s, _, _)| s.starts_with('h'))
        .map(|(s, _, _)| s.clone())
        .collect();
    assert_eq!(sensors.len(), 9);
    for sensor in sensors {
        let values: Vec<f64> = model
            .iter()
            .filter(|((s, _, _), _)| *s == sensor)
            .map(|(_, v)| *v)
            .collect();
        let got = reader
            .get_json(&format!(
                "/api/v1/sensors/{sensor}/average?metric=m&from={from}&to={to}"
            ))
            .await;
        assert_eq!(
            got["count"].as_u64(),
            Some(values.len() as u64),
            "{sensor}: {got}"
        );
        assert_eq!(
            got["sum"].as_f64(),
            Some(values.iter().sum()),
            "{sensor}: {got}"
        );
        group.0 += values.len() as u64;
        group.1 += values.iter().sum::<f64>();
    }
    let got = reader
        .get_json(&format!(
            "/api/v1/average?metric=m&sensor=h*&from={from}&to={to}"
        ))
        .await;
    assert_eq!(got["groups"][0]["count"].as_u64(), Some(group.0), "{got}");
    assert_eq!(got["groups"][0]["sum"].as_f64(), Some(group.1), "{got}");
    for (_, child, _) in &mut instances {
        assert!(terminate(child).success(), "a graceful stop exits 0");
    }
    reader.stop().await.expect("clean stop");
}

/// One reading as the JSON write API takes it.
fn one(sensor: &str, ts: i64, value: f64) -> Vec<u8> {
    serde_json::to_vec(
        &json!([{ "sensor": sensor, "metric": "m", "ts": rfc3339(ts), "value": value }]),
    )
    .expect("json")
}

/// The stored value of `sensor`'s second `ts`.
async fn stored(app: &TestApp, g: Granularity, sensor: &str, ts: i64) -> Option<f64> {
    let docs = app.buckets().await;
    assert_invariants(&docs, g);
    all_values(&docs, g)
        .get(&(sensor.to_owned(), "m".to_owned(), ts))
        .copied()
}

/// Instance A acknowledges a value and holds it in its journal; instance B
/// then acknowledges a correction of the same second and stores it at once
/// (`wait=stored`). A's write lands afterwards and loses: the value
/// acknowledged last is the one stored, wherever each was acknowledged. And
/// the other way round, a value A acknowledges after B's stored one wins
/// when A writes it.
#[tokio::test]
async fn a_correction_acknowledged_later_on_another_instance_is_the_value_stored() {
    for g in [Granularity::Minute, Granularity::Hour] {
        let mut a_settings = journal_settings();
        a_settings.buckets.granularity = g;
        // A holds what it journals until it stops (which drains it).
        a_settings.batcher.max_hold = Duration::from_secs(300);
        a_settings.batcher.hold_grace = Duration::from_secs(120);
        a_settings.buckets.rollup_after = Duration::from_secs(180);
        let mut b_settings = a_settings.clone();
        b_settings.journal.enabled = false;
        b_settings.journal.dir = journal_dir();
        let a = spawn_app_with(a_settings).await;
        let b = spawn_app_with(b_settings).await;
        let t = now() - 2;

        // Earlier on A (held), later on B (stored at once): B's stands.
        let r = a.post_raw("application/json", one("c", t, 1.0), "").await;
        assert_eq!(r.status(), 200, "{g:?}");
        let r = b
            .post_raw("application/json", one("c", t, 2.0), "?wait=stored")
            .await;
        assert_eq!(r.status(), 200, "{g:?}");
        assert_eq!(stored(&b, g, "c", t).await, Some(2.0), "{g:?}");
        // A, still holding its older value, answers with B's.
        let latest = a.get_json("/api/v1/sensors/c/latest?metric=m").await;
        assert_eq!(latest["value"].as_f64(), Some(2.0), "{g:?}: {latest}");

        // Earlier on B (stored), later on A (held): A's wins once written.
        let r = b
            .post_raw("application/json", one("c", t + 1, 3.0), "?wait=stored")
            .await;
        assert_eq!(r.status(), 200, "{g:?}");
        let r = a
            .post_raw("application/json", one("c", t + 1, 4.0), "")
            .await;
        assert_eq!(r.status(), 200, "{g:?}");

        // Before A writes, its answers lay its unstored values over the
        // buckets as its writes will: B's later value stands, A's wins.
        assert_eq!(
            crate::fleet::counted(&a, "hourglass_readings_stored_total", "").await,
            0.0,
            "{g:?}: A still holds both"
        );
        for (ts, want) in [(t, 2.0), (t + 1, 4.0)] {
            let got = a
                .get_json(&format!(
                    "/api/v1/sensors/c/average?metric=m&from={}&to={}",
                    rfc3339(ts),
                    rfc3339(ts + 1)
                ))
                .await;
            assert_eq!(got["sum"].as_f64(), Some(want), "{g:?} at {ts}: {got}");
        }

        // A drains: both its held values go out now.
        a.stop().await.expect("A drains");
        assert_eq!(
            stored(&b, g, "c", t).await,
            Some(2.0),
            "{g:?}: A's earlier value lost"
        );
        assert_eq!(
            stored(&b, g, "c", t + 1).await,
            Some(4.0),
            "{g:?}: A's later value won"
        );
        b.stop().await.expect("B drains");
    }
}

/// The replay variant: A acknowledges a value into its journal and is
/// SIGKILLed before writing it; B stores a correction; A comes back on its
/// journal and replays the older value, which must not overwrite the newer.
#[tokio::test]
async fn a_journal_replayed_after_a_correction_elsewhere_never_overwrites_it() {
    let logs = tempfile::tempdir().expect("temp dir");
    let mut a_settings = journal_settings();
    a_settings.mqtt.enabled = false;
    let mut b_settings = a_settings.clone();
    b_settings.journal.enabled = false;
    b_settings.journal.dir = journal_dir();
    let b = spawn_app_with(b_settings).await;
    let extra = [("HOURGLASS__BATCHER__MAX_HOLD", "60s")];
    // A holds what it acknowledges until the kill, however slow the machine.
    let mut a = spawn_binary(
        &a_settings,
        crate::journal::HOLD_EVERYTHING,
        &logs.path().join("a.log"),
    );
    let a_url = binary_address(&logs.path().join("a.log")).await;
    let client = crate::helpers::http_client();
    let t = now() - 2;
    let r = client
        .post(format!("{a_url}/api/v1/readings"))
        .header("content-type", "application/json")
        .body(one("r", t, 1.0))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    a.kill().expect("SIGKILL");
    a.wait().expect("reaped");
    assert_eq!(
        stored(&b, Granularity::Minute, "r", t).await,
        None,
        "A held it"
    );
    let r = b
        .post_raw("application/json", one("r", t, 2.0), "?wait=stored")
        .await;
    assert_eq!(r.status(), 200);
    // A again, on the same journal, then stopped by SIGTERM, which drains:
    // the replayed 1.0, acknowledged first, is written now.
    let log = logs.path().join("a-again.log");
    let mut again = spawn_binary(&a_settings, &extra, &log);
    binary_address(&log).await;
    let term = std::process::Command::new("kill")
        .args(["-TERM", &again.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(term.success());
    let exit = again.wait().expect("reaped");
    assert!(exit.success(), "A drained and stopped cleanly: {exit:?}");
    let docs = b
        .documents(&b.settings.mongodb.collection, mongodb::bson::doc! {})
        .await;
    assert_eq!(docs.len(), 1);
    let n = docs[0]
        .get_i32("n")
        .map(i64::from)
        .or_else(|_| docs[0].get_i64("n"));
    assert!(
        n.is_ok_and(|n| n >= 2),
        "the replay wrote the bucket: {docs:?}"
    );
    assert_eq!(stored(&b, Granularity::Minute, "r", t).await, Some(2.0));
}

/// A lone instance keeps no versions: nothing it holds can be older than
/// what it stores, and it knows of no other instance.
#[tokio::test]
async fn a_lone_instance_stores_no_versions() {
    let app = spawn_app_with(journal_settings()).await;
    let t = now() - 120;
    for i in 0..5 {
        let r = app
            .post_raw(
                "application/json",
                one("alone", t + i, i as f64),
                "?wait=stored",
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    let docs = app.buckets().await;
    assert!(!docs.is_empty());
    assert!(
        docs.iter()
            .all(|d| !d.contains_key("a") && !d.contains_key("amax")),
        "{docs:?}"
    );
    app.stop().await.expect("drains");
}

/// An instance whose journal is gone for good leaves its floor behind: what
/// the others store keeps its version. `hourglass instances` shows it, and
/// `--forget` removes it (never a running instance, never an unknown one),
/// after which values are stored without versions again.
#[tokio::test]
async fn forgetting_an_instance_gone_for_good_lets_values_be_stored_without_versions() {
    let app = spawn_app().await;
    let floor = (now() - 7200) * 1000;
    let gone_at = mongodb::bson::DateTime::from_millis(floor);
    app.db
        .collection::<mongodb::bson::Document>(&app.settings.mongodb.metadata_collection)
        .insert_one(mongodb::bson::doc! {
            "_id": "instance:gone", "floor": floor, "durable": true, "at": gone_at,
        })
        .await
        .expect("insert");
    let versioned = |docs: &[mongodb::bson::Document], sensor: &str| {
        docs.iter()
            .find(|d| d.get_str("sensor") == Ok(sensor))
            .map(|d| d.contains_key("a"))
    };
    // Each try a new sensor: a bucket that holds versions keeps them.
    let tries = std::sync::atomic::AtomicUsize::new(0);
    let stored_with_version = |prefix: &'static str, ts: i64| {
        let sensor = format!(
            "{prefix}-{}",
            tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let app = &app;
        async move {
            let r = app
                .post_raw("application/json", one(&sensor, ts, 1.0), "?wait=stored")
                .await;
            assert_eq!(r.status(), 200);
            versioned(&app.buckets().await, &sensor)
        }
    };
    // The floor is read within a second; a value stored after it keeps a version.
    let t = now() - 300;
    eventually(Duration::from_secs(10), "a version kept", || async {
        stored_with_version("held", t).await == Some(true)
    })
    .await;

    let listed = hourglass::instances(&app.settings).await.expect("listed");
    assert_eq!(listed.len(), 2, "{listed:?}");
    let gone = listed.iter().find(|i| i.id == "gone").expect("listed");
    assert_eq!((gone.floor, gone.durable), (Some(floor), true));
    let running = listed.iter().find(|i| i.id != "gone").expect("this one");
    let refused = hourglass::forget_instance(&app.settings, &running.id).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("it is running")),
        "{refused:?}"
    );
    let unknown = hourglass::forget_instance(&app.settings, "nobody").await;
    assert!(
        unknown
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("no instance \"nobody\"")),
        "{unknown:?}"
    );
    assert_eq!(
        hourglass::instances(&app.settings)
            .await
            .expect("listed")
            .len(),
        2,
        "refusals change nothing"
    );

    hourglass::forget_instance(&app.settings, "gone")
        .await
        .expect("forgotten");
    eventually(
        Duration::from_secs(10),
        "stored without a version",
        || async { stored_with_version("free", t + 120).await == Some(false) },
    )
    .await;
    app.stop().await.expect("drains");
}

/// A lone instance writes its floor document once a minute (and says so in
/// `every`): only other instances read it. It still reads theirs every few
/// seconds, so once another instance runs on the database, both write
/// theirs every second.
#[tokio::test]
async fn a_lone_instance_writes_its_floor_once_a_minute_and_every_second_beside_another() {
    use futures_util::TryStreamExt;
    use mongodb::bson::{Document, doc};

    let a = spawn_app_with(journal_settings()).await;
    let metadata =
        a.db.collection::<Document>(&a.settings.mongodb.metadata_collection);
    let instances = || async {
        metadata
            .find(doc! { "_id": { "$regex": "^instance:" } })
            .await
            .expect("find")
            .try_collect::<Vec<Document>>()
            .await
            .expect("read")
    };
    let every = |d: &Document| d.get_i64("every").ok();
    const WRITTEN: &str =
        "hourglass_db_documents_written_total{collection=\"metadata\",kind=\"instance_floor\"}";
    const READ: &str =
        "hourglass_db_documents_read_total{collection=\"metadata\",kind=\"instance_floor\"}";
    eventually(
        Duration::from_secs(20),
        "a lone instance promises a minute",
        || async {
            let docs = instances().await;
            docs.len() == 1 && every(&docs[0]) == Some(60_000)
        },
    )
    .await;
    // A read follows each write's count.
    let read = a.metric(READ).await;
    eventually(Duration::from_secs(20), "a read", || async {
        a.metric(READ).await > read
    })
    .await;
    let (written, read) = (a.metric(WRITTEN).await, a.metric(READ).await);
    eventually(Duration::from_secs(40), "three more reads", || async {
        a.metric(READ).await >= read + 3.0
    })
    .await;
    assert_eq!(a.metric(WRITTEN).await, written, "reads without writes");

    let mut s = a.settings.clone();
    s.journal.dir = journal_dir();
    let b = spawn_app_with(s).await;
    let written = a.metric(WRITTEN).await;
    eventually(WAIT, "both write every second", || async {
        let docs = instances().await;
        docs.len() == 2 && docs.iter().all(|d| every(d) == Some(1_000))
    })
    .await;
    eventually(WAIT, "the lone one writes every second now", || async {
        a.metric(WRITTEN).await >= written + 3.0
    })
    .await;
    b.stop().await.expect("drains");
    a.stop().await.expect("drains");
}

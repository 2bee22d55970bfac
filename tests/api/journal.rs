//! The journal, with real processes, files and sockets: acknowledged once
//! fsync'd, visible to queries at once, kept through SIGKILL, storage outages
//! and damaged files, and bounded on disk.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hourglass::Granularity;
use serde_json::{Value, json};

use crate::database::Database;
use crate::helpers::*;

const WAIT: Duration = Duration::from_secs(120);

type Model = BTreeMap<(String, String, i64), f64>;

/// A binary that writes no journaled bucket for an hour: what it held is
/// only in its journal when the test kills it.
pub const HOLD_EVERYTHING: &[(&str, &str)] = &[
    ("HOURGLASS__BATCHER__HOLD_GRACE", "1h"),
    ("HOURGLASS__BATCHER__MAX_HOLD", "1h"),
    ("HOURGLASS__BUCKETS__ROLLUP_AFTER", "2h"),
];

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn readings_for(sensor: &str, ts: &[i64], value: impl Fn(i64) -> f64, model: &mut Model) -> Value {
    Value::Array(
        ts.iter()
            .map(|&t| {
                let v = value(t);
                model.insert((sensor.to_owned(), "m".into(), t), v);
                reading(sensor, "m", t, v)
            })
            .collect(),
    )
}

async fn stored_equals(app: &TestApp, model: &Model) {
    eventually(WAIT, "every acknowledged reading is stored", || async {
        all_values(&app.buckets().await, Granularity::Minute) == *model
    })
    .await;
    assert_invariants(&app.buckets().await, Granularity::Minute);
}

#[tokio::test]
async fn a_write_is_acknowledged_from_the_journal_and_queried_before_any_bucket_is_written() {
    let app = spawn_app_with(journal_settings()).await;
    let t = now() - 5;
    // A stored value first, then a newer one for the same second that is
    // only journaled: the query must answer the newer one.
    let r = app
        .post_raw(
            "application/json",
            serde_json::to_vec(&reading("live", "m", t, 1.0)).expect("json"),
            "?wait=stored",
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        app.buckets().await.len(),
        1,
        "wait=stored answered once stored"
    );
    let updates = metric(&app.address, "hourglass_bucket_updates_total").await;
    let both = app
        .post_raw(
            "application/json",
            serde_json::to_vec(&reading("live", "m", t, 3.0)).expect("json"),
            "?async=true&wait=stored",
        )
        .await;
    assert_eq!(
        both.status(),
        400,
        "async and wait=stored contradict each other"
    );
    let r = app
        .post_readings(&json!([
            reading("live", "m", t, 5.0),
            reading("live", "m", t + 1, 7.0),
        ]))
        .await;
    assert_eq!(r.status(), 200);
    let from = rfc3339(t - 60);
    let to = rfc3339(t + 60);
    let avg = app
        .get_json(&format!(
            "/api/v1/sensors/live/average?metric=m&from={from}&to={to}"
        ))
        .await;
    assert_eq!(
        (avg["count"].as_u64(), avg["sum"].as_f64()),
        (Some(2), Some(12.0)),
        "{avg}"
    );
    let series = app
        .get_json(&format!(
            "/api/v1/sensors/live/series?metric=m&from={from}&to={to}&step=1m"
        ))
        .await;
    let counted: u64 = series["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| p["count"].as_u64().expect("count"))
        .sum();
    assert_eq!(counted, 2, "{series}");
    // Nothing of the second write was sent to storage: it is held until its
    // minute ends.
    assert_eq!(
        metric(&app.address, "hourglass_bucket_updates_total").await,
        updates
    );
    let stored = all_values(&app.buckets().await, Granularity::Minute);
    assert_eq!(stored.get(&("live".into(), "m".into(), t)), Some(&1.0));
    assert_eq!(stored.len(), 1);
    assert!(metric(&app.address, "hourglass_journal_fsyncs_total").await >= 1.0);
    // A graceful stop writes what is held.
    let db = app.db.clone();
    let collection = app.settings.mongodb.collection.clone();
    let dir = app.settings.journal.dir.clone();
    app.stop().await.expect("clean stop");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("journal dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .collect();
    assert!(
        left.is_empty(),
        "a clean stop leaves nothing to replay: {left:?}"
    );
    let doc = db
        .collection::<mongodb::bson::Document>(&collection)
        .find_one(mongodb::bson::doc! {})
        .await
        .expect("read")
        .expect("a bucket");
    assert_eq!(
        doc.get_i32("count")
            .ok()
            .map(i64::from)
            .or(doc.get_i64("count").ok()),
        Some(2),
        "{doc}"
    );
}

#[tokio::test]
async fn a_sigkill_during_a_synchronous_http_stream_loses_no_acknowledged_reading() {
    let settings = journal_settings();
    let reader = spawn_app_with(test_settings_on(&settings)).await;
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("first.log");
    // Held until the kill (not only for their window, which may end while
    // a slow machine sends): acknowledged readings are in the journal and
    // memory only, and every one is replayed.
    let mut first = spawn_binary(&settings, HOLD_EVERYTHING, &log);
    let url = format!("{}/api/v1/readings", binary_address(&log).await);
    let t0 = now() - 60;
    let acked = kill_mid_stream(url, &mut first, 300, 200, move |i, m| {
        Value::Array(
            (0..5)
                .map(|k| {
                    let v = ((i * 7 + k) % 13) as f64;
                    m.insert((format!("k{k}"), "m".into(), t0 + i), v);
                    reading(&format!("k{k}"), "m", t0 + i, v)
                })
                .collect(),
        )
    })
    .await;

    let log = logs.path().join("second.log");
    let mut second = spawn_binary(&settings, &[("HOURGLASS__BATCHER__MAX_HOLD", "1s")], &log);
    let address = binary_address(&log).await;
    let replayed = metric(&address, "hourglass_journal_replayed_readings_total").await;
    assert_eq!(
        replayed,
        acked.len() as f64,
        "the replay shows in the metrics"
    );
    eventually(WAIT, "every acknowledged reading is stored", || async {
        let stored = all_values(&reader.buckets().await, Granularity::Minute);
        acked.iter().all(|(k, v)| stored.get(k) == Some(v))
    })
    .await;
    assert_invariants(&reader.buckets().await, Granularity::Minute);
    assert!(terminate(&mut second).success());
    reader.stop().await.expect("clean stop");
}

/// Journal-less settings on the same database: a reader of what is stored.
fn test_settings_on(settings: &hourglass::Settings) -> hourglass::Settings {
    let mut s = settings.clone();
    s.journal.enabled = false;
    s.journal.dir = journal_dir();
    s
}

#[tokio::test]
async fn a_storage_outage_longer_than_the_write_timeout_still_answers_every_write() {
    let mut db = Database::start().await;
    let mut settings = db.settings();
    settings.journal.enabled = true;
    // Long enough for a journal commit on a loaded two-core machine (at
    // 500 ms one fsync in CI took longer, and its write answered 503).
    settings.http.write_timeout = Duration::from_secs(2);
    let app = spawn_app_with(settings).await;
    let t = base_time();
    let mut model = Model::new();
    let mut statuses = Vec::new();
    for i in 0..30 {
        if i == 5 {
            db.stop_gracefully();
        }
        let ts: Vec<i64> = (0..10).map(|k| t + i * 10 + k).collect();
        let b = readings_for("outage", &ts, |x| (x % 23) as f64, &mut model);
        statuses.push(app.post_readings(&b).await.status().as_u16());
        if (5..25).contains(&i) {
            // 20 writes over 8 s of outage: four times the write timeout.
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        if i == 10 {
            let ready = app.get("/health/ready").await;
            assert_eq!(
                ready.status(),
                200,
                "with the journal, an outage is not unreadiness"
            );
        }
    }
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(
        app.buckets_or_none().await.is_none(),
        "storage really was down"
    );
    db.restart_gracefully().await;
    stored_equals(&app, &model).await;
    app.stop().await.expect("clean stop");
}

/// The first writes of new series during an outage are answered from the
/// journal too: their registration (which then lasts a whole server
/// selection, longer than the write timeout here) is waited for briefly,
/// and the flush that stores them registers them once storage is back.
#[tokio::test]
async fn new_series_first_written_during_a_storage_outage_are_answered_and_stored() {
    let mut db = Database::start().await;
    let mut settings = db.settings();
    settings.journal.enabled = true;
    settings.mongodb.uri = db
        .uri()
        .replace(
            "serverSelectionTimeoutMS=1000",
            "serverSelectionTimeoutMS=30000",
        )
        .into();
    settings.http.write_timeout = Duration::from_secs(2) + hourglass::REGISTER_WAIT;
    let app = spawn_app_with(settings).await;
    let t = base_time();
    let mut model = Model::new();
    let b = readings_for("known", &[t, t + 1], |x| (x % 7) as f64, &mut model);
    assert_eq!(app.post_readings(&b).await.status(), 200);
    db.stop_gracefully();
    for i in 0..3 {
        let ts: Vec<i64> = (0..5).map(|k| t + 10 * i + k).collect();
        let b = readings_for(&format!("new-{i}"), &ts, |x| (x % 11) as f64, &mut model);
        let r = app.post_readings(&b).await;
        assert_eq!(
            r.status(),
            200,
            "new-{i}: {}",
            r.text().await.unwrap_or_default()
        );
    }
    db.restart_gracefully().await;
    stored_equals(&app, &model).await;
    let listed = app
        .get("/api/v1/sensors")
        .await
        .text()
        .await
        .unwrap_or_default();
    for i in 0..3 {
        assert!(
            listed.contains(&format!("new-{i}")),
            "new-{i} is listed: {listed}"
        );
    }
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_full_journal_answers_503_and_stores_all_it_acknowledged_once_storage_is_back() {
    let mut db = Database::start().await;
    let mut settings = db.settings();
    settings.journal.enabled = true;
    settings.journal.segment_bytes = 4096;
    settings.journal.max_bytes = 8192;
    let app = spawn_app_with(settings).await;
    db.stop_gracefully();
    let t = base_time();
    let mut model = Model::new();
    let mut refused = None;
    for i in 0..200 {
        let mut m = Model::new();
        let ts: Vec<i64> = (0..10).map(|k| t + i * 10 + k).collect();
        let b = readings_for("full", &ts, |x| (x % 11) as f64, &mut m);
        let r = app.post_readings(&b).await;
        if r.status() == 503 {
            refused = Some(r);
            break;
        }
        assert_eq!(r.status(), 200);
        model.extend(m);
    }
    let refused = refused.expect("the journal filled up");
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("journal is full")),
        "{body}"
    );
    let ready = app.get("/health/ready").await;
    assert_eq!(ready.status(), 503);
    let ready: Value = ready.json().await.expect("json");
    assert_eq!(ready["checks"]["journal"]["ok"], false, "{ready}");
    assert!(
        model.len() >= 100,
        "several writes fit first: {}",
        model.len()
    );

    db.restart_gracefully().await;
    stored_equals(&app, &model).await;
    // Stored segments are deleted and input is taken again.
    let mut m = Model::new();
    let b = readings_for("full", &[t - 1], |_| 1.0, &mut m);
    eventually(WAIT, "input is taken again", || async {
        app.post_readings(&b).await.status() == 200
    })
    .await;
    model.extend(m);
    stored_equals(&app, &model).await;
    app.stop().await.expect("clean stop");
}

/// The segments a killed binary left in `dir` that hold records, oldest
/// first.
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("journal dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .filter(|p| std::fs::metadata(p).expect("meta").len() > 8)
        .collect();
    logs.sort();
    logs
}

/// Record offsets of a segment: an 8-byte header, then frames of
/// `len: u32 LE, crc: u32, payload`.
fn record_offsets(file: &Path) -> Vec<(u64, u64)> {
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .expect("open")
        .read_to_end(&mut bytes)
        .expect("read");
    let mut at = 8usize;
    let mut out = Vec::new();
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        out.push((at as u64, (8 + len) as u64));
        at += 8 + len;
    }
    out
}

/// Overwrites bytes of `file` at `at`.
fn overwrite(file: &Path, at: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .expect("open");
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.write_all(bytes).expect("write");
}

/// Flips one bit of the byte at `at`.
fn flip(file: &Path, at: u64) {
    let mut byte = [0u8; 1];
    let mut f = std::fs::File::open(file).expect("open");
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.read_exact(&mut byte).expect("read");
    overwrite(file, at, &[byte[0] ^ 0x20]);
}

/// Sensors of the damaged-journal tests: one acknowledged request each.
const SENSORS: [&str; 9] = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];

/// What a damaged journal's restart left: stored readings, the log, and
/// the damaged-ranges counter.
struct Restarted {
    stored: Model,
    log: String,
    damaged_ranges: f64,
}

/// Writes nine acknowledged records (sensors a to i, 70 readings each, so
/// three to a 4 KiB segment) with a binary that is then killed; damages
/// the segments (oldest first, with their record offsets) with `damage`;
/// restarts; returns what is stored once `records` records' readings are.
async fn damaged_journal(
    records: usize,
    damage: impl FnOnce(&[(PathBuf, Vec<(u64, u64)>)]),
) -> Restarted {
    let settings = journal_settings();
    let reader = spawn_app_with(test_settings_on(&settings)).await;
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("first.log");
    // It holds every bucket until the kill, however slow the machine.
    let mut env = HOLD_EVERYTHING.to_vec();
    env.push(("HOURGLASS__JOURNAL__SEGMENT_BYTES", "4096"));
    let mut first = spawn_binary(&settings, &env, &log);
    let address = binary_address(&log).await;
    let client = crate::helpers::http_client();
    let t = now() - 300;
    for sensor in SENSORS {
        let batch: Vec<Value> = (0..70).map(|k| reading(sensor, "m", t + k, 1.0)).collect();
        let r = client
            .post(format!("{address}/api/v1/readings"))
            .json(&batch)
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 200);
    }
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");
    assert!(
        reader.buckets().await.is_empty(),
        "nothing was written before the kill"
    );
    let segments: Vec<(PathBuf, Vec<(u64, u64)>)> = segment_files(&settings.journal.dir)
        .into_iter()
        .map(|f| {
            let records = record_offsets(&f);
            (f, records)
        })
        .collect();
    let per_segment: Vec<usize> = segments.iter().map(|(_, r)| r.len()).collect();
    assert_eq!(per_segment, vec![3, 3, 3], "one record per request");
    damage(&segments);

    let log = logs.path().join("second.log");
    let mut second = spawn_binary(&settings, &[("HOURGLASS__BATCHER__MAX_HOLD", "1s")], &log);
    let address = binary_address(&log).await;
    eventually(WAIT, "the replay is written", || async {
        all_values(&reader.buckets().await, Granularity::Minute).len() >= records * 70
    })
    .await;
    // A moment more for anything that should not be there to show up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stored = all_values(&reader.buckets().await, Granularity::Minute);
    let damaged_ranges = metric(&address, "hourglass_journal_damaged_ranges_total").await;
    assert!(terminate(&mut second).success());
    reader.stop().await.expect("clean stop");
    Restarted {
        stored,
        log: std::fs::read_to_string(&log).expect("log"),
        damaged_ranges,
    }
}

/// Each sensor stored, with its count of readings.
fn sensors(stored: &Model) -> Vec<(String, usize)> {
    let mut s: BTreeMap<String, usize> = BTreeMap::new();
    for (sensor, _, _) in stored.keys() {
        *s.entry(sensor.clone()).or_default() += 1;
    }
    s.into_iter().collect()
}

fn all_but(lost: &[&str]) -> Vec<(String, usize)> {
    SENSORS
        .iter()
        .filter(|s| !lost.contains(s))
        .map(|s| (s.to_string(), 70))
        .collect()
}

#[tokio::test]
async fn a_torn_last_record_is_cut_off_and_every_whole_record_is_stored() {
    let restarted = damaged_journal(8, |segments| {
        let (file, records) = &segments[2];
        let (at, len) = records[2];
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .expect("open");
        // A crash mid-write: half of the last record made it.
        f.set_len(at + len / 2).expect("truncate");
    })
    .await;
    assert_eq!(sensors(&restarted.stored), all_but(&["i"]));
    let log = &restarted.log;
    assert!(log.contains("torn write"), "{log}");
    assert!(log.contains("\"truncated_bytes\""), "{log}");
    assert!(
        !log.contains("ERROR"),
        "a torn write loses nothing acknowledged: {log}"
    );
    assert_eq!(restarted.damaged_ranges, 0.0);
}

/// A bad sector over a length in the oldest segment and a flipped payload
/// byte in the middle of the newest: each loses its own record only, kept
/// aside in a `.corrupt` file, counted and logged as lost; every other
/// acknowledged reading is stored once.
#[tokio::test]
async fn damage_in_an_older_or_the_newest_segment_loses_only_the_damaged_records() {
    let dir = std::sync::Arc::new(std::sync::Mutex::new(PathBuf::new()));
    let kept = dir.clone();
    let restarted = damaged_journal(7, move |segments| {
        let (oldest, records) = &segments[0];
        overwrite(oldest, records[1].0, &[0xff, 0xff, 0xff, 0x7f]);
        let (newest, records) = &segments[2];
        flip(newest, records[1].0 + 12);
        *kept.lock().expect("lock") = oldest.parent().expect("dir").to_owned();
    })
    .await;
    assert_eq!(sensors(&restarted.stored), all_but(&["b", "h"]));
    let log = &restarted.log;
    assert!(log.contains("ERROR"), "{log}");
    assert!(log.contains("\"damaged_ranges\":2"), "{log}");
    assert!(!log.contains("torn write"), "nothing was cut: {log}");
    assert_eq!(restarted.damaged_ranges, 2.0);
    let dir = dir.lock().expect("lock").clone();
    let corrupt = std::fs::read_dir(&dir)
        .expect("journal dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "corrupt"))
        })
        .count();
    assert_eq!(corrupt, 2, "each damaged range kept aside");
}

/// A journal holding readings acknowledged for one database is not replayed
/// into another: a start with another `mongodb.database` over the same
/// journal directory refuses, naming both, and writes nothing; a start with
/// the old setting stores them where they were acknowledged for.
#[tokio::test]
async fn a_journal_is_never_replayed_into_another_database() {
    let settings = journal_settings();
    let reader = spawn_app_with(test_settings_on(&settings)).await;
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("first.log");
    let mut first = spawn_binary(&settings, &[], &log);
    let address = binary_address(&log).await;
    let t = now() - 5;
    let r = crate::helpers::http_client()
        .post(format!("{address}/api/v1/readings"))
        .json(&json!([
            reading("a", "m", t, 1.0),
            reading("b", "m", t, 2.0)
        ]))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");

    let mut other = settings.clone();
    other.mongodb.database = format!("{}_other", settings.mongodb.database);
    let other_reader = spawn_app_with(test_settings_on(&other)).await;
    let log = logs.path().join("other.log");
    let mut refused = spawn_binary(&other, &[("HOURGLASS__BATCHER__MAX_HOLD", "1s")], &log);
    let status = refused.wait().expect("exits");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(!status.success(), "{text}");
    let found = format!("{}/buckets (minute)", settings.mongodb.database);
    let configured = format!("{}/buckets (minute)", other.mongodb.database);
    assert!(
        text.contains(&found) && text.contains(&configured) && text.contains("journal.dir"),
        "{text}"
    );
    assert!(other_reader.buckets().await.is_empty(), "nothing replayed");

    let log = logs.path().join("again.log");
    let mut again = spawn_binary(&settings, &[("HOURGLASS__BATCHER__MAX_HOLD", "1s")], &log);
    binary_address(&log).await;
    let want: Model = [
        (("a".to_owned(), "m".to_owned(), t), 1.0),
        (("b".to_owned(), "m".to_owned(), t), 2.0),
    ]
    .into();
    eventually(WAIT, "the replay is stored where it belongs", || async {
        all_values(&reader.buckets().await, Granularity::Minute) == want
    })
    .await;
    assert!(terminate(&mut again).success());
    assert!(other_reader.buckets().await.is_empty(), "nothing replayed");
    other_reader.stop().await.expect("clean stop");
    reader.stop().await.expect("clean stop");
}

/// A stop whose last write still waits for a database that went away: the
/// readings it holds are in the journal, so nothing is lost. The stop says
/// so, logs no ERROR and exits 0; the next start writes them.
#[tokio::test]
async fn a_stop_while_a_write_waits_on_a_vanished_database_keeps_its_readings_for_the_next_start() {
    let mut db = Database::start().await;
    let mut settings = db.settings();
    // Server selection as shipped (the test URI cuts it to 1 s), longer
    // than the shutdown deadline: the last write is still waiting at it.
    settings.mongodb.uri = db
        .uri()
        .replace("&serverSelectionTimeoutMS=1000", "")
        .into();
    settings.journal.enabled = true;
    settings.journal.dir = journal_dir();
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("hourglass.log");
    let extra = [
        ("HOURGLASS__BATCHER__FLUSH_INTERVAL", "1h"),
        ("HOURGLASS__BATCHER__MAX_HOLD", "1h"),
        ("HOURGLASS__SHUTDOWN__TIMEOUT", "1s"),
        ("HOURGLASS__MONGODB__SERVER_SELECTION_TIMEOUT", "30s"),
    ];
    let mut child = spawn_binary(&settings, &extra, &log);
    let address = binary_address(&log).await;
    let body: Vec<Value> = (0..40)
        .map(|i| reading("kept", "m", base_time() + i, 1.0))
        .collect();
    let r = crate::helpers::http_client()
        .post(format!("{address}/api/v1/readings"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200, "acknowledged once journaled");
    db.stop();
    let status = terminate(&mut child);
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(status.success(), "nothing acknowledged was lost: {text}");
    let errors: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["level"] == "ERROR")
        .collect();
    assert!(errors.is_empty(), "no ERROR: nothing was lost: {errors:?}");
    assert!(text.contains("in the journal for the next start"), "{text}");

    db.restart().await;
    let app = spawn_app_with(settings).await;
    eventually(
        Duration::from_secs(60),
        "the journal's readings are stored",
        || {
            let app = &app;
            async move {
                let stored: i64 = app
                    .buckets()
                    .await
                    .iter()
                    .map(|d| i64::from(d.get_i32("count").unwrap_or(0)))
                    .sum();
                stored == 40
            }
        },
    )
    .await;
    app.stop().await.expect("clean stop");
}

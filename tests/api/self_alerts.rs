//! The rules of `config/alerts.yml`, as shipped, loaded by a real Prometheus
//! that scrapes the real binary: each test drives the binary into a
//! condition a rule is written for and waits for the rule to become pending
//! or firing (its expression true on what `/metrics` said). The rules'
//! `for` durations are the operator's; pending is the expression holding.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mongodb::bson::doc;
use serde_json::Value;

use crate::database::Database;
use crate::helpers::*;

/// Conditions that take their time to show (the journal's wait is over a
/// minute by the rule), on a loaded machine.
const WAIT: Duration = Duration::from_secs(240);

/// A Prometheus 2 scraping one target every second as job `hourglass`,
/// evaluating `config/alerts.yml` every second.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    async fn scraping(address: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/alerts.yml");
        let target = address.trim_start_matches("http://");
        let config = format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
             rule_files: [{rules:?}]\n\
             scrape_configs:\n  - job_name: hourglass\n    static_configs: [{{ targets: [{target:?}] }}]\n",
        );
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, config).expect("write the configuration");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new("/usr/bin/prometheus")
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts; `make test` installs it");
        listening(port, "Prometheus listens").await;
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        // A counter's increase needs a sample from before it.
        eventually(WAIT, "Prometheus scraped the binary", || async {
            prometheus.query("up{job=\"hourglass\"}").await == Some(1.0)
        })
        .await;
        prometheus
    }

    /// The first value of an instant query, if it has one.
    async fn query(&self, expr: &str) -> Option<f64> {
        let url =
            url::Url::parse_with_params(&format!("{}/api/v1/query", self.url), [("query", expr)])
                .ok()?;
        let v: Value = reqwest::get(url).await.ok()?.json().await.ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }

    /// The state (`pending` or `firing`) of the alert `name`, if active.
    async fn alert(&self, name: &str) -> Option<String> {
        let v: Value = reqwest::get(format!("{}/api/v1/alerts", self.url))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        v["data"]["alerts"]
            .as_array()?
            .iter()
            .find(|a| a["labels"]["alertname"] == name)
            .and_then(|a| a["state"].as_str().map(str::to_owned))
    }

    async fn sees(&self, name: &str) {
        eventually(WAIT, &format!("{name} is pending or firing"), || async {
            self.alert(name).await.is_some()
        })
        .await;
    }

    async fn does_not_see(&self, names: &[&str]) {
        for name in names {
            assert_eq!(self.alert(name).await, None, "{name}");
        }
    }
}

/// A running binary with its log, stopped with the test.
struct Binary {
    child: Child,
    address: String,
    logs: tempfile::TempDir,
}

impl Binary {
    fn log(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("hourglass.log")).unwrap_or_default()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn binary(settings: &hourglass::Settings, env: &[(&str, &str)]) -> Binary {
    let logs = tempfile::tempdir().expect("a temporary directory");
    let log = logs.path().join("hourglass.log");
    let child = spawn_binary(settings, env, &log);
    let address = binary_address(&log).await;
    Binary {
        child,
        address,
        logs,
    }
}

async fn post(address: &str, body: Value) -> reqwest::StatusCode {
    post_to(address, "", body).await
}

/// POSTs readings with `query` (`?async=true`: accepted into memory, 202).
async fn post_to(address: &str, query: &str, body: Value) -> reqwest::StatusCode {
    http_client()
        .post(format!("{address}/api/v1/readings{query}"))
        .json(&body)
        .send()
        .await
        .expect("sent")
        .status()
}

fn readings(sensor: &str, from: i64, n: i64) -> Value {
    Value::Array(
        (0..n)
            .map(|i| reading(sensor, "m", from + i, i as f64))
            .collect(),
    )
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// A storage outage with the journal on: writes fail, readings pile up in
/// memory to its bound, then wait on disk, and each rule about it shows.
#[tokio::test]
async fn a_storage_outage_raises_the_outage_pending_and_waiting_on_disk_alerts() {
    let mut db = Database::start().await;
    let mut settings = db.settings();
    settings.journal.enabled = true;
    let app = binary(
        &settings,
        &[("HOURGLASS__BATCHER__MAX_BUFFERED_READINGS", "120000")],
    )
    .await;
    let prometheus = Prometheus::scraping(&app.address).await;
    let t = now() - 20_000;
    assert_eq!(post(&app.address, readings("before", t, 10)).await, 200);
    prometheus
        .does_not_see(&["HourglassStorageOutage", "HourglassPendingReadingsGrowing"])
        .await;
    db.stop();
    // Acknowledged once journaled, outage or not.
    for k in 0..14 {
        let sensor = format!("s{k}");
        assert_eq!(post(&app.address, readings(&sensor, t, 10_000)).await, 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    prometheus.sees("HourglassStorageOutage").await;
    prometheus.sees("HourglassPendingReadingsGrowing").await;
    prometheus.sees("HourglassReadingsWaitOnDisk").await;
}

/// Readings storage refuses for good are dead-lettered; the rule counts them.
#[tokio::test]
async fn readings_storage_refuses_for_good_raise_the_dead_letters_alert() {
    let db = Database::start().await;
    let app = binary(&db.settings(), &[]).await;
    let prometheus = Prometheus::scraping(&app.address).await;
    db.fail_point(doc! {
        "mode": "alwaysOn",
        "data": { "failCommands": ["update"], "errorCode": 54321 },
    })
    .await;
    assert_eq!(
        post(&app.address, readings("refused", now() - 600, 12)).await,
        422
    );
    prometheus.sees("HourglassDeadLetters").await;
}

/// A broker that does not answer: the MQTT rule shows.
#[tokio::test]
async fn a_broker_out_of_reach_raises_the_mqtt_disconnected_alert() {
    let mut settings = test_settings();
    settings.mqtt.enabled = true;
    settings.mqtt.url = format!("mqtt://127.0.0.1:{}", free_port());
    settings.mqtt.client_id = format!("alerts-{}", uuid::Uuid::new_v4().simple());
    let app = binary(&settings, &[]).await;
    let prometheus = Prometheus::scraping(&app.address).await;
    prometheus.sees("HourglassMqttDisconnected").await;
}

/// New series past the hourly bound are refused (429); the rule shows.
#[tokio::test]
async fn new_series_past_the_bound_raise_the_new_series_refused_alert() {
    let app = binary(
        &test_settings(),
        &[("HOURGLASS__CARDINALITY__MAX_NEW_SERIES_PER_HOUR", "3")],
    )
    .await;
    let prometheus = Prometheus::scraping(&app.address).await;
    let t = now() - 60;
    let mut refused = false;
    for k in 0..10 {
        let status = post(&app.address, readings(&format!("new-{k}"), t, 1)).await;
        refused |= status == 429;
    }
    assert!(refused, "the bound refused some series");
    prometheus.sees("HourglassNewSeriesRefused").await;
}

/// Hours written late whose roll-up cannot finish (the markers cannot be
/// removed): the late-hours rule shows.
#[tokio::test]
async fn hours_that_wait_to_be_rolled_up_raise_the_late_hours_alert() {
    let db = Database::start().await;
    db.fail_point(doc! {
        "mode": "alwaysOn",
        "data": { "failCommands": ["delete"], "errorCode": 2 },
    })
    .await;
    let app = binary(&db.settings(), &[]).await;
    let prometheus = Prometheus::scraping(&app.address).await;
    let end = now() - now().rem_euclid(3600) - 3600;
    let body: Vec<Value> = (0..36)
        .map(|i| reading("late", "m", end - 3 * 3600 + i * 300, 1.0))
        .collect();
    assert_eq!(post(&app.address, Value::Array(body)).await, 200);
    prometheus.sees("HourglassLateHoursNotRolledUp").await;
}

/// The `.log` segments of a journal directory, oldest first.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the journal's directory")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

/// A journal damaged on disk between two runs: the start that finds it is
/// scraped after the count was raised, and the rule still shows.
#[tokio::test]
async fn a_journal_found_damaged_at_start_raises_the_journal_damaged_alert() {
    let settings = journal_settings();
    let mut first = binary(&settings, crate::journal::HOLD_EVERYTHING).await;
    let t = now() - 300;
    for k in 0..3 {
        assert_eq!(
            post(&first.address, readings(&format!("j{k}"), t, 70)).await,
            200
        );
    }
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");
    let segment = segments(&settings.journal.dir)
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .expect("a segment");
    let mut bytes = std::fs::read(&segment).expect("read the segment");
    // Inside the second of three records.
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&segment, bytes).expect("write the segment");
    let second = binary(&settings, &[]).await;
    assert!(metric(&second.address, "hourglass_journal_damaged_ranges_total").await >= 1.0);
    let prometheus = Prometheus::scraping(&second.address).await;
    prometheus.sees("HourglassJournalDamaged").await;
}

/// The records of losses beside a journal directory.
fn loss_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("UNSTORED-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A stop that passes its deadline with readings accepted into memory (the
/// journal off, storage out) cannot be scraped any more: it leaves a record beside
/// the journal, and the next start reports it, where the rule sees it.
#[tokio::test]
async fn readings_a_stop_could_not_store_are_reported_by_the_next_start_and_alerted() {
    let db = Database::start().await;
    let settings = db.settings();
    let first = binary(&settings, &[("HOURGLASS__SHUTDOWN__TIMEOUT", "1s")]).await;
    let t = now() - 600;
    // Registered while storage takes writes: a new sensor's registration
    // goes ahead of its readings and would refuse the request.
    assert_eq!(post(&first.address, readings("lost", t, 1)).await, 200);
    // Storage takes nothing from here on, not even the record of the loss.
    db.fail_point(doc! {
        "mode": "alwaysOn",
        "data": { "failCommands": ["update", "insert"], "errorCode": 91 },
    })
    .await;
    // Accepted into memory (202): with the journal off, that is all it has.
    assert_eq!(
        post_to(&first.address, "?async=true", readings("lost", t + 1, 20)).await,
        202
    );
    let mut first = first;
    assert!(
        !terminate(&mut first.child).success(),
        "a stop that stored nothing fails"
    );
    let records = loss_files(&settings.journal.dir);
    assert_eq!(records.len(), 1, "a record beside the journal");
    assert_eq!(
        std::fs::read_to_string(&records[0]).expect("readable"),
        "20\n"
    );
    db.fail_point(doc! { "mode": "off" }).await;
    let second = binary(&settings, &[]).await;
    eventually(WAIT, "the start counts the loss", || async {
        metric(&second.address, "hourglass_readings_unstored_total").await == 20.0
    })
    .await;
    assert!(
        loss_files(&settings.journal.dir).is_empty(),
        "reported once"
    );
    let prometheus = Prometheus::scraping(&second.address).await;
    prometheus.sees("HourglassReadingsUnstored").await;
}

/// The database's record: a stop with storage up but its writes failing
/// leaves the record there, and exactly one later start claims it.
#[tokio::test]
async fn a_loss_recorded_in_the_database_is_reported_once_by_the_next_start() {
    let db = Database::start().await;
    let settings = db.settings();
    let mut first = binary(&settings, &[("HOURGLASS__SHUTDOWN__TIMEOUT", "1s")]).await;
    let t = now() - 600;
    assert_eq!(post(&first.address, readings("lost", t, 1)).await, 200);
    db.fail_point(doc! {
        "mode": "alwaysOn",
        // Interrupted: an outage to the service, retried; the server stays
        // selectable (a ShutdownInProgress would make the driver drop it).
        "data": { "failCommands": ["update"], "errorCode": 11601 },
    })
    .await;
    assert_eq!(
        post_to(&first.address, "?async=true", readings("lost", t + 1, 7)).await,
        202
    );
    assert!(!terminate(&mut first.child).success());
    assert!(
        loss_files(&settings.journal.dir).is_empty(),
        "the database took it: {}",
        first.log()
    );
    db.fail_point(doc! { "mode": "off" }).await;
    let second = binary(&settings, &[]).await;
    eventually(WAIT, "the start counts the loss", || async {
        metric(&second.address, "hourglass_readings_unstored_total").await == 7.0
    })
    .await;
    let left = mongo_client(&db.uri())
        .await
        .database(&settings.mongodb.database)
        .collection::<mongodb::bson::Document>(&settings.mongodb.metadata_collection)
        .count_documents(doc! { "_id": { "$regex": "^unstored:" } })
        .await
        .expect("counted");
    assert_eq!(
        left, 0,
        "the record is claimed, so no later start reports it"
    );
}

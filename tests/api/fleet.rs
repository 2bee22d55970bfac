//! A fleet, through the service: 200 sensors live and backfilled over more
//! than a 30-day period, written round robin by two instances in requests
//! that each touch every sensor, at both granularities. Afterwards every
//! rollup level is there and equals its buckets, and per-sensor, group and
//! PromQL answers over hours, days and 30-day periods equal the truth.
//!
//! Below 65 sensors a flush once recomputed rollups per sensor; above, by
//! time range alone, through a filter the test stand-in mishandled, and
//! long ranges dropped data. A fleet of three would not have shown it.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::rollup_checks::assert_rollups_match_buckets;

const SENSORS: usize = 200;
const SITES: usize = 4;
const DAY: i64 = 86_400;
const PERIOD: i64 = 30 * DAY;

fn sensor(i: usize) -> String {
    format!("fl-{i:03}")
}

fn site(i: usize) -> String {
    format!("s{}", i % SITES)
}

/// Every reading written: `(sensor index, ts) → value`.
type Truth = BTreeMap<(usize, i64), f64>;

/// Count, sum, min and max of the readings of `sensors` in `[from, to)`.
fn truth_of(
    truth: &Truth,
    sensors: impl Fn(usize) -> bool,
    from: i64,
    to: i64,
) -> (u64, f64, Option<f64>, Option<f64>) {
    let values: Vec<f64> = truth
        .iter()
        .filter(|((i, ts), _)| sensors(*i) && *ts >= from && *ts < to)
        .map(|(_, v)| *v)
        .collect();
    (
        values.len() as u64,
        values.iter().sum(),
        values.iter().copied().reduce(f64::min),
        values.iter().copied().reduce(f64::max),
    )
}

fn assert_answer(got: &Value, want: (u64, f64, Option<f64>, Option<f64>), what: &str) {
    assert_eq!(got["count"].as_u64(), Some(want.0), "{what}: {got}");
    assert_eq!(got["sum"].as_f64(), Some(want.1), "{what}: {got}");
    assert_eq!(got["min"].as_f64(), want.2, "{what}: {got}");
    assert_eq!(got["max"].as_f64(), want.3, "{what}: {got}");
}

fn fleet_settings(g: Granularity) -> hourglass::Settings {
    let mut s = settings_with(g);
    s.ingest.max_age = Duration::from_secs(400 * 86_400);
    s.http.write_timeout = Duration::from_secs(300);
    s.http.request_timeout = Duration::from_secs(330);
    s.query.timeout = Duration::from_secs(120);
    s
}

/// The readings: per sensor one every three days (phase by sensor) from two
/// days before the last whole 30-day period to yesterday, a two-hour slice
/// every ten minutes, and fifteen live readings of the last five minutes.
/// Values are whole numbers, so sums are exact in any order.
fn readings(now: i64) -> (Truth, i64, i64) {
    let period = now - now.rem_euclid(PERIOD) - PERIOD;
    let slice = now - 2 * DAY - (now - 2 * DAY).rem_euclid(3600) + 17;
    let mut truth = Truth::new();
    for i in 0..SENSORS {
        let phase = (i as i64 * 7919) % (3 * DAY);
        let mut ts = period - 2 * DAY + phase;
        while ts < now - DAY {
            truth.insert((i, ts), ((ts / 61 + i as i64) % 97) as f64);
            ts += 3 * DAY;
        }
        for k in 0..12 {
            let ts = slice + k * 600 + (i as i64 % 7);
            truth.insert((i, ts), (k * 3 + i as i64 % 11) as f64);
        }
        for k in 0..15 {
            let ts = now - 300 + k * 20 + (i as i64 % 19);
            truth.insert((i, ts), (k + i as i64 % 13) as f64 - 6.0);
        }
    }
    (truth, period, slice)
}

async fn write_round_robin(apps: [&TestApp; 2], truth: &Truth) {
    let all: Vec<Value> = truth
        .iter()
        .map(|(&(i, ts), &v)| reading(&sensor(i), "temp", ts, v))
        .collect();
    // Requests of 5000 readings in time order: each touches every sensor.
    for (k, chunk) in all.chunks(5000).enumerate() {
        let app = apps[k % 2];
        let r = app.post_readings(&Value::Array(chunk.to_vec())).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
}

async fn label_sites(app: &TestApp) {
    for i in 0..SENSORS {
        let r = app
            .client
            .put(format!(
                "{}/api/v1/sensors/{}/labels",
                app.address,
                sensor(i)
            ))
            .json(&json!({ "site": site(i) }))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 204);
    }
}

/// The value of a PromQL instant vector, by the value of `label`.
async fn promql_by(app: &TestApp, query: &str, time: i64, label: &str) -> BTreeMap<String, f64> {
    let q: String = url::form_urlencoded::byte_serialize(query.as_bytes()).collect();
    let r = app
        .get(&format!("/prometheus/api/v1/query?query={q}&time={time}"))
        .await;
    assert_eq!(r.status(), 200, "{query}");
    let body: Value = r.json().await.expect("json");
    body["data"]["result"]
        .as_array()
        .expect("a vector")
        .iter()
        .map(|s| {
            (
                s["metric"][label].as_str().unwrap_or_default().to_owned(),
                s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .expect("a value"),
            )
        })
        .collect()
}

async fn fleet_is_answered_exactly(g: Granularity) {
    let one = spawn_app_with(fleet_settings(g)).await;
    let mut s = one.settings.clone();
    s.journal.dir = journal_dir();
    let two = spawn_app_with(s).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let (truth, period, slice) = readings(now);
    write_round_robin([&one, &two], &truth).await;
    label_sites(&one).await;

    // Every level is there (buckets, then hour, day and 30-day rollups)
    // and each sub-period equals its buckets.
    assert_rollups_match_buckets(&one, g).await;

    let hour = slice - slice.rem_euclid(3600);
    let ranges = [
        ("the whole 30-day period", period, period + PERIOD),
        ("a day of it", period + 4 * DAY, period + 5 * DAY),
        ("an hour of the slice", hour, hour + 3600),
        ("the issue's range", now - 2 * DAY, now + DAY),
        ("everything", period - 3 * DAY, now + 3600),
        ("unaligned", period + 12_345, period + PERIOD + 777),
        ("the live minutes", now - 400, now + 60),
    ];
    for (what, from, to) in ranges {
        for i in [0, 7, 63, 64, 65, 130, 199] {
            let got = one
                .get_json(&format!(
                    "/api/v1/sensors/{}/average?metric=temp&from={}&to={}",
                    sensor(i),
                    rfc3339(from),
                    rfc3339(to)
                ))
                .await;
            assert_answer(&got, truth_of(&truth, |s| s == i, from, to), what);
        }
        let got = two
            .get_json(&format!(
                "/api/v1/average?metric=temp&group_by=label.site&from={}&to={}",
                rfc3339(from),
                rfc3339(to)
            ))
            .await;
        let groups = got["groups"].as_array().expect("groups");
        assert_eq!(groups.len(), SITES, "{what}: {got}");
        for (k, group) in groups.iter().enumerate() {
            assert_eq!(group["group"], json!({ "site": format!("s{k}") }));
            assert_eq!(group["sensors"].as_u64(), Some((SENSORS / SITES) as u64));
            let want = truth_of(&truth, |s| s % SITES == k, from, to);
            assert_answer(group, want, &format!("{what}, site s{k}"));
        }
    }

    // PromQL, left-open windows: (t − range, t] holds seconds t − range + 1 ..= t.
    let t = period + PERIOD;
    let got = promql_by(&two, "sum by (site) (sum_over_time(temp[30d]))", t, "site").await;
    for k in 0..SITES {
        let want = truth_of(&truth, |s| s % SITES == k, t - PERIOD + 1, t + 1).1;
        assert_eq!(got.get(&format!("s{k}")), Some(&want), "30 days, site s{k}");
    }
    let t = hour + 3600;
    let got = promql_by(&one, "count_over_time(temp[1h])", t, "sensor").await;
    for i in [0, 64, 65, 199] {
        let want = truth_of(&truth, |s| s == i, t - 3600 + 1, t + 1).0 as f64;
        assert_eq!(got.get(&sensor(i)), Some(&want), "an hour, {}", sensor(i));
    }
    let t = period + 10 * DAY;
    let got = promql_by(&one, "max by (site) (max_over_time(temp[1d]))", t, "site").await;
    for k in 0..SITES {
        let want = truth_of(&truth, |s| s % SITES == k, t - DAY + 1, t + 1).3;
        assert_eq!(got.get(&format!("s{k}")).copied(), want, "a day, site s{k}");
    }
    // Where the server scans a `$in` of sensors (the stand-in), the reads of
    // the whole fleet above went as one find by metric and time, and held.
    let mut scans = 0.0;
    let mut by_time = 0.0;
    for app in [&one, &two] {
        scans += counted(app, "hourglass_store_read_shape", "per_series").await;
        by_time += counted(app, "hourglass_store_level_reads_total", "time_first").await;
    }
    if scans > 0.0 {
        assert!(by_time > 0.0, "no read of the fleet went by time");
    } else {
        assert_eq!(by_time, 0.0, "MongoDB's reads stay one $in");
    }
    one.stop().await.expect("clean stop");
    two.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_fleet_of_200_sensors_is_answered_exactly_at_every_level_with_minute_buckets() {
    fleet_is_answered_exactly(Granularity::Minute).await;
}

#[tokio::test]
async fn a_fleet_of_200_sensors_is_answered_exactly_at_every_level_with_hour_buckets() {
    fleet_is_answered_exactly(Granularity::Hour).await;
}

/// A counter of `/metrics`, summed over the series whose labels contain `with`.
pub async fn counted(app: &TestApp, name: &str, with: &str) -> f64 {
    let text = app.get("/metrics").await.text().await.expect("metrics");
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Late readings of 65 sensors in a fleet of 10 000: the rollup upkeep of
/// that flush reads and writes in proportion to the 65, not the fleet.
#[tokio::test]
async fn a_flush_of_65_late_sensors_in_a_fleet_of_10000_does_rollup_work_for_65() {
    let app = spawn_app_with(fleet_settings(Granularity::Minute)).await;
    // The fleet: 10 000 sensors in the current hour (still open: nothing to
    // roll up yet). Near an hour's end, wait for the next one, so the hour
    // stays open for the whole test.
    let mut now = time::OffsetDateTime::now_utc().unix_timestamp();
    let left = 3600 - now.rem_euclid(3600);
    if left < 240 {
        tokio::time::sleep(Duration::from_secs(left as u64 + 2)).await;
        now = time::OffsetDateTime::now_utc().unix_timestamp();
    }
    let hour_start = now - now.rem_euclid(3600);
    let live: Vec<Value> = (0..10_000)
        .map(|i| {
            let ts = (now - 30 - i % 20).max(hour_start);
            reading(&format!("big-{i:05}"), "temp", ts, 1.0)
        })
        .collect();
    for chunk in live.chunks(5000) {
        let r = app.post_readings(&Value::Array(chunk.to_vec())).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
    let written = |what| counted(&app, "hourglass_db_documents_written_total", what);
    let read = |what| counted(&app, "hourglass_db_documents_read_total", what);
    let driver_cpu = || counted(&app, "hourglass_mongodb_driver_cpu_seconds_total", "");
    let before = (
        written("rollups").await,
        read("kind=\"rollup_upkeep\"").await,
        driver_cpu().await,
    );
    // 65 of them send readings of an hour two days ago.
    let late_hour = base_time() + 3 * 3600;
    let late: Vec<Value> = (0..65)
        .flat_map(|i| {
            let sensor = format!("big-{:05}", i * 150);
            (0..3).map(move |k| reading(&sensor, "temp", late_hour + k * 700 + i, 2.0))
        })
        .collect();
    let r = app.post_readings(&Value::Array(late)).await;
    assert_eq!(r.status(), 200);
    app.late_rolled_up().await;
    let written = written("rollups").await - before.0;
    let read = read("kind=\"rollup_upkeep\"").await - before.1;
    // An hour document, a day document's slot and a 30-day document's slot
    // (the day has ended) for each of the 65.
    assert_eq!(written, 3.0 * 65.0, "rollup documents written");
    // Their buckets of the hour and of the rest of their thirty days (to
    // complete them), their day and 30-day documents: none of the 9 935 others.
    assert!(read <= 65.0 * 8.0, "{read} documents read for 65 sensors");
    // The driver's CPU for those writes and reads is told apart.
    assert!(driver_cpu().await > before.2, "the driver's CPU is counted");
    app.stop().await.expect("clean stop");
}

/// The registry's writes are counted like every other: a new series is
/// registered as it is accepted, its first flush sets its `last_seen`, a
/// flush of a newer hour moves it, and a flush of an hour already known
/// writes nothing.
#[tokio::test]
async fn every_registry_write_is_counted_once_per_series_and_new_hour() {
    let app = spawn_app().await;
    let registry = || {
        counted(
            &app,
            "hourglass_db_documents_written_total",
            "kind=\"registry_update\"",
        )
    };
    let hour = base_time() + 3 * 3600;
    let batch = |start: i64| {
        Value::Array(
            (0..3)
                .flat_map(|i| {
                    let sensor = format!("reg-{i}");
                    (0..2).map(move |k| reading(&sensor, "temp", start + 60 * k, 1.0))
                })
                .collect(),
        )
    };
    let before = registry().await;
    for (start, expected) in [(hour, 6.0), (hour + 600, 6.0), (hour + 3600, 9.0)] {
        let r = app.post_readings(&batch(start)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        // The registration of new series may land after the answer (it
        // waits for it at most 2 s), never twice.
        eventually(
            Duration::from_secs(10),
            &format!("{expected} registry documents written after the flush of {start}"),
            || async { registry().await - before == expected },
        )
        .await;
    }
    assert_eq!(registry().await - before, 9.0, "nothing more");
    let listed = app.get_json("/api/v1/sensors?prefix=reg-").await;
    assert_eq!(listed["sensors"][0]["last_seen"], rfc3339(hour + 3600));
    // Labels are written to the registry too, and counted apart.
    let labels = || {
        counted(
            &app,
            "hourglass_db_documents_written_total",
            "kind=\"labels\"",
        )
    };
    let before = labels().await;
    let r = crate::rollup_checks::put_labels(&app, "reg-0", json!({ "site": "berlin" })).await;
    assert_eq!(r.status(), 204);
    assert_eq!(labels().await - before, 1.0, "a label write is counted");
    app.stop().await.expect("clean stop");
}

/// A backfill in time order, one request (one flush) per minute of an hour
/// that has ended: the upkeep reads the buckets the flushes wrote and the
/// hour documents, not the hour's earlier buckets again (rolling the hour
/// up whole after each flush made a backfill's upkeep quadratic in the
/// hour: 91 500 bucket reads here); and the flushes only mark the hour
/// late, so it is rolled up once a minute and at each pause of the writes
/// (how often depends on the machine's load: not asserted beyond one per
/// flush), and what each pass reads is bounded. A pass clears the marker
/// generations it read, so the next one reads about what was marked since,
/// even while the backfill goes on (with one field per entry, a backfill
/// going on through 6 passes read 15 881).
#[tokio::test]
async fn a_backfill_in_time_order_rereads_only_what_each_flush_wrote() {
    let app = spawn_app_with(fleet_settings(Granularity::Minute)).await;
    let hour = base_time() + 5 * 3600;
    let read = |what| counted(&app, "hourglass_db_documents_read_total", what);
    let before = read("collection=\"buckets\",kind=\"rollup_upkeep\"").await;
    let jobs_before = counted(&app, "hourglass_rollup_hours_total", "").await;
    let started = std::time::Instant::now();
    for minute in 0..60 {
        let body: Vec<Value> = (0..50)
            .flat_map(|i| {
                let sensor = format!("bf-{i:02}");
                (0..3).map(move |k| {
                    reading(
                        &sensor,
                        "temp",
                        hour + minute * 60 + k * 17 + i % 5,
                        (minute + k) as f64,
                    )
                })
            })
            .collect();
        let r = app.post_readings(&Value::Array(body)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
    app.late_rolled_up().await;
    let read = read("collection=\"buckets\",kind=\"rollup_upkeep\"").await - before;
    let rolled = counted(&app, "hourglass_rollup_hours_total", "").await - jobs_before;
    // 60 flushes of 50 series into one hour: a roll-up per series a minute
    // while the writes go on and each time they pause for
    // `late_rollup_after`, never one per flush and series more; how many
    // passes that is depends on the machine's load (1 on an idle machine, 7
    // in a slow CI run). Each pass reads what was marked since the
    // generations it cleared: measured 5 250 buckets in 4 passes and 12 400
    // in 7, where one field per entry read 15 881 in 6.
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    eprintln!(
        "backfill upkeep: {read} buckets read, {rolled} series-hours rolled up in {minutes:.1} min"
    );
    assert!(
        rolled <= 50.0 * 60.0,
        "{rolled} series-hours rolled up for 60 flushes of 50 series"
    );
    assert!(read <= 60.0 * rolled, "{read} buckets read by the upkeep");
    // The first pass reads the hour's buckets so far (at most 3 000), each
    // later one about what the flushes of the last minute or two wrote
    // (measured 1 300–1 600 a pass beyond the first; one field per entry
    // read 2 150 a pass, and more the longer the backfill).
    let passes = rolled / 50.0;
    assert!(
        read <= 3000.0 + 2000.0 * passes,
        "{read} buckets read by the upkeep in {passes} passes"
    );
    crate::rollup_checks::assert_rollups_match_buckets(&app, Granularity::Minute).await;
    app.stop().await.expect("clean stop");
}

/// A late hour is rolled up once per flush that writes into it, after that
/// flush: the first flush's hour is rolled up as soon as it is written;
/// then the server holds the second flush's bucket write for 15 s (a slow
/// database, longer than `late_rollup_after`), and the hour is rolled up
/// once more, after that flush, not during it.
#[tokio::test]
async fn a_late_hour_is_rolled_up_once_when_a_flush_into_it_outlasts_the_quiet() {
    let mut db = crate::database::Database::start().await;
    let mut settings = fleet_settings(Granularity::Minute);
    settings.mongodb.uri = db.uri().into();
    // Room before the marker is due, so the second flush starts first.
    settings.buckets.late_rollup_after = Duration::from_secs(5);
    let app = spawn_app_with(settings).await;
    let hour = base_time() + 9 * 3600;
    let r = app
        .post_readings(&json!([reading("qf-0", "temp", hour + 5, 1.0)]))
        .await;
    assert_eq!(r.status(), 200);
    let rolled = || counted(&app, "hourglass_rollup_hours_total", "");
    app.late_rolled_up().await;
    let before = rolled().await;
    assert!(before >= 1.0, "the first flush's hour is rolled up");
    app.db
        .client()
        .database("admin")
        .run_command(mongodb::bson::doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["update"], "blockConnection": true, "blockTimeMS": 15_000 },
        })
        .await
        .expect("the server takes the fail point");
    let r = app
        .post_readings(&json!([reading("qf-0", "temp", hour + 65, 2.0)]))
        .await;
    assert_eq!(r.status(), 200);
    app.late_rolled_up().await;
    assert_eq!(
        rolled().await - before,
        1.0,
        "rolled up once, after the flush"
    );
    assert_rollups_match_buckets(&app, Granularity::Minute).await;
    app.stop().await.expect("clean stop");
    db.stop();
}

/// A late write into an hour whose slots are complete: until the hour is
/// rolled up again its marker sends queries to the buckets, so every answer
/// (JSON, group, PromQL) holds the new readings at once; then the rollups
/// equal their buckets. Without the marker the stale slots would answer.
#[tokio::test]
async fn answers_hold_a_late_write_before_its_hour_is_rolled_up_again() {
    let mut settings = fleet_settings(Granularity::Minute);
    settings.buckets.late_rollup_after = Duration::from_secs(20);
    let app = spawn_app_with(settings).await;
    let hour = base_time() + 7 * 3600;
    let first: Vec<Value> = (0..6)
        .flat_map(|i| {
            let sensor = format!("lw-{i}");
            (0..30).map(move |k| reading(&sensor, "temp", hour + k * 120 + i, 1.0))
        })
        .collect();
    let r = app.post_readings(&Value::Array(first)).await;
    assert_eq!(r.status(), 200);
    app.late_rolled_up().await;
    // Rolled up and complete: a day's answer now comes from slots.
    let day = hour - hour.rem_euclid(86_400);
    let (from, to) = (rfc3339(day), rfc3339(day + 86_400));
    let avg =
        |sensor: &str| format!("/api/v1/sensors/{sensor}/average?metric=temp&from={from}&to={to}");
    let before = app.get_json(&avg("lw-0")).await;
    assert_eq!(before["count"], 30);
    // The late write: ten more readings and one overwritten, for lw-0..2.
    let late: Vec<Value> = (0..3)
        .flat_map(|i| {
            let sensor = format!("lw-{i}");
            let overwrite = reading(&sensor, "temp", hour + i, 3.0);
            (0..10)
                .map(move |k| reading(&sensor, "temp", hour + 60 + k * 120 + i, 5.0))
                .chain(std::iter::once(overwrite))
        })
        .collect();
    let r = app.post_readings(&Value::Array(late)).await;
    assert_eq!(r.status(), 200);
    let late_docs = app
        .documents(
            &app.settings.mongodb.late_collection,
            mongodb::bson::doc! {},
        )
        .await;
    assert!(!late_docs.is_empty(), "the hour is marked late");
    let got = app.get_json(&avg("lw-0")).await;
    assert_eq!(got["count"], 40, "{got}");
    assert_eq!(got["sum"], 29.0 + 3.0 + 50.0, "{got}");
    assert_eq!(got["max"], 5.0, "{got}");
    let untouched = app.get_json(&avg("lw-4")).await;
    assert_eq!(untouched["count"], 30, "{untouched}");
    let prom = app
        .get_json(&format!(
            "/prometheus/api/v1/query?query=sum(sum_over_time(temp[2d]))&time={}",
            day + 86_400
        ))
        .await;
    let total = prom["data"]["result"][0]["value"][1]
        .as_str()
        .expect("a value")
        .parse::<f64>()
        .expect("a number");
    assert_eq!(total, 6.0 * 30.0 + 3.0 * (2.0 + 50.0), "{prom}");
    app.late_rolled_up().await;
    assert_eq!(app.get_json(&avg("lw-0")).await, got);
    assert_rollups_match_buckets(&app, Granularity::Minute).await;
    app.stop().await.expect("clean stop");
}

/// A PromQL range query's answer per sensor index, with the documents read
/// and the round trips it took.
async fn panel(
    app: &TestApp,
    query: &str,
    start: i64,
    end: i64,
    step: i64,
) -> (BTreeMap<usize, BTreeMap<i64, f64>>, f64, f64) {
    let trips_before = counted(app, "hourglass_query_round_trips_sum", "promql_range").await;
    let docs_before = counted(app, "hourglass_query_documents_read_sum", "promql_range").await;
    let q: String = url::form_urlencoded::byte_serialize(query.as_bytes()).collect();
    let got = app
        .get_json(&format!(
            "/prometheus/api/v1/query_range?query={q}&start={start}&end={end}&step={step}"
        ))
        .await;
    let trips =
        counted(app, "hourglass_query_round_trips_sum", "promql_range").await - trips_before;
    let docs =
        counted(app, "hourglass_query_documents_read_sum", "promql_range").await - docs_before;
    let result = got["data"]["result"].as_array().expect("a matrix");
    let mut out = BTreeMap::new();
    for series in result {
        let sensor = series["metric"]["sensor"].as_str().expect("sensor");
        let i: usize = sensor[3..].parse().expect("index");
        let values: BTreeMap<i64, f64> = series["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|p| {
                (
                    p[0].as_i64().expect("time"),
                    p[1].as_str().and_then(|v| v.parse().ok()).expect("value"),
                )
            })
            .collect();
        out.insert(i, values);
    }
    (out, docs, trips)
}

/// Prometheus 3's `increase` over the readings of sensor `i` in
/// `(t − range, t]`, by its definition: the reset-corrected change,
/// extrapolated towards the window's ends (not past zero for a counter):
/// Prometheus' `extrapolatedRate`, written again from its definition.
fn increase_of(truth: &Truth, i: usize, t: i64, range: i64) -> Option<f64> {
    let points: Vec<(f64, f64)> = truth
        .range((i, t - range + 1)..=(i, t))
        .map(|(&(_, ts), &v)| (ts as f64, v))
        .collect();
    let (&(t1, first), &(tn, last)) = (points.first()?, points.last()?);
    if points.len() < 2 {
        return None;
    }
    let mut result = last - first;
    for w in points.windows(2) {
        if w[1].1 < w[0].1 {
            result += w[0].1;
        }
    }
    let sampled = tn - t1;
    let average = sampled / (points.len() - 1) as f64;
    let threshold = average * 1.1;
    let mut to_start = t1 - (t - range) as f64;
    if to_start >= threshold {
        to_start = average / 2.0;
    }
    // Prometheus 3 takes the zero point after the threshold (2.x before).
    if result > 0.0 && first >= 0.0 {
        to_start = to_start.min(sampled * (first / result));
    }
    let mut to_end = t as f64 - tn;
    if to_end >= threshold {
        to_end = average / 2.0;
    }
    Some(result * (sampled + to_start + to_end) / sampled)
}

/// A Grafana panel over a fleet: 100 sensors, windows as long as the step,
/// the start aligned to it, readings on the windows' edges among them.
/// Every value equals a brute-force sum of the left-open windows; the panel
/// reads about one document per series and day, in a few round trips.
#[tokio::test]
async fn a_fleet_panel_is_exact_at_window_edges_and_reads_a_document_per_series_and_day() {
    let app = spawn_app_with(fleet_settings(Granularity::Minute)).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let day0 = now - now.rem_euclid(DAY) - 3 * DAY;
    let mut truth = Truth::new();
    for i in 0..100 {
        for h in (0..48).step_by(2) {
            // On the hour (a window's right end) and inside the next.
            let at = day0 + h * 3600;
            truth.insert((i, at), (h + i as i64 % 5) as f64);
            truth.insert((i, at + 1800 + i as i64), (i % 7) as f64);
        }
    }
    let mut all: Vec<Value> = truth
        .iter()
        .map(|(&(i, ts), &v)| reading(&format!("pn-{i:03}"), "temp", ts, v))
        .collect();
    // A series with nothing in the panel's range (its readings are days
    // older) asks the finer levels for all of it, and must not make the
    // others read all of theirs.
    all.extend((0..24).map(|h| reading("pn-old", "temp", day0 - 5 * DAY + h * 3600, 1.0)));
    for chunk in all.chunks(5000) {
        let r = app.post_readings(&Value::Array(chunk.to_vec())).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
    // The bounds are the rolled-up state's: until then the hours written
    // late are read from their buckets.
    app.late_rolled_up().await;
    let (start, end) = (day0 + 3600, day0 + 47 * 3600);
    let (got, docs, trips) = panel(&app, "sum_over_time(temp[1h])", start, end, 3600).await;
    assert_eq!(got.len(), 100, "every series");
    for (&i, values) in &got {
        // (t − 1h, t]: the reading on t counts, the one on t − 1h does not.
        let want: BTreeMap<i64, f64> = (start..=end)
            .step_by(3600)
            .filter_map(|t| {
                let (count, sum, _, _) = truth_of(&truth, |s| s == i, t - 3600 + 1, t + 1);
                (count > 0).then_some((t, sum))
            })
            .collect();
        assert_eq!(*values, want, "sensor {i}");
    }
    // Two days of day documents per series (and the ends), read in a few
    // round trips for all 100 series.
    // A `$in` per read, or where the server scans a `$in`, a find per series
    // for each of those reads (at most four here: days, hours, buckets and
    // the readings at a window's ends).
    let per_series = counted(&app, "hourglass_store_read_shape", "per_series").await == 1.0;
    let trip_budget = if per_series { 100.0 * 4.0 + 10.0 } else { 10.0 };
    eprintln!("fleet panel: {docs} documents, {trips} round trips");
    assert!(docs <= 1.5 * 100.0 * (2.0 + 2.0), "{docs} documents");
    assert!(trips <= trip_budget, "{trips} round trips");

    // A meter panel: the same readings as counters (with resets), two
    // readings in each 2 h window, answered from the slots' first and last
    // readings and reset-corrected increase at the same cost.
    let (got, docs, trips) = panel(&app, "increase(temp[2h])", start, end, 3600).await;
    assert_eq!(got.len(), 100, "every series");
    for (&i, values) in &got {
        let want: BTreeMap<i64, f64> = (start..=end)
            .step_by(3600)
            .filter_map(|t| Some((t, increase_of(&truth, i, t, 7200)?)))
            .collect();
        assert_eq!(
            values.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "sensor {i}"
        );
        for (t, v) in values {
            let w = want[t];
            assert!(
                (v - w).abs() <= 1e-9 * v.abs().max(w.abs()).max(1.0),
                "sensor {i} at {t}: {v}, brute force {w}"
            );
        }
    }
    eprintln!("fleet meter panel: {docs} documents, {trips} round trips");
    assert!(docs <= 1.5 * 100.0 * (2.0 + 2.0), "{docs} documents");
    assert!(trips <= trip_budget, "{trips} round trips");
    app.stop().await.expect("clean stop");
}

//! The query engine end to end: rollups kept exact by every flush and
//! rebuilt from buckets, calendar days in time zones, the sensor registry,
//! latest values, groups, CSV, timeouts and the OpenAPI document.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{Bson, Document, doc};
use serde_json::{Value, json};

use crate::database::Database;
use crate::helpers::*;

/// Settings that accept readings up to 400 days old (the longest range),
/// with room for requests that each touch hundreds of buckets on a slow,
/// shared test server.
fn long_settings(g: Granularity) -> hourglass::Settings {
    let mut s = settings_with(g);
    // The daylight saving test writes readings on fixed past dates: a bound
    // of a year or so made it a time bomb (it refused them from November
    // 2026). Thirty years keeps those dates writable for decades.
    s.ingest.max_age = Duration::from_secs(30 * 365 * 86_400);
    s
}

async fn post_all(app: &TestApp, readings: &[Value]) {
    for chunk in readings.chunks(250) {
        let r = app.post_readings(&Value::Array(chunk.to_vec())).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
}

fn ts(text: &str) -> i64 {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .expect("a timestamp")
        .unix_timestamp()
}

pub(crate) fn average_path(sensor: &str, metric: &str, from: i64, to: i64) -> String {
    format!(
        "/api/v1/sensors/{sensor}/average?metric={metric}&from={}&to={}",
        rfc3339(from),
        rfc3339(to)
    )
}

pub(crate) fn assert_aggregates(
    got: &Value,
    want: (u64, f64, Option<f64>, Option<f64>),
    what: &str,
) {
    assert_eq!(got["count"].as_u64(), Some(want.0), "{what}: {got}");
    assert_eq!(got["sum"].as_f64(), Some(want.1), "{what}: {got}");
    assert_eq!(got["min"].as_f64(), want.2, "{what}: {got}");
    assert_eq!(got["max"].as_f64(), want.3, "{what}: {got}");
}

/// (sensor, metric, period, start of the slot) of a rollup slot.
type SlotKey = (String, String, String, i64);

/// Count, sum, first and last of a slot's readings.
type SlotFigures = (u64, f64, Option<(i64, f64)>, Option<(i64, f64)>);

const LEVELS: [(&str, i64, i64); 3] = [
    ("hour", 3600, 60),
    ("day", 86_400, 3600),
    ("30d", 30 * 86_400, 86_400),
];

fn levels(g: Granularity) -> &'static [(&'static str, i64, i64)] {
    match g {
        Granularity::Minute => &LEVELS,
        Granularity::Hour => &LEVELS[1..],
    }
}

/// What the rollups say: every complete slot's figures (none for a
/// complete slot without readings), checking that only complete slots
/// hold figures.
async fn complete_slots(app: &TestApp) -> BTreeMap<SlotKey, Option<SlotFigures>> {
    let rollups = app
        .documents(&app.settings.mongodb.rollup_collection, doc! { "start": 1 })
        .await;
    let mut got = BTreeMap::new();
    for r in &rollups {
        assert_eq!(r.get_i32("schema_version"), Ok(3), "{r}");
        let period = r.get_str("period").expect("period").to_owned();
        let (_, len, slot) = *LEVELS
            .iter()
            .find(|l| l.0 == period)
            .expect("a known period");
        let start = r.get_datetime("start").expect("start").timestamp_millis() / 1000;
        let complete = r.get_i64("complete").expect("complete") as u64;
        let slots = r.get_document("s").expect("s");
        let writes = r.get_document("w").cloned().unwrap_or_default();
        for k in 0..len / slot {
            let key = (
                r.get_str("sensor").expect("sensor").to_owned(),
                r.get_str("metric").expect("metric").to_owned(),
                period.clone(),
                start + k * slot,
            );
            let entry = slots.get_binary_generic(k.to_string()).ok();
            if complete & (1 << k) == 0 {
                assert!(entry.is_none(), "an incomplete slot holds figures: {r}");
                continue;
            }
            let figures = entry.map(|bytes| {
                let n = match writes.get(k.to_string()) {
                    Some(Bson::Int32(n)) => *n as u64,
                    Some(Bson::Int64(n)) => *n as u64,
                    None => 1,
                    other => panic!("slot {k}'s write count is {other:?}: {r}"),
                };
                let s = hourglass::pure::rollup_slot_decode(bytes, start + k * slot, n, None)
                    .expect("a readable slot")
                    .summary
                    .expect("a slot with readings");
                (
                    s.count,
                    s.sum,
                    Some((s.first.t, s.first.v)),
                    Some((s.last.t, s.last.v)),
                )
            });
            got.insert(key, figures);
        }
    }
    got
}

/// The first rollup slot that differs from its buckets, or that ended
/// before `settled` and is not rolled up yet: every complete slot equals
/// its buckets, and every slot of a span with readings that ended before
/// `settled` is complete (the computed pattern's invariant, checked on the
/// documents).
async fn rollups_against_buckets(app: &TestApp, g: Granularity, settled: i64) -> Option<String> {
    let values = all_values(&app.buckets().await, g);
    let mut want: BTreeMap<SlotKey, SlotFigures> = BTreeMap::new();
    for ((sensor, metric, t), v) in &values {
        for &(name, _, slot) in levels(g) {
            let start = t - t.rem_euclid(slot);
            let e = want
                .entry((sensor.clone(), metric.clone(), name.to_owned(), start))
                .or_insert((0, 0.0, None, None));
            e.0 += 1;
            e.1 += v;
            e.2 = e.2.or(Some((*t, *v)));
            e.3 = Some((*t, *v));
        }
    }
    let got = complete_slots(app).await;
    for (key, figures) in &got {
        if figures.as_ref() != want.get(key) {
            return Some(format!(
                "rollup slot {key:?} against its buckets: {figures:?} != {:?}",
                want.get(key)
            ));
        }
    }
    for (key, figures) in &want {
        let (_, _, name, start) = key;
        let (_, _, slot) = *LEVELS.iter().find(|l| l.0 == name).expect("known");
        if start + slot <= settled && got.get(key) != Some(&Some(*figures)) {
            return Some(format!(
                "slot {key:?} ended, is it rolled up? {:?} != {figures:?}",
                got.get(key)
            ));
        }
    }
    None
}

/// [`rollups_against_buckets`] holds once every hour that ended a
/// while ago is rolled up (the upkeep rolls up open hours after they end,
/// and hours written late once their writes pause). The upkeep's delay is
/// a lower bound, not a deadline: on a loaded machine it runs later, so
/// the check is given a minute to hold.
pub(crate) async fn assert_rollups_match_buckets(app: &TestApp, g: Granularity) {
    app.late_rolled_up().await;
    let wait = app.settings.buckets.rollup_after + Duration::from_secs(10);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let hour = now - now.rem_euclid(3600);
        // Hours that ended before the upkeep's delay (plus its tick) are done.
        let settled = if now - hour > wait.as_secs() as i64 {
            hour
        } else {
            hour - 3600
        };
        match rollups_against_buckets(app, g, settled).await {
            None => return,
            Some(mismatch) if tokio::time::Instant::now() >= deadline => panic!("{mismatch}"),
            Some(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

#[tokio::test]
async fn rollups_stay_exact_under_overwrites_late_readings_and_two_instances() {
    let g = Granularity::Minute;
    let one = spawn_app_with(long_settings(g)).await;
    // A second instance on the same database, as a scaled-out deployment runs.
    let mut s = one.settings.clone();
    s.journal.dir = journal_dir();
    let two = spawn_app_with(s).await;
    let t = base_time() - 3 * 86_400;
    let mut model: BTreeMap<i64, f64> = BTreeMap::new();
    let mut writes = Vec::new();
    for i in 0..600i64 {
        let at = t + i * 397 % (3 * 86_400);
        writes.push((at, (i % 23) as f64 - 5.0));
    }
    // Overwrites of earlier seconds and late readings for old hours, split
    // between the instances, in rounds.
    for round in 0..3 {
        let app = if round % 2 == 0 { &one } else { &two };
        let mut batch = Vec::new();
        for (i, &(at, v)) in writes.iter().enumerate() {
            if i % 3 == round {
                let v = v + round as f64 * 0.25;
                model.insert(at, v);
                batch.push(reading("r1", "temp", at, v));
            }
        }
        // Overwrite a few seconds written in the previous round.
        for &(at, _) in writes.iter().step_by(7).take(40) {
            if let Some(old) = model.get_mut(&at) {
                let v = 1000.0 + round as f64;
                *old = v;
                batch.push(reading("r1", "temp", at, v));
            }
        }
        post_all(app, &batch).await;
    }
    assert_rollups_match_buckets(&one, g).await;
    for (from, to) in [
        (t, t + 3 * 86_400),
        (t + 4321, t + 2 * 86_400 + 777),
        (t - 86_400, t + 86_400 + 59),
    ] {
        let got = one.get_json(&average_path("r1", "temp", from, to)).await;
        assert_aggregates(&got, expected(&model, from, to), &format!("{from}..{to}"));
        let got = two.get_json(&average_path("r1", "temp", from, to)).await;
        assert_aggregates(&got, expected(&model, from, to), "second instance");
    }
    one.stop().await.expect("clean stop");
    two.stop().await.expect("clean stop");
}

/// `hourglass rebuild-rollups` over and over while two instances write late
/// readings and overwrites into the same ended hours: afterwards every
/// rollup slot equals its buckets. A slot is written only if no figure from
/// more writes is stored, so the rebuild's older reads never win.
#[tokio::test]
async fn rebuilds_racing_two_writing_instances_leave_every_rollup_slot_equal_to_its_buckets() {
    let g = Granularity::Minute;
    let one = spawn_app_with(long_settings(g)).await;
    let mut s = one.settings.clone();
    s.journal.dir = journal_dir();
    let two = spawn_app_with(s).await;
    let t = base_time() - 2 * 86_400;
    let rebuilding = {
        let settings = one.settings.clone();
        tokio::spawn(async move {
            for _ in 0..4 {
                hourglass::rebuild_rollups(&settings, Some("race-*"), None, None)
                    .await
                    .expect("rebuilds");
            }
        })
    };
    for round in 0..8i64 {
        let app = if round % 2 == 0 { &one } else { &two };
        let batch: Vec<Value> = (0..300i64)
            .map(|i| {
                // Six series over two days, every round overwriting some
                // seconds of the one before and adding late ones.
                let at = t + (i * 577 + round * 13 * (i % 3)) % (2 * 86_400);
                let sensor = format!("race-{}", i % 6);
                reading(&sensor, "temp", at, (round * 10 + i % 7) as f64)
            })
            .collect();
        post_all(app, &batch).await;
    }
    rebuilding.await.expect("the rebuilds end");
    assert_rollups_match_buckets(&one, g).await;
    one.stop().await.expect("clean stop");
    two.stop().await.expect("clean stop");
}

/// An upgrade that changes the rollups' layout: the next start finds them
/// older, rebuilds them in the background (answers exact meanwhile, from
/// the buckets) and records the new layout.
#[tokio::test]
async fn rollups_of_an_older_layout_are_rebuilt_by_the_next_start_and_answers_stay_exact() {
    let mut settings = long_settings(Granularity::Minute);
    settings.query.cache_bytes = 0;
    let app = spawn_app_with(settings).await;
    let t = base_time() - 3 * 86_400;
    let batch: Vec<Value> = (0..400i64)
        .map(|i| {
            reading(
                "up-1",
                "speed",
                t + i * 617 % (3 * 86_400),
                (i % 29) as f64 / 4.0,
            )
        })
        .collect();
    post_all(&app, &batch).await;
    app.late_rolled_up().await;
    let path = average_path("up-1", "speed", t, t + 3 * 86_400);
    let before = app.get_json(&path).await;
    // As the version before left them: its layout, recorded as such.
    let rollups = app
        .db
        .collection::<Document>(&app.settings.mongodb.rollup_collection);
    let metadata = app
        .db
        .collection::<Document>(&app.settings.mongodb.metadata_collection);
    rollups
        .update_many(doc! {}, doc! { "$set": { "schema_version": 2 } })
        .await
        .expect("downgraded");
    metadata
        .update_one(
            doc! { "_id": "format" },
            doc! { "$set": { "rollup_schema_version": 2 } },
        )
        .await
        .expect("recorded");
    let read_before = documents_read(&app, "average").await;
    assert_eq!(app.get_json(&path).await, before, "exact from the buckets");
    let older = documents_read(&app, "average").await - read_before;

    let next = spawn_app_with(app.settings.clone()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let format = metadata
            .find_one(doc! { "_id": "format" })
            .await
            .expect("find")
            .expect("the format document");
        if format.get_i32("rollup_schema_version") == Ok(3) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not rebuilt in 2 minutes: {format}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for r in app
        .documents(&app.settings.mongodb.rollup_collection, doc! {})
        .await
    {
        assert_eq!(r.get_i32("schema_version"), Ok(3), "rebuilt: {r}");
    }
    let read_before = documents_read(&next, "average").await;
    assert_eq!(next.get_json(&path).await, before, "exact from the rollups");
    let rebuilt = documents_read(&next, "average").await - read_before;
    assert!(
        rebuilt < older,
        "rebuilt rollups answer from {rebuilt} documents, the buckets from {older}"
    );
    assert_rollups_match_buckets(&next, Granularity::Minute).await;
    next.stop().await.expect("clean stop");
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn rebuilding_rollups_of_data_written_without_them_restores_them_and_answers_stay_exact() {
    for g in [Granularity::Minute, Granularity::Hour] {
        // What is read from storage is the point: no results cache.
        let mut settings = long_settings(g);
        settings.query.cache_bytes = 0;
        let app = spawn_app_with(settings).await;
        let t = base_time() - 5 * 86_400;
        let mut model = BTreeMap::new();
        let mut batch = Vec::new();
        for i in 0..800i64 {
            let at = t + i * 541 % (5 * 86_400);
            let v = (i % 31) as f64 / 4.0;
            model.insert(at, v);
            batch.push(reading(
                if i % 2 == 0 { "old-1" } else { "old-2" },
                "speed",
                at,
                v,
            ));
        }
        post_all(&app, &batch).await;
        app.late_rolled_up().await;
        let ranges = [(t, t + 5 * 86_400), (t + 999, t + 4 * 86_400 + 3601)];
        let mut before = Vec::new();
        for &(from, to) in &ranges {
            before.push(
                app.get_json(&average_path("old-1", "speed", from, to))
                    .await,
            );
        }
        // As a database written by a version without rollups or registry.
        for c in [
            &app.settings.mongodb.rollup_collection,
            &app.settings.mongodb.sensor_collection,
        ] {
            app.db
                .collection::<Document>(c)
                .delete_many(doc! {})
                .await
                .expect("delete");
        }
        // Without rollups the answers are still exact, read from the buckets.
        let read_before = documents_read(&app, "average").await;
        let missing = app
            .get_json(&average_path("old-1", "speed", ranges[0].0, ranges[0].1))
            .await;
        assert_eq!(missing, before[0], "exact from the buckets alone");
        let without = documents_read(&app, "average").await - read_before;
        let days = hourglass::rebuild_rollups(&app.settings, None, None, None)
            .await
            .expect("rebuilds");
        assert!(days >= 5, "{days} days");
        let read_before = documents_read(&app, "average").await;
        for (&(from, to), want) in ranges.iter().zip(&before) {
            let got = app
                .get_json(&average_path("old-1", "speed", from, to))
                .await;
            assert_eq!(&got, want, "{g:?} {from}..{to}");
        }
        let with = documents_read(&app, "average").await - read_before;
        assert!(
            with < without,
            "{g:?}: rebuilt rollups answer two ranges from {with} documents, the buckets one from {without}"
        );
        assert_rollups_match_buckets(&app, g).await;
        let listed = app.get_json("/api/v1/sensors?prefix=old-").await;
        let names: Vec<&str> = listed["sensors"]
            .as_array()
            .expect("sensors")
            .iter()
            .filter_map(|s| s["sensor"].as_str())
            .collect();
        assert_eq!(names, ["old-1", "old-2"], "the registry is rebuilt too");
        app.stop().await.expect("clean stop");
    }
}

/// The documents queries of `endpoint` read so far, from `/metrics`.
pub(crate) async fn documents_read(app: &TestApp, endpoint: &str) -> f64 {
    let text = app
        .get("/metrics")
        .await
        .text()
        .await
        .expect("metrics text");
    let prefix = format!("hourglass_query_documents_read_sum{{endpoint=\"{endpoint}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// One reading every 10 minutes over `[from, to)`, all of value 1.
fn every_ten_minutes(sensor: &str, from: i64, to: i64) -> Vec<Value> {
    (from..to)
        .step_by(600)
        .map(|at| reading(sensor, "power", at, 1.0))
        .collect()
}

#[tokio::test]
async fn days_across_daylight_saving_changes_have_23_and_25_hours_of_readings() {
    let app = spawn_app_with(long_settings(Granularity::Minute)).await;
    let cases = [
        // (zone, local days around the change, the day, hours, offsets of the day and the next)
        (
            "Europe/Berlin",
            "2026-03-28T00:00:00Z",
            "2026-03-29T00:00:00+01:00",
            23,
            "+02:00",
        ),
        (
            "Europe/Berlin",
            "2025-10-25T00:00:00Z",
            "2025-10-26T00:00:00+02:00",
            25,
            "+01:00",
        ),
        (
            "America/New_York",
            "2026-03-07T12:00:00Z",
            "2026-03-08T00:00:00-05:00",
            23,
            "-04:00",
        ),
        (
            "America/New_York",
            "2025-11-01T12:00:00Z",
            "2025-11-02T00:00:00-04:00",
            25,
            "-05:00",
        ),
    ];
    for (i, (zone, around, day, hours, next_offset)) in cases.into_iter().enumerate() {
        let sensor = format!("dst-{i}");
        let from = ts(around);
        let to = from + 3 * 86_400;
        post_all(&app, &every_ten_minutes(&sensor, from, to)).await;
        let path = format!(
            "/api/v1/sensors/{sensor}/series?metric=power&from={}&to={}&step=1d&tz={zone}",
            rfc3339(from),
            rfc3339(to)
        );
        let got = app.get_json(&path).await;
        assert_eq!(got["tz"], zone);
        let points = got["points"].as_array().expect("points");
        let at = points
            .iter()
            .position(|p| p["start"] == day)
            .unwrap_or_else(|| panic!("{zone}: no point starts at {day}: {got}"));
        assert_eq!(points[at]["count"], hours * 6, "{zone} {day}");
        assert!(
            points[at + 1]["start"]
                .as_str()
                .is_some_and(|s| s.ends_with(next_offset)),
            "{zone}: the next day is at {next_offset}: {got}"
        );
        // Weeks start on Monday at local midnight; months on the first.
        for step in ["1w", "1mo"] {
            let got = app
                .get_json(&path.replace("step=1d", &format!("step={step}")))
                .await;
            let first = got["points"][0]["start"]
                .as_str()
                .expect("a start")
                .to_owned();
            assert!(first.contains("T00:00:00"), "{zone} {step}: {first}");
            let total: u64 = got["points"]
                .as_array()
                .expect("points")
                .iter()
                .filter_map(|p| p["count"].as_u64())
                .sum();
            assert_eq!(total, 3 * 144, "{zone} {step}");
        }
    }
    let r = app
        .get("/api/v1/sensors/dst-0/series?metric=power&from=0&to=86400000&step=1d&tz=Mars/Olympus")
        .await;
    assert_eq!(r.status(), 400);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_latest_reading_comes_from_the_newest_bucket_or_from_memory() {
    let app = spawn_app_with(journal_settings()).await;
    let t = base_time();
    assert_eq!(
        app.get("/api/v1/sensors/l1/latest?metric=t").await.status(),
        404
    );
    post_all(
        &app,
        &[
            reading("l1", "t", t + 10, 1.0),
            reading("l1", "t", t + 70, 2.0),
        ],
    )
    .await;
    // Journaled and held in memory, not yet in a bucket: still the latest.
    let got = app.get_json("/api/v1/sensors/l1/latest?metric=t").await;
    assert_eq!(
        got,
        json!({ "sensor": "l1", "metric": "t", "ts": rfc3339(t + 70), "value": 2.0 })
    );
    let mut s = app.settings.clone();
    app.stop().await.expect("clean stop");
    s.journal.enabled = false;
    let app = spawn_app_with(s).await;
    // A late reading for an older time does not change the latest.
    post_all(&app, &[reading("l1", "t", t - 3600, 9.0)]).await;
    let got = app.get_json("/api/v1/sensors/l1/latest?metric=t").await;
    assert_eq!(got["ts"], rfc3339(t + 70));
    assert_eq!(got["value"], 2.0);
    app.stop().await.expect("clean stop");
}

pub async fn put_labels(app: &TestApp, sensor: &str, labels: Value) -> reqwest::Response {
    app.client
        .put(format!("{}/api/v1/sensors/{sensor}/labels", app.address))
        .json(&labels)
        .send()
        .await
        .expect("PUT")
}

#[tokio::test]
async fn sensors_are_listed_with_metrics_labels_and_pages() {
    let app = spawn_app().await;
    let t = base_time();
    let mut batch = Vec::new();
    for i in 0..5 {
        batch.push(reading(&format!("site-{i}"), "temp", t + i, 1.0));
        batch.push(reading(&format!("site-{i}"), "hum", t + i, 1.0));
    }
    batch.push(reading("other", "temp", t, 1.0));
    post_all(&app, &batch).await;
    for i in 0..5 {
        let site = if i < 3 { "berlin" } else { "paris" };
        let r = put_labels(
            &app,
            &format!("site-{i}"),
            json!({ "site": site, "type": "ht" }),
        )
        .await;
        assert_eq!(r.status(), 204);
    }
    for bad in [
        json!({ "__name__": "x" }),
        json!({ "site": "" }),
        json!({ "site": 3 }),
        json!(["site"]),
    ] {
        let r = put_labels(&app, "site-0", bad.clone()).await;
        assert_eq!(r.status(), 400, "{bad}");
    }
    let got = app
        .get_json("/api/v1/sensors?prefix=site-&label.site=berlin")
        .await;
    let sensors = got["sensors"].as_array().expect("sensors");
    assert_eq!(sensors.len(), 3);
    assert_eq!(sensors[0]["sensor"], "site-0");
    assert_eq!(
        sensors[0]["labels"],
        json!({ "site": "berlin", "type": "ht" }),
        "bad labels changed nothing"
    );
    let mut metrics: Vec<&str> = sensors[0]["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    metrics.sort_unstable();
    assert_eq!(metrics, ["hum", "temp"]);
    assert_eq!(sensors[0]["last_seen"], rfc3339(t));
    // Pages of two over six sensors.
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let page = app
            .get_json(&format!("/api/v1/sensors?limit=2{after}"))
            .await;
        seen.extend(
            page["sensors"]
                .as_array()
                .expect("sensors")
                .iter()
                .map(|s| s["sensor"].as_str().expect("id").to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(
        seen,
        ["other", "site-0", "site-1", "site-2", "site-3", "site-4"]
    );
    assert_eq!(app.get("/api/v1/sensors?limit=0").await.status(), 400);
    assert_eq!(app.get("/api/v1/sensors?colour=red").await.status(), 400);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn groups_sum_every_matching_sensor_exactly() {
    let mut s = settings_with(Granularity::Minute);
    s.query.max_series = 5;
    let app = spawn_app_with(s).await;
    let t = base_time();
    let mut model: BTreeMap<String, BTreeMap<i64, f64>> = BTreeMap::new();
    let mut batch = Vec::new();
    for i in 0..6 {
        let sensor = format!("g-{i}");
        for k in 0..(20 + 10 * i) {
            let at = t + k * 113;
            let v = (k * (i + 1)) as f64 / 2.0;
            model.entry(sensor.clone()).or_default().insert(at, v);
            batch.push(reading(&sensor, "flow", at, v));
        }
    }
    post_all(&app, &batch).await;
    for i in 0..5 {
        let site = if i % 2 == 0 { "a" } else { "b" };
        assert_eq!(
            put_labels(&app, &format!("g-{i}"), json!({ "site": site }))
                .await
                .status(),
            204
        );
    }
    let (from, to) = (t + 50, t + 3000);
    let range = format!("metric=flow&from={}&to={}", rfc3339(from), rfc3339(to));
    let want = |sensors: &[usize]| {
        let mut all = BTreeMap::new();
        for &i in sensors {
            for (k, v) in &model[&format!("g-{i}")] {
                all.insert((i, *k), *v);
            }
        }
        let vals: Vec<f64> = all
            .iter()
            .filter(|((_, k), _)| *k >= from && *k < to)
            .map(|(_, v)| *v)
            .collect();
        (
            vals.len() as u64,
            vals.iter().sum::<f64>(),
            vals.iter().copied().reduce(f64::min),
            vals.iter().copied().reduce(f64::max),
        )
    };
    let got = app
        .get_json(&format!("/api/v1/average?{range}&label.site=a"))
        .await;
    let groups = got["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["sensors"], 3);
    assert_aggregates(&groups[0], want(&[0, 2, 4]), "site a");
    let got = app
        .get_json(&format!(
            "/api/v1/average?{range}&sensor=g-*&label.site=b&group_by=sensor"
        ))
        .await;
    let groups = got["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0]["group"], json!({ "sensor": "g-1" }));
    assert_aggregates(&groups[1], want(&[3]), "g-3 alone");
    let got = app
        .get_json(&format!(
            "/api/v1/series?{range}&sensor=g-?&label.site=a&group_by=label.site&step=15m"
        ))
        .await;
    let points = got["groups"][0]["points"].as_array().expect("points");
    let total: u64 = points.iter().filter_map(|p| p["count"].as_u64()).sum();
    assert_eq!(total, want(&[0, 2, 4]).0);
    // Six sensors match g-*: over query.max_series.
    let r = app
        .get(&format!("/api/v1/average?{range}&sensor=g-*"))
        .await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_series")),
        "{body}"
    );
    assert_eq!(
        app.get(&format!("/api/v1/average?{range}&group_by=site"))
            .await
            .status(),
        400
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn series_answer_csv_for_spreadsheets() {
    let app = spawn_app().await;
    let t = base_time();
    post_all(
        &app,
        &[
            reading("c1", "t", t + 5, 1.5),
            reading("c1", "t", t + 65, 2.5),
        ],
    )
    .await;
    let path = format!(
        "/api/v1/sensors/c1/series?metric=t&from={}&to={}&step=1m",
        rfc3339(t),
        rfc3339(t + 180)
    );
    let r = app
        .client
        .get(format!("{}{path}", app.address))
        .header("Accept", "text/csv")
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("text")
            .starts_with("text/csv")
    );
    let body = r.text().await.expect("text");
    let want = format!(
        "start,count,sum,avg,min,max\n{},1,1.5,1.5,1.5,1.5\n{},1,2.5,2.5,2.5,2.5\n{},0,0,,,\n",
        rfc3339(t),
        rfc3339(t + 60),
        rfc3339(t + 120)
    );
    assert_eq!(body, want);
    let r = app.get(&format!("{path}&format=csv")).await;
    assert_eq!(r.text().await.expect("text"), want);
    assert_eq!(app.get(&format!("{path}&format=xml")).await.status(), 400);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_query_slower_than_its_timeout_answers_503_and_ingest_goes_on() {
    let mut db = Database::start().await;
    let mut s = test_settings();
    s.mongodb.uri = secrecy::SecretString::from(db.uri());
    s.query.timeout = Duration::from_millis(500);
    let app = spawn_app_with(s).await;
    let t = base_time();
    post_all(&app, &[reading("slow", "t", t, 1.0)]).await;
    app.db
        .client()
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "blockConnection": true, "blockTimeMS": 3000 },
        })
        .await
        .expect("the server takes the fail point");
    let r = app.get(&average_path("slow", "t", t - 60, t + 60)).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("query.timeout")),
        "{body}"
    );
    // Writes do not queue behind queries.
    post_all(&app, &[reading("slow", "t", t + 1, 2.0)]).await;
    let got = app
        .get_json(&average_path("slow", "t", t - 60, t + 60))
        .await;
    assert_eq!(got["count"], 2);
    let metrics = app.get("/metrics").await.text().await.expect("metrics");
    assert!(
        metrics.contains("hourglass_query_documents_read_count{endpoint=\"average\"}"),
        "documents read are recorded"
    );
    app.stop().await.expect("clean stop");
    db.stop();
}

#[tokio::test]
async fn the_openapi_document_lists_every_route() {
    let app = spawn_app().await;
    let doc = app.get_json("/api/v1/openapi.json").await;
    let paths = doc["paths"].as_object().expect("paths");
    let mut listed: Vec<(String, String)> = Vec::new();
    for (path, item) in paths {
        for method in item.as_object().expect("an item").keys() {
            listed.push((method.to_uppercase(), path.clone()));
        }
    }
    listed.sort();
    let mut routes: Vec<(String, String)> = [
        ("POST", "/api/v1/readings"),
        ("DELETE", "/api/v1/readings"),
        ("PUT", "/api/v1/sensors/{sensor}/labels"),
        ("GET", "/api/v1/sensors"),
        ("GET", "/api/v1/sensors/{sensor}/average"),
        ("GET", "/api/v1/sensors/{sensor}/series"),
        ("GET", "/api/v1/sensors/{sensor}/latest"),
        ("GET", "/api/v1/sensors/{sensor}/uptime"),
        ("GET", "/api/v1/average"),
        ("GET", "/api/v1/series"),
        ("GET", "/api/v1/dead_letters"),
        ("GET", "/api/v1/export"),
        ("GET", "/api/v1/openapi.json"),
        ("GET", "/health/live"),
        ("GET", "/health/ready"),
        ("GET", "/metrics"),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_owned(), p.to_owned()))
    .collect();
    routes.sort();
    assert_eq!(listed, routes);
    // And every listed route is served: none answers 404 or 405.
    for (method, path) in &listed {
        let url = format!("{}{}", app.address, path.replace("{sensor}", "x"));
        let r = app
            .client
            .request(method.parse().expect("a method"), url)
            .send()
            .await
            .expect("request");
        assert!(
            r.status() != 404 || path.ends_with("/latest"),
            "{method} {path}: {}",
            r.status()
        );
        assert_ne!(r.status(), 405, "{method} {path}");
    }
    app.stop().await.expect("clean stop");
}

/// A backfill's hours are read from their buckets while they are marked
/// late, the gauge counting them, and from their rollups as soon as the
/// upkeep has rewritten them and removed their markers.
#[tokio::test]
async fn a_backfills_hours_count_as_late_until_rolled_up_and_are_then_read_from_rollups() {
    let mut s = test_settings();
    // Longer than the upkeep's five-second tick: the gauge is read while
    // the hours wait for their writes to pause.
    s.buckets.late_rollup_after = Duration::from_secs(10);
    let app = spawn_app_with(s).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let end = now - now.rem_euclid(3600) - 3600;
    let start = end - 12 * 3600;
    let body: Vec<Value> = (0..144)
        .map(|i| reading("bf", "m", start + i * 300, (i % 7) as f64))
        .collect();
    assert_eq!(app.post_readings(&Value::Array(body)).await.status(), 200);
    eventually(
        Duration::from_secs(60),
        "the gauge counts the twelve hours marked late",
        || async { app.metric("hourglass_rollup_late_hours").await == 12.0 },
    )
    .await;
    let path = format!(
        "/api/v1/sensors/bf/average?metric=m&from={}&to={}",
        rfc3339(start),
        rfc3339(end)
    );
    let buckets_read = "hourglass_db_documents_read_total{collection=\"buckets\",kind=\"query\"}";
    // Cold each time: the results cache would answer without reading.
    let average = || async {
        let before = app.metric(buckets_read).await;
        let r = app
            .client
            .get(format!("{}{path}", app.address))
            .header("cache-control", "no-cache")
            .send()
            .await
            .expect("the request is sent");
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.expect("json");
        (body, app.metric(buckets_read).await - before)
    };
    let markers = || async {
        app.db
            .collection::<Document>(&app.settings.mongodb.late_collection)
            .count_documents(doc! {})
            .await
            .expect("count")
    };
    let (marked, read) = average().await;
    // Markers left after the query were there during it (nothing marks
    // them again); if the upkeep was quicker, the next check covers it.
    let checked = markers().await > 0;
    if checked {
        assert_eq!(read, 144.0, "every marked bucket is read: {marked}");
    }
    assert_eq!(marked["count"], 144, "{marked}");
    // Asked again through the results cache while still marked: the answer
    // read from the buckets was kept (any later write leaves a change entry).
    let before = app.metric(buckets_read).await;
    let r = app
        .client
        .get(format!("{}{path}", app.address))
        .send()
        .await
        .expect("the request is sent");
    assert_eq!(r.status(), 200);
    let warm: Value = r.json().await.expect("json");
    let warm_read = app.metric(buckets_read).await - before;
    if checked && markers().await > 0 {
        assert_eq!(warm_read, 0.0, "answered from the cache: {warm}");
    }
    assert_eq!(warm, marked);
    eventually(
        Duration::from_secs(120),
        "the hours are rolled up, their markers gone and the gauge at zero",
        || async { app.metric("hourglass_rollup_late_hours").await == 0.0 && markers().await == 0 },
    )
    .await;
    let (rolled, read) = average().await;
    assert_eq!(read, 0.0, "whole hours come from their rollups: {rolled}");
    assert_eq!(rolled, marked);
    app.stop().await.expect("clean stop");
}

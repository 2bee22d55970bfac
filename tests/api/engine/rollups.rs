//! Rollups kept exact by every flush, by rebuilds racing writers, across
//! an upgrade of their layout, and read from as soon as a backfill's hours
//! are rolled up.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{Document, doc};
use serde_json::Value;

use crate::helpers::*;

use super::{long_settings, post_all};
use crate::rollup_checks::*;

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

/// A service on a server of its own whose late markers cannot be removed
/// (every `delete` fails until the test lets them): the hours it is sent
/// stay marked while the gauge and the reads are looked at. Also answers
/// the end of the last ended hour but one.
async fn app_holding_late_markers() -> (crate::database::Database, TestApp, i64) {
    let db = crate::database::Database::start().await;
    db.fail_point(doc! {
        "mode": "alwaysOn",
        "data": { "failCommands": ["delete"], "errorCode": 2 },
    })
    .await;
    let app = spawn_app_with(db.settings()).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    (db, app, now - now.rem_euclid(3600) - 3600)
}

/// A backfill's hours are read from their buckets while they are marked
/// late, the gauge counting them, and from their rollups as soon as the
/// upkeep has rewritten them and removed their markers.
#[tokio::test]
async fn a_backfills_hours_count_as_late_until_rolled_up_and_are_then_read_from_rollups() {
    let (db, app, end) = app_holding_late_markers().await;
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
    assert!(markers().await > 0);
    assert_eq!(read, 144.0, "every marked bucket is read: {marked}");
    assert_eq!(marked["count"], 144, "{marked}");
    // Asked again through the results cache while still marked: the answer
    // read from the buckets was kept (any later write leaves a change
    // entry), and the markers of the hours it answers are not read again.
    let markers_read = "hourglass_db_documents_read_total{collection=\"late\",kind=\"query\"}";
    let before = app.metric(buckets_read).await;
    let markers_before = app.metric(markers_read).await;
    assert!(markers_before > 0.0, "the cold read read the markers");
    let r = app
        .client
        .get(format!("{}{path}", app.address))
        .send()
        .await
        .expect("the request is sent");
    assert_eq!(r.status(), 200);
    let warm: Value = r.json().await.expect("json");
    let warm_read = app.metric(buckets_read).await - before;
    assert_eq!(warm_read, 0.0, "answered from the cache: {warm}");
    assert_eq!(app.metric(markers_read).await - markers_before, 0.0);
    assert_eq!(warm, marked);
    db.fail_point(doc! { "mode": "off" }).await;
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

/// With the journal on, a backfill larger than a flush reaches the batcher
/// at once: its hours are taken whole and each is rolled up as soon as its
/// last bucket is written, once, without waiting for a quiet in the writes
/// (here a minute: neither it nor the minute's backstop comes before
/// the deadline).
#[tokio::test]
async fn a_journaled_backfills_hours_are_each_rolled_up_once_as_their_last_bucket_is_written() {
    let mut s = test_settings();
    s.journal.enabled = true;
    s.buckets.late_rollup_after = Duration::from_secs(60);
    s.batcher.max_flush_buckets = 50;
    let app = spawn_app_with(s).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let end = now - now.rem_euclid(3600) - 2 * 86_400;
    let start = end - 6 * 3600;
    let sensors = ["jb-a", "jb-b", "jb-c"];
    let body: Vec<Value> = sensors
        .iter()
        .flat_map(|s| (0..72).map(move |i| reading(s, "m", start + i * 300, (i % 13) as f64)))
        .collect();
    assert_eq!(app.post_readings(&Value::Array(body)).await.status(), 200);
    let markers = || async {
        app.db
            .collection::<Document>(&app.settings.mongodb.late_collection)
            .count_documents(doc! {})
            .await
            .expect("count")
    };
    eventually(
        Duration::from_secs(45),
        "every reading stored and every hour rolled up, without a quiet",
        || async {
            app.metric("hourglass_readings_stored_total").await == 216.0
                && markers().await == 0
                && app.metric("hourglass_rollup_late_hours").await == 0.0
        },
    )
    .await;
    assert_eq!(
        app.metric("hourglass_rollup_hours_total").await,
        18.0,
        "three sensors' six hours, each rolled up once"
    );
    let sum: i64 = (0..72).map(|i| i % 13).sum();
    for sensor in sensors {
        let r = app
            .get(&format!(
                "/api/v1/sensors/{sensor}/average?metric=m&from={}&to={}",
                rfc3339(start),
                rfc3339(end)
            ))
            .await;
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["count"], 72, "{sensor}: {body}");
        assert_eq!(body["sum"].as_f64(), Some(sum as f64), "{sensor}: {body}");
    }
    app.stop().await.expect("clean stop");
}

/// A query whose hours are marked late, and whose marked buckets would take
/// longer to read than it may (at the pace this instance measured reading
/// buckets), is answered at once with a 503 saying the hours are being
/// rolled up and when to retry: not at its timeout, having taken the
/// server's time from the catch-up it waits for.
#[tokio::test]
async fn a_query_that_cannot_read_its_marked_hours_in_time_is_refused_at_once_with_when_to_retry() {
    let (_db, app, end) = app_holding_late_markers().await;
    let start = end - 24 * 3600;
    for sensor in ["cu-a", "cu-b", "cu-c"] {
        let body: Vec<Value> = (0..24 * 60)
            .map(|i| reading(sensor, "m", start + i * 60, (i % 7) as f64))
            .collect();
        assert_eq!(app.post_readings(&Value::Array(body)).await.status(), 200);
    }
    eventually(
        Duration::from_secs(60),
        "the gauge counts the 72 series-hours marked late",
        || async { app.metric("hourglass_rollup_late_hours").await == 72.0 },
    )
    .await;
    // Read once in full: the pace of bucket reads is measured.
    let path = |extra: &str| {
        format!(
            "/prometheus/api/v1/query_range?query=avg_over_time(m%5B1h%5D)&start={}&end={end}&step=3600{extra}",
            start + 3600
        )
    };
    // Cold each time: the results cache would answer without reading.
    let get = |path: String| {
        app.client
            .get(format!("{}{path}", app.address))
            .header("cache-control", "no-cache")
            .send()
    };
    let r = get(path("")).await.expect("the request is sent");
    assert_eq!(r.status(), 200);
    // 4 320 marked buckets cannot be read within 300 ms at that pace (nor
    // rolled up: the failpoint keeps their markers). On a machine busy enough that the look at the markers alone takes
    // the 300 ms, the query times out instead: asked again, a little later.
    let mut tries = 0;
    let (retry, body) = loop {
        tries += 1;
        let r = get(path("&timeout=300ms"))
            .await
            .expect("the request is sent");
        assert_eq!(r.status(), 503);
        let retry: Option<u64> = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let body: Value = r.json().await.expect("json");
        if body["errorType"] == "timeout" && tries < 5 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        break (retry, body);
    };
    assert_eq!(body["errorType"], "unavailable", "{body}");
    assert!(retry.expect("a Retry-After in seconds") >= 1);
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("being rolled up")),
        "{body}"
    );
    app.stop().await.expect("clean stop");
}

/// A query over hours marked late asks the upkeep for them: they are
/// rolled up at once, before the quiet other marked hours wait for (here
/// the longest allowed, a minute), and read from their rollups from then on.
#[tokio::test]
async fn a_query_over_hours_marked_late_has_them_rolled_up_first_without_waiting_for_their_quiet() {
    let mut s = test_settings();
    s.buckets.late_rollup_after = Duration::from_secs(60);
    let app = spawn_app_with(s).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let hour = now - now.rem_euclid(3600);
    let (asked, other) = (hour - 5 * 3600, hour - 2 * 3600);
    let body: Vec<Value> = (0..6)
        .flat_map(|i| {
            [
                reading("pq", "m", asked + i * 600, i as f64),
                reading("pq", "m", other + i * 600, 10.0 + i as f64),
            ]
        })
        .collect();
    assert_eq!(app.post_readings(&Value::Array(body)).await.status(), 200);
    let late = app
        .db
        .collection::<Document>(&app.settings.mongodb.late_collection);
    // The markers of one hour (one partition document per hour here).
    let marked = |h: i64| {
        let late = late.clone();
        async move {
            late.count_documents(
                doc! { "_id": { "$gte": h / 3600 * 16, "$lt": (h / 3600 + 1) * 16 } },
            )
            .await
            .expect("count")
        }
    };
    assert_eq!((marked(asked).await, marked(other).await), (1, 1));
    let buckets_read = "hourglass_db_documents_read_total{collection=\"buckets\",kind=\"query\"}";
    let average = || async {
        let before = app.metric(buckets_read).await;
        let r = app
            .client
            .get(format!(
                "{}/api/v1/sensors/pq/average?metric=m&from={}&to={}",
                app.address,
                rfc3339(asked),
                rfc3339(asked + 3600)
            ))
            .header("cache-control", "no-cache")
            .send()
            .await
            .expect("the request is sent");
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.expect("json");
        (body, app.metric(buckets_read).await - before)
    };
    let (first, read) = average().await;
    assert_eq!(first["count"], 6, "{first}");
    assert!(read > 0.0, "the marked hour is read from its buckets");
    eventually(
        Duration::from_secs(30),
        "the hour asked for is rolled up and its marker gone",
        || async { marked(asked).await == 0 },
    )
    .await;
    assert_eq!(
        marked(other).await,
        1,
        "the hour nobody asked for still waits for its quiet"
    );
    let (again, read) = average().await;
    assert_eq!(read, 0.0, "read from its rollups now: {again}");
    assert_eq!(again, first);
    app.stop().await.expect("clean stop");
}

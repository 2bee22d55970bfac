//! The workload: everything that reaches storage, driven through the
//! service with the profiler on.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::helpers::*;

use super::shapes::OURS;

pub(super) const DAY: i64 = 86_400;

pub(super) fn conformance_settings(g: Granularity) -> hourglass::Settings {
    let mut s = settings_with(g);
    s.ingest.max_age = Duration::from_secs(400 * DAY as u64);
    // Correctness, not speed: right after the writes a long range reads
    // every bucket until late markers clear (issue 77), which on the
    // stand-in beside five other tests passed a minute.
    s.query.timeout = Duration::from_secs(300);
    s.http.request_timeout = Duration::from_secs(330);
    s
}

pub(super) async fn profiled(settings: &hourglass::Settings) -> Option<mongodb::Database> {
    use secrecy::ExposeSecret;
    let client = crate::helpers::mongo_client(settings.mongodb.uri.expose_secret()).await;
    let db = client.database(&settings.mongodb.database);
    match db.run_command(doc! { "profile": 2 }).await {
        Ok(_) => Some(db),
        Err(e) => {
            // A mongos has no profiler: the checks need one.
            eprintln!("skipped: the server keeps no profile of commands ({e})");
            None
        }
    }
}

pub(super) async fn post(app: &TestApp, readings: &[Value]) -> u16 {
    let mut status = 200;
    for chunk in readings.chunks(2000) {
        let r = app.post_readings(&Value::Array(chunk.to_vec())).await;
        status = status.max(r.status().as_u16());
    }
    status
}

/// Everything that reaches storage; answers the readings written, by
/// `(sensor, metric, ts)`, last write winning.
pub(super) async fn workload(
    app: &TestApp,
    g: Granularity,
) -> BTreeMap<(String, String, i64), f64> {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let t = now - 40 * DAY;
    let t = t - t.rem_euclid(3600);
    let mut truth = BTreeMap::new();
    let mut put = |batch: &mut Vec<Value>, s: &str, m: &str, ts: i64, v: f64| {
        truth.insert((s.to_owned(), m.to_owned(), ts), v);
        batch.push(reading(s, m, ts, v));
    };
    // A wide backfill (80 sensors in one flush, over 38 days and a 30-day
    // boundary), readings on whole minutes, hours and days among them.
    let mut batch = Vec::new();
    for i in 0..80 {
        for k in 0..12i64 {
            let ts = t + k * (3 * DAY + 3600) + i * 61 - if k % 4 == 0 { i * 61 } else { 0 };
            put(
                &mut batch,
                &format!("c-{i:02}"),
                "temp",
                ts,
                (k * 7 + i) as f64,
            );
        }
    }
    assert_eq!(post(app, &batch).await, 200);
    // Narrow flushes: a few sensors, late readings and overwrites, a second metric.
    for round in 0..3i64 {
        let mut batch = Vec::new();
        for i in 0..3 {
            let ts = t + round * DAY + 7 * 3600 + i * 17;
            put(
                &mut batch,
                &format!("c-{i:02}"),
                "temp",
                ts,
                (round * 100 + i) as f64,
            );
            put(
                &mut batch,
                &format!("c-{i:02}"),
                "hum",
                ts + 1,
                round as f64 / 2.0,
            );
        }
        // Overwrite a second of the backfill.
        put(
            &mut batch,
            "c-05",
            "temp",
            t + 3 * DAY + 3600 + 5 * 61,
            1000.0 + round as f64,
        );
        assert_eq!(post(app, &batch).await, 200);
    }
    // Live readings.
    let mut batch = Vec::new();
    for i in 0..5 {
        for k in 0..10 {
            put(
                &mut batch,
                &format!("c-{i:02}"),
                "temp",
                now - 200 + k * 20 + i,
                k as f64,
            );
        }
    }
    assert_eq!(post(app, &batch).await, 200);
    // Labels: replaced by PUT, merged from line protocol tags.
    for i in 0..6 {
        let r = app
            .client
            .put(format!("{}/api/v1/sensors/c-{i:02}/labels", app.address))
            .json(&json!({ "site": if i % 2 == 0 { "north" } else { "south" } }))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 204);
    }
    let line = format!(
        "power,sensor=c-07,room=r1 value=5 {}\n",
        (now - 100) * 1_000_000_000
    );
    truth.insert(("c-07".into(), "power".into(), now - 100), 5.0);
    let r = app
        .client
        .post(format!("{}/api/v2/write", app.address))
        .body(line)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 204);
    // The labels of line protocol are written in the background.
    eventually(Duration::from_secs(30), "the line's labels", || async {
        let c07 = app.get_json("/api/v1/sensors?prefix=c-07").await;
        c07["sensors"][0]["labels"]["room"] == "r1"
    })
    .await;
    // A bucket not in the expected shape: its readings are dead-lettered.
    // (The test's own commands carry a comment and are left out.)
    let buckets = app
        .db
        .collection::<Document>(&app.settings.mongodb.collection);
    let start = g.bucket_start(t + 10 * DAY);
    let broken = doc! {
        "sensor": "c-broken", "metric": "temp",
        "start": mongodb::bson::DateTime::from_millis(start * 1000),
    };
    let mut bad = broken.clone();
    bad.insert("v", "not a document");
    buckets
        .insert_one(bad)
        .comment(OURS)
        .await
        .expect("inserted");
    let r = app
        .post_readings(&json!([reading("c-broken", "temp", start + 3, 1.0)]))
        .await;
    assert_eq!(r.status(), 422);
    // Gone again, so the rest of the workload reads only good buckets.
    buckets
        .delete_one(broken)
        .comment(OURS)
        .await
        .expect("deleted");
    // Every query route.
    let range = |from: i64, to: i64| format!("from={}&to={}", rfc3339(from), rfc3339(to));
    for (from, to) in [
        (t + 5, t + 50),
        (t + 61, t + 3 * 3600 + 7),
        (t, t + 36 * DAY),
        (t - DAY, now + 60),
        (now - 3600, now),
    ] {
        for sensor in ["c-00", "c-05", "c-79", "c-nobody"] {
            app.get_json(&format!(
                "/api/v1/sensors/{sensor}/average?metric=temp&{}",
                range(from, to)
            ))
            .await;
        }
        app.get_json(&format!(
            // Ten sensors are as many shapes as eighty, and quicker.
            "/api/v1/average?metric=temp&sensor=c-0*&group_by=label.site&{}",
            range(from, to)
        ))
        .await;
        app.get_json(&format!(
            "/api/v1/average?metric=temp&label.site=north&{}",
            range(from, to)
        ))
        .await;
    }
    for step in ["1m", "1h", "1d"] {
        app.get_json(&format!(
            "/api/v1/sensors/c-01/series?metric=temp&step={step}&{}",
            range(t + 59, t + if step == "1m" { 7200 } else { 36 * DAY })
        ))
        .await;
    }
    app.get_json(&format!(
        "/api/v1/series?metric=temp&sensor=c-0?&step=1d&tz=Europe/Berlin&{}",
        range(t, t + 35 * DAY)
    ))
    .await;
    app.get_json("/api/v1/sensors/c-00/latest?metric=temp")
        .await;
    app.get_json("/api/v1/sensors?prefix=c-0&limit=3").await;
    app.get_json("/api/v1/sensors?after=c-03&limit=2&label.site=north")
        .await;
    app.get_json("/api/v1/sensors?prefix=c-&label.room=r1")
        .await;
    for q in [
        "temp{sensor=~\"c-0.\"}",
        "last_over_time(temp{sensor=~\"c-0.\"}[1h])",
        "last_over_time(temp{sensor=~\"c-0.\"}[40d])",
        "avg by (site) (avg_over_time(temp{sensor=~\"c-0.\"}[1d]))",
        "count_over_time(temp{sensor=~\"c-0.\"}[2h])",
    ] {
        let q: String = url::form_urlencoded::byte_serialize(q.as_bytes()).collect();
        app.get_json(&format!("/prometheus/api/v1/query?query={q}&time={now}"))
            .await;
        app.get_json(&format!(
            "/prometheus/api/v1/query_range?query={q}&start={}&end={now}&step=3h",
            now - 3 * DAY
        ))
        .await;
    }
    app.get_json("/prometheus/api/v1/labels").await;
    app.get_json("/prometheus/api/v1/label/sensor/values").await;
    app.get_json("/prometheus/api/v1/series?match[]=temp{site=\"north\"}")
        .await;
    truth
}

/// Rebuilds: all, a prefix, one sensor.
pub(super) async fn rebuilds(app: &TestApp) {
    let t = time::OffsetDateTime::now_utc().unix_timestamp() - 38 * DAY;
    for sensor in [None, Some("c-1*"), Some("c-02")] {
        hourglass::rebuild_rollups(&app.settings, sensor, Some(t), None)
            .await
            .expect("rebuilt");
    }
}

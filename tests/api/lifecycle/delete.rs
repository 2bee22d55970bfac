//! Deleting readings: partial and whole buckets, refusals, races with
//! writes and other instances.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, all_values, assert_invariants, base_time, journal_settings, reading, rfc3339,
    settings_with, spawn_app_with,
};

use super::common::{cli, open_hour, post_all, text};

fn delete_path(query: &str) -> String {
    format!("/api/v1/readings?{query}")
}

async fn delete(app: &TestApp, query: &str) -> reqwest::Response {
    app.client
        .delete(format!("{}{}", app.address, delete_path(query)))
        .send()
        .await
        .expect("sent")
}

/// Readings of `sensors` × `metrics` every 7 s over three ended hours.
fn fleet(t0: i64, sensors: &[&str], metrics: &[&str]) -> BTreeMap<(String, String, i64), f64> {
    let mut data = BTreeMap::new();
    for (k, s) in sensors.iter().enumerate() {
        for (j, m) in metrics.iter().enumerate() {
            for i in 0..(3 * 3600 / 7) {
                let ts = t0 + i * 7 + k as i64;
                data.insert(
                    ((*s).to_owned(), (*m).to_owned(), ts),
                    ((i * 13 + j as i64 * 5) % 97) as f64 * 0.5 - 11.0,
                );
            }
        }
    }
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_partial_and_whole_buckets_keeps_every_rollup_slot_and_average_exact() {
    for g in [Granularity::Minute, Granularity::Hour] {
        let app = spawn_app_with(settings_with(g)).await;
        let t0 = base_time() - 4 * 3600;
        let mut data = fleet(t0, &["d1", "d2"], &["temp", "hum"]);
        post_all(&app, &data).await;
        crate::rollup_checks::assert_rollups_match_buckets(&app, g).await;

        // From the middle of one bucket to the middle of another, over
        // whole buckets (and, with hour buckets, a whole hour).
        let (from, to) = (t0 + 1234, t0 + 2 * 3600 + 1801);
        let gone = |s: &str, m: &str, ts: i64| s == "d1" && m == "temp" && (from..to).contains(&ts);
        let want = data.keys().filter(|(s, m, ts)| gone(s, m, *ts)).count() as u64;
        let query = format!(
            "sensor=d1&metric=temp&from={}&to={}",
            rfc3339(from),
            rfc3339(to)
        );
        let before = app.buckets().await;
        let dry: Value = delete(&app, &format!("{query}&dry_run=true"))
            .await
            .json()
            .await
            .expect("JSON");
        assert_eq!(dry["readings"].as_u64(), Some(want), "{g:?}: {dry}");
        assert_eq!(dry["dry_run"], true);
        assert_eq!(
            app.buckets().await,
            before,
            "{g:?}: a dry run changes nothing"
        );

        let r = delete(&app, &query).await;
        assert_eq!(r.status(), 200);
        let done: Value = r.json().await.expect("JSON");
        assert_eq!(done["readings"].as_u64(), Some(want), "{g:?}: {done}");
        assert!(done["buckets_deleted"].as_u64() > Some(0), "{g:?}: {done}");
        assert!(done["buckets_edited"].as_u64() >= Some(1), "{g:?}: {done}");
        assert_eq!(done["sensors"], 1);
        data.retain(|(s, m, ts), _| !gone(s, m, *ts));

        // Exact at once (the hours are marked late: buckets are read) …
        let model = |s: &str, m: &str| -> BTreeMap<i64, f64> {
            data.iter()
                .filter(|((ds, dm, _), _)| ds == s && dm == m)
                .map(|((_, _, ts), v)| (*ts, *v))
                .collect()
        };
        for (s, m) in [("d1", "temp"), ("d1", "hum"), ("d2", "temp")] {
            for (f, t) in [
                (t0 - 3600, t0 + 5 * 3600),
                (from - 61, to + 59),
                (t0, t0 + 86_400),
            ] {
                let got = app
                    .get_json(&crate::rollup_checks::average_path(s, m, f, t))
                    .await;
                crate::rollup_checks::assert_aggregates(
                    &got,
                    crate::helpers::expected(&model(s, m), f, t),
                    &format!("{g:?} {s} {m} {f}..{t}"),
                );
            }
        }
        let docs = app.buckets().await;
        assert_invariants(&docs, g);
        assert_eq!(
            all_values(&docs, g),
            data,
            "{g:?}: the buckets hold what is left"
        );
        // … and once rolled up again, every rollup slot equals its buckets.
        crate::rollup_checks::assert_rollups_match_buckets(&app, g).await;

        // Again: nothing left to delete.
        let again: Value = delete(&app, &query).await.json().await.expect("JSON");
        assert_eq!(again["readings"], 0, "{g:?}: {again}");

        // A whole series: its metric leaves the registry; the sensor stays.
        let all = format!(
            "sensor=d2&metric=hum&from={}&to={}",
            rfc3339(t0 - 86_400),
            rfc3339(t0 + 86_400)
        );
        let done: Value = delete(&app, &all).await.json().await.expect("JSON");
        assert_eq!(done["series_emptied"], 1, "{g:?}: {done}");
        data.retain(|(s, m, _), _| !(s == "d2" && m == "hum"));
        assert_eq!(all_values(&app.buckets().await, g), data);
        let listed = app.get_json("/api/v1/sensors?prefix=d2").await;
        assert_eq!(listed["sensors"][0]["metrics"], json!(["temp"]), "{listed}");
        crate::rollup_checks::assert_rollups_match_buckets(&app, g).await;
        app.stop().await.expect("stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_without_a_range_or_selector_is_refused_and_deletes_nothing() {
    let app = spawn_app_with(settings_with(Granularity::Minute)).await;
    let t0 = base_time();
    let data = fleet(t0, &["d1"], &["temp"]);
    post_all(&app, &data).await;
    let before = app.buckets().await;
    let (from, to) = (rfc3339(t0), rfc3339(t0 + 3600));
    for (query, why) in [
        (format!("from={from}&to={to}"), "sensor="),
        (format!("sensor=d1&to={to}"), "from= and to="),
        (format!("sensor=d1&from={to}&to={from}"), "before"),
        (
            format!("sensor=d1&from={from}&to={to}&dry_run=maybe"),
            "dry_run",
        ),
        (
            format!("sensor=d1&from={from}&to={to}&colour=red"),
            "unknown parameter",
        ),
    ] {
        let r = delete(&app, &query).await;
        assert_eq!(r.status(), 400, "{query}");
        let body: Value = r.json().await.expect("JSON");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(why)),
            "{query}: {body}"
        );
    }
    assert_eq!(app.buckets().await, before);
    // `hourglass delete` from a shell: the same route, counted the same way.
    let out = cli(
        &app.address,
        &[
            "delete",
            "--sensor",
            "d1",
            "--from",
            &from,
            "--to",
            &to,
            "--dry-run",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let want = data.keys().filter(|k| k.2 < t0 + 3600).count();
    assert!(
        text(&out).contains(&format!("Would delete {want} readings of 1 sensors")),
        "{}",
        text(&out)
    );
    let out = cli(&app.address, &["delete", "--from", &from, "--to", &to]).await;
    assert!(!out.status.success(), "no selector");
    assert!(text(&out).contains("sensor="), "{}", text(&out));
    assert_eq!(app.buckets().await, before);
    app.stop().await.expect("stops");
}

/// Writes into the range go on while the delete runs: each reading
/// acknowledged before the delete was sent is gone, each acknowledged
/// after its answer is kept; readings held unstored by the journal and
/// batcher when it ran (this hour's, with hour buckets) never reach a bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_racing_writes_keeps_what_was_acknowledged_after_it_and_drops_what_was_held() {
    let g = Granularity::Hour;
    let mut settings = journal_settings();
    settings.buckets.granularity = g;
    let app = spawn_app_with(settings).await;
    // The open hour's journaled readings are held (batcher.max_hold) until
    // the delete has run.
    let (from, to) = open_hour().await;
    let old: BTreeMap<(String, String, i64), f64> = (from..to)
        .step_by(7)
        .map(|ts| (("r1".to_owned(), "temp".to_owned(), ts), (ts % 91) as f64))
        .collect();
    // Stored at once (?wait=stored), then overwritten by readings held.
    let body: Vec<Value> = old
        .iter()
        .map(|((s, m, ts), v)| reading(s, m, *ts, *v))
        .collect();
    let r = app
        .post_raw(
            "application/json",
            serde_json::to_vec(&body).expect("JSON"),
            "?wait=stored",
        )
        .await;
    assert_eq!(r.status(), 200);
    let held: BTreeMap<_, _> = old.iter().map(|(k, v)| (k.clone(), v + 1000.0)).collect();
    post_all(&app, &held).await;

    // A writer of new seconds in the range, all along.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (client, url) = (
            app.client.clone(),
            format!("{}/api/v1/readings", app.address),
        );
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut log = Vec::new();
            for i in 0..3000_i64 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                // Seconds the first rounds left empty (theirs are 7 apart).
                let ts = from + (i / 6) * 7 + 1 + i % 6;
                if ts >= to {
                    break;
                }
                let sent = std::time::Instant::now();
                let r = client
                    .post(&url)
                    .json(&json!([reading("r1", "temp", ts, i as f64)]))
                    .send()
                    .await
                    .expect("sent");
                assert_eq!(r.status(), 200);
                log.push((ts, i as f64, sent, std::time::Instant::now()));
            }
            log
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The second round is still held (the flush after the first is seconds away).
    let stored = all_values(&app.buckets().await, g);
    assert_eq!(
        stored, old,
        "the second round is still unstored when the delete runs"
    );
    let sent = std::time::Instant::now();
    let r = delete(
        &app,
        &format!("sensor=r1&from={}&to={}", rfc3339(from), rfc3339(to)),
    )
    .await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let answered = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let log = writer.await.expect("the writer ends");
    assert!(
        log.iter().any(|w| w.2 > answered),
        "some writes came after the answer"
    );
    // Answers leave the held readings out at once (they are all ≥ 1000,
    // the writer's are its request numbers).
    let avg = app
        .get_json(&crate::rollup_checks::average_path("r1", "temp", from, to))
        .await;
    assert!(avg["max"].as_f64().is_none_or(|m| m < 1000.0), "{avg}");
    assert!(avg["count"].as_u64() <= Some(log.len() as u64), "{avg}");
    assert!(
        log.iter().any(|w| w.3 < sent),
        "some writes came before the delete"
    );
    let (db, collection) = (app.db.clone(), app.settings.mongodb.collection.clone());
    app.stop().await.expect("drains");

    // What the journal and batcher held is gone with the rest of the range.
    let docs: Vec<mongodb::bson::Document> = {
        use futures_util::TryStreamExt;
        db.collection::<mongodb::bson::Document>(&collection)
            .find(mongodb::bson::doc! {})
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("buckets")
    };
    let values = all_values(&docs, g);
    for k in old.keys() {
        assert!(
            !values.contains_key(k),
            "{k:?} was deleted, yet {:?} is stored",
            values.get(k)
        );
    }
    for &(ts, v, sent_at, acked_at) in &log {
        let key = ("r1".to_owned(), "temp".to_owned(), ts);
        if sent_at > answered {
            assert_eq!(
                values.get(&key),
                Some(&v),
                "{ts} acknowledged after the delete"
            );
        } else if acked_at < sent {
            assert_eq!(
                values.get(&key),
                None,
                "{ts} acknowledged before the delete"
            );
        }
    }
}

/// Two instances on one database: readings another instance holds in its
/// journal and batcher when the delete runs never reach a bucket, and it
/// keeps what it acknowledges after the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_on_one_instance_covers_what_another_instance_holds() {
    let g = Granularity::Hour;
    let mut settings = journal_settings();
    settings.buckets.granularity = g;
    let a = spawn_app_with(settings.clone()).await;
    let mut other = settings.clone();
    other.journal.dir = crate::helpers::journal_dir();
    let b = spawn_app_with(other).await;
    let (from, to) = open_hour().await;
    let held: BTreeMap<(String, String, i64), f64> = (from..to)
        .step_by(5)
        .map(|ts| (("x1".to_owned(), "temp".to_owned(), ts), (ts % 17) as f64))
        .collect();
    // Acknowledged by B (journaled), held there: this hour is open.
    post_all(&b, &held).await;
    assert!(a.buckets().await.is_empty(), "B still holds what it took");
    let r = delete(
        &a,
        &format!("sensor=x1&from={}&to={}", rfc3339(from), rfc3339(to)),
    )
    .await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    // After the answer, B takes a new reading in the range: it stays.
    let after = (("x1".to_owned(), "temp".to_owned(), from + 1), 42.0);
    post_all(&b, &BTreeMap::from([after.clone()])).await;
    let (db, collection) = (a.db.clone(), a.settings.mongodb.collection.clone());
    b.stop().await.expect("B drains");
    a.stop().await.expect("A stops");
    let docs: Vec<mongodb::bson::Document> = {
        use futures_util::TryStreamExt;
        db.collection::<mongodb::bson::Document>(&collection)
            .find(mongodb::bson::doc! {})
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("buckets")
    };
    assert_eq!(
        all_values(&docs, g),
        BTreeMap::from([after]),
        "only what B acknowledged after the delete is stored"
    );
}

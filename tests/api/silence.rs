//! Silence and uptime through the service, against a model of every second:
//! a fleet reporting by exception (bursts while a value moves, nothing while
//! it holds), overwritten seconds, late writes into rolled-up hours and a
//! delete.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::helpers::{Gen, TestApp, spawn_app};

const SENSORS: usize = 200;
const DAY: i64 = 86_400;

/// A number in `0..n`.
fn below(rng: &mut Gen, n: i64) -> i64 {
    rng.below(n.max(1) as u64) as i64
}

fn rfc3339(t: i64) -> String {
    OffsetDateTime::from_unix_timestamp(t)
        .expect("a time")
        .format(&Rfc3339)
        .expect("formats")
}

fn epoch(text: &str) -> i64 {
    OffsetDateTime::parse(text, &Rfc3339)
        .expect("RFC 3339")
        .unix_timestamp()
}

fn sensor(k: usize) -> String {
    format!("sl-{k:03}")
}

/// Report by exception: bursts of readings a few seconds to a minute and a
/// half apart (a value moving past its deadband), silence between them.
fn bursts(rng: &mut Gen, from: i64, to: i64) -> Vec<(i64, f64)> {
    let mut out = Vec::new();
    for _ in 0..2 + below(rng, 5) {
        let mut t = from + below(rng, to - from);
        let mut v = below(rng, 100) as f64;
        for _ in 0..1 + below(rng, 12) {
            if t >= to {
                break;
            }
            out.push((t, v));
            v += (below(rng, 9) - 4) as f64 / 2.0;
            t += 1 + below(rng, 90);
        }
    }
    out
}

async fn post(app: &TestApp, readings: &[(String, i64, f64)]) {
    for chunk in readings.chunks(5000) {
        let body: Vec<Value> = chunk
            .iter()
            .map(|(s, t, v)| json!({ "sensor": s, "metric": "level", "ts": rfc3339(*t), "value": v }))
            .collect();
        // Retried on 503: the same readings again change nothing.
        let r = app.post_readings_retrying(&json!(body)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
}

/// Covered seconds and gaps of `[from, to)` by a difference array: a
/// reading at `r` covers `[r, r + interval)`.
fn model(times: &BTreeSet<i64>, from: i64, to: i64, interval: i64) -> (f64, Vec<(i64, i64)>) {
    let len = (to - from) as usize;
    let mut diff = vec![0i32; len + 1];
    for &r in times {
        let (a, b) = ((r).max(from), (r + interval).min(to));
        if a < b {
            diff[(a - from) as usize] += 1;
            diff[(b - from) as usize] -= 1;
        }
    }
    let (mut depth, mut covered) = (0i32, 0i64);
    let mut gaps: Vec<(i64, i64)> = Vec::new();
    for (i, d) in diff.iter().take(len).enumerate() {
        depth += d;
        let t = from + i as i64;
        if depth > 0 {
            covered += 1;
        } else if let Some(g) = gaps.last_mut().filter(|g| g.1 == t) {
            g.1 = t + 1;
        } else {
            gaps.push((t, t + 1));
        }
    }
    (covered as f64 / (to - from) as f64, gaps)
}

#[tokio::test]
async fn uptime_and_the_silent_listing_equal_a_model_of_every_second_over_a_fleet_reporting_by_exception()
 {
    let app = spawn_app().await;
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let (start, end) = (now - 3 * DAY, now - 2 * 3600);
    let mut rng = Gen(0x5EED);
    // (sensor) -> every second it has a reading; the first post.
    let mut times: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    let mut first = Vec::new();
    for k in 0..SENSORS {
        for (t, v) in bursts(&mut rng, start, end) {
            times.entry(sensor(k)).or_default().insert(t);
            first.push((sensor(k), t, v));
        }
    }
    // Overwritten seconds: a second value for a tenth of the readings.
    let again: Vec<(String, i64, f64)> = first
        .iter()
        .step_by(10)
        .map(|(s, t, v)| (s.clone(), *t, v + 100.0))
        .collect();
    post(&app, &first).await;
    post(&app, &again).await;
    // Every tenth sensor expects a reading a week: none of them is silent.
    for k in (0..SENSORS).step_by(10) {
        let r = app
            .client
            .put(format!(
                "{}/api/v1/sensors/{}/labels",
                app.address,
                sensor(k)
            ))
            .json(&json!({ "expected_interval": "7d" }))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 204);
    }
    // A sensor registered by its labels alone, never heard from.
    let r = app
        .client
        .put(format!("{}/api/v1/sensors/sl-mute/labels", app.address))
        .json(&json!({ "site": "x" }))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 204);
    app.late_rolled_up().await;

    // Late writes into rolled-up hours, then a delete of one span.
    let mut late = Vec::new();
    for k in (1..SENSORS).step_by(7) {
        for (t, v) in bursts(&mut rng, start, end) {
            times.entry(sensor(k)).or_default().insert(t);
            late.push((sensor(k), t, v));
        }
    }
    post(&app, &late).await;
    let (cut_from, cut_to) = (start + DAY, start + DAY + 6 * 3600 + 17);
    let r = app
        .client
        .delete(format!(
            "{}/api/v1/readings?sensor={}&metric=level&from={}&to={}",
            app.address,
            sensor(3),
            rfc3339(cut_from),
            rfc3339(cut_to)
        ))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    if let Some(ts) = times.get_mut(&sensor(3)) {
        ts.retain(|t| !(cut_from..cut_to).contains(t));
    }
    app.late_rolled_up().await;

    // A quarter report now (just before the listing, whatever the upkeep
    // took): not silent at the fleet's 5 minutes.
    let fresh = OffsetDateTime::now_utc().unix_timestamp() - 5;
    let current: Vec<(String, i64, f64)> = (0..SENSORS)
        .step_by(4)
        .map(|k| (sensor(k), fresh, 1.0))
        .collect();
    for (s, t, _) in &current {
        times.entry(s.clone()).or_default().insert(*t);
    }
    post(&app, &current).await;

    // The silent listing, page by page.
    let asked_at = OffsetDateTime::now_utc().unix_timestamp();
    let mut want: Vec<(String, Option<i64>)> = times
        .iter()
        .filter(|(s, ts)| {
            let weekly =
                s.as_str() != "sl-mute" && s[3..].parse::<usize>().is_ok_and(|k| k % 10 == 0);
            let interval = if weekly { 7 * DAY } else { 300 };
            ts.last().is_none_or(|&t| asked_at - t > interval)
        })
        .map(|(s, ts)| (s.clone(), ts.last().copied()))
        .collect();
    want.push(("sl-mute".to_owned(), None));
    want.sort();
    let mut got: Vec<(String, Option<i64>)> = Vec::new();
    let mut after = String::new();
    loop {
        let page = app
            .get_json(&format!(
                "/api/v1/sensors?prefix=sl-&silent=true&limit=40{after}"
            ))
            .await;
        for s in page["sensors"].as_array().expect("sensors") {
            got.push((
                s["sensor"].as_str().expect("id").to_owned(),
                s["last_reading"].as_str().map(epoch),
            ));
        }
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(got, want, "the silent sensors and their last readings");
    assert!(
        got.len() > SENSORS / 2 && got.len() < SENSORS,
        "{}",
        got.len()
    );

    // Uptime of a few sensors at intervals read from buckets (30 s), hour
    // documents (5 min), day documents (2 h) and thirty-day documents (2 d).
    let (from, to) = (start + 1234, end + 600);
    for k in [0, 3, 8, 50, 99, 157] {
        let s = sensor(k);
        let ts = times.get(&s).cloned().unwrap_or_default();
        for (interval, text) in [(30, "30s"), (300, "5m"), (7200, "2h"), (2 * DAY, "2d")] {
            let answer = app
                .get_json(&format!(
                    "/api/v1/sensors/{s}/uptime?metric=level&from={}&to={}&interval={text}",
                    rfc3339(from),
                    rfc3339(to)
                ))
                .await;
            let (share, gaps) = model(&ts, from, to, interval);
            assert_eq!(
                answer["uptime"].as_f64(),
                Some(share),
                "{s} {text}: {answer}"
            );
            assert_eq!(answer["interval"], interval);
            assert_eq!(
                answer["gap_count"].as_u64(),
                Some(gaps.len() as u64),
                "{s} {text}"
            );
            let listed: Vec<(i64, i64)> = answer["gaps"]
                .as_array()
                .expect("gaps")
                .iter()
                .map(|g| {
                    (
                        epoch(g["from"].as_str().expect("from")),
                        epoch(g["to"].as_str().expect("to")),
                    )
                })
                .collect();
            assert_eq!(listed, gaps, "{s} {text}");
        }
    }
    // A sensor's label is its interval when the request names none.
    let weekly = app
        .get_json(&format!(
            "/api/v1/sensors/{}/uptime?metric=level&from={}&to={}",
            sensor(10),
            rfc3339(from),
            rfc3339(to)
        ))
        .await;
    assert_eq!(weekly["interval"], 7 * DAY);
    let bad = app
        .get(&format!(
            "/api/v1/sensors/{}/uptime?from={}&to={}&interval=soon",
            sensor(0),
            rfc3339(from),
            rfc3339(to)
        ))
        .await;
    assert_eq!(bad.status(), 400);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_silent_sensors_metric_follows_the_fleet() {
    let mut settings = crate::helpers::test_settings();
    settings.query.expected_interval = std::time::Duration::from_secs(10);
    let app = crate::helpers::spawn_app_with(settings).await;
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let labels = |sensor: &'static str, body: Value| {
        let request = app
            .client
            .put(format!("{}/api/v1/sensors/{sensor}/labels", app.address))
            .json(&body);
        async move {
            assert_eq!(request.send().await.expect("sent").status(), 204);
        }
    };
    // Hourly: not silent. Every 10 s, last heard a minute ago: silent.
    // Registered, never heard from: silent.
    labels("m-hourly", json!({ "expected_interval": "1h" })).await;
    post(
        &app,
        &[
            ("m-hourly".to_owned(), now - 60, 1.0),
            ("m-late".to_owned(), now - 60, 2.0),
        ],
    )
    .await;
    labels("m-never", json!({ "site": "x" })).await;
    let silent = || async { app.metric("hourglass_sensors_silent").await };
    crate::helpers::eventually(
        std::time::Duration::from_secs(60),
        "two silent sensors",
        || async { silent().await == 2.0 },
    )
    .await;
    // A daily interval for the late one: one silent sensor left.
    labels("m-late", json!({ "expected_interval": "1d" })).await;
    crate::helpers::eventually(
        std::time::Duration::from_secs(60),
        "one silent sensor",
        || async { silent().await == 1.0 },
    )
    .await;
    app.stop().await.expect("clean stop");
}

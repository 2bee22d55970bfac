//! Percentiles from rollups through the service, against the exact
//! percentiles of every reading: 200 sensors reporting by exception, with
//! zeros, negative values, overwritten seconds, a late write into a
//! rolled-up hour and a delete; one sensor, a group, series and CSV; read
//! from the rollups' sketches, and from the buckets where a slot has none.

use std::collections::BTreeMap;

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use serde_json::{Value, json};

use crate::helpers::{Gen, TestApp, base_time, rfc3339, spawn_app};

const SENSORS: usize = 200;
const HOUR: i64 = 3600;
/// `buckets.sketch_accuracy`'s default.
const ACCURACY: f64 = 0.01;
const ASKED: [f64; 6] = [0.0, 0.05, 0.5, 0.95, 0.99, 1.0];

/// Every reading, by sensor and second: the last written wins.
type Truth = BTreeMap<(String, i64), f64>;

/// Bursts around changes, holds between; values from −20 to 80, often 0.
fn by_exception(rng: &mut Gen, from: i64, to: i64) -> Vec<(i64, f64)> {
    let mut out = Vec::new();
    let mut t = from + rng.below(4 * HOUR as u64) as i64;
    let mut v = rng.below(100) as f64 - 20.0;
    while t < to {
        for _ in 0..1 + rng.below(6) {
            if t >= to {
                break;
            }
            out.push((t, if rng.below(10) == 0 { 0.0 } else { v }));
            v += (rng.below(41) as f64 - 20.0) / 8.0;
            t += 1 + rng.below(90) as i64;
        }
        t += 1 + rng.below(8 * HOUR as u64) as i64;
    }
    out
}

async fn post(app: &TestApp, rows: &[(String, i64, f64)]) {
    for chunk in rows.chunks(5000) {
        let body: Vec<Value> = chunk
            .iter()
            .map(|(s, t, v)| json!({ "sensor": s, "metric": "vib", "ts": rfc3339(*t), "value": v }))
            .collect();
        let r = app.post_readings(&json!(body)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
}

/// The value at rank ⌊q·(n − 1)⌋ of the sorted readings.
fn exact(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    (n > 0).then(|| sorted[(q * (n - 1) as f64).floor() as usize])
}

/// Each quantile asked is within the accuracy of the exact one (relative to
/// it: magnitudes under 1e-9 answer 0).
fn assert_within(got: &Value, values: &mut [f64], what: &str) {
    values.sort_by(f64::total_cmp);
    for q in ASKED {
        let key = q.to_string();
        match exact(values, q) {
            None => assert_eq!(got[&key], Value::Null, "{what}: q{key}"),
            Some(want) => {
                let g = got[&key].as_f64().unwrap_or(f64::NAN);
                assert!(
                    (g - want).abs() <= ACCURACY * want.abs() + 1e-9,
                    "{what}: q{key} is {g}, the exact one {want}"
                );
            }
        }
    }
}

fn values_of(truth: &Truth, sensor: Option<&str>, a: i64, b: i64) -> Vec<f64> {
    truth
        .iter()
        .filter(|((s, t), _)| sensor.is_none_or(|x| x == s) && *t >= a && *t < b)
        .map(|(_, v)| *v)
        .collect()
}

const QUANTILES: &str = "quantiles=0,0.05,0.5,0.95,0.99,1";

/// One sensor's average with quantiles, checked; the documents it read.
async fn check_sensor(
    app: &TestApp,
    truth: &Truth,
    sensor: &str,
    a: i64,
    b: i64,
    what: &str,
) -> f64 {
    let before = app
        .metric("hourglass_query_documents_read_sum{endpoint=\"average\"}")
        .await;
    let body = app
        .get_json(&format!(
            "/api/v1/sensors/{sensor}/average?metric=vib&from={}&to={}&{QUANTILES}",
            rfc3339(a),
            rfc3339(b)
        ))
        .await;
    let mut values = values_of(truth, Some(sensor), a, b);
    let what = format!("{what}: {sensor} [{a}, {b}): {body}");
    assert_eq!(body["count"], json!(values.len()), "{what}");
    assert_within(&body["quantiles"], &mut values, &what);
    app.metric("hourglass_query_documents_read_sum{endpoint=\"average\"}")
        .await
        - before
}

#[tokio::test]
async fn percentiles_from_rollups_are_within_the_sketch_accuracy_of_the_exact_ones() {
    let app = spawn_app().await;
    // One whole UTC day, ended: its hours, the day and its 30 days' slot.
    let base = base_time();
    let day = (base - 12 * HOUR) - (base - 12 * HOUR).rem_euclid(24 * HOUR);
    let (from, to) = (day, day + 24 * HOUR);
    let mut rng = Gen(95);
    let mut truth = Truth::new();
    let mut rows = Vec::new();
    for k in 0..SENSORS {
        let sensor = format!("pq-{k:03}");
        for (t, v) in by_exception(&mut rng, from, to) {
            rows.push((sensor.clone(), t, v));
        }
    }
    // Some seconds written twice: the second value stands.
    let again: Vec<(String, i64, f64)> = rows
        .iter()
        .step_by(37)
        .map(|(s, t, v)| (s.clone(), *t, v + 1000.0))
        .collect();
    post(&app, &rows).await;
    post(&app, &again).await;
    for (s, t, v) in rows.iter().chain(&again) {
        truth.insert((s.clone(), *t), *v);
    }
    app.late_rolled_up().await;

    // Every sensor over the whole range, from its hour and day slots.
    let mut most = 0.0f64;
    for k in 0..SENSORS {
        let sensor = format!("pq-{k:03}");
        most = most.max(check_sensor(&app, &truth, &sensor, from, to, "whole days").await);
    }
    assert!(
        most <= 2.0,
        "a whole-day percentile reads its 30 days' or day document, not buckets: {most} documents"
    );
    // Ranges cut anywhere: edges from minute slots and buckets.
    for k in (0..SENSORS).step_by(20) {
        let sensor = format!("pq-{k:03}");
        let cut = |rng: &mut Gen| from + rng.below((to - from) as u64) as i64;
        let (a, b) = (cut(&mut rng), cut(&mut rng));
        check_sensor(&app, &truth, &sensor, a.min(b), a.max(b) + 1, "cut").await;
    }

    // The group: every sensor's readings together.
    let (a, b) = (from + 5 * HOUR + 123, to - 3 * HOUR + 7);
    let body = app
        .get_json(&format!(
            "/api/v1/average?metric=vib&sensor=pq-*&from={}&to={}&{QUANTILES}",
            rfc3339(a),
            rfc3339(b)
        ))
        .await;
    let group = &body["groups"][0];
    assert_eq!(group["sensors"], json!(SENSORS), "{body}");
    let mut all = values_of(&truth, None, a, b);
    assert_eq!(group["count"], json!(all.len()), "{body}");
    assert_within(&group["quantiles"], &mut all, "the group");

    // Series: each point's own readings, one sensor and per sensor.
    let step = 6 * HOUR;
    let first = from - from.rem_euclid(step);
    let body = app
        .get_json(&format!(
            "/api/v1/series?metric=vib&sensor=pq-00?&group_by=sensor&from={}&to={}&step=6h&{QUANTILES}",
            rfc3339(from),
            rfc3339(to)
        ))
        .await;
    let groups = body["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 10, "{body}");
    for g in groups {
        let sensor = g["group"]["sensor"].as_str().expect("a sensor");
        for (i, p) in g["points"].as_array().expect("points").iter().enumerate() {
            let t = first + i as i64 * step;
            let mut values = values_of(&truth, Some(sensor), t.max(from), (t + step).min(to));
            assert_eq!(p["count"], json!(values.len()), "{sensor} {p}");
            assert_within(&p["quantiles"], &mut values, &format!("{sensor} point {i}"));
        }
    }
    let csv = app
        .get(&format!(
            "/api/v1/sensors/pq-001/series?metric=vib&from={}&to={}&step=1h&quantiles=0.5,0.95&format=csv",
            rfc3339(from),
            rfc3339(to)
        ))
        .await
        .text()
        .await
        .expect("csv");
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("start,count,sum,avg,min,max,q0.5,q0.95"));
    for (i, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        let t = from + i as i64 * HOUR;
        let mut values = values_of(&truth, Some("pq-001"), t, t + HOUR);
        values.sort_by(f64::total_cmp);
        let want = exact(&values, 0.95);
        let got: Option<f64> = cells[7].parse().ok();
        match (got, want) {
            (Some(g), Some(w)) => assert!((g - w).abs() <= ACCURACY * w.abs() + 1e-9, "{line}"),
            (None, None) => {}
            _ => panic!("hour {i}: {line}, exact {want:?}"),
        }
    }

    // A late write into a rolled-up hour counts at once, and after the
    // hour is rolled up again; a delete leaves its readings out.
    let late: Vec<(String, i64, f64)> = (0..30)
        .map(|i| {
            (
                "pq-003".to_owned(),
                from + 7 * HOUR + 17 + i * 60,
                500.0 + i as f64,
            )
        })
        .collect();
    post(&app, &late).await;
    for (s, t, v) in &late {
        truth.insert((s.clone(), *t), *v);
    }
    check_sensor(&app, &truth, "pq-003", from, to, "after a late write").await;
    app.late_rolled_up().await;
    check_sensor(&app, &truth, "pq-003", from, to, "rolled up again").await;
    let (da, db) = (from + 6 * HOUR, from + 13 * HOUR + 600);
    let r = app
        .client
        .delete(format!(
            "{}/api/v1/readings?sensor=pq-003&metric=vib&from={}&to={}",
            app.address,
            rfc3339(da),
            rfc3339(db)
        ))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    truth.retain(|(s, t), _| !(s == "pq-003" && *t >= da && *t < db));
    check_sensor(&app, &truth, "pq-003", from, to, "after a delete").await;
    app.late_rolled_up().await;
    check_sensor(
        &app,
        &truth,
        "pq-003",
        from,
        to,
        "after a delete, rolled up",
    )
    .await;

    // Slots kept without sketches (summaries of another accuracy) answer
    // from the level below: the same bound, more documents. Slots stored as
    // their readings compute theirs at any accuracy: each slot of pq-004 is
    // stored again as its summary without its sketch.
    let rollups = app
        .db
        .collection::<Document>(&app.settings.mongodb.rollup_collection);
    let docs: Vec<Document> = rollups
        .find(doc! { "sensor": "pq-004" })
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("rollups");
    for d in docs {
        let slot_seconds = match d.get_str("period").expect("period") {
            "hour" => 60,
            "day" => 3600,
            _ => 86_400,
        };
        let start = d.get_datetime("start").expect("start").timestamp_millis() / 1000;
        let writes = d.get_document("w").cloned().unwrap_or_default();
        let mut set = Document::new();
        for (k, bytes) in d.get_document("s").expect("s") {
            let Bson::Binary(b) = bytes else {
                panic!("slot {k}: {bytes}")
            };
            let n = writes
                .get_i32(k)
                .map(|n| n as u64)
                .or_else(|_| writes.get_i64(k).map(|n| n as u64))
                // A count of 1 is not stored.
                .unwrap_or(1);
            let at = start + k.parse::<i64>().expect("slot number") * slot_seconds;
            let mut slot = hourglass::pure::rollup_slot_decode(&b.bytes, at, n, Some(ACCURACY))
                .expect("decodes");
            slot.sketch = None;
            let mut encoded = Vec::new();
            hourglass::pure::rollup_slot_encode(&slot, &mut encoded);
            set.insert(
                format!("s.{k}"),
                Bson::Binary(mongodb::bson::Binary {
                    subtype: mongodb::bson::spec::BinarySubtype::Generic,
                    bytes: encoded,
                }),
            );
        }
        rollups
            .update_one(
                doc! { "_id": d.get_object_id("_id").expect("_id") },
                doc! { "$set": set },
            )
            .await
            .expect("sketches removed");
    }
    let with = check_sensor(&app, &truth, "pq-005", from, to, "with sketches").await;
    let without = check_sensor(&app, &truth, "pq-004", from, to, "without sketches").await;
    let readings = values_of(&truth, Some("pq-004"), from, to).len();
    assert!(
        without > with && readings > 4,
        "without sketches the buckets are read: {without} documents, with them {with}"
    );

    for bad in [
        "quantiles=",
        "quantiles=1.5",
        "quantiles=p95",
        "quantiles=0.5,0.5",
    ] {
        let r = app
            .get(&format!(
                "/api/v1/sensors/pq-001/average?metric=vib&from={}&to={}&{bad}",
                rfc3339(from),
                rfc3339(to)
            ))
            .await;
        assert_eq!(r.status(), 400, "{bad}");
        assert!(
            r.text().await.unwrap_or_default().contains("quantiles"),
            "{bad}"
        );
    }
}

/// Prometheus' quantile of a window's readings: interpolated between ranks.
fn prometheus_quantile(q: f64, sorted: &[f64]) -> f64 {
    let rank = q * (sorted.len() - 1) as f64;
    let lower = rank.floor();
    let upper = (lower + 1.0).min((sorted.len() - 1) as f64);
    let weight = rank - lower;
    sorted[lower as usize] * (1.0 - weight) + sorted[upper as usize] * weight
}

#[tokio::test]
async fn promql_quantiles_past_31_days_answer_from_sketches_only_when_asked() {
    let mut settings = crate::helpers::test_settings();
    settings.ingest.max_age = std::time::Duration::from_secs(45 * 86_400);
    let app = crate::helpers::spawn_app_with(settings).await;
    let base = base_time();
    let start = base - 42 * 86_400;
    let mut rng = Gen(31);
    // A few readings a day for 42 days, each day's in one burst of minutes.
    let mut truth: BTreeMap<i64, f64> = BTreeMap::new();
    for day in 0..42 {
        let t0 = start + day * 86_400 + rng.below(20 * HOUR as u64) as i64;
        for k in 0..1 + rng.below(6) as i64 {
            truth.insert(t0 + k * 61, rng.below(4000) as f64 / 8.0 - 100.0);
        }
    }
    let rows: Vec<(String, i64, f64)> = truth
        .iter()
        .map(|(&t, &v)| ("pq-long".to_owned(), t, v))
        .collect();
    post(&app, &rows).await;
    app.late_rolled_up().await;
    let at = base + 7;
    let ask = |q: String, extra: &str| {
        let q: String = url::form_urlencoded::byte_serialize(q.as_bytes()).collect();
        format!("/prometheus/api/v1/query?query={q}&time={at}{extra}")
    };
    let window = |range: i64| -> Vec<f64> {
        let mut v: Vec<f64> = truth.range(at - range + 1..=at).map(|(_, v)| *v).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    // Past 31 days: refused unless asked for, then within the accuracy.
    let long = "quantile_over_time(0.9, vib{sensor=\"pq-long\"}[40d])".to_owned();
    let r = app.get(&ask(long.clone(), "")).await;
    assert_eq!(r.status(), 400);
    assert!(
        r.text()
            .await
            .unwrap_or_default()
            .contains("quantile_sketches")
    );
    for q in [0.0, 0.1, 0.5, 0.9, 0.99, 1.0] {
        let query = format!("quantile_over_time({q}, vib{{sensor=\"pq-long\"}}[40d])");
        let body = app.get_json(&ask(query, "&quantile_sketches=true")).await;
        let got: f64 = body["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        let values = window(40 * 86_400);
        let want = prometheus_quantile(q, &values);
        // Interpolated between two estimates, each within the accuracy.
        let (lo, hi) = {
            let rank = q * (values.len() - 1) as f64;
            (
                values[rank.floor() as usize],
                values[(rank.floor() as usize + 1).min(values.len() - 1)],
            )
        };
        let bound = ACCURACY * lo.abs().max(hi.abs()) + 1e-9;
        assert!(
            (got - want).abs() <= bound,
            "q {q}: {got} against {want}: {body}"
        );
    }
    // A window within 31 days stays exact with the parameter too.
    let query = "quantile_over_time(0.9, vib{sensor=\"pq-long\"}[20d])".to_owned();
    let body = app.get_json(&ask(query, "&quantile_sketches=true")).await;
    let got: f64 = body["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    assert_eq!(
        got,
        prometheus_quantile(0.9, &window(20 * 86_400)),
        "{body}"
    );
    let r = app.get(&ask(long, "&quantile_sketches=maybe")).await;
    assert_eq!(r.status(), 400);
}

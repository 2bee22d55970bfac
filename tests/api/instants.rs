//! Values at instants through the service, against a scan of every reading
//! posted: a sensor reporting by exception (bursts, then quiet stretches
//! longer than the staleness limit), asked at readings' own seconds, between
//! them, before the first and after the last.

use serde_json::{Value, json};

use crate::helpers::{Gen, base_time, reading, rfc3339, spawn_app};

/// The model: the reading at or before the instant's second while it holds
/// (`previous`), or the line to the next one when at most `gap` apart
/// (`linear`), with the readings used.
fn model(xs: &[(i64, f64)], ms: i64, gap: i64, linear: bool) -> (Option<f64>, Vec<i64>) {
    let t = ms.div_euclid(1000);
    let prev = xs.iter().rev().find(|x| x.0 <= t);
    let next = xs.iter().find(|x| x.0 > t);
    match (prev, next) {
        (Some(p), _) if p.0 == t => (Some(p.1), vec![p.0]),
        (Some(p), _) if !linear => {
            if t - p.0 < gap {
                (Some(p.1), vec![p.0])
            } else {
                (None, vec![])
            }
        }
        (Some(p), Some(n)) if n.0 - p.0 <= gap => (
            Some(p.1 + (n.1 - p.1) * (t - p.0) as f64 / (n.0 - p.0) as f64),
            vec![p.0, n.0],
        ),
        _ => (None, vec![]),
    }
}

fn check(answer: &Value, asked: &[i64], xs: &[(i64, f64)], gap: i64, linear: bool) {
    let values = answer["values"].as_array().expect("values");
    assert_eq!(values.len(), asked.len(), "{answer}");
    for (v, &ms) in values.iter().zip(asked) {
        let (want, used) = model(xs, ms, gap, linear);
        let got = v["value"].as_f64();
        match (got, want) {
            (Some(g), Some(w)) => assert!((g - w).abs() <= 1e-9 * w.abs().max(1.0), "{v}: {w}"),
            _ => assert_eq!(got, want, "at {ms}: {v}"),
        }
        let readings: Vec<String> = v["readings"]
            .as_array()
            .expect("readings")
            .iter()
            .map(|r| r["ts"].as_str().expect("ts").to_owned())
            .collect();
        let want: Vec<String> = used.iter().map(|&t| rfc3339(t)).collect();
        assert_eq!(readings, want, "at {ms}: {v}");
    }
}

#[tokio::test]
async fn a_value_at_each_instant_is_the_reading_before_it_or_the_line_between_as_a_scan_of_every_reading_says()
 {
    let app = spawn_app().await;
    let start = base_time() - 86_400;
    let mut rng = Gen(93);
    let mut xs: Vec<(i64, f64)> = Vec::new();
    let mut t = start + 17;
    while t < start + 6 * 3600 {
        xs.push((t, (rng.below(2000) as f64 - 1000.0) / 8.0));
        t += if rng.below(5) == 0 {
            300 + rng.below(1800) as i64
        } else {
            1 + rng.below(60) as i64
        };
    }
    let body: Vec<Value> = xs
        .iter()
        .map(|&(t, v)| reading("door", "open", t, v))
        .collect();
    assert_eq!(app.post_readings(&Value::Array(body)).await.status(), 200);
    // Instants at readings' seconds (and half a second after), between
    // them, and outside the readings.
    let mut asked: Vec<i64> = vec![(start - 600) * 1000, (start + 7 * 3600) * 1000];
    for _ in 0..60 {
        let x = xs[rng.below(xs.len() as u64) as usize].0;
        asked.push(x * 1000 + if rng.below(2) == 0 { 0 } else { 500 });
        asked.push((start + rng.below(6 * 3600 + 1200) as i64 - 600) * 1000 + 250);
    }
    let ts: Vec<String> = asked.iter().map(i64::to_string).collect();
    for (method, linear) in [("previous", false), ("linear", true)] {
        let answer = app
            .get_json(&format!(
                "/api/v1/sensors/door/at?metric=open&staleness=10m&method={method}&ts={}",
                ts.join(",")
            ))
            .await;
        assert_eq!(answer["staleness_seconds"], 600, "{answer}");
        assert_eq!(answer["method"], method);
        check(&answer, &asked, &xs, 600, linear);
    }
    // A regular grid, with the fleet's staleness limit (a day): every
    // instant after the first reading has one.
    let (from, to) = (start - 1800, start + 7 * 3600);
    let grid: Vec<i64> = (0..=((to - from) / 900))
        .map(|k| (from + k * 900) * 1000)
        .collect();
    let answer = app
        .get_json(&format!(
            "/api/v1/sensors/door/at?metric=open&from={}&to={}&every=15m&method=linear",
            rfc3339(from),
            rfc3339(to)
        ))
        .await;
    assert_eq!(answer["staleness_seconds"], 86_400, "{answer}");
    check(&answer, &grid, &xs, 86_400, true);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn values_at_instants_refuse_what_they_cannot_answer_with_a_clear_error() {
    let app = spawn_app().await;
    let t = rfc3339(base_time());
    for (query, says) in [
        (format!("ts={t}&from={t}&to={t}&every=1h"), "not both"),
        (String::new(), "give ts"),
        (format!("ts={t}&method=nearest"), "method"),
        (format!("from={t}&to={t}&every=0s"), "every"),
        ("from=0&to=86400000&every=1s".to_owned(), "max_points"),
        (
            "from=0&to=34560000000&every=1h".to_owned(),
            "minute by minute",
        ),
        (format!("ts={t},soon"), "ts must be"),
        (format!("ts={t}&staleness=forever"), "staleness"),
    ] {
        let r = app
            .get(&format!("/api/v1/sensors/door/at?metric=open&{query}"))
            .await;
        assert_eq!(r.status(), 400, "{query}");
        let body: Value = r.json().await.expect("json");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(says)),
            "{query}: {body}"
        );
    }
    let empty = app
        .get_json(&format!("/api/v1/sensors/door/at?metric=open&ts={t}"))
        .await;
    assert_eq!(
        empty["values"],
        json!([{ "at": t, "value": null, "readings": [] }]),
        "{empty}"
    );
    app.stop().await.expect("clean stop");
}

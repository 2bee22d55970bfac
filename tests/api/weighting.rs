//! Time-weighted averages through the service, against a model of every
//! second: sensors reporting by exception (bursts while a value moves, long
//! holds between them), read from rolled-up hours, over ranges cut anywhere,
//! with staleness limits that take the pieces whole, by the hour and reading
//! by reading; one sensor at a time and as a group.

use serde_json::{Value, json};

use crate::helpers::{Gen, TestApp, base_time, rfc3339, spawn_app_with, test_settings};

const SENSORS: usize = 5;
const HOUR: i64 = 3600;

/// A value held for minutes to hours, then a burst of readings seconds
/// apart while it moves.
fn by_exception(rng: &mut Gen, from: i64, to: i64) -> Vec<(i64, f64)> {
    let mut out = Vec::new();
    let mut t = from + rng.below(600) as i64;
    let mut v = rng.below(100) as f64;
    while t < to {
        for _ in 0..1 + rng.below(20) {
            if t >= to {
                break;
            }
            out.push((t, v));
            v += (rng.below(9) as f64 - 4.0) / 4.0;
            t += 1 + rng.below(40) as i64;
        }
        // Holds: under a minute, under two hours, or up to ten.
        t += match rng.below(3) {
            0 => 1 + rng.below(60),
            1 => 1 + rng.below(2 * HOUR as u64),
            _ => 1 + rng.below(10 * HOUR as u64),
        } as i64;
    }
    out
}

/// Short bursts with holds of seconds to ten minutes between them: gaps
/// past a short staleness limit in most points of a series.
fn chatty(rng: &mut Gen, from: i64, to: i64) -> Vec<(i64, f64)> {
    let mut out = Vec::new();
    let mut t = from + rng.below(60) as i64;
    let mut v = rng.below(100) as f64;
    while t < to {
        out.push((t, v));
        v += (rng.below(9) as f64 - 4.0) / 4.0;
        t += match rng.below(3) {
            0 => 1 + rng.below(40),
            _ => 1 + rng.below(600),
        } as i64;
    }
    out
}

/// The held seconds and the integral over them of `[from, to)`, second by
/// second: a reading holds until the next one or `staleness` after it, a
/// line joins it to a next one within `staleness`.
pub(crate) fn model(
    xs: &[(i64, f64)],
    linear: bool,
    staleness: i64,
    from: i64,
    to: i64,
) -> (i64, f64) {
    let (mut held, mut integral) = (0, 0.0);
    let mut k: Option<usize> = None;
    for x in from..to {
        while xs.get(k.map_or(0, |k| k + 1)).is_some_and(|n| n.0 <= x) {
            k = Some(k.map_or(0, |k| k + 1));
        }
        let Some(k) = k else { continue };
        let (t, v) = xs[k];
        if x - t >= staleness {
            continue;
        }
        integral += match xs.get(k + 1) {
            Some(&(nt, nv)) if linear && nt - t <= staleness => {
                let at = |y: i64| v + (nv - v) * (y - t) as f64 / (nt - t) as f64;
                (at(x) + at(x + 1)) / 2.0
            }
            _ => v,
        };
        held += 1;
    }
    (held, integral)
}

async fn post(app: &TestApp, sensor: &str, xs: &[(i64, f64)]) {
    for chunk in xs.chunks(5000) {
        let body: Vec<Value> = chunk
            .iter()
            .map(|(t, v)| json!({ "sensor": sensor, "metric": "valve", "ts": rfc3339(*t), "value": v }))
            .collect();
        let r = app.post_readings(&json!(body)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
}

#[tokio::test]
async fn time_weighted_averages_equal_a_model_of_every_second_at_any_boundary_and_staleness() {
    let mut settings = test_settings();
    // Room for a reading 40 days back (below).
    settings.ingest.max_age = std::time::Duration::from_secs(45 * 86_400);
    let app = spawn_app_with(settings).await;
    let base = base_time();
    let (from, to) = (base - 24 * HOUR, base + 24 * HOUR);
    let mut rng = Gen(66);
    let mut data = Vec::new();
    for k in 0..SENSORS {
        let sensor = format!("tw-{k}");
        let xs = by_exception(&mut rng, from, to);
        post(&app, &sensor, &xs).await;
        data.push((sensor, xs));
    }
    // The hours are rolled up: whole slots answer where they can.
    app.late_rolled_up().await;
    let mut asked = 0;
    for (sensor, xs) in &data {
        let cut = |rng: &mut Gen| from + rng.below((to - from) as u64) as i64;
        let (a, b) = (cut(&mut rng), cut(&mut rng));
        let ranges = [
            (from, to),
            (base - 17 * HOUR + 123, base + 5 * HOUR + 7),
            (a.min(b), a.max(b) + 1),
        ];
        for (a, b) in ranges {
            for (staleness, seconds) in [
                ("", 86_400),
                ("&staleness=2h", 2 * HOUR),
                ("&staleness=90s", 90),
            ] {
                for (weighting, linear) in [("time", false), ("linear", true)] {
                    let body = app
                        .get_json(&format!(
                            "/api/v1/sensors/{sensor}/average?metric=valve&from={}&to={}&weighting={weighting}{staleness}",
                            rfc3339(a),
                            rfc3339(b)
                        ))
                        .await;
                    let (held, integral) = model(xs, linear, seconds, a, b);
                    let what = format!("{sensor} [{a}, {b}) {weighting}{staleness}: {body}");
                    assert_eq!(body["held_seconds"], json!(held), "{what}");
                    assert_eq!(body["weighting"], json!(weighting), "{what}");
                    let inside = xs.iter().filter(|x| x.0 >= a && x.0 < b).count();
                    assert_eq!(body["count"], json!(inside), "{what}");
                    if held == 0 {
                        assert_eq!(body["avg"], Value::Null, "{what}");
                    } else {
                        let want = integral / held as f64;
                        let got = body["avg"].as_f64().expect("an average");
                        assert!(
                            (got - want).abs() <= 1e-9 * (1.0 + want.abs()),
                            "{want}: {what}"
                        );
                    }
                    asked += 1;
                }
            }
        }
    }
    assert_eq!(asked, SENSORS * 3 * 3 * 2);
    // A group weighs its sensors' integrals over their held time together.
    let (a, b) = (base - 17 * HOUR + 123, base + 5 * HOUR + 7);
    for (staleness, seconds) in [("", 86_400), ("&staleness=90s", 90)] {
        let body = app
            .get_json(&format!(
                "/api/v1/average?metric=valve&sensor=tw-?&from={}&to={}&weighting=time{staleness}",
                rfc3339(a),
                rfc3339(b)
            ))
            .await;
        let (held, integral) = data
            .iter()
            .map(|(_, xs)| model(xs, false, seconds, a, b))
            .fold((0, 0.0), |(h, i), (h2, i2)| (h + h2, i + i2));
        let group = &body["groups"][0];
        assert_eq!(body["weighting"], json!("time"), "{body}");
        assert_eq!(group["sensors"], json!(SENSORS), "{body}");
        assert_eq!(group["held_seconds"], json!(held), "{body}");
        let want = integral / held as f64;
        let got = group["avg"].as_f64().expect("an average");
        assert!(
            (got - want).abs() <= 1e-9 * (1.0 + want.abs()),
            "{want}: {body}"
        );
    }
    // A sensor's `staleness` label is its limit where the request sets none.
    for (sensor, limit) in [("tw-1", "90s"), ("tw-2", "2h")] {
        let r = app
            .client
            .put(format!("{}/api/v1/sensors/{sensor}/labels", app.address))
            .json(&json!({ "staleness": limit }))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 204);
    }
    let limit_of = |sensor: &str| match sensor {
        "tw-1" => 90,
        "tw-2" => 2 * HOUR,
        _ => 86_400,
    };
    for (sensor, xs) in &data[..3] {
        for (asked, seconds) in [("", limit_of(sensor)), ("&staleness=1d", 86_400)] {
            let body = app
                .get_json(&format!(
                    "/api/v1/sensors/{sensor}/average?metric=valve&from={}&to={}&weighting=time{asked}",
                    rfc3339(a),
                    rfc3339(b)
                ))
                .await;
            assert_eq!(
                body["staleness_seconds"],
                json!(seconds),
                "{sensor}{asked}: {body}"
            );
            let (held, _) = model(xs, false, seconds, a, b);
            assert_eq!(body["held_seconds"], json!(held), "{sensor}{asked}: {body}");
        }
    }
    // A group weighs each sensor with its own limit.
    let body = app
        .get_json(&format!(
            "/api/v1/average?metric=valve&sensor=tw-?&from={}&to={}&weighting=linear",
            rfc3339(a),
            rfc3339(b)
        ))
        .await;
    let (held, integral) = data
        .iter()
        .map(|(sensor, xs)| model(xs, true, limit_of(sensor), a, b))
        .fold((0, 0.0), |(h, i), (h2, i2)| (h + h2, i + i2));
    let group = &body["groups"][0];
    assert_eq!(group["held_seconds"], json!(held), "{body}");
    let want = integral / held as f64;
    let got = group["avg"].as_f64().expect("an average");
    assert!(
        (got - want).abs() <= 1e-9 * (1.0 + want.abs()),
        "{want}: {body}"
    );
    // Readings weigh once each, as without the parameter.
    let (sensor, xs) = &data[0];
    let body = app
        .get_json(&format!(
            "/api/v1/sensors/{sensor}/average?metric=valve&from={}&to={}&weighting=readings",
            rfc3339(from),
            rfc3339(to)
        ))
        .await;
    let mean = xs.iter().map(|x| x.1).sum::<f64>() / xs.len() as f64;
    assert!((body["avg"].as_f64().expect("avg") - mean).abs() < 1e-9 * (1.0 + mean.abs()));
    assert_eq!(body.get("weighting"), None);
    for bad in [
        "weighting=mean",
        "weighting=time&staleness=0s",
        "weighting=time&staleness=soon",
    ] {
        let r = app
            .get(&format!(
                "/api/v1/sensors/{sensor}/average?metric=valve&from={}&to={}&{bad}",
                rfc3339(from),
                rfc3339(to)
            ))
            .await;
        assert_eq!(r.status(), 400, "{bad}");
        let text = r.text().await.unwrap_or_default();
        assert!(
            text.contains("weighting") || text.contains("staleness"),
            "{bad}: {text}"
        );
    }
    // Hours holding gaps past a 1 s limit 40 days apart are more readings
    // than one request reads: refused, with what to ask instead.
    let far = [
        (base - 40 * 86_400, 1.0),
        (base - 40 * 86_400 + 10, 2.0),
        (base, 3.0),
        (base + 10, 4.0),
    ];
    post(&app, "tw-far", &far).await;
    let ask = |from: i64, staleness: &str| {
        format!(
            "/api/v1/sensors/tw-far/average?metric=valve&from={}&to={}&weighting=time&staleness={staleness}",
            rfc3339(from),
            rfc3339(base + HOUR)
        )
    };
    let r = app.get(&ask(base - 41 * 86_400, "1s")).await;
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap_or_default().contains("staleness"));
    // A shorter range, or a limit the gaps are within, is answered.
    let body = app.get_json(&ask(base - HOUR, "1s")).await;
    assert_eq!(body["held_seconds"], json!(2), "{body}");
    let body = app.get_json(&ask(base - 41 * 86_400, "1m")).await;
    assert_eq!(body["held_seconds"], json!(10 + 60 + 10 + 60), "{body}");
}

/// The expected points of a series over `[a, b)` at `step` seconds
/// (aligned to the epoch): each point's held seconds and integral.
fn model_points(
    xs: &[(i64, f64)],
    linear: bool,
    staleness: i64,
    (a, b): (i64, i64),
    step: i64,
) -> Vec<(i64, f64)> {
    let mut out = Vec::new();
    let mut start = a - a.rem_euclid(step);
    while start < b {
        out.push(model(
            xs,
            linear,
            staleness,
            start.max(a),
            (start + step).min(b),
        ));
        start += step;
    }
    out
}

fn assert_point(point: &Value, (held, integral): (i64, f64), what: &str) {
    assert_eq!(point["held_seconds"], json!(held), "{what}: {point}");
    if held == 0 {
        assert_eq!(point["avg"], Value::Null, "{what}: {point}");
    } else {
        let want = integral / held as f64;
        let got = point["avg"].as_f64().expect("an average");
        assert!(
            (got - want).abs() <= 1e-9 * (1.0 + want.abs()),
            "{want}: {what}: {point}"
        );
    }
}

#[tokio::test]
async fn time_weighted_series_weigh_each_point_with_the_value_carried_in_from_the_one_before() {
    let app = spawn_app_with(test_settings()).await;
    let base = base_time();
    let (from, to) = (base - 24 * HOUR, base + 24 * HOUR);
    let mut rng = Gen(67);
    let mut data = Vec::new();
    for k in 0..3 {
        let sensor = format!("ts-{k}");
        let xs = if k == 0 {
            chatty(&mut rng, from, to)
        } else {
            by_exception(&mut rng, from, to)
        };
        post(&app, &sensor, &xs).await;
        data.push((sensor, xs));
    }
    app.late_rolled_up().await;
    let (a, b) = (base - 17 * HOUR + 123, base + 5 * HOUR + 7);
    let range = format!("from={}&to={}", rfc3339(a), rfc3339(b));
    // One sensor: hourly and 5-minute points, whole, by the hour and
    // reading by reading (its holds pass a 90 s limit in most points).
    let (sensor, xs) = &data[0];
    for (step, step_seconds) in [("1h", HOUR), ("5m", 300)] {
        for (staleness, seconds) in [
            ("", 86_400),
            ("&staleness=2h", 2 * HOUR),
            ("&staleness=90s", 90),
        ] {
            for (weighting, linear) in [("time", false), ("linear", true)] {
                let body = app
                    .get_json(&format!(
                        "/api/v1/sensors/{sensor}/series?metric=valve&{range}&step={step}&weighting={weighting}{staleness}"
                    ))
                    .await;
                assert_eq!(body["weighting"], json!(weighting), "{body}");
                let want = model_points(xs, linear, seconds, (a, b), step_seconds);
                let points = body["points"].as_array().expect("points");
                assert_eq!(points.len(), want.len(), "{body}");
                for (k, (point, want)) in points.iter().zip(want).enumerate() {
                    let what = format!("{sensor} {step} {weighting}{staleness} point {k}");
                    assert_point(point, want, &what);
                }
            }
        }
    }
    // A group's points: its sensors' integrals over their held time together.
    let body = app
        .get_json(&format!(
            "/api/v1/series?metric=valve&sensor=ts-?&{range}&step=3h&weighting=time&staleness=2h"
        ))
        .await;
    assert_eq!(body["weighting"], json!("time"), "{body}");
    let each: Vec<Vec<(i64, f64)>> = data
        .iter()
        .map(|(_, xs)| model_points(xs, false, 2 * HOUR, (a, b), 3 * HOUR))
        .collect();
    let points = body["groups"][0]["points"].as_array().expect("points");
    assert_eq!(points.len(), each[0].len(), "{body}");
    for (k, point) in points.iter().enumerate() {
        let want = each
            .iter()
            .map(|e| e[k])
            .fold((0, 0.0), |(h, i), (h2, i2)| (h + h2, i + i2));
        assert_point(point, want, &format!("group point {k}"));
    }
    // CSV carries the held seconds last.
    let r = app
        .get(&format!(
            "/api/v1/sensors/{sensor}/series?metric=valve&{range}&step=1h&weighting=time&format=csv"
        ))
        .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("csv");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("start,count,sum,avg,min,max,held_seconds")
    );
    let want = model_points(xs, false, 86_400, (a, b), HOUR);
    let held: Vec<i64> = lines
        .map(|l| {
            l.rsplit(',')
                .next()
                .and_then(|h| h.parse().ok())
                .expect("held")
        })
        .collect();
    assert_eq!(held, want.iter().map(|w| w.0).collect::<Vec<_>>());
    // The export's step form: every sensor's points with readings or held
    // time, the same figures.
    let text = app
        .get(&format!(
            "/api/v1/export?metric=valve&sensor=ts-?&{range}&step=1h&weighting=linear&staleness=2h"
        ))
        .await
        .text()
        .await
        .expect("ndjson");
    let mut want: Vec<(String, i64, (i64, f64))> = Vec::new();
    for (sensor, xs) in &data {
        let points = model_points(xs, true, 2 * HOUR, (a, b), HOUR);
        for (k, p) in points.into_iter().enumerate() {
            let start = a - a.rem_euclid(HOUR) + k as i64 * HOUR;
            let count = xs
                .iter()
                .filter(|x| x.0 >= start.max(a) && x.0 < (start + HOUR).min(b))
                .count();
            if count > 0 || p.0 > 0 {
                want.push((sensor.clone(), start, p));
            }
        }
    }
    let rows: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect();
    assert_eq!(rows.len(), want.len(), "{text}");
    for (row, (sensor, start, p)) in rows.iter().zip(want) {
        assert_eq!(row["sensor"], json!(sensor), "{row}");
        assert_eq!(row["start"], json!(rfc3339(start)), "{row}");
        assert_point(row, p, &format!("export of {sensor}"));
    }
    let r = app
        .get(&format!(
            "/api/v1/export?metric=valve&{range}&weighting=time"
        ))
        .await;
    assert_eq!(r.status(), 400, "raw readings are not weighted");
    // A staleness limit means nothing to the mean of readings.
    let r = app
        .get(&format!(
            "/api/v1/sensors/{sensor}/series?metric=valve&{range}&step=1h&staleness=1h"
        ))
        .await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap_or_default().contains("staleness"));
}

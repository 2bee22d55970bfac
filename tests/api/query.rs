use std::collections::BTreeMap;

use hourglass::Granularity;
use serde_json::{Value, json};

use crate::helpers::*;

/// Writes a known data set: about three hours of one sensor, irregular seconds.
async fn seed(app: &TestApp, t: i64) -> BTreeMap<i64, f64> {
    let mut data = BTreeMap::new();
    let mut body = Vec::new();
    let mut o = 0i64;
    while o < 3 * 3600 + 500 {
        let v = ((o * 7919) % 1000) as f64 / 4.0 - 100.0;
        data.insert(t + o, v);
        body.push(reading("q1", "speed", t + o, v));
        o += 1 + (o * 31) % 17;
    }
    for chunk in body.chunks(2000) {
        assert_eq!(
            app.post_readings(&Value::Array(chunk.to_vec()))
                .await
                .status(),
            200
        );
    }
    data
}

fn assert_point(got: &Value, want: (u64, f64, Option<f64>, Option<f64>), what: &str) {
    let (count, sum, min, max) = want;
    assert_eq!(got["count"].as_u64(), Some(count), "{what}: {got}");
    assert_eq!(got["sum"].as_f64(), Some(sum), "{what}: {got}");
    assert_eq!(got["min"].as_f64(), min, "{what}: {got}");
    assert_eq!(got["max"].as_f64(), max, "{what}: {got}");
    // avg is derived, so its decimal text may round-trip within an ULP.
    match (count, got["avg"].as_f64()) {
        (0, _) => assert!(got["avg"].is_null(), "{what}: avg is null when empty"),
        (n, Some(avg)) => {
            let want = sum / n as f64;
            assert!(
                (avg - want).abs() <= want.abs() * 1e-12,
                "{what}: avg {avg} != {want}"
            );
        }
        (_, None) => panic!("{what}: avg missing in {got}"),
    }
}

#[tokio::test]
async fn averages_are_exact_at_aligned_and_unaligned_boundaries() {
    for g in [Granularity::Minute, Granularity::Hour] {
        let app = spawn_app_with(settings_with(g)).await;
        let t = base_time();
        let data = seed(&app, t).await;
        let ranges = [
            (t, t + 3 * 3600),               // whole buckets only
            (t + 17, t + 2 * 3600 + 3333),   // partial edges in both
            (t + 3600 + 61, t + 3600 + 119), // inside one minute
            (t + 125, t + 3599),             // inside one hour
            (t - 7200, t - 3600),            // nothing there
        ];
        for (from, to) in ranges {
            let path = format!(
                "/api/v1/sensors/q1/average?metric=speed&from={}&to={}",
                rfc3339(from),
                rfc3339(to)
            );
            let got = app.get_json(&path).await;
            assert_eq!(got["sensor"], "q1");
            assert_eq!(got["metric"], "speed");
            assert_eq!(got["from"], rfc3339(from));
            assert_point(
                &got,
                expected(&data, from, to),
                &format!("{g:?} {from}..{to}"),
            );
        }
        app.stop().await.expect("clean stop");
    }
}

#[tokio::test]
async fn epoch_millisecond_bounds_count_a_second_from_its_start() {
    let app = spawn_app().await;
    let t = base_time();
    let data = seed(&app, t).await;
    // from in the middle of a second excludes that second; to in the middle includes it.
    let (from_ms, to_ms) = (t * 1000 + 500, (t + 100) * 1000 + 1);
    let got = app
        .get_json(&format!(
            "/api/v1/sensors/q1/average?metric=speed&from={from_ms}&to={to_ms}"
        ))
        .await;
    assert_point(&got, expected(&data, t + 1, t + 101), "ms bounds");
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn series_have_one_point_per_step_and_empty_steps_count_zero() {
    for g in [Granularity::Minute, Granularity::Hour] {
        let app = spawn_app_with(settings_with(g)).await;
        let t = base_time();
        let data = seed(&app, t).await;
        for (step, secs) in [
            ("1m", 60),
            ("5m", 300),
            ("15m", 900),
            ("1h", 3600),
            ("7m", 420),
        ] {
            let (from, to) = (t - 1800 + 13, t + 3 * 3600 + 1234);
            let path = format!(
                "/api/v1/sensors/q1/series?metric=speed&from={}&to={}&step={step}",
                rfc3339(from),
                rfc3339(to)
            );
            let got = app.get_json(&path).await;
            assert_eq!(got["step"], step);
            let points = got["points"].as_array().expect("points");
            let origin = from - from.rem_euclid(secs);
            let n = ((to - origin) + secs - 1) / secs;
            assert_eq!(points.len() as i64, n, "{g:?} {step}");
            let mut empty = 0;
            for (i, p) in points.iter().enumerate() {
                let start = origin + i as i64 * secs;
                assert_eq!(p["start"], rfc3339(start), "{g:?} {step}");
                let want = expected(&data, start.max(from), (start + secs).min(to));
                if want.0 == 0 {
                    empty += 1;
                }
                assert_point(p, want, &format!("{g:?} {step} point {i}"));
            }
            assert!(
                empty > 0,
                "the range starts before the data: some steps are empty"
            );
        }
        app.stop().await.expect("clean stop");
    }
}

#[tokio::test]
async fn a_day_step_aligns_to_utc_midnight() {
    let app = spawn_app().await;
    let t = base_time();
    let data = seed(&app, t).await;
    let (from, to) = (t - 86_400, t + 86_400);
    let got = app
        .get_json(&format!(
            "/api/v1/sensors/q1/series?metric=speed&from={}&to={}&step=1d",
            rfc3339(from),
            rfc3339(to)
        ))
        .await;
    let points = got["points"].as_array().expect("points");
    let midnight = from - from.rem_euclid(86_400);
    assert_eq!(points[0]["start"], rfc3339(midnight));
    let total: u64 = points
        .iter()
        .map(|p| p["count"].as_u64().expect("count"))
        .sum();
    assert_eq!(total, data.len() as u64);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn queries_with_bad_parameters_are_400_with_a_reason() {
    let mut s = test_settings();
    s.query.max_points = 100;
    s.query.max_range = std::time::Duration::from_secs(7 * 86_400);
    let app = spawn_app_with(s).await;
    let t = base_time();
    let (from, to) = (rfc3339(t), rfc3339(t + 3600));
    let cases = [
        format!("/api/v1/sensors/q1/series?from={from}&to={to}&step=30s"),
        format!("/api/v1/sensors/q1/series?from={from}&to={to}&step=0m"),
        format!("/api/v1/sensors/q1/series?from={from}&to={to}"),
        format!(
            "/api/v1/sensors/q1/series?from={from}&to={}&step=1m",
            rfc3339(t + 86_400)
        ),
        format!("/api/v1/sensors/q1/average?from={to}&to={from}"),
        format!("/api/v1/sensors/q1/average?from={from}&to={from}"),
        format!(
            "/api/v1/sensors/q1/average?from={from}&to={}",
            rfc3339(t + 8 * 86_400)
        ),
        format!("/api/v1/sensors/q1/average?from=yesterday&to={to}"),
        format!("/api/v1/sensors/q1/average?to={to}"),
        format!("/api/v1/sensors/q1/average?from={from}&to={to}&metric=a.b"),
        format!("/api/v1/sensors/q1/average?from={from}&to={to}&bogus=1"),
        format!("/api/v1/sensors/bad$id/average?from={from}&to={to}"),
    ];
    for path in cases {
        let r = app.get(&path).await;
        assert_eq!(r.status(), 400, "{path}");
        let body: Value = r.json().await.expect("a JSON error");
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{path}: {body}"
        );
    }
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_unknown_sensor_has_a_null_average() {
    let app = spawn_app().await;
    let t = base_time();
    let got = app
        .get_json(&format!(
            "/api/v1/sensors/nobody/average?from={}&to={}",
            rfc3339(t),
            rfc3339(t + 60)
        ))
        .await;
    assert_eq!(
        got,
        json!({
            "sensor": "nobody", "metric": "value", "from": rfc3339(t), "to": rfc3339(t + 60),
            "count": 0, "sum": 0.0, "avg": null, "min": null, "max": null,
        })
    );
    app.stop().await.expect("clean stop");
}

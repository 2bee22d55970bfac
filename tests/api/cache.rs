//! The results cache of closed periods through the service: answers equal
//! the readings' truth cold and warm, and stay equal after a correction
//! through another instance, a late write, a delete, a rebuild of the
//! rollups and a retention pass; a request can bypass the cache.

use std::collections::BTreeMap;

use mongodb::bson::{Document, doc};
use serde_json::Value;

use crate::helpers::*;

const SENSORS: [&str; 3] = ["cq-0", "cq-1", "cq-2"];
const HOURS: i64 = 30;

type Truth = BTreeMap<(String, i64), f64>;

async fn post(app: &TestApp, readings: &[(String, i64, f64)], truth: &mut Truth) {
    let body: Vec<Value> = readings
        .iter()
        .map(|(s, t, v)| reading(s, "temp", *t, *v))
        .collect();
    for chunk in body.chunks(500) {
        let r = app.post_readings(&Value::Array(chunk.to_vec())).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
    for (s, t, v) in readings {
        truth.insert((s.clone(), *t), *v);
    }
}

/// Each sensor's hourly `(count, sum)` over `[from, from + HOURS h)`.
fn hourly(truth: &Truth, from: i64) -> BTreeMap<String, Vec<(u64, f64)>> {
    SENSORS
        .iter()
        .map(|s| {
            let points = (0..HOURS)
                .map(|h| {
                    let (a, b) = (from + h * 3600, from + (h + 1) * 3600);
                    let vals: Vec<f64> = truth
                        .range(((*s).to_owned(), a)..((*s).to_owned(), b))
                        .map(|(_, v)| *v)
                        .collect();
                    (vals.len() as u64, vals.iter().sum())
                })
                .collect();
            ((*s).to_owned(), points)
        })
        .collect()
}

/// The hourly series of every sensor, as the JSON API answers them.
async fn answered(app: &TestApp, from: i64, no_cache: bool) -> BTreeMap<String, Vec<(u64, f64)>> {
    let path = format!(
        "/api/v1/series?metric=temp&sensor=cq-*&group_by=sensor&step=1h&from={}&to={}",
        rfc3339(from),
        rfc3339(from + HOURS * 3600)
    );
    let mut r = app.client.get(format!("{}{path}", app.address));
    if no_cache {
        r = r.header("cache-control", "no-cache");
    }
    let got: Value = r.send().await.expect("sent").json().await.expect("JSON");
    got["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            let points = g["points"]
                .as_array()
                .expect("points")
                .iter()
                .map(|p| {
                    (
                        p["count"].as_u64().unwrap_or(0),
                        p["sum"].as_f64().unwrap_or(0.0),
                    )
                })
                .collect();
            (
                g["group"]["sensor"].as_str().expect("sensor").to_owned(),
                points,
            )
        })
        .collect()
}

/// The PromQL hourly sums of every sensor at the ends of the hours.
async fn promql_sums(app: &TestApp, from: i64) -> BTreeMap<String, Vec<f64>> {
    let form = [
        ("query", "sum_over_time(temp[1h])".to_owned()),
        ("start", (from + 3600).to_string()),
        ("end", (from + HOURS * 3600).to_string()),
        ("step", "3600".to_owned()),
    ];
    let got: Value = app
        .client
        .post(format!("{}/prometheus/api/v1/query_range", app.address))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(&form)
                .finish(),
        )
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    got["data"]["result"]
        .as_array()
        .expect("a matrix")
        .iter()
        .map(|s| {
            let values = s["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|v| {
                    v[1].as_str()
                        .and_then(|x| x.parse().ok())
                        .unwrap_or(f64::NAN)
                })
                .collect();
            (
                s["metric"]["sensor"].as_str().expect("sensor").to_owned(),
                values,
            )
        })
        .collect()
}

/// Each sensor's PromQL hourly sums: windows `(t − 1h, t]` at the ends of
/// the hours, those without a reading absent (as from a matrix).
fn sums(truth: &Truth, from: i64) -> BTreeMap<String, Vec<f64>> {
    SENSORS
        .iter()
        .map(|s| {
            let sums = (1..=HOURS)
                .filter_map(|h| {
                    let (a, b) = (from + (h - 1) * 3600 + 1, from + h * 3600 + 1);
                    let vals: Vec<f64> = truth
                        .range(((*s).to_owned(), a)..((*s).to_owned(), b))
                        .map(|(_, v)| *v)
                        .collect();
                    (!vals.is_empty()).then(|| vals.iter().sum())
                })
                .collect();
            ((*s).to_owned(), sums)
        })
        .collect()
}

/// Asks the JSON API and PromQL twice and compares both with the truth;
/// answers the cache hits and misses the second asking counted.
async fn exact_twice(app: &TestApp, truth: &Truth, from: i64, when: &str) -> (f64, f64) {
    let want = hourly(truth, from);
    assert_eq!(answered(app, from, false).await, want, "{when}: cold");
    assert_eq!(
        promql_sums(app, from).await,
        sums(truth, from),
        "{when}: PromQL, cold"
    );
    let hits = app.metric("hourglass_query_cache_hits_total").await;
    let misses = app.metric("hourglass_query_cache_misses_total").await;
    assert_eq!(answered(app, from, false).await, want, "{when}: warm");
    assert_eq!(
        promql_sums(app, from).await,
        sums(truth, from),
        "{when}: PromQL, warm"
    );
    (
        app.metric("hourglass_query_cache_hits_total").await - hits,
        app.metric("hourglass_query_cache_misses_total").await - misses,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_answers_stay_exact_through_corrections_elsewhere_late_writes_deletes_rebuilds_and_retention()
 {
    let mut settings = test_settings();
    settings.ingest.max_age = std::time::Duration::from_secs(40 * 86_400);
    // Kept 40 days and 2 hours: the cache keeps nothing from before 39 days
    // and 2 hours ago (the horizon, less a day), where ingest still takes it.
    settings.retention.buckets =
        hourglass::Keep::For(std::time::Duration::from_secs(40 * 86_400 + 7200));
    let a = spawn_app_with(settings.clone()).await;
    let mut other = settings.clone();
    other.journal.dir = journal_dir();
    let b = spawn_app_with(other).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let from = now - now.rem_euclid(3600) - (HOURS + 3) * 3600;
    let mut truth = Truth::new();
    let readings: Vec<(String, i64, f64)> = SENSORS
        .iter()
        .enumerate()
        .flat_map(|(k, s)| {
            (0..HOURS * 3600 / 420).map(move |i| {
                (
                    (*s).to_owned(),
                    from + i * 420 + 7 * k as i64,
                    ((i * 13 + k as i64) % 40) as f64 / 4.0,
                )
            })
        })
        .collect();
    post(&a, &readings, &mut truth).await;
    a.late_rolled_up().await;
    let (hits, _) = exact_twice(&a, &truth, from, "written").await;
    assert!(hits > 0.0, "the second asking was answered from the cache");

    // A correction and a new reading through another instance, into a
    // cached hour: its cell is read again once (from the buckets while the
    // hour is marked late) and then kept; a second write into it drops it
    // again.
    let (s0, t) = (readings[40].0.clone(), readings[40].1);
    post(
        &b,
        &[(s0.clone(), t, 99.5), (s0.clone(), t + 1, -3.0)],
        &mut truth,
    )
    .await;
    let (_, misses) = exact_twice(
        &a,
        &truth,
        from,
        "after a correction through another instance",
    )
    .await;
    assert_eq!(misses, 0.0, "the hour written late was kept once read");
    post(&b, &[(s0, t + 2, 7.25)], &mut truth).await;
    exact_twice(
        &a,
        &truth,
        from,
        "after a second write into the hour marked late",
    )
    .await;
    a.late_rolled_up().await;
    exact_twice(&a, &truth, from, "after its hour was rolled up again").await;

    // A delete of twenty minutes of one sensor, through the other instance.
    let (a_del, b_del) = (from + 10 * 3600 + 600, from + 10 * 3600 + 1800);
    let r = b
        .client
        .delete(format!(
            "{}/api/v1/readings?sensor=cq-1&from={}&to={}",
            b.address,
            rfc3339(a_del),
            rfc3339(b_del)
        ))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    truth.retain(|(s, t), _| !(s == "cq-1" && *t >= a_del && *t < b_del));
    exact_twice(&a, &truth, from, "after a delete").await;
    a.late_rolled_up().await;

    // A rebuild of the rollups: everything kept goes.
    hourglass::rebuild_rollups(&a.settings, None, Some(from), None)
        .await
        .expect("rebuilt");
    let misses = a.metric("hourglass_query_cache_misses_total").await;
    exact_twice(&a, &truth, from, "after a rebuild").await;
    assert!(
        a.metric("hourglass_query_cache_misses_total").await > misses,
        "the rebuild emptied the cache"
    );

    // Asked not to, the service answers from storage.
    let hits = a.metric("hourglass_query_cache_hits_total").await;
    assert_eq!(answered(&a, from, true).await, hourly(&truth, from));
    assert_eq!(a.metric("hourglass_query_cache_hits_total").await, hits);

    // Near the retention horizon nothing is kept: a retention pass there
    // (the server's TTL monitor, done here at once) shows at once.
    let old = now - now.rem_euclid(3600) - 39 * 86_400 - 8 * 3600;
    let old_readings: Vec<(String, i64, f64)> = (0..HOURS * 6)
        .map(|i| ("cq-0".to_owned(), old + i * 600, 1.0))
        .collect();
    let mut old_truth = Truth::new();
    post(&a, &old_readings, &mut old_truth).await;
    a.late_rolled_up().await;
    let hits = a.metric("hourglass_query_cache_hits_total").await;
    assert_eq!(answered(&a, old, false).await, hourly(&old_truth, old));
    assert_eq!(answered(&a, old, false).await, hourly(&old_truth, old));
    assert_eq!(
        a.metric("hourglass_query_cache_hits_total").await,
        hits,
        "nothing near the horizon is kept"
    );
    for collection in [
        &settings.mongodb.collection,
        &settings.mongodb.rollup_collection,
    ] {
        a.db.collection::<Document>(collection)
            .delete_many(doc! { "start": { "$lt": mongodb::bson::DateTime::from_millis((old + HOURS * 3600) * 1000) } })
            .await
            .expect("expired");
    }
    assert_eq!(answered(&a, old, false).await, hourly(&Truth::new(), old));
    b.stop().await.expect("stops");
    a.stop().await.expect("stops");
}

/// Each sensor's hourly counts over `[from, from + hours h)`, asked with
/// the cache bypassed (`no_cache`) or not.
async fn counts(
    app: &TestApp,
    glob: &str,
    from: i64,
    hours: i64,
    no_cache: bool,
) -> BTreeMap<String, Vec<u64>> {
    let path = format!(
        "/api/v1/series?metric=temp&sensor={glob}&group_by=sensor&step=1h&from={}&to={}",
        rfc3339(from),
        rfc3339(from + hours * 3600)
    );
    let mut r = app.client.get(format!("{}{path}", app.address));
    if no_cache {
        r = r.header("cache-control", "no-cache");
    }
    let got: Value = r.send().await.expect("sent").json().await.expect("JSON");
    got["groups"]
        .as_array()
        .unwrap_or_else(|| panic!("groups in {got}"))
        .iter()
        .map(|g| {
            let points = g["points"]
                .as_array()
                .expect("points")
                .iter()
                .map(|p| p["count"].as_u64().unwrap_or(0))
                .collect();
            (
                g["group"]["sensor"].as_str().expect("sensor").to_owned(),
                points,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensors_quiet_since_before_a_range_are_answered_without_a_read_until_one_writes_into_it() {
    let a = spawn_app().await;
    let mut other = a.settings.clone();
    other.journal.dir = journal_dir();
    let b = spawn_app_with(other).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let from = now - now.rem_euclid(3600) - 6 * 3600;
    let mut truth = Truth::new();
    // Three sensors whose readings end two days before the range, one
    // with readings in it.
    let mut readings: Vec<(String, i64, f64)> = (0..3)
        .flat_map(|k| {
            (0..6).map(move |i| (format!("sq-quiet-{k}"), from - 2 * 86_400 + i * 600, 1.0))
        })
        .collect();
    readings.extend((0..36).map(|i| ("sq-live".to_owned(), from + i * 600, 2.0)));
    post(&a, &readings, &mut truth).await;
    a.late_rolled_up().await;
    let reads = "hourglass_store_level_reads_total";

    let before = a.metric(reads).await;
    let quiet = counts(&a, "sq-quiet-*", from, 6, true).await;
    assert_eq!(quiet.len(), 3, "{quiet:?}");
    assert!(quiet.values().flatten().all(|&c| c == 0), "{quiet:?}");
    assert_eq!(
        a.metric(reads).await,
        before,
        "the quiet sensors read nothing"
    );
    let live = counts(&a, "sq-live", from, 6, true).await;
    assert_eq!(live["sq-live"], vec![6; 6]);
    assert!(
        a.metric(reads).await > before,
        "a sensor with readings reads them"
    );

    // A reading into the range through another instance, and one through
    // this one: each answered at once, cold and warm.
    post(
        &b,
        &[("sq-quiet-1".to_owned(), from + 2 * 3600 + 5, 3.0)],
        &mut truth,
    )
    .await;
    post(
        &a,
        &[("sq-quiet-2".to_owned(), from + 4 * 3600 + 5, 4.0)],
        &mut truth,
    )
    .await;
    let mut want: BTreeMap<String, Vec<u64>> = (0..3)
        .map(|k| (format!("sq-quiet-{k}"), vec![0; 6]))
        .collect();
    want.get_mut("sq-quiet-1").expect("sensor")[2] = 1;
    want.get_mut("sq-quiet-2").expect("sensor")[4] = 1;
    for no_cache in [true, false, false] {
        assert_eq!(counts(&a, "sq-quiet-*", from, 6, no_cache).await, want);
    }
    b.stop().await.expect("stops");
    a.stop().await.expect("stops");
}

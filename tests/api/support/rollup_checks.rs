//! Checks the suites share on what the service stored: every complete
//! rollup slot against its buckets, the aggregates of an average, the
//! documents a query read; and the paths and calls they use.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{Bson, doc};
use serde_json::Value;

use super::helpers::{TestApp, all_values, rfc3339};

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

pub async fn put_labels(app: &TestApp, sensor: &str, labels: Value) -> reqwest::Response {
    app.client
        .put(format!("{}/api/v1/sensors/{sensor}/labels", app.address))
        .json(&labels)
        .send()
        .await
        .expect("PUT")
}

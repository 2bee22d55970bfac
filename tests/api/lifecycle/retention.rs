//! Retention per level: TTL indexes in line with the settings, old
//! ranges answered coarse and flagged.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use serde_json::Value;

use crate::helpers::{TestApp, rfc3339, settings_with, spawn_app_with};

use super::common::post_all;

/// `(name, expireAfterSeconds, partial filter)` of each TTL index of `collection`.
async fn ttl_indexes(app: &TestApp, collection: &str) -> Vec<(String, i64, Option<String>)> {
    use futures_util::TryStreamExt;
    let mut out: Vec<(String, i64, Option<String>)> = app
        .db
        .collection::<mongodb::bson::Document>(collection)
        .list_indexes()
        .await
        .expect("indexes")
        .try_collect::<Vec<_>>()
        .await
        .expect("indexes")
        .into_iter()
        .filter_map(|i| {
            let o = i.options?;
            let ttl = o.expire_after?;
            Some((
                o.name?,
                ttl.as_secs() as i64,
                o.partial_filter_expression.map(|p| p.to_string()),
            ))
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_per_level_keeps_its_indexes_in_line_and_answers_old_ranges_coarse_and_flagged() {
    const DAY: i64 = 86_400;
    let g = Granularity::Minute;
    let mut writer = settings_with(g);
    writer.ingest.max_age = Duration::from_secs(30 * DAY as u64);
    let a = spawn_app_with(writer.clone()).await;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let old = now - now.rem_euclid(3600) - 5 * DAY;
    let mut model: BTreeMap<i64, f64> = BTreeMap::new();
    let mut data = BTreeMap::new();
    for i in 0..(3 * 3600 / 13) {
        let ts = old + i * 13;
        let v = ((i * 7) % 41) as f64 - 3.5;
        model.insert(ts, v);
        data.insert(("old-1".to_owned(), "temp".to_owned(), ts), v);
    }
    post_all(&a, &data).await;
    crate::rollup_checks::assert_rollups_match_buckets(&a, g).await;
    assert!(
        ttl_indexes(&a, &writer.mongodb.rollup_collection)
            .await
            .is_empty()
    );
    a.stop().await.expect("stops");

    // Buckets (and hour documents) for 3 days, day documents for 30, then 60.
    let mut kept = writer.clone();
    kept.ingest.max_age = Duration::from_secs(2 * DAY as u64);
    kept.retention.buckets = hourglass::Keep::For(Duration::from_secs(3 * DAY as u64));
    kept.retention.day = hourglass::Keep::For(Duration::from_secs(30 * DAY as u64));
    kept.retention.days30 = hourglass::Keep::Off;
    let b = spawn_app_with(kept.clone()).await;
    let rollups = kept.mongodb.rollup_collection.clone();
    assert_eq!(
        ttl_indexes(&b, &rollups).await,
        vec![
            (
                "start_ttl_day".to_owned(),
                31 * DAY,
                Some(r#"{ "period": "day" }"#.to_owned())
            ),
            (
                "start_ttl_hour".to_owned(),
                3 * DAY + 3600,
                Some(r#"{ "period": "hour" }"#.to_owned())
            ),
        ]
    );
    assert_eq!(
        ttl_indexes(&b, &kept.mongodb.collection).await,
        vec![("start_ttl".to_owned(), 3 * DAY, None)]
    );
    b.stop().await.expect("stops");
    kept.retention.day = hourglass::Keep::For(Duration::from_secs(60 * DAY as u64));
    let c = spawn_app_with(kept.clone()).await;
    assert_eq!(
        ttl_indexes(&c, &rollups).await[0],
        (
            "start_ttl_day".to_owned(),
            61 * DAY,
            Some(r#"{ "period": "day" }"#.to_owned())
        ),
        "changed in place"
    );

    // What the TTL indexes delete in time: the old buckets and hour documents.
    let db = &c.db;
    db.collection::<mongodb::bson::Document>(&kept.mongodb.collection)
        .delete_many(mongodb::bson::doc! { "sensor": "old-1" })
        .await
        .expect("deleted");
    db.collection::<mongodb::bson::Document>(&rollups)
        .delete_many(mongodb::bson::doc! { "sensor": "old-1", "period": "hour" })
        .await
        .expect("deleted");

    // An average over old readings: whole hours, flagged, exact over them.
    let (from, to) = (old + 1234, old + 2 * 3600 + 100);
    let got = c
        .get_json(&crate::rollup_checks::average_path(
            "old-1", "temp", from, to,
        ))
        .await;
    let (wide_from, wide_to) = (old, old + 3 * 3600);
    assert_eq!(got["coarse"]["from"], rfc3339(wide_from), "{got}");
    assert_eq!(got["coarse"]["to"], rfc3339(wide_to), "{got}");
    assert_eq!(got["coarse"]["resolution"], "1h", "{got}");
    crate::rollup_checks::assert_aggregates(
        &got,
        crate::helpers::expected(&model, wide_from, wide_to),
        "coarse average",
    );
    // A series: minutes are refused there, hours answer and are flagged.
    let series = |step: &str| {
        format!(
            "/api/v1/sensors/old-1/series?metric=temp&from={}&to={}&step={step}",
            rfc3339(from),
            rfc3339(to)
        )
    };
    let r = c.get(&series("1m")).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("JSON");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("1h")),
        "{body}"
    );
    let got = c.get_json(&series("1h")).await;
    assert_eq!(got["coarse"]["resolution"], "1h", "{got}");
    for (i, p) in got["points"].as_array().expect("points").iter().enumerate() {
        let h = wide_from + i as i64 * 3600;
        assert_eq!(
            p["count"].as_u64(),
            Some(crate::helpers::expected(&model, h, h + 3600).0),
            "{p}"
        );
    }
    // Recent ranges are exact and not flagged.
    let recent = c
        .get_json(&crate::rollup_checks::average_path(
            "old-1",
            "temp",
            now - 3600,
            now,
        ))
        .await;
    assert!(recent.get("coarse").is_none(), "{recent}");
    // The Prometheus API warns.
    let warned = c
        .get_json(&format!(
            "/prometheus/api/v1/query?query=count_over_time(temp[1h])&time={}",
            old + 3600
        ))
        .await;
    assert!(
        warned["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("retention.buckets")),
        "{warned}"
    );
    let quiet = c
        .get_json("/prometheus/api/v1/query?query=count_over_time(temp[1h])")
        .await;
    assert!(quiet.get("warnings").is_none(), "{quiet}");
    c.stop().await.expect("stops");
}

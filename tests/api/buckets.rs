use std::collections::BTreeMap;

use futures_util::TryStreamExt;
use hourglass::Granularity;
use mongodb::bson::{Document, doc};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::helpers::*;

const BOTH: [Granularity; 2] = [Granularity::Minute, Granularity::Hour];

#[tokio::test]
async fn a_duplicate_request_leaves_every_bucket_exactly_as_one_copy() {
    for g in BOTH {
        let app = spawn_app_with(settings_with(g)).await;
        let t = base_time();
        let body: Vec<Value> = (0..150)
            .map(|i| reading("s", "m", t + i * 7, f64::from(i as i32) * 0.5))
            .collect();
        let body = Value::Array(body);
        assert_eq!(app.post_readings(&body).await.status(), 200);
        let once = app.buckets().await;
        assert_eq!(app.post_readings(&body).await.status(), 200);
        assert_eq!(app.buckets().await, once, "{g:?}: a retry changes nothing");
        assert_invariants(&once, g);
        app.stop().await.expect("clean stop");
    }
}

#[tokio::test]
async fn an_overwrite_replaces_the_value_and_the_aggregates_follow() {
    for g in BOTH {
        let app = spawn_app_with(settings_with(g)).await;
        let t = base_time() + 60;
        let first = json!([reading("s", "m", t, 10.0), reading("s", "m", t + 1, 5.0)]);
        assert_eq!(app.post_readings(&first).await.status(), 200);
        // The same second again, lower than the old minimum, in a later flush.
        assert_eq!(
            app.post_readings(&reading("s", "m", t, 1.0)).await.status(),
            200
        );
        let docs = app.buckets().await;
        assert_invariants(&docs, g);
        assert_eq!(docs[0].get_i32("count"), Ok(2), "{g:?}");
        assert_eq!(docs[0].get_f64("sum"), Ok(6.0), "{g:?}");
        assert_eq!(
            (docs[0].get_f64("min"), docs[0].get_f64("max")),
            (Ok(1.0), Ok(5.0)),
            "{g:?}"
        );
        // Within one request the later reading of a second wins too.
        let same = json!([
            reading("s", "m", t + 1, 100.0),
            reading("s", "m", t + 1, 7.0)
        ]);
        assert_eq!(app.post_readings(&same).await.status(), 200);
        let docs = app.buckets().await;
        assert_invariants(&docs, g);
        assert_eq!(docs[0].get_f64("max"), Ok(7.0), "{g:?}");
        app.stop().await.expect("clean stop");
    }
}

#[tokio::test]
async fn late_and_out_of_order_readings_keep_the_aggregates_exact() {
    for g in BOTH {
        let app = spawn_app_with(settings_with(g)).await;
        let t = base_time();
        let mut model = BTreeMap::new();
        // Newest first, then a backfill of older seconds, then the middle.
        for chunk in [
            (3000..3600).rev().step_by(13).collect::<Vec<i64>>(),
            (0..600).step_by(11).collect(),
            (1200..1300).rev().collect(),
        ] {
            let body: Vec<Value> = chunk
                .iter()
                .map(|&o| {
                    let v = ((o * 37) % 101) as f64 - 50.0;
                    model.insert(o, v);
                    reading("late", "m", t + o, v)
                })
                .collect();
            assert_eq!(app.post_readings(&Value::Array(body)).await.status(), 200);
        }
        let docs = app.buckets().await;
        assert_invariants(&docs, g);
        let stored: usize = docs.iter().map(|d| stored_values(d, g).len()).sum();
        assert_eq!(stored, model.len(), "{g:?}");
        app.stop().await.expect("clean stop");
    }
}

#[tokio::test]
async fn two_instances_writing_the_same_buckets_keep_one_exact_bucket_each() {
    for g in BOTH {
        let settings = settings_with(g);
        let a = spawn_app_with(settings.clone()).await;
        let mut other = settings.clone();
        other.http.listen = "127.0.0.1:0".parse().expect("address");
        let b = spawn_app_with(other).await;
        let t = base_time();
        // Both write overlapping seconds with the same value per second, in
        // different orders and request sizes, all at once.
        let value = |o: i64| ((o * 13) % 29) as f64;
        let bodies = |step: usize, rev: bool| {
            let mut os: Vec<i64> = (0..400).collect();
            if rev {
                os.reverse();
            }
            os.chunks(step)
                .map(|c| {
                    Value::Array(
                        c.iter()
                            .map(|&o| reading("shared", "m", t + o * 9, value(o)))
                            .collect(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let (ba, bb) = (bodies(37, false), bodies(23, true));
        let sa = async {
            for body in &ba {
                assert_eq!(a.post_readings(body).await.status(), 200);
            }
        };
        let sb = async {
            for body in &bb {
                assert_eq!(b.post_readings(body).await.status(), 200);
            }
        };
        tokio::join!(sa, sb);
        let docs = a.buckets().await;
        assert_invariants(&docs, g);
        let stored: BTreeMap<i64, f64> = docs
            .iter()
            .flat_map(|d| {
                let start = d.get_datetime("start").expect("start").timestamp_millis() / 1000;
                stored_values(d, g)
                    .into_iter()
                    .map(move |(o, v)| (start + o, v))
            })
            .collect();
        let want: BTreeMap<i64, f64> = (0..400).map(|o| (t + o * 9, value(o))).collect();
        assert_eq!(stored, want, "{g:?}");
        a.stop().await.expect("clean stop");
        b.stop().await.expect("clean stop");
    }
}

#[tokio::test]
async fn the_bucket_index_is_unique_and_creating_it_again_is_harmless() {
    let settings = test_settings();
    let first = spawn_app_with(settings.clone()).await;
    let second = spawn_app_with(settings).await;
    let coll = first.db.collection::<Document>("buckets");
    let indexes: Vec<_> = coll
        .list_indexes()
        .await
        .expect("indexes")
        .try_collect()
        .await
        .expect("list");
    // The unique index serves upserts and every range query; the other one
    // finds what a flush touched, for rollups.
    let ours: Vec<_> = indexes
        .iter()
        .filter(|i| i.options.as_ref().and_then(|o| o.unique) == Some(true))
        .collect();
    assert_eq!(ours.len(), 1, "one unique index");
    assert_eq!(ours[0].keys, doc! { "sensor": 1, "metric": 1, "start": 1 });
    assert_eq!(ours[0].options.as_ref().and_then(|o| o.unique), Some(true));
    let bucket =
        doc! { "sensor": "x", "metric": "m", "start": mongodb::bson::DateTime::from_millis(0) };
    coll.insert_one(bucket.clone()).await.expect("first insert");
    assert!(
        coll.insert_one(bucket).await.is_err(),
        "a second bucket with the same key is refused"
    );
    first.stop().await.expect("clean stop");
    second.stop().await.expect("clean stop");
}

/// One request: `(sensor index, offset in seconds, value)` readings.
fn requests() -> impl Strategy<Value = Vec<Vec<(usize, i64, i32)>>> {
    prop::collection::vec(
        prop::collection::vec((0..2usize, 0..2 * 3600i64, -20..20i32), 1..25),
        1..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Any sequence of requests (duplicates, overwrites, any order) leaves the
    /// database equal to a last-write-wins model, with exact aggregates.
    #[test]
    fn random_write_sequences_match_a_last_write_wins_model(reqs in requests(), hour in any::<bool>()) {
        let g = if hour { Granularity::Hour } else { Granularity::Minute };
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let app = spawn_app_with(settings_with(g)).await;
            let t = base_time();
            let sensors = ["p0", "p1"];
            let mut model: BTreeMap<(String, i64), f64> = BTreeMap::new();
            for req in &reqs {
                let body: Vec<Value> = req.iter().map(|&(s, o, v)| {
                    model.insert((sensors[s].to_owned(), t + o), f64::from(v));
                    reading(sensors[s], "m", t + o, f64::from(v))
                }).collect();
                assert_eq!(app.post_readings(&Value::Array(body)).await.status(), 200);
            }
            let docs = app.buckets().await;
            assert_invariants(&docs, g);
            let stored: BTreeMap<(String, i64), f64> = docs.iter().flat_map(|d| {
                let sensor = d.get_str("sensor").expect("sensor").to_owned();
                let start = d.get_datetime("start").expect("start").timestamp_millis() / 1000;
                stored_values(d, g).into_iter().map(move |(o, v)| ((sensor.clone(), start + o), v))
            }).collect();
            assert_eq!(stored, model);
            app.stop().await.expect("clean stop");
        });
    }
}

/// A fresh database's collections are created zstd-compressed (what MongoDB's
/// own time-series collections use); with "server", the server decides.
#[tokio::test]
async fn collections_are_created_with_the_configured_block_compressor() {
    let options_of = |app: &TestApp| {
        let db = app.db.clone();
        async move {
            let listed: Vec<Document> = db
                .run_cursor_command(doc! { "listCollections": 1 })
                .await
                .expect("listCollections")
                .try_collect()
                .await
                .expect("collections");
            listed
                .into_iter()
                .map(|c| {
                    let name = c.get_str("name").expect("name").to_owned();
                    let config = c
                        .get_document("options")
                        .and_then(|o| o.get_document("storageEngine"))
                        .and_then(|e| e.get_document("wiredTiger"))
                        .and_then(|w| w.get_str("configString"))
                        .ok()
                        .map(str::to_owned);
                    (name, config)
                })
                .collect::<BTreeMap<String, Option<String>>>()
        }
    };
    let app = spawn_app().await;
    let created = options_of(&app).await;
    for c in [
        &app.settings.mongodb.collection,
        &app.settings.mongodb.rollup_collection,
        &app.settings.mongodb.late_collection,
        &app.settings.mongodb.metadata_collection,
    ] {
        assert_eq!(
            created.get(c),
            Some(&Some("block_compressor=zstd".to_owned())),
            "{c}: {created:?}"
        );
    }
    // A second start leaves them as they are.
    let again = spawn_app_with(app.settings.clone()).await;
    assert_eq!(options_of(&again).await, created);
    again.stop().await.expect("clean stop");

    let mut settings = test_settings();
    settings.mongodb.block_compressor = hourglass::BlockCompressor::Server;
    let server = spawn_app_with(settings).await;
    let created = options_of(&server).await;
    assert!(
        created.values().all(Option::is_none),
        "the server's compressor: {created:?}"
    );
    server.stop().await.expect("clean stop");
    app.stop().await.expect("clean stop");
}

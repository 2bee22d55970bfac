use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{DateTime, doc};
use serde_json::{Value, json};

use crate::helpers::*;

#[tokio::test]
async fn a_posted_reading_is_stored_in_its_minute_bucket_before_the_answer() {
    let app = spawn_app().await;
    let t = base_time() + 7 * 60 + 38;
    let r = app
        .post_readings(&reading("I80_mile23", "speed", t, 63.0))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.expect("json"),
        json!({ "accepted": 1 })
    );

    let docs = app.buckets().await;
    assert_eq!(
        docs,
        vec![doc! {
            "sensor": "I80_mile23", "metric": "speed",
            "start": DateTime::from_millis((t - 38) * 1000),
            "v": { "38": 63.0 },
            "count": 1, "sum": 63.0, "min": 63.0, "max": 63.0,
        }]
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_hour_bucket_nests_seconds_under_minutes_with_minute_aggregates() {
    let app = spawn_app_with(settings_with(Granularity::Hour)).await;
    let t = base_time();
    let body = json!([
        reading("s1", "temp", t + 7 * 60 + 38, 20.0),
        reading("s1", "temp", t + 7 * 60 + 39, 22.0),
        reading("s1", "temp", t + 59 * 60 + 59, -1.0),
    ]);
    assert_eq!(app.post_readings(&body).await.status(), 200);
    let docs = app.buckets().await;
    assert_eq!(docs.len(), 1);
    let d = &docs[0];
    assert_eq!(
        d.get_datetime("start").expect("start").timestamp_millis(),
        t * 1000
    );
    assert_eq!(
        d.get_document("v").expect("v"),
        &doc! { "7": { "38": 20.0, "39": 22.0 }, "59": { "59": -1.0 } }
    );
    assert_eq!(
        d.get_document("m")
            .expect("m")
            .get_document("7")
            .expect("m.7"),
        &doc! { "count": 2, "sum": 42.0, "min": 20.0, "max": 22.0 }
    );
    assert_eq!(
        d.get_document("m").expect("m").get("59"),
        Some(&mongodb::bson::Bson::Double(-1.0)),
        "a minute of one reading is stored as its value"
    );
    assert_invariants(&docs, Granularity::Hour);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn readings_without_metric_or_ts_get_the_defaults() {
    let app = spawn_app().await;
    let before = time::OffsetDateTime::now_utc().unix_timestamp();
    let r = app
        .post_readings(&json!({ "sensor": "s", "value": 1.5 }))
        .await;
    let after = time::OffsetDateTime::now_utc().unix_timestamp();
    assert_eq!(r.status(), 200);
    let docs = app.buckets().await;
    assert_eq!(docs[0].get_str("metric"), Ok("value"));
    let start = docs[0]
        .get_datetime("start")
        .expect("start")
        .timestamp_millis()
        / 1000;
    let second: i64 = docs[0]
        .get_document("v")
        .expect("v")
        .keys()
        .next()
        .expect("a second")
        .parse()
        .expect("number");
    assert!(
        (before..=after).contains(&(start + second)),
        "stamped with the time of receipt"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn epoch_milliseconds_and_offsets_land_in_the_same_second() {
    let app = spawn_app().await;
    let t = base_time() + 90;
    let body = json!([
        { "sensor": "s", "ts": t * 1000 + 999, "value": 1.0 },
        { "sensor": "s", "ts": rfc3339(t).replace('Z', "+00:00"), "value": 2.0 },
    ]);
    assert_eq!(app.post_readings(&body).await.status(), 200);
    let docs = app.buckets().await;
    assert_eq!(
        docs[0].get_document("v").expect("v"),
        &doc! { "30": 2.0 },
        "one second, last write wins"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn one_invalid_reading_refuses_the_whole_request_with_its_index() {
    let app = spawn_app().await;
    let t = base_time();
    let body = json!([
        reading("good", "m", t, 1.0),
        { "sensor": "bad$", "value": 1 },
        reading("good", "m", t + 1, 2.0),
        { "sensor": "x", "value": "1" },
    ]);
    let r = app.post_readings(&body).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .expect("error")
            .contains("nothing was stored")
    );
    let indexes: Vec<u64> = body["details"]
        .as_array()
        .expect("details")
        .iter()
        .map(|d| d["index"].as_u64().expect("index"))
        .collect();
    assert_eq!(indexes, vec![1, 3]);
    tokio::time::sleep(app.settings.batcher.flush_interval * 4).await;
    assert!(
        app.buckets().await.is_empty(),
        "nothing from the request is stored"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_ndjson_body_takes_a_reading_with_its_ts_per_line_all_or_nothing() {
    let app = spawn_app().await;
    let t = base_time();
    let line = |v: &Value| serde_json::to_string(v).expect("json");
    let good = [reading("nd", "m", t, 1.0), reading("nd", "m", t + 1, 2.0)];
    // A line without its ts (stamped on receipt, a reading would be new at
    // each import) and a broken one: refused with their lines, nothing taken.
    let bad = format!(
        "{}\n\n{}\n{}\nnot json\n",
        line(&good[0]),
        line(&json!({ "sensor": "nd", "value": 3 })),
        line(&good[1])
    );
    let r = app
        .post_raw("application/x-ndjson", bad.into_bytes(), "")
        .await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("json");
    let details: Vec<(u64, String)> = body["details"]
        .as_array()
        .expect("details")
        .iter()
        .map(|d| {
            (
                d["index"].as_u64().expect("index"),
                d["reason"].as_str().expect("reason").to_owned(),
            )
        })
        .collect();
    assert_eq!(details.len(), 2, "{body}");
    assert_eq!(details[0].0, 2, "{body}");
    assert!(details[0].1.contains("ts is required"), "{body}");
    assert_eq!(details[1].0, 4, "{body}");
    tokio::time::sleep(app.settings.batcher.flush_interval * 4).await;
    assert!(
        app.buckets().await.is_empty(),
        "nothing from the request is stored"
    );

    let body = format!("{}\n{}", line(&good[0]), line(&good[1])).into_bytes();
    let r = app.post_raw("application/x-ndjson", body, "").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["accepted"], 2);
    let avg = app
        .get_json(&format!(
            "/api/v1/sensors/nd/average?metric=m&from={}&to={}",
            rfc3339(t - 60),
            rfc3339(t + 60)
        ))
        .await;
    assert_eq!(
        (avg["count"].as_u64(), avg["sum"].as_f64()),
        (Some(2), Some(3.0)),
        "{avg}"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_csv_body_maps_its_columns_and_is_all_or_nothing() {
    let app = spawn_app().await;
    let t = base_time();
    let params = "?ts_unit=s&column.ts=time&column.sensor=device&column.value=temp&ignore=note";
    // A quoted field, a CRLF, a blank line, an empty metric (the default).
    let good = format!(
        "time,device,metric,temp,note\r\n{t},cv,m,1.5,\"a, b\"\n\n{},cv,,2.5,x\n{},cv,m,3,\"say \"\"hi\"\"\"\n",
        t + 1,
        t + 2
    );
    let bad = good.replace(",3,", ",three,");
    let r = app.post_raw("text/csv", bad.into_bytes(), params).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["details"][0]["index"], 4, "its line, from 0: {body}");
    assert!(
        body["details"][0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("\"three\" is not a number")),
        "{body}"
    );
    for (query, why) in [
        (
            "?ts_unit=s&column.ts=time&column.sensor=device&column.value=temp",
            "\"note\"",
        ),
        (
            "?ts_unit=s&column.sensor=device&column.value=temp&ignore=note",
            "\"ts\"",
        ),
        ("?ts_unit=hours", "ts_unit"),
    ] {
        let r = app
            .post_raw("text/csv", good.clone().into_bytes(), query)
            .await;
        assert_eq!(r.status(), 400, "{query}");
        let body: Value = r.json().await.expect("json");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "{query}: {body}");
    }
    let json = serde_json::to_vec(&reading("cv", "m", t, 1.0)).expect("json");
    let r = app.post_raw("application/json", json, "?ts_unit=s").await;
    assert_eq!(r.status(), 400, "CSV parameters on a JSON body");
    tokio::time::sleep(app.settings.batcher.flush_interval * 4).await;
    assert!(
        app.buckets().await.is_empty(),
        "nothing from the refused requests is stored"
    );

    let r = app.post_raw("text/csv", good.into_bytes(), params).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["accepted"], 3);
    let range = format!("from={}&to={}", rfc3339(t - 60), rfc3339(t + 60));
    let avg = app
        .get_json(&format!("/api/v1/sensors/cv/average?metric=m&{range}"))
        .await;
    assert_eq!(
        (avg["count"].as_u64(), avg["sum"].as_f64()),
        (Some(2), Some(4.5)),
        "{avg}"
    );
    let avg = app
        .get_json(&format!("/api/v1/sensors/cv/average?metric=value&{range}"))
        .await;
    assert_eq!(avg["sum"].as_f64(), Some(2.5), "the default metric: {avg}");
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_wrong_content_type_is_415() {
    let app = spawn_app().await;
    let body = serde_json::to_vec(&reading("s", "m", base_time(), 1.0)).expect("json");
    for ct in ["text/plain", "application/x-www-form-urlencoded", ""] {
        assert_eq!(
            app.post_raw(ct, body.clone(), "").await.status(),
            415,
            "{ct:?}"
        );
    }
    assert_eq!(
        app.post_raw("application/json; charset=utf-8", body, "")
            .await
            .status(),
        200
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn bodies_over_the_size_limit_are_413() {
    let mut s = test_settings();
    s.http.max_body_bytes = 1024;
    let app = spawn_app_with(s).await;
    let many: Vec<Value> = (0..40)
        .map(|i| reading("sensor", "m", base_time() + i, 1.0))
        .collect();
    let r = app.post_readings(&Value::Array(many)).await;
    assert_eq!(r.status(), 413);
    assert!(
        r.json::<Value>().await.expect("json")["error"]
            .as_str()
            .expect("error")
            .contains("1024")
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn too_many_readings_in_one_request_are_413() {
    let mut s = test_settings();
    s.ingest.max_readings_per_request = 3;
    let app = spawn_app_with(s).await;
    let many: Vec<Value> = (0..4)
        .map(|i| reading("sensor", "m", base_time() + i, 1.0))
        .collect();
    assert_eq!(app.post_readings(&Value::Array(many)).await.status(), 413);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn async_writes_answer_202_and_are_stored_by_the_next_flush() {
    let app = spawn_app().await;
    let body = serde_json::to_vec(&json!([reading("s", "m", base_time(), 4.0)])).expect("json");
    let r = app.post_raw("application/json", body, "?async=true").await;
    assert_eq!(r.status(), 202);
    assert_eq!(
        r.json::<Value>().await.expect("json"),
        json!({ "accepted": 1 })
    );
    // Stopping drains the batcher: the reading must be in the database after.
    let db = app.db.clone();
    let collection = app.settings.mongodb.collection.clone();
    app.stop().await.expect("clean stop");
    let n = db
        .collection::<mongodb::bson::Document>(&collection)
        .count_documents(doc! {})
        .await
        .expect("count");
    assert_eq!(n, 1);
}

#[tokio::test]
async fn input_beyond_the_memory_bound_gets_503_with_retry_after() {
    let mut s = test_settings();
    s.batcher.flush_interval = Duration::from_secs(3600);
    s.batcher.max_pending_readings = 5;
    s.batcher.max_buffered_readings = 5;
    s.ingest.max_readings_per_request = 5;
    let app = spawn_app_with(s).await;
    // Four pending readings: under the flush threshold, so nothing flushes.
    let four: Vec<Value> = (0..4)
        .map(|i| reading("s", "m", base_time() + i, 1.0))
        .collect();
    let r = app
        .post_raw(
            "application/json",
            serde_json::to_vec(&four).expect("json"),
            "?async=true",
        )
        .await;
    assert_eq!(r.status(), 202);
    let two: Vec<Value> = (10..12)
        .map(|i| reading("s", "m", base_time() + i, 1.0))
        .collect();
    let r = app
        .post_raw(
            "application/json",
            serde_json::to_vec(&two).expect("json"),
            "?async=true",
        )
        .await;
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let db = app.db.clone();
    app.stop().await.expect("clean stop");
    let docs = all_documents(&db.collection("buckets")).await;
    assert_eq!(docs.len(), 1);
    assert_eq!(
        docs[0].get_i32("count"),
        Ok(4),
        "the refused request left nothing behind"
    );
}

#[tokio::test]
async fn malformed_bodies_are_400_and_store_nothing() {
    let app = spawn_app().await;
    for body in [
        "",
        "[",
        "{\"sensor\":\"s\",\"value\":1",
        "42",
        "[{\"sensor\":\"s\",\"value\":NaN}]",
    ] {
        let r = app
            .post_raw("application/json", body.as_bytes().to_vec(), "")
            .await;
        assert_eq!(r.status(), 400, "{body:?}");
        let v: Value = r.json().await.expect("a JSON error");
        assert!(v["error"].is_string(), "{body:?}: {v}");
    }
    assert!(app.buckets().await.is_empty());
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn requests_beyond_the_concurrency_limit_get_503_at_once() {
    let mut s = test_settings();
    s.http.max_concurrent_requests = 1;
    s.batcher.flush_interval = Duration::from_secs(3600);
    s.http.write_timeout = Duration::from_secs(5);
    let app = spawn_app_with(s).await;
    // A synchronous write that holds the only slot until its write timeout.
    let holder = {
        let (client, url) = (
            app.client.clone(),
            format!("{}/api/v1/readings", app.address),
        );
        let body = reading("held", "m", base_time(), 1.0);
        tokio::spawn(async move {
            client
                .post(url)
                .json(&body)
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let mut refused = false;
    let t = base_time();
    let query = format!(
        "/api/v1/sensors/held/average?metric=m&from={}&to={}",
        t * 1000,
        (t + 60) * 1000
    );
    while !holder.is_finished() {
        let r = app.get(&query).await;
        if r.status() == 503 {
            assert!(r.headers().contains_key("retry-after"));
            // Probes are outside the limit.
            assert_eq!(app.get("/health/live").await.status(), 200);
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "a second request while the slot was held got 503");
    assert_eq!(
        holder.await.expect("joined").expect("answered"),
        503,
        "the held write timed out"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn readings_that_would_open_too_many_buckets_get_503_and_change_nothing() {
    let mut s = test_settings();
    // max_buckets must hold one whole request (startup checks it).
    s.batcher.max_buckets = 3;
    s.ingest.max_readings_per_request = 3;
    s.batcher.flush_interval = Duration::from_secs(3600);
    let app = spawn_app_with(s).await;
    let t = base_time();
    let two = json!([
        reading("a", "m", t, 1.0),
        reading("b", "m", t, 1.0),
        reading("a", "m", t + 1, 2.0)
    ]);
    let r = app
        .post_raw(
            "application/json",
            serde_json::to_vec(&two).expect("json"),
            "?async=true",
        )
        .await;
    assert_eq!(r.status(), 202);
    let third = json!([
        reading("a", "m", t + 2, 1.0),
        reading("c", "m", t, 1.0),
        reading("d", "m", t, 1.0)
    ]);
    let r = app
        .post_raw(
            "application/json",
            serde_json::to_vec(&third).expect("json"),
            "?async=true",
        )
        .await;
    assert_eq!(r.status(), 503, "a fourth bucket is refused");
    let db = app.db.clone();
    app.stop().await.expect("clean stop");
    let n = db
        .collection::<mongodb::bson::Document>("buckets")
        .count_documents(doc! {})
        .await
        .expect("count");
    assert_eq!(n, 2, "only the first request's buckets");
}

/// A gzipped body (Telegraf's and Vector's HTTP outputs) is read
/// decompressed, counted decompressed against the body limit; a coding the
/// service does not take is a 415 and stores nothing.
#[tokio::test]
async fn a_gzipped_body_is_stored_and_an_unknown_coding_is_refused() {
    use std::io::Write;
    let mut settings = test_settings();
    settings.http.max_body_bytes = 4096;
    let app = spawn_app_with(settings).await;
    let t = base_time() + 90;
    let body = json!([reading("zipped", "temp", t, 21.5)]).to_string();
    let gzip = |bytes: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).expect("written");
        e.finish().expect("gzipped")
    };
    let post = |body: Vec<u8>, coding: &'static str| {
        app.client
            .post(format!("{}/api/v1/readings", app.address))
            .header("content-type", "application/json")
            .header("content-encoding", coding)
            .body(body)
            .send()
    };
    let r = post(gzip(body.as_bytes()), "gzip").await.expect("sent");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    // 8 KiB of spaces (within the JSON) in a few dozen bytes: over the limit
    // once decompressed.
    let padded = format!("{}{body}", " ".repeat(8192));
    let r = post(gzip(padded.as_bytes()), "gzip").await.expect("sent");
    assert_eq!(r.status(), 413);
    let other = json!([reading("unzipped", "temp", t, 1.0)]).to_string();
    let r = post(other.into_bytes(), "br").await.expect("sent");
    assert_eq!(r.status(), 415);
    let docs = app.buckets().await;
    assert_eq!(docs.len(), 1, "{docs:?}");
    assert_eq!(docs[0].get_str("sensor").expect("sensor"), "zipped");
    app.stop().await.expect("clean stop");
}

//! Buckets no update can merge into and commands the server refuses: their
//! readings dead-lettered once, the others stored, redriven once fixed;
//! the worst-case request within the server's limits.

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::database::Database;
use crate::helpers::*;

use super::{
    dead_letters, dead_readings, fail_point, metric, metrics_text, plant_broken_bucket,
    readings_for, values_of,
};

#[tokio::test]
async fn a_poison_bucket_dead_letters_its_readings_and_the_others_are_stored() {
    let app = spawn_app().await;
    let t = plant_broken_bucket(&app, "broken").await;
    let body = json!([
        reading("fine", "m", t + 1, 1.5),
        reading("broken", "m", t + 2, 2.5),
        reading("fine", "m", t + 61, 3.5),
        reading("broken", "m", t + 3, 4.5),
        reading("broken", "m", t + 62, 5.5),
    ]);
    let r = app.post_readings(&body).await;
    assert_eq!(r.status(), 422);
    let answer: Value = r.json().await.expect("json");
    let indexes: Vec<u64> = answer["details"]
        .as_array()
        .expect("details")
        .iter()
        .map(|d| d["index"].as_u64().expect("index"))
        .collect();
    assert_eq!(
        indexes,
        vec![1, 3],
        "the readings of the broken bucket: {answer}"
    );
    // Every other reading is stored, the broken minute's are dead-lettered.
    let fine = values_of(&app, "fine").await;
    assert_eq!(fine.len(), 2);
    let broken_next_minute = values_of(&app, "broken").await;
    assert_eq!(
        broken_next_minute.into_iter().collect::<Vec<_>>(),
        vec![(("broken".into(), "m".into(), t + 62), 5.5)]
    );
    let letters = dead_letters(&app).await;
    assert_eq!(letters.len(), 1);
    assert!(!letters[0].get_str("reason").expect("reason").is_empty());
    assert_eq!(
        dead_readings(&letters),
        BTreeMap::from([
            (("broken".into(), t + 2), 2.5),
            (("broken".into(), t + 3), 4.5)
        ])
    );
    let text = metrics_text(&app).await;
    assert_eq!(metric(&text, "hourglass_readings_dead_lettered_total"), 2.0);
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn dead_letters_are_written_once_and_redriven_into_their_buckets_once_fixed() {
    let app = spawn_app().await;
    let t = plant_broken_bucket(&app, "mend").await;
    let body = json!([
        reading("mend", "m", t + 2, 2.5),
        reading("mend", "m", t + 3, 4.5)
    ]);
    // Sent twice (a client retry, a replay): one dead letter.
    for _ in 0..2 {
        assert_eq!(app.post_readings(&body).await.status(), 422);
    }
    assert_eq!(dead_letters(&app).await.len(), 1, "idempotent");
    // Not fixed yet: re-driven and refused again, kept with the reason.
    let r = hourglass::redrive(&app.settings, Some("mend"), false)
        .await
        .expect("redrives");
    assert_eq!((r.letters, r.refused), (0, 1));
    assert_eq!(dead_letters(&app).await.len(), 1);
    // The cause fixed (the broken bucket removed): a dry run counts,
    // the re-drive stores and deletes.
    app.db
        .collection::<Document>(&app.settings.mongodb.collection)
        .delete_one(doc! { "sensor": "mend" })
        .await
        .expect("deleted");
    let r = hourglass::redrive(&app.settings, Some("mend*"), true)
        .await
        .expect("counts");
    assert_eq!((r.letters, r.readings), (1, 2));
    assert_eq!(
        dead_letters(&app).await.len(),
        1,
        "a dry run changes nothing"
    );
    let r = hourglass::redrive(&app.settings, None, false)
        .await
        .expect("redrives");
    assert_eq!((r.letters, r.readings, r.refused), (1, 2, 0));
    assert!(dead_letters(&app).await.is_empty());
    assert_eq!(
        values_of(&app, "mend").await,
        BTreeMap::from([
            (("mend".to_owned(), "m".to_owned(), t + 2), 2.5),
            (("mend".to_owned(), "m".to_owned(), t + 3), 4.5),
        ])
    );
    crate::rollup_checks::assert_rollups_match_buckets(&app, Granularity::Minute).await;
    let again = hourglass::redrive(&app.settings, None, false)
        .await
        .expect("redrives");
    assert_eq!(again.letters, 0, "nothing left");
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_command_refused_as_poison_is_split_until_the_statement_is_found() {
    let db = Database::start().await;
    let s = db.settings();
    let app = spawn_app_with(s).await;
    let t = base_time();
    // BadValue for every update while it is on: each statement ends up alone
    // and refused, so every reading goes to the dead-letter collection.
    fail_point(
        &app,
        "alwaysOn".into(),
        doc! { "failCommands": ["update"], "errorCode": 2 },
    )
    .await;
    let (body, model) = readings_for("poisoned", t, 12);
    let r = app.post_readings(&body).await;
    assert_eq!(r.status(), 422);
    fail_point(&app, "off".into(), doc! {}).await;
    let (body, stored) = readings_for("after", t, 12);
    assert_eq!(app.post_readings(&body).await.status(), 200);
    assert_eq!(values_of(&app, "after").await, stored);
    assert!(values_of(&app, "poisoned").await.is_empty());
    let dead: BTreeMap<(String, String, i64), f64> = dead_readings(&dead_letters(&app).await)
        .into_iter()
        .map(|((s, ts), v)| ((s, "m".to_owned(), ts), v))
        .collect();
    assert_eq!(
        dead, model,
        "each reading in its bucket or in the dead letters"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_worst_case_hour_request_is_stored_in_commands_within_the_limits() {
    let mut s = settings_with(Granularity::Hour);
    s.batcher.max_pending_readings = 50_000;
    // The stand-in server is slow with 3 600-value documents: give it time.
    s.http.write_timeout = Duration::from_secs(300);
    s.http.request_timeout = Duration::from_secs(301);
    let app = spawn_app_with(s).await;
    let t = base_time();
    // 833 sensors × one reading in each of 60 minutes: 49 980 readings, whose
    // single command used to be about 21 MiB.
    let body: Vec<Value> = (0..833)
        .flat_map(|s| (0..60).map(move |m| (s, m)))
        .map(|(s, m)| reading(&format!("w{s:03}"), "m", t + m * 60 + 7, 1.0))
        .collect();
    let r = app.post_readings(&Value::Array(body)).await;
    assert_eq!(r.status(), 200);
    let text = metrics_text(&app).await;
    assert!(
        metric(&text, "hourglass_write_round_trips_total") >= 2.0,
        "cut into several commands: {text}"
    );
    let docs = app.buckets().await;
    assert_eq!(docs.len(), 833);
    assert_eq!(all_values(&docs, Granularity::Hour).len(), 49_980);
    app.stop().await.expect("clean stop");
}

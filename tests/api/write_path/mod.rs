//! The write path against the failures a real MongoDB returns, injected with
//! `configureFailPoint` / `failCommand` (as MongoDB's own driver tests do) on
//! a private server, and against real bucket documents that can never be
//! updated: outages and unclassed errors, poison buckets and dead letters,
//! and a service that stays alive and honest about readiness meanwhile.

mod liveness;
mod outages;
mod poison;

use std::collections::BTreeMap;
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{Bson, DateTime, Document, doc};
use serde_json::Value;

use crate::database::Database;
use crate::helpers::*;

pub(super) const WAIT: Duration = Duration::from_secs(90);

pub(super) async fn fail_point(app: &TestApp, mode: Bson, data: Document) {
    app.db
        .client()
        .database("admin")
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": mode, "data": data })
        .await
        .expect("the server takes the fail point");
}

pub(super) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

pub(super) async fn metrics_text(app: &TestApp) -> String {
    app.get("/metrics").await.text().await.expect("metrics")
}

pub(super) fn readings_for(
    sensor: &str,
    t: i64,
    n: i64,
) -> (Value, BTreeMap<(String, String, i64), f64>) {
    let mut model = BTreeMap::new();
    let body: Vec<Value> = (0..n)
        .map(|i| {
            // Two minutes, so every request spans two buckets.
            let ts = t + i * (120 / n.max(1));
            let v = (i % 13) as f64 + 0.25;
            model.insert((sensor.to_owned(), "m".to_owned(), ts), v);
            reading(sensor, "m", ts, v)
        })
        .collect();
    (Value::Array(body), model)
}

/// The stored values of `sensor`, leaving out buckets planted broken.
pub(super) async fn values_of(app: &TestApp, sensor: &str) -> BTreeMap<(String, String, i64), f64> {
    let docs: Vec<Document> = app
        .buckets()
        .await
        .into_iter()
        .filter(|d| d.get_str("sensor") == Ok(sensor) && d.get_document("v").is_ok())
        .collect();
    all_values(&docs, Granularity::Minute)
}

pub(super) async fn dead_letters(app: &TestApp) -> Vec<Document> {
    app.documents(&app.settings.mongodb.dead_letter_collection, doc! {})
        .await
}

/// `(sensor, ts) → value` of every dead-lettered reading.
pub(super) fn dead_readings(letters: &[Document]) -> BTreeMap<(String, i64), f64> {
    letters
        .iter()
        .flat_map(|d| {
            let sensor = d.get_str("sensor").expect("sensor").to_owned();
            d.get_array("readings")
                .expect("readings")
                .iter()
                .map(move |r| {
                    let r = r.as_document().expect("a reading");
                    let ts = r.get_datetime("ts").expect("ts").timestamp_millis() / 1000;
                    ((sensor.clone(), ts), r.get_f64("value").expect("value"))
                })
        })
        .collect()
}

/// A private server and an app on it that waits out an outage, however
/// long: after a "node is shutting down" the driver rediscovers the server
/// before it sends again.
pub(super) async fn spawn_patient_app() -> (Database, TestApp) {
    let db = Database::start().await;
    let mut s = db.settings();
    s.http.write_timeout = Duration::from_secs(120);
    s.http.request_timeout = Duration::from_secs(121);
    let app = spawn_app_with(s).await;
    (db, app)
}

pub(super) async fn outages(app: &TestApp) -> f64 {
    metric(
        &metrics_text(app).await,
        "hourglass_storage_errors_total{kind=\"outage\"}",
    )
}

/// A bucket document that no update pipeline can merge into (`v` is not an
/// object) for `sensor` at `base_time()`, which it answers.
pub(super) async fn plant_broken_bucket(app: &TestApp, sensor: &str) -> i64 {
    let start = base_time();
    app.db
        .collection::<Document>(&app.settings.mongodb.collection)
        .insert_one(doc! {
            "sensor": sensor, "metric": "m", "start": DateTime::from_millis(start * 1000),
            "v": "not an object", "count": 0, "schema_version": 1,
        })
        .await
        .expect("insert");
    start
}

//! The query engine end to end: rollups kept exact by every flush and
//! rebuilt from buckets (`rollups`); calendar days in time zones, the sensor
//! registry, latest values, groups, CSV, timeouts and the OpenAPI document
//! (`reads`).

mod reads;
mod rollups;

use std::time::Duration;

use hourglass::Granularity;
use serde_json::Value;

use crate::helpers::{TestApp, reading, settings_with};

/// Settings that accept readings up to 400 days old (the longest range),
/// with room for requests that each touch hundreds of buckets on a slow,
/// shared test server.
pub(super) fn long_settings(g: Granularity) -> hourglass::Settings {
    let mut s = settings_with(g);
    // The daylight saving test writes readings on fixed past dates: a bound
    // of a year or so made it a time bomb (it refused them from November
    // 2026). Thirty years keeps those dates writable for decades.
    s.ingest.max_age = Duration::from_secs(30 * 365 * 86_400);
    s
}

pub(super) async fn post_all(app: &TestApp, readings: &[Value]) {
    for chunk in readings.chunks(250) {
        let r = app.post_readings(&Value::Array(chunk.to_vec())).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    }
}

pub(super) fn ts(text: &str) -> i64 {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .expect("a timestamp")
        .unix_timestamp()
}

/// One reading every 10 minutes over `[from, to)`, all of value 1.
pub(super) fn every_ten_minutes(sensor: &str, from: i64, to: i64) -> Vec<Value> {
    (from..to)
        .step_by(600)
        .map(|at| reading(sensor, "power", at, 1.0))
        .collect()
}

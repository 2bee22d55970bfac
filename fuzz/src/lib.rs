//! What the decoding targets share: the context they decode under and the
//! rules every reading they accept obeys, whatever its format.

use std::time::Duration;

use hourglass::pure::{DecodeContext, METRIC_MAX_LEN, Reading, SENSOR_MAX_LEN, TimeWindow};

/// The targets' clock, epoch seconds.
pub const NOW: i64 = 1_700_000_000;
/// How far back a reading may be, seconds.
pub const MAX_AGE: i64 = 30 * 86_400;
/// How far ahead a reading may be, seconds.
pub const MAX_FUTURE: i64 = 300;
/// How many readings a body may hold.
pub const MAX_READINGS: usize = 1000;

/// The context every decoding target decodes under.
pub fn context() -> DecodeContext {
    DecodeContext {
        now: NOW,
        window: TimeWindow {
            max_age: Duration::from_secs(MAX_AGE.unsigned_abs()),
            max_future: Duration::from_secs(MAX_FUTURE.unsigned_abs()),
        },
        max_readings: MAX_READINGS,
    }
}

/// An accepted reading: a finite value, a sensor and a metric of allowed
/// lengths with no `$` (nor a `.` in the metric: they become field names),
/// a time inside the window.
pub fn assert_accepted(r: &Reading<'_>) {
    assert!(r.value.is_finite());
    let (sensor, metric) = (r.sensor.as_str(), r.metric.as_str());
    assert!(!sensor.is_empty() && sensor.len() <= SENSOR_MAX_LEN);
    assert!(!metric.is_empty() && metric.len() <= METRIC_MAX_LEN);
    assert!(!sensor.contains('$') && !metric.contains(['$', '.']));
    assert!(r.ts >= NOW - MAX_AGE && r.ts <= NOW + MAX_FUTURE);
}

//! CSV bodies (POST /api/v1/readings as text/csv, and import files): never
//! a panic; whatever is accepted obeys every rule.
#![no_main]

use std::time::Duration;

use hourglass::pure::{CsvFormat, DecodeContext, METRIC_MAX_LEN, SENSOR_MAX_LEN, TimeWindow, decode_csv};
use libfuzzer_sys::fuzz_target;

const NOW: i64 = 1_700_000_000;

fuzz_target!(|data: &[u8]| {
    let ctx = DecodeContext {
        now: NOW,
        window: TimeWindow { max_age: Duration::from_secs(30 * 86_400), max_future: Duration::from_secs(300) },
        max_readings: 1000,
    };
    let formats = [
        CsvFormat::default(),
        CsvFormat {
            mapping: vec![("sensor".into(), "device".into()), ("value".into(), "v".into())],
            ignore: vec!["note".into()],
            ..CsvFormat::default()
        },
    ];
    for format in &formats {
        if let Ok(readings) = decode_csv(data, format, &ctx) {
            assert!(readings.len() <= 1000);
            for r in readings {
                assert!(r.value.is_finite());
                assert!(!r.sensor.as_str().is_empty() && r.sensor.as_str().len() <= SENSOR_MAX_LEN);
                assert!(!r.metric.as_str().is_empty() && r.metric.as_str().len() <= METRIC_MAX_LEN);
                assert!(r.ts >= NOW - 30 * 86_400 && r.ts <= NOW + 300);
            }
        }
    }
});

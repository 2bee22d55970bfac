//! Line-protocol bodies: never a panic; every line is either taken or
//! refused with its number; whatever is taken obeys every rule; and the
//! parser agrees with itself on a line cut out of the body.
#![no_main]

use std::time::Duration;

use bumpalo::Bump;
use hourglass::pure::{
    DecodeContext, Line, Lines, METRIC_MAX_LEN, Precision, SENSOR_MAX_LEN, TimeWindow,
    decode_line_protocol, parse_line,
};
use libfuzzer_sys::fuzz_target;

const NOW: i64 = 1_700_000_000;

fuzz_target!(|data: &[u8]| {
    let ctx = DecodeContext {
        now: NOW,
        window: TimeWindow { max_age: Duration::from_secs(30 * 86_400), max_future: Duration::from_secs(300) },
        max_readings: 1000,
    };
    let tags = ["sensor".to_owned(), "host".to_owned()];
    let lines = Lines::new(data).count();
    let arena = Bump::new();
    for precision in [Precision::Nanoseconds, Precision::Seconds, Precision::Hours] {
        let Ok(d) = decode_line_protocol(data, precision, &ctx, &tags, &arena) else {
            continue;
        };
        assert_eq!(d.lines + d.refused, lines);
        let readings = d.readings();
        assert!(readings.len() <= 1000);
        let mut last = 0;
        for e in &d.errors {
            assert!(e.line > last && !e.reason.is_empty());
            last = e.line;
        }
        for r in &readings {
            assert!(r.value.is_finite());
            assert!(!r.sensor.as_str().is_empty() && r.sensor.as_str().len() <= SENSOR_MAX_LEN);
            assert!(!r.metric.as_str().is_empty() && r.metric.as_str().len() <= METRIC_MAX_LEN);
            assert!(!r.sensor.as_str().contains(['$', ' ', ',']) && !r.metric.as_str().contains(['$', '.']));
            assert!(r.ts >= NOW - 30 * 86_400 && r.ts <= NOW + 300);
        }
        for set in &d.labels {
            assert!(set.labels.iter().all(|(k, v)| !k.is_empty() && !v.is_empty()));
        }
    }
    // A line parses the same alone as within its body.
    let mut a = Line::default();
    for (_, bytes) in Lines::new(data) {
        let alone = bytes.to_vec();
        let mut b = Line::default();
        let first = parse_line(bytes, &mut a).map(|()| (a.fields.len(), a.tags.len(), a.timestamp));
        let second = parse_line(&alone, &mut b).map(|()| (b.fields.len(), b.tags.len(), b.timestamp));
        assert_eq!(first, second);
    }
});

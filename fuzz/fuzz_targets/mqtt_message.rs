//! MQTT messages: the first line is the topic, the rest the payload.
#![no_main]

use std::time::Duration;

use hourglass::pure::{DecodeContext, TimeWindow, decode_payload, parse_topic};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let Ok(topic) = std::str::from_utf8(&data[..split]) else { return };
    let payload = data.get(split + 1..).unwrap_or_default();
    let Ok(implied) = parse_topic("sensors", topic) else { return };
    let ctx = DecodeContext {
        now: 1_700_000_000,
        window: TimeWindow { max_age: Duration::from_secs(86_400), max_future: Duration::from_secs(300) },
        max_readings: 1000,
    };
    if let Ok(readings) = decode_payload(payload, implied, &ctx) {
        for r in readings {
            // The topic's sensor (and metric) always win or agree.
            assert_eq!(Some(r.sensor.as_str()), implied.sensor);
            if let Some(m) = implied.metric {
                assert_eq!(r.metric.as_str(), m);
            }
            assert!(r.value.is_finite());
        }
    }
});

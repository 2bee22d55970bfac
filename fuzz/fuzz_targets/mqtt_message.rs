//! MQTT messages: the first line is the topic, the rest the payload.
#![no_main]

use hourglass::pure::{decode_payload, parse_topic};
use hourglass_fuzz::context;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let Ok(topic) = std::str::from_utf8(&data[..split]) else {
        return;
    };
    let payload = data.get(split + 1..).unwrap_or_default();
    let Ok(implied) = parse_topic("sensors", topic) else {
        return;
    };
    if let Ok(readings) = decode_payload(payload, implied, &context()) {
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

//! Sparkplug B messages: the first line is the topic, the rest the payload,
//! fed to one host in sequence so births, data and deaths interleave.
#![no_main]

use std::cell::RefCell;
use std::time::Duration;

use hourglass::pure::{
    SparkplugHost, SparkplugRules, TimeWindow, sparkplug_decode, sparkplug_topic,
};
use libfuzzer_sys::fuzz_target;

thread_local! {
    static HOST: RefCell<SparkplugHost> = RefCell::new(SparkplugHost::new(SparkplugRules {
        device_sensor: "{edge_node}.{device}".into(),
        node_sensor: "{edge_node}".into(),
        reorder_timeout_ms: 2000,
        rebirth_cooldown_ms: 30_000,
        window: TimeWindow { max_age: Duration::from_secs(86_400 * 3650), max_future: Duration::from_secs(300) },
        property_labels: true,
        max_edge_nodes: 1_000,
        max_devices_per_node: 100,
        max_state_bytes: 64 << 20,
    }));
}

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let Ok(topic) = std::str::from_utf8(&data[..split]) else {
        return;
    };
    let payload = data.get(split + 1..).unwrap_or_default();
    let Ok(payload) = sparkplug_decode(payload) else {
        return;
    };
    let Ok(hourglass::pure::SparkplugParsed::Message(topic)) = sparkplug_topic(topic) else {
        return;
    };
    HOST.with(|h| {
        let mut h = h.borrow_mut();
        let fx = h.handle(&topic, &payload, 1_700_000_000_000);
        // A dead-lettered message stores nothing; every reading is finite.
        assert!(fx.dead_letter.is_none() || fx.readings.is_empty());
        for r in &fx.readings {
            assert!(r.value.is_finite());
            assert!(hourglass::pure::SensorId::parse(&*r.sensor).is_ok());
            assert!(hourglass::pure::MetricName::parse(&*r.metric).is_ok());
        }
        let _ = h.tick(1_700_000_100_000);
    });
});

//! MQTT messages (readings, line protocol, Sparkplug B), each
//! dead-lettered.

use super::cases::nested;

/// MQTT messages (readings, line protocol, Sparkplug B), each dead-lettered.
pub fn messages() -> Vec<(&'static str, String, Vec<u8>)> {
    // Sparkplug: a metric holding a template holding a metric … 5 000 deep.
    let mut metric: Vec<u8> = Vec::new();
    for _ in 0..5000 {
        let mut template = vec![0x12]; // Template.metrics (2), length-delimited
        varint(&mut template, metric.len());
        template.extend_from_slice(&metric);
        let mut m = vec![0x92, 0x01]; // Metric.template_value (18)
        varint(&mut m, template.len());
        m.extend_from_slice(&template);
        metric = m;
    }
    let mut deep_payload = vec![0x12]; // Payload.metrics (2)
    varint(&mut deep_payload, metric.len());
    deep_payload.extend_from_slice(&metric);
    vec![
        (
            "MQTT: not a number",
            "sensors/s1/temp".into(),
            b"warm".to_vec(),
        ),
        ("MQTT: NaN", "sensors/s1/temp".into(), b"NaN".to_vec()),
        ("MQTT: 1e400", "sensors/s1/temp".into(), b"1e400".to_vec()),
        (
            "MQTT: an operator as value",
            "sensors/s1/temp".into(),
            br#"{"value":{"$gt":1}}"#.to_vec(),
        ),
        (
            "MQTT: JSON nested 100 000 deep",
            "sensors/s1".into(),
            nested("[", "", "]", 100_000).into_bytes(),
        ),
        (
            "MQTT: invalid UTF-8",
            "sensors/s1/temp".into(),
            vec![0xff, 0xfe, 0xfd],
        ),
        (
            "MQTT: a payload over the limit",
            "sensors/s1/temp".into(),
            vec![b'1'; 950 * 1024],
        ),
        (
            "MQTT: an operator as sensor",
            "sensors/$gt/temp".into(),
            b"1".to_vec(),
        ),
        (
            "MQTT: a sensor of 300 characters",
            format!("sensors/{}/temp", "a".repeat(300)),
            b"1".to_vec(),
        ),
        (
            "MQTT: line protocol with 10 000 tags",
            "telegraf/host/cpu".into(),
            format!(
                "temp,sensor=s1{} value=1\n",
                (0..10_000).map(|i| format!(",t{i}=v")).collect::<String>()
            )
            .into_bytes(),
        ),
        (
            "MQTT: line protocol that is not",
            "telegraf/host/cpu".into(),
            b"\\\\\\ ,,, === \n".to_vec(),
        ),
        (
            "Sparkplug: garbage",
            "spBv1.0/plant/NDATA/edge-1".into(),
            vec![0xff; 64],
        ),
        (
            "Sparkplug: a truncated payload",
            "spBv1.0/plant/NBIRTH/edge-1".into(),
            vec![0x12, 0x40, 0x0a, 0x01],
        ),
        (
            "Sparkplug: templates nested 5 000 deep",
            "spBv1.0/plant/NBIRTH/edge-1".into(),
            deep_payload,
        ),
        (
            "Sparkplug: data before any birth",
            "spBv1.0/plant/DDATA/edge-2/dev".into(),
            // metrics { name: "t", datatype: 10 (Double), double_value: 1 }
            vec![
                0x12, 0x0e, 0x0a, 0x01, b't', 0x20, 0x0a, 0x69, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f,
            ],
        ),
        (
            "Sparkplug: an unknown message type",
            "spBv1.0/plant/NFOO/edge-1".into(),
            vec![0x08, 0x01],
        ),
    ]
}

pub fn varint(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use proptest::prelude::*;
use srad_types::payload::metric::Value;
use srad_types::payload::{DataType, Metric, Payload};

use super::*;

const NOW: u64 = 1_800_000_000_000;

fn rules() -> Rules {
    Rules {
        device_sensor: "{edge_node}.{device}".into(),
        node_sensor: "{edge_node}".into(),
        reorder_timeout_ms: 2_000,
        rebirth_cooldown_ms: 30_000,
        window: TimeWindow {
            max_age: Duration::from_secs(86_400),
            max_future: Duration::from_secs(600),
        },
        property_labels: true,
        max_edge_nodes: 50,
        max_devices_per_node: 20,
        max_state_bytes: usize::MAX,
    }
}

fn topic<'a>(kind: Kind, node: &'a str, device: Option<&'a str>) -> Topic<'a> {
    Topic {
        group: "plant",
        kind,
        node,
        device,
    }
}

fn metric(name: Option<&str>, alias: Option<u64>, t: DataType, value: Option<Value>) -> Metric {
    Metric {
        name: name.map(str::to_owned),
        alias,
        datatype: Some(t as u32),
        value,
        ..Metric::new()
    }
}

fn payload(seq: Option<u64>, ts: u64, metrics: Vec<Metric>) -> Payload {
    Payload {
        timestamp: Some(ts),
        metrics,
        seq,
        uuid: None,
        body: None,
    }
}

fn birth(seq: u64, bd: u64, ts: u64) -> Payload {
    payload(
        Some(seq),
        ts,
        vec![
            metric(
                Some("bdSeq"),
                None,
                DataType::Int64,
                Some(Value::LongValue(bd)),
            ),
            metric(
                Some("Node Control/Rebirth"),
                None,
                DataType::Boolean,
                Some(Value::BooleanValue(false)),
            ),
            metric(
                Some("Inputs/temp"),
                Some(1),
                DataType::Double,
                Some(Value::DoubleValue(20.5)),
            ),
            metric(
                Some("level"),
                Some(2),
                DataType::Int8,
                Some(Value::IntValue(255)),
            ),
        ],
    )
}

fn data(seq: u64, ts: u64, v: f64) -> Payload {
    payload(
        Some(seq),
        ts,
        vec![metric(
            None,
            Some(1),
            DataType::Double,
            Some(Value::DoubleValue(v)),
        )],
    )
}

fn death(bd: u64) -> Payload {
    payload(
        None,
        NOW,
        vec![metric(
            Some("bdSeq"),
            None,
            DataType::Int64,
            Some(Value::LongValue(bd)),
        )],
    )
}

#[test]
fn a_birth_stores_its_values_and_data_by_alias_resolves_through_it() {
    let mut h = Host::new(rules());
    let fx = h.handle(&topic(Kind::NBirth, "gw", None), &birth(0, 0, NOW), NOW);
    assert_eq!(fx.dead_letter, None);
    let got: Vec<(String, f64)> = fx
        .readings
        .iter()
        .map(|r| (r.metric.to_string(), r.value))
        .collect();
    assert_eq!(
        got,
        vec![("Inputs__temp".into(), 20.5), ("level".into(), -1.0)]
    );
    assert_eq!(fx.skipped.control, 2);
    assert_eq!(fx.presence, vec![("gw".to_owned(), true)]);
    assert_eq!(fx.births.len(), 1);
    let fx = h.handle(
        &topic(Kind::NData, "gw", None),
        &data(1, NOW + 1000, 21.0),
        NOW + 1000,
    );
    assert_eq!(
        fx.readings,
        vec![Out {
            sensor: "gw".into(),
            metric: "Inputs__temp".into(),
            ts: (NOW / 1000 + 1) as i64,
            value: 21.0
        }]
    );
    assert!(fx.rebirth.is_empty());
}

#[test]
fn data_before_a_birth_or_with_an_unknown_alias_is_dead_lettered_and_asks_for_one_rebirth() {
    let mut h = Host::new(rules());
    let fx = h.handle(&topic(Kind::NData, "gw", None), &data(1, NOW, 1.0), NOW);
    assert!(fx.dead_letter.is_some() && fx.readings.is_empty());
    assert_eq!(fx.rebirth, vec![("plant".to_owned(), "gw".to_owned())]);
    // Within the cooldown: dead-lettered again, no second request.
    let fx = h.handle(
        &topic(Kind::NData, "gw", None),
        &data(2, NOW, 1.0),
        NOW + 1000,
    );
    assert!(fx.dead_letter.is_some());
    assert!(fx.rebirth.is_empty());
    assert_eq!(fx.rebirths_held, 1);
    h.handle(
        &topic(Kind::NBirth, "gw", None),
        &birth(0, 0, NOW),
        NOW + 2000,
    );
    let mut unknown = data(1, NOW, 1.0);
    unknown.metrics.push(metric(
        None,
        Some(9),
        DataType::Double,
        Some(Value::DoubleValue(2.0)),
    ));
    let fx = h.handle(&topic(Kind::NData, "gw", None), &unknown, NOW + 3000);
    assert!(
        fx.dead_letter
            .as_deref()
            .is_some_and(|r| r.contains("alias 9")),
        "{fx:?}"
    );
    assert!(
        fx.readings.is_empty(),
        "nothing of a dead-lettered message is stored"
    );
    assert!(fx.rebirth.is_empty(), "still within the cooldown");
    let fx = h.handle(&topic(Kind::NData, "gw", None), &unknown, NOW + 40_000);
    assert_eq!(fx.rebirth.len(), 1, "after the cooldown");
}

#[test]
fn nulls_transients_strings_and_history_are_handled_as_the_spec_says() {
    let mut h = Host::new(rules());
    let mut b = birth(0, 0, NOW);
    b.metrics.push(metric(
        Some("note"),
        Some(3),
        DataType::String,
        Some(Value::StringValue("x".into())),
    ));
    b.metrics.push(metric(
        Some("big"),
        Some(4),
        DataType::UInt64,
        Some(Value::LongValue(u64::MAX)),
    ));
    h.handle(&topic(Kind::NBirth, "gw", None), &b, NOW);
    let mut null = metric(None, Some(1), DataType::Double, None);
    null.is_null = Some(true);
    let mut transient = metric(None, Some(2), DataType::Int8, Some(Value::IntValue(3)));
    transient.is_transient = Some(true);
    let mut old = metric(
        None,
        Some(1),
        DataType::Double,
        Some(Value::DoubleValue(7.0)),
    );
    old.is_historical = Some(true);
    old.timestamp = Some(NOW - 3_600_000);
    let p = payload(
        Some(1),
        NOW,
        vec![
            null,
            transient,
            metric(
                None,
                Some(3),
                DataType::String,
                Some(Value::StringValue("y".into())),
            ),
            metric(
                None,
                Some(4),
                DataType::UInt64,
                Some(Value::LongValue(1 << 60)),
            ),
            old,
        ],
    );
    let fx = h.handle(&topic(Kind::NData, "gw", None), &p, NOW);
    assert_eq!(fx.dead_letter, None);
    assert_eq!(
        fx.skipped,
        Skipped {
            not_numeric: 1,
            null: 1,
            transient: 1,
            control: 0,
            rounded: 1
        }
    );
    let got: Vec<(&str, i64, f64)> = fx
        .readings
        .iter()
        .map(|r| (&*r.metric, r.ts, r.value))
        .collect();
    let s = (NOW / 1000) as i64;
    assert_eq!(
        got,
        vec![
            ("big", s, (1u64 << 60) as f64),
            ("Inputs__temp", s - 3600, 7.0)
        ]
    );
}

#[test]
fn a_stale_death_is_ignored_and_a_current_one_takes_the_node_and_its_devices_offline() {
    let mut h = Host::new(rules());
    h.handle(&topic(Kind::NBirth, "gw", None), &birth(0, 1, NOW), NOW);
    let db = payload(
        Some(1),
        NOW,
        vec![metric(
            Some("rpm"),
            Some(1),
            DataType::UInt16,
            Some(Value::IntValue(1200)),
        )],
    );
    let fx = h.handle(&topic(Kind::DBirth, "gw", Some("press")), &db, NOW);
    assert_eq!(fx.presence, vec![("gw.press".to_owned(), true)]);
    assert_eq!(&*fx.readings[0].sensor, "gw.press");
    let fx = h.handle(&topic(Kind::NDeath, "gw", None), &death(0), NOW);
    assert!(fx.stale_death && fx.presence.is_empty());
    let fx = h.handle(&topic(Kind::NDeath, "gw", None), &death(1), NOW);
    assert_eq!(
        fx.presence,
        vec![("gw".to_owned(), false), ("gw.press".to_owned(), false)]
    );
    let fx = h.handle(&topic(Kind::NData, "gw", None), &data(2, NOW, 1.0), NOW);
    assert!(
        fx.dead_letter.is_some(),
        "data after a death waits for a birth"
    );
}

#[test]
fn a_sequence_gap_waits_for_the_reorder_timeout_then_asks_for_a_rebirth() {
    let mut h = Host::new(rules());
    h.handle(&topic(Kind::NBirth, "gw", None), &birth(0, 0, NOW), NOW);
    // 2 before 1: closed in time, no rebirth.
    h.handle(&topic(Kind::NData, "gw", None), &data(2, NOW, 1.0), NOW);
    assert!(h.next_deadline().is_some());
    h.handle(
        &topic(Kind::NData, "gw", None),
        &data(1, NOW, 1.0),
        NOW + 500,
    );
    assert_eq!(h.next_deadline(), None);
    assert!(h.tick(NOW + 10_000).rebirth.is_empty());
    // 4 never comes.
    h.handle(&topic(Kind::NData, "gw", None), &data(3, NOW, 1.0), NOW);
    let fx = h.handle(
        &topic(Kind::NData, "gw", None),
        &data(5, NOW, 1.0),
        NOW + 1000,
    );
    assert!(
        fx.rebirth.is_empty() && !fx.readings.is_empty(),
        "stored at once"
    );
    assert!(h.tick(NOW + 2_999).rebirth.is_empty());
    assert_eq!(h.tick(NOW + 3_000).rebirth.len(), 1);
    assert_eq!(h.next_deadline(), None);
}

#[test]
fn birth_properties_become_labels_when_asked() {
    let mut h = Host::new(rules());
    let mut b = birth(0, 0, NOW);
    b.metrics.push(metric(
        Some("Properties/Hardware Make"),
        None,
        DataType::String,
        Some(Value::StringValue("Acme".into())),
    ));
    let fx = h.handle(&topic(Kind::NBirth, "gw", None), &b, NOW);
    assert_eq!(
        fx.labels,
        vec![(
            "gw".to_owned(),
            vec![
                ("group".to_owned(), "plant".to_owned()),
                ("edge_node".to_owned(), "gw".to_owned()),
                ("Hardware_Make".to_owned(), "Acme".to_owned()),
            ]
        )]
    );
    assert_eq!(fx.skipped.control, 3, "properties are not readings");
}

#[test]
fn a_message_delivered_again_is_no_gap() {
    let mut h = Host::new(rules());
    h.handle(&topic(Kind::NBirth, "gw", None), &birth(0, 0, NOW), NOW);
    for seq in [1, 2, 3, 2, 3, 4] {
        let fx = h.handle(&topic(Kind::NData, "gw", None), &data(seq, NOW, 1.0), NOW);
        assert_eq!(fx.readings.len(), 1);
    }
    assert_eq!(h.next_deadline(), None);
    assert!(h.tick(NOW + 60_000).rebirth.is_empty());
}

#[test]
fn sequence_numbers_wrap_at_256() {
    let mut h = Host::new(rules());
    h.handle(&topic(Kind::NBirth, "gw", None), &birth(0, 0, NOW), NOW);
    for k in 1..600u64 {
        h.handle(
            &topic(Kind::NData, "gw", None),
            &data(k % 256, NOW, 1.0),
            NOW,
        );
    }
    assert_eq!(h.next_deadline(), None);
}

#[test]
fn restored_births_resolve_aliases_without_a_rebirth() {
    let mut first = Host::new(rules());
    let births = first
        .handle(&topic(Kind::NBirth, "gw", None), &birth(0, 0, NOW), NOW)
        .births;
    let mut h = Host::new(rules());
    h.restore(births);
    let fx = h.handle(&topic(Kind::NData, "gw", None), &data(77, NOW, 3.0), NOW);
    assert_eq!(fx.dead_letter, None);
    assert!(fx.rebirth.is_empty());
    assert_eq!(fx.readings.len(), 1);
    assert_eq!(
        h.next_deadline(),
        None,
        "the first seq after a restart starts the count"
    );
}

mod model;

/// A fleet minting edge node ids cannot grow the host: births past
/// `max_edge_nodes` and messages from nodes never born are dead-lettered
/// without state; the nodes already known carry on.
#[test]
fn the_host_keeps_state_for_at_most_max_edge_nodes_and_devices() {
    let mut host = Host::new(rules());
    let names: Vec<String> = (0..rules().max_edge_nodes + 5)
        .map(|i| format!("n{i}"))
        .collect();
    for (i, n) in names.iter().enumerate() {
        let fx = host.handle(&topic(Kind::NBirth, n, None), &birth(0, 1, NOW), NOW);
        let refused = i >= rules().max_edge_nodes;
        assert_eq!(fx.dead_letter.is_some(), refused, "{n}: {fx:?}");
        if refused {
            assert!(
                fx.dead_letter
                    .as_deref()
                    .unwrap_or_default()
                    .contains("max_edge_nodes")
            );
            assert!(fx.readings.is_empty());
        }
    }
    // Nodes never born get no state: at most a rebirth request each, as
    // long as their cooldowns fit in max_edge_nodes, then none.
    let mut asked = 0;
    for k in 0..100 {
        let stranger = format!("stranger{k}");
        let fx = host.handle(
            &topic(Kind::NData, &stranger, None),
            &data(1, NOW, 1.0),
            NOW,
        );
        assert!(fx.dead_letter.is_some() && fx.rebirth.len() <= 1, "{fx:?}");
        asked += fx.rebirth.len();
    }
    assert!(asked <= rules().max_edge_nodes, "{asked}");
    assert!(host.asked.len() <= rules().max_edge_nodes);
    assert_eq!(host.nodes.len(), rules().max_edge_nodes);
    let fx = host.handle(&topic(Kind::NData, "n0", None), &data(1, NOW, 2.0), NOW);
    assert_eq!((fx.dead_letter, fx.readings.len()), (None, 1));
    let devices: Vec<String> = (0..rules().max_devices_per_node + 1)
        .map(|i| format!("d{i}"))
        .collect();
    for (i, d) in devices.iter().enumerate() {
        let fx = host.handle(
            &topic(Kind::DBirth, "n0", Some(d)),
            &birth(2 + i as u64, 1, NOW),
            NOW,
        );
        assert_eq!(
            fx.dead_letter.is_some(),
            i >= rules().max_devices_per_node,
            "{d}: {fx:?}"
        );
    }
}

/// Nodes that only send data (never a birth) cannot take the room of the
/// ones that are born: their rebirth cooldowns live apart, bounded, and a
/// real node's birth is taken whatever they sent.
#[test]
fn nodes_that_are_never_born_cannot_lock_out_a_real_one() {
    let mut host = Host::new(rules());
    for k in 0..(rules().max_edge_nodes * 3) {
        let ghost = format!("ghost{k}");
        let fx = host.handle(&topic(Kind::NData, &ghost, None), &data(1, NOW, 1.0), NOW);
        assert!(fx.dead_letter.is_some(), "{fx:?}");
    }
    assert!(host.nodes.is_empty());
    assert!(host.asked.len() <= rules().max_edge_nodes);
    let fx = host.handle(&topic(Kind::NBirth, "real", None), &birth(0, 1, NOW), NOW);
    assert_eq!(fx.dead_letter, None);
    let fx = host.handle(&topic(Kind::NData, "real", None), &data(1, NOW, 2.0), NOW);
    assert_eq!((fx.dead_letter, fx.readings.len()), (None, 1));
    // Once the cooldowns expire, ghosts may be asked again (never flooding).
    let later = NOW + rules().rebirth_cooldown_ms;
    let fx = host.handle(
        &topic(Kind::NData, "ghost0", None),
        &data(1, later, 1.0),
        later,
    );
    assert!(fx.rebirth.len() <= 1);
}

/// At the node cap, a dead node's state makes room for a new birth.
#[test]
fn at_the_node_cap_a_dead_node_gives_way_to_a_new_birth() {
    let mut host = Host::new(rules());
    for i in 0..rules().max_edge_nodes {
        let n = format!("n{i}");
        host.handle(&topic(Kind::NBirth, &n, None), &birth(0, 1, NOW), NOW);
    }
    let fx = host.handle(&topic(Kind::NBirth, "late", None), &birth(0, 1, NOW), NOW);
    assert!(fx.dead_letter.is_some(), "{fx:?}");
    host.handle(&topic(Kind::NDeath, "n3", None), &death(1), NOW);
    let fx = host.handle(&topic(Kind::NBirth, "late", None), &birth(0, 1, NOW), NOW);
    assert_eq!(fx.dead_letter, None);
    assert_eq!(host.nodes.len(), rules().max_edge_nodes);
    assert!(
        !host
            .nodes
            .contains_key(&("plant".to_owned(), "n3".to_owned()))
    );
}

/// Sequence numbers that jump about keep a gap of at most 256 numbers:
/// each message's work stays constant however many came before.
#[test]
fn a_flood_of_sequence_gaps_keeps_the_gap_bounded() {
    let mut host = Host::new(rules());
    host.handle(&topic(Kind::NBirth, "gw", None), &birth(0, 1, NOW), NOW);
    for k in 0..20_000u64 {
        let seq = if k % 2 == 0 { 128 } else { 0 };
        host.handle(&topic(Kind::NData, "gw", None), &data(seq, NOW, 1.0), NOW);
    }
    let node = &host.nodes[&("plant".to_owned(), "gw".to_owned())];
    assert!(node.missing.0.iter().map(|w| w.count_ones()).sum::<u32>() <= 256);
    assert!(host.next_deadline().is_some());
    assert_eq!(host.tick(NOW + 2_000).rebirth.len(), 1);
}

/// Two topics that map to one sensor id (node `gw.press` and device
/// `press` of node `gw`; one node name in two groups) would write each
/// other's readings: the second birth is refused, and the first keeps it.
#[test]
fn two_topics_mapped_to_one_sensor_id_cannot_write_each_others_readings() {
    let mut host = Host::new(rules());
    host.handle(&topic(Kind::NBirth, "gw", None), &birth(0, 1, NOW), NOW);
    let fx = host.handle(
        &topic(Kind::DBirth, "gw", Some("press")),
        &birth(1, 1, NOW),
        NOW,
    );
    assert_eq!(fx.dead_letter, None);
    let fx = host.handle(
        &topic(Kind::NBirth, "gw.press", None),
        &birth(0, 1, NOW),
        NOW,
    );
    let reason = fx.dead_letter.expect("refused");
    assert!(reason.contains("device plant/gw/press"), "{reason}");
    assert!(fx.readings.is_empty() && fx.labels.is_empty() && fx.births.is_empty());
    let other = Topic {
        group: "evil",
        kind: Kind::NBirth,
        node: "gw",
        device: None,
    };
    let fx = host.handle(&other, &birth(0, 1, NOW), NOW);
    assert!(
        fx.dead_letter
            .expect("refused")
            .contains("edge node plant/gw")
    );
    // The owner's own rebirth is taken.
    let fx = host.handle(&topic(Kind::NBirth, "gw", None), &birth(0, 2, NOW), NOW);
    assert_eq!(fx.dead_letter, None);
}

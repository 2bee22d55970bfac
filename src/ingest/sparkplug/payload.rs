//! Sparkplug B topics and payloads: what a message says, before the host
//! state machine judges it. Protobuf decoding is `srad-types`' (generated
//! from Eclipse Tahu's `sparkplug_b.proto`); this module maps its metrics to
//! numbers and its names to Hourglass's.

use prost::Message as _;
use srad_types::payload::metric::Value;
use srad_types::payload::{DataType, Metric, Payload};

/// The Sparkplug B namespace of every topic.
pub const NAMESPACE: &str = "spBv1.0";

/// The message types of `spBv1.0/<group>/<type>/<edge node>[/<device>]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NBirth,
    NData,
    NDeath,
    NCmd,
    DBirth,
    DData,
    DDeath,
    DCmd,
}

impl Kind {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "NBIRTH" => Kind::NBirth,
            "NDATA" => Kind::NData,
            "NDEATH" => Kind::NDeath,
            "NCMD" => Kind::NCmd,
            "DBIRTH" => Kind::DBirth,
            "DDATA" => Kind::DData,
            "DDEATH" => Kind::DDeath,
            "DCMD" => Kind::DCmd,
            _ => return None,
        })
    }

    pub fn is_device(self) -> bool {
        matches!(self, Kind::DBirth | Kind::DData | Kind::DDeath | Kind::DCmd)
    }
}

/// A parsed Sparkplug topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic<'a> {
    pub group: &'a str,
    pub kind: Kind,
    pub node: &'a str,
    pub device: Option<&'a str>,
}

/// What a topic under `spBv1.0/` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<'a> {
    Message(Topic<'a>),
    /// `spBv1.0/STATE/<host id>`: a primary host's own state, not data.
    State,
}

/// Parses `spBv1.0/<group>/<type>/<node>[/<device>]`; `None` when the topic
/// is not Sparkplug's or is malformed.
pub fn parse_topic(topic: &str) -> Result<Parsed<'_>, String> {
    let rest = topic
        .strip_prefix(NAMESPACE)
        .and_then(|r| r.strip_prefix('/'))
        .ok_or_else(|| format!("topic is not under {NAMESPACE}/"))?;
    let parts: Vec<&str> = rest.split('/').collect();
    if parts.first() == Some(&"STATE") {
        return Ok(Parsed::State);
    }
    let (group, kind, node, device) = match parts.as_slice() {
        [g, k, n] => (*g, *k, *n, None),
        [g, k, n, d] => (*g, *k, *n, Some(*d)),
        _ => {
            return Err(format!(
                "topic must be {NAMESPACE}/<group>/<type>/<edge node>[/<device>]"
            ));
        }
    };
    let kind = Kind::parse(kind).ok_or_else(|| format!("unknown message type {kind:?}"))?;
    if kind.is_device() != device.is_some() {
        return Err(format!(
            "a {kind:?} topic {} a device id",
            if device.is_some() { "has" } else { "lacks" }
        ));
    }
    for (what, id) in [
        ("group", Some(group)),
        ("edge node", Some(node)),
        ("device", device),
    ] {
        if let Some(id) = id
            && !valid_id(id)
        {
            return Err(format!(
                "the {what} id must be 1 to {} bytes without control characters, + or #",
                crate::domain::LABEL_VALUE_MAX_LEN
            ));
        }
    }
    Ok(Parsed::Message(Topic {
        group,
        kind,
        node,
        device,
    }))
}

/// A group, edge node or device id Hourglass takes: what a label value may
/// be (they become the `group`, `edge_node` and `device` labels), without
/// MQTT's wildcards. Checked once, at the topic, before any state.
pub(super) fn valid_id(id: &str) -> bool {
    crate::domain::valid_label_value(id) && !id.contains(['+', '#'])
}

/// Decodes a Sparkplug B payload.
pub fn decode(bytes: &[u8]) -> Result<Payload, String> {
    Payload::decode(bytes).map_err(|e| format!("the payload is not a Sparkplug B payload: {e}"))
}

/// The `Node Control/Rebirth` command a host sends to ask for births.
pub fn rebirth_command(now_ms: u64) -> Vec<u8> {
    let metric = Metric {
        name: Some("Node Control/Rebirth".into()),
        timestamp: Some(now_ms),
        datatype: Some(DataType::Boolean as u32),
        value: Some(Value::BooleanValue(true)),
        ..Metric::new()
    };
    Payload {
        timestamp: Some(now_ms),
        metrics: vec![metric],
        seq: None,
        uuid: None,
        body: None,
    }
    .encode_to_vec()
}

/// What a metric's value is to Hourglass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// A reading's value.
    Exact(f64),
    /// A 64-bit integer beyond 2^53: stored, rounded to the nearest double.
    Rounded(f64),
    /// Strings, bytes, data sets, templates, files and arrays: not readings.
    NotNumeric,
    /// The value does not match the datatype (or is missing).
    Mismatch,
}

/// Two's complement of the low `bits` bits: `Int8` −1 arrives as 255 from
/// some clients and 4 294 967 295 from others (sign-extended to 32 bits).
fn signed(raw: u64, bits: u32) -> i64 {
    let shift = 64 - bits;
    ((raw << shift) as i64) >> shift
}

const EXACT: u64 = 1 << 53;

/// A metric's value as a number, read by its datatype.
pub fn number(datatype: u32, value: Option<&Value>) -> Number {
    let Ok(t) = DataType::try_from(datatype as i32) else {
        return Number::Mismatch;
    };
    let int = |v: Option<&Value>| match v {
        Some(Value::IntValue(x)) => Some(u64::from(*x)),
        Some(Value::LongValue(x)) => Some(*x),
        _ => None,
    };
    match t {
        DataType::Int8 | DataType::Int16 | DataType::Int32 => {
            let bits = match t {
                DataType::Int8 => 8,
                DataType::Int16 => 16,
                _ => 32,
            };
            int(value).map_or(Number::Mismatch, |x| Number::Exact(signed(x, bits) as f64))
        }
        DataType::Int64 => int(value).map_or(Number::Mismatch, |x| {
            let v = x as i64;
            if v.unsigned_abs() > EXACT {
                Number::Rounded(v as f64)
            } else {
                Number::Exact(v as f64)
            }
        }),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => {
            let bits = match t {
                DataType::UInt8 => 8,
                DataType::UInt16 => 16,
                _ => 32,
            };
            int(value).map_or(Number::Mismatch, |x| {
                Number::Exact((x & ((1u64 << bits) - 1)) as f64)
            })
        }
        DataType::UInt64 => int(value).map_or(Number::Mismatch, |x| {
            if x > EXACT {
                Number::Rounded(x as f64)
            } else {
                Number::Exact(x as f64)
            }
        }),
        DataType::Float => match value {
            Some(Value::FloatValue(x)) if x.is_finite() => Number::Exact(f64::from(*x)),
            _ => Number::Mismatch,
        },
        DataType::Double => match value {
            Some(Value::DoubleValue(x)) if x.is_finite() => Number::Exact(*x),
            _ => Number::Mismatch,
        },
        DataType::Boolean => match value {
            Some(Value::BooleanValue(b)) => Number::Exact(if *b { 1.0 } else { 0.0 }),
            _ => Number::Mismatch,
        },
        _ => Number::NotNumeric,
    }
}

/// A Sparkplug metric name as an Hourglass metric name: folder separators
/// `/` become `__`, any other character outside `A-Z a-z 0-9 _ -` becomes
/// `_`; `None` when the result is empty or longer than a metric name may be.
pub fn metric_name(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '/' => out.push_str("__"),
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => out.push(c),
            _ => out.push('_'),
        }
    }
    crate::domain::MetricName::parse(out.as_str()).ok()?;
    Some(out)
}

/// A Sparkplug id as part of a sensor id: characters a sensor id may not
/// hold become `_`.
pub fn sensor_part(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn topics_name_group_type_node_and_device() {
        assert_eq!(
            parse_topic("spBv1.0/plant/DDATA/gw-1/press").expect("valid"),
            Parsed::Message(Topic {
                group: "plant",
                kind: Kind::DData,
                node: "gw-1",
                device: Some("press")
            })
        );
        assert_eq!(
            parse_topic("spBv1.0/STATE/host").expect("valid"),
            Parsed::State
        );
        for bad in [
            "spBv1.0/plant/NDATA/gw/dev",
            "spBv1.0/plant/DDATA/gw",
            "spBv1.0/plant/XDATA/gw",
            "spBv1.0/plant",
            "spBv1.0//NDATA/gw",
            "other/plant/NDATA/gw",
        ] {
            assert!(parse_topic(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn integers_are_twos_complement_whichever_way_they_were_widened() {
        let i8t = DataType::Int8 as u32;
        assert_eq!(
            number(i8t, Some(&Value::IntValue(255))),
            Number::Exact(-1.0)
        );
        assert_eq!(
            number(i8t, Some(&Value::IntValue(u32::MAX))),
            Number::Exact(-1.0)
        );
        assert_eq!(
            number(DataType::Int16 as u32, Some(&Value::IntValue(0x8000))),
            Number::Exact(-32768.0)
        );
        assert_eq!(
            number(DataType::Int32 as u32, Some(&Value::IntValue(u32::MAX))),
            Number::Exact(-1.0)
        );
        assert_eq!(
            number(DataType::Int64 as u32, Some(&Value::LongValue(u64::MAX))),
            Number::Exact(-1.0)
        );
        assert_eq!(
            number(DataType::UInt32 as u32, Some(&Value::IntValue(u32::MAX))),
            Number::Exact(4_294_967_295.0)
        );
        assert_eq!(
            number(DataType::UInt64 as u32, Some(&Value::LongValue(u64::MAX))),
            Number::Rounded(u64::MAX as f64)
        );
        assert_eq!(
            number(DataType::Boolean as u32, Some(&Value::BooleanValue(true))),
            Number::Exact(1.0)
        );
        assert_eq!(
            number(
                DataType::String as u32,
                Some(&Value::StringValue("x".into()))
            ),
            Number::NotNumeric
        );
        assert_eq!(
            number(DataType::Double as u32, Some(&Value::FloatValue(1.0))),
            Number::Mismatch
        );
        assert_eq!(
            number(DataType::Double as u32, Some(&Value::DoubleValue(f64::NAN))),
            Number::Mismatch
        );
    }

    proptest! {
        #[test]
        fn every_signed_value_survives_both_widenings(v in any::<i8>(), w in any::<i16>(), x in any::<i32>(), y in any::<i64>()) {
            let t8 = DataType::Int8 as u32;
            prop_assert_eq!(number(t8, Some(&Value::IntValue(u32::from(v as u8)))), Number::Exact(f64::from(v)));
            prop_assert_eq!(number(t8, Some(&Value::IntValue(i32::from(v) as u32))), Number::Exact(f64::from(v)));
            prop_assert_eq!(number(DataType::Int16 as u32, Some(&Value::IntValue(u32::from(w as u16)))), Number::Exact(f64::from(w)));
            prop_assert_eq!(number(DataType::Int32 as u32, Some(&Value::IntValue(x as u32))), Number::Exact(f64::from(x)));
            let got = number(DataType::Int64 as u32, Some(&Value::LongValue(y as u64)));
            if y.unsigned_abs() > EXACT {
                prop_assert_eq!(got, Number::Rounded(y as f64));
            } else {
                prop_assert_eq!(got, Number::Exact(y as f64));
            }
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn names_map_folders_and_refuse_what_cannot_be_a_metric() {
        assert_eq!(
            metric_name("Inputs/Temp 1").as_deref(),
            Some("Inputs__Temp_1")
        );
        assert_eq!(metric_name("a-b_c").as_deref(), Some("a-b_c"));
        assert_eq!(metric_name(""), None);
        assert_eq!(metric_name(&"x".repeat(65)), None);
        assert_eq!(sensor_part("gw 1/a"), "gw_1_a");
    }

    #[test]
    fn the_rebirth_command_decodes_as_node_control_rebirth_true() {
        let p = decode(&rebirth_command(5)).expect("decodes");
        assert_eq!(p.metrics[0].name.as_deref(), Some("Node Control/Rebirth"));
        assert_eq!(p.metrics[0].value, Some(Value::BooleanValue(true)));
    }
}

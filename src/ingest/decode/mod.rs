//! JSON readings → validated [`Reading`]s, borrowing from the input.
//!
//! A request is all or nothing: one invalid reading refuses all of them, with
//! the index and reason of each (up to [`MAX_DETAILS`]).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde_json::value::RawValue;

use crate::domain::Reading;

pub mod csv;
mod fields;
mod outcome;
mod plain;

pub use fields::Implied;
use fields::{RawReading, reason, validate};
use outcome::Collector;
pub use outcome::{DecodeContext, DecodeError, Detail, MAX_DETAILS};

fn decode_one<'a>(
    json: &'a str,
    implied: Implied<'a>,
    ctx: &DecodeContext,
) -> Result<Reading<'a>, String> {
    let raw: RawReading<'a> = serde_json::from_str(json).map_err(|e| reason(&e))?;
    validate(raw, implied, ctx).map_err(|e| e.to_string())
}

/// Decodes one reading object that must carry its `ts` (an import's line:
/// a reading stamped on receipt would be a new one at each import), in one
/// pass.
pub fn decode_timestamped<'a>(json: &'a str, ctx: &DecodeContext) -> Result<Reading<'a>, String> {
    // A plain, valid line without serde; the rest (and every error) as serde reads it.
    if let Some(raw) = plain::object(json).filter(|r| r.ts.is_some())
        && let Ok(r) = validate(raw, Implied::default(), ctx)
    {
        return Ok(r);
    }
    serde_timestamped(json, ctx)
}

/// Decodes an NDJSON body, the export's format and what `hourglass import`
/// sends: one reading object per line, each with its `ts`, blank lines
/// skipped. All or nothing, as an array: a detail's `index` is its line's
/// (from 0).
pub fn decode_ndjson<'a>(
    body: &'a [u8],
    ctx: &DecodeContext,
) -> Result<Vec<Reading<'a>>, DecodeError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| DecodeError::Malformed(format!("the body is not UTF-8: {e}")))?;
    match plain::ndjson(text, ctx) {
        Some(readings) => Ok(readings),
        // Not all plain, or not all valid: line by line, to explain.
        None => ndjson_lines(text, ctx),
    }
}

/// [`decode_ndjson`] line by line, each line through serde unless plain.
fn ndjson_lines<'a>(text: &'a str, ctx: &DecodeContext) -> Result<Vec<Reading<'a>>, DecodeError> {
    let lines = || {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
    };
    let mut seen = 0;
    let decoded = collect(
        lines()
            .take(ctx.max_readings + 1)
            .inspect(|_| seen += 1)
            .map(|(index, line)| (index, decode_timestamped(line, ctx))),
        // A reading line takes some 70 bytes: a guess that spares most regrowth.
        (text.len() / 64).min(ctx.max_readings),
    );
    if seen > ctx.max_readings {
        // Counted for the answer only now: the refused path.
        return Err(DecodeError::TooMany {
            count: lines().count(),
            max: ctx.max_readings,
        });
    }
    decoded
}

fn serde_timestamped<'a>(json: &'a str, ctx: &DecodeContext) -> Result<Reading<'a>, String> {
    let raw: RawReading<'a> = serde_json::from_str(json).map_err(|e| reason(&e))?;
    if raw.ts.is_none() {
        return Err("ts is required in an import".to_owned());
    }
    validate(raw, Implied::default(), ctx).map_err(|e| e.to_string())
}

/// Decodes a body that is one reading object or an array of them.
pub fn decode_readings<'a>(
    body: &'a [u8],
    ctx: &DecodeContext,
) -> Result<Vec<Reading<'a>>, DecodeError> {
    decode_with(body, Implied::default(), ctx)
}

/// Decodes an MQTT payload for a topic that names the sensor (and maybe the
/// metric): a bare number (timestamped on receipt), a reading object, or an
/// array of them.
pub fn decode_payload<'a>(
    payload: &'a [u8],
    implied: Implied<'a>,
    ctx: &DecodeContext,
) -> Result<Vec<Reading<'a>>, DecodeError> {
    let text = std::str::from_utf8(payload)
        .map_err(|e| DecodeError::Malformed(format!("the payload is not UTF-8: {e}")))?;
    let trimmed = text.trim();
    if trimmed.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        let value: f64 =
            serde_json::from_str(trimmed).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        let raw = RawReading {
            sensor: None,
            metric: None,
            ts: None,
            value,
        };
        return validate(raw, implied, ctx)
            .map(|r| vec![r])
            .map_err(|e| DecodeError::Invalid {
                invalid: 1,
                total: 1,
                details: vec![Detail {
                    index: 0,
                    reason: e.to_string(),
                }],
            });
    }
    decode_with(payload, implied, ctx)
}

fn decode_with<'a>(
    body: &'a [u8],
    implied: Implied<'a>,
    ctx: &DecodeContext,
) -> Result<Vec<Reading<'a>>, DecodeError> {
    // Long: one arm per shape a body may have (array, object, NDJSON), each tried plain first, then by serde.
    let text = std::str::from_utf8(body)
        .map_err(|e| DecodeError::Malformed(format!("the body is not UTF-8: {e}")))?;
    match text.trim_start().as_bytes().first() {
        Some(b'[') => match plain::readings(text, implied, ctx) {
            Some(readings) => Ok(readings),
            None => serde_array(text, implied, ctx),
        },
        Some(b'{') => {
            // Check the syntax first so a broken body is "malformed", not "invalid".
            let item: &'a RawValue =
                serde_json::from_str(text).map_err(|e| DecodeError::Malformed(e.to_string()))?;
            collect(
                std::iter::once((0, decode_one(item.get(), implied, ctx))),
                1,
            )
        }
        Some(_) => match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => Err(DecodeError::NotReadings),
            Err(e) => Err(DecodeError::Malformed(e.to_string())),
        },
        None => Err(DecodeError::Malformed("the body is empty".to_owned())),
    }
}

/// An array of readings through serde: one pass when every element has the
/// right shape, otherwise two that say which ones do not.
fn serde_array<'a>(
    text: &'a str,
    implied: Implied<'a>,
    ctx: &DecodeContext,
) -> Result<Vec<Reading<'a>>, DecodeError> {
    // One pass when every element has the right shape (bodies with
    // escapes or nulls); otherwise the two passes below say which do not.
    let mut de = serde_json::Deserializer::from_str(text);
    let seed = OnePass {
        implied,
        ctx,
        // serde_json gives no length: a guess from the body's size
        // (a reading with a sensor and a metric takes some 60 bytes)
        // spares most of the vector's regrowth.
        capacity: (text.len() / 64).min(ctx.max_readings),
    };
    let one_pass = de::DeserializeSeed::deserialize(seed, &mut de)
        .and_then(|checked| de.end().map(|()| checked));
    if let Ok(checked) = one_pass {
        return checked;
    }
    let items: Vec<&'a RawValue> =
        serde_json::from_str(text).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if items.len() > ctx.max_readings {
        return Err(DecodeError::TooMany {
            count: items.len(),
            max: ctx.max_readings,
        });
    }
    collect(
        items
            .iter()
            .map(|item| decode_one(item.get(), implied, ctx))
            .enumerate(),
        items.len(),
    )
}

/// An array of readings deserialized and validated element by element, into
/// the answer of [`decode_with`]: no intermediate vector of raw readings.
struct OnePass<'a, 'c> {
    implied: Implied<'a>,
    ctx: &'c DecodeContext,
    capacity: usize,
}

impl<'a> de::DeserializeSeed<'a> for OnePass<'a, '_> {
    type Value = Result<Vec<Reading<'a>>, DecodeError>;

    fn deserialize<D: Deserializer<'a>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'a> Visitor<'a> for OnePass<'a, '_> {
    type Value = Result<Vec<Reading<'a>>, DecodeError>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of readings")
    }

    fn visit_seq<A: de::SeqAccess<'a>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let max = self.ctx.max_readings;
        let mut readings = Vec::with_capacity(seq.size_hint().unwrap_or(self.capacity).min(max));
        let (mut total, mut invalid, mut details) = (0, 0, Vec::new());
        while let Some(raw) = seq.next_element::<RawReading<'a>>()? {
            total += 1;
            if total > max {
                continue; // only counted, for the answer
            }
            match validate(raw, self.implied, self.ctx) {
                Ok(r) if invalid == 0 => readings.push(r),
                Ok(_) => {}
                Err(e) => {
                    invalid += 1;
                    if details.len() < MAX_DETAILS {
                        details.push(Detail {
                            index: total - 1,
                            reason: e.to_string(),
                        });
                    }
                }
            }
        }
        Ok(if total > max {
            Err(DecodeError::TooMany { count: total, max })
        } else if invalid > 0 {
            Err(DecodeError::Invalid {
                invalid,
                total,
                details,
            })
        } else {
            Ok(readings)
        })
    }
}

/// Every reading, or every error (each with its index) when any is
/// invalid; `capacity` is a guess of how many there are.
fn collect<'a>(
    results: impl Iterator<Item = (usize, Result<Reading<'a>, String>)>,
    capacity: usize,
) -> Result<Vec<Reading<'a>>, DecodeError> {
    let mut out = Collector::new(capacity);
    for (index, result) in results {
        out.push(index, result);
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::domain::{SensorId, TimeWindow};

    pub(super) const NOW: i64 = 1_381_961_300; // 2013-10-16T22:08:20Z

    pub(super) fn ctx() -> DecodeContext {
        DecodeContext {
            now: NOW,
            window: TimeWindow {
                max_age: Duration::from_secs(30 * 86400),
                max_future: Duration::from_secs(300),
            },
            max_readings: 10,
        }
    }

    fn reasons(body: &str) -> Vec<(usize, String)> {
        match decode_readings(body.as_bytes(), &ctx()) {
            Err(DecodeError::Invalid { details, .. }) => {
                details.into_iter().map(|d| (d.index, d.reason)).collect()
            }
            other => panic!("expected invalid readings, got {other:?}"),
        }
    }

    #[test]
    fn names_are_borrowed_from_the_body_unless_escaped() {
        let body = br#"[{"sensor":"s1","metric":"temp","value":1},{"sensor":"s\u0032","metric":"temp","value":2}]"#;
        let inside = |s: &str| body.as_ptr_range().contains(&s.as_ptr());
        let r = decode_readings(body, &ctx()).expect("valid");
        assert!(inside(r[0].sensor.as_str()) && inside(r[0].metric.as_str()));
        assert_eq!(r[1].sensor.as_str(), "s2");
        assert!(!inside(r[1].sensor.as_str()) && inside(r[1].metric.as_str()));
    }

    #[test]
    fn a_single_object_decodes_with_the_documented_example() {
        let body =
            br#"{"sensor":"I80_mile23","metric":"speed","ts":"2013-10-16T22:07:38Z","value":63}"#;
        let r = decode_readings(body, &ctx()).expect("valid");
        assert_eq!(r.len(), 1);
        assert_eq!(
            (
                r[0].sensor.as_str(),
                r[0].metric.as_str(),
                r[0].ts,
                r[0].value
            ),
            ("I80_mile23", "speed", 1_381_961_258, 63.0)
        );
    }

    #[test]
    fn names_borrow_from_the_body_when_they_can() {
        let body = br#"[{"sensor":"a","value":1}]"#;
        let r = decode_readings(body, &ctx()).expect("valid");
        assert!(matches!(r[0].sensor, SensorId { .. }));
        assert_eq!(r[0].metric.as_str(), "value", "the default metric");
        assert_eq!(r[0].ts, NOW, "no ts means the time of receipt");
    }

    #[test]
    fn epoch_milliseconds_are_accepted() {
        let r = decode_readings(br#"{"sensor":"a","ts":1381961258999,"value":1}"#, &ctx())
            .expect("valid");
        assert_eq!(r[0].ts, 1_381_961_258);
    }

    #[test]
    fn every_invalid_reading_is_reported_with_its_index() {
        let body = r#"[
            {"sensor":"ok","value":1},
            {"sensor":"$gt","value":1},
            {"sensor":"a","value":"63"},
            {"sensor":"a","value":{"$gt":1}},
            {"sensor":"a","metric":"a.b","value":1},
            {"sensor":"a","ts":"2099-01-01T00:00:00Z","value":1},
            {"sensor":"a","ts":"2000-01-01T00:00:00Z","value":1},
            {"sensor":"a","ts":1.5,"value":1},
            {"sensor":"a","value":1,"unit":"C"},
            {"value":1}
        ]"#;
        let got = reasons(body);
        let indexes: Vec<usize> = got.iter().map(|(i, _)| *i).collect();
        assert_eq!(indexes, (1..10).collect::<Vec<_>>());
        assert!(got[0].1.contains("sensor"), "{:?}", got[0]);
        assert!(got[1].1.contains("invalid type"), "{:?}", got[1]);
        assert!(got[4].1.contains("future"), "{:?}", got[4]);
        assert!(got[5].1.contains("past"), "{:?}", got[5]);
        assert!(got[7].1.contains("unknown field"), "{:?}", got[7]);
        assert!(got[8].1.contains("sensor is required"), "{:?}", got[8]);
    }

    #[test]
    fn malformed_bodies_are_told_apart_from_invalid_readings() {
        for body in ["", "  ", "[", "{\"sensor\":", "[1,]", "nul", "\u{feff}[]"] {
            assert!(
                matches!(
                    decode_readings(body.as_bytes(), &ctx()),
                    Err(DecodeError::Malformed(_))
                ),
                "{body:?}"
            );
        }
        for body in ["1", "\"x\"", "null", "true"] {
            assert_eq!(
                decode_readings(body.as_bytes(), &ctx()),
                Err(DecodeError::NotReadings),
                "{body:?}"
            );
        }
        assert!(matches!(
            decode_readings(b"[1]", &ctx()),
            Err(DecodeError::Invalid { .. })
        ));
        assert!(matches!(
            decode_readings(&[0xff, 0xfe], &ctx()),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn numbers_that_do_not_fit_a_double_are_refused() {
        let got = reasons(r#"[{"sensor":"a","value":1e400}]"#);
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn too_many_readings_are_refused_before_decoding_them() {
        let body = format!("[{}]", ["{}"; 11].join(","));
        assert_eq!(
            decode_readings(body.as_bytes(), &ctx()),
            Err(DecodeError::TooMany { count: 11, max: 10 })
        );
    }

    #[test]
    fn payloads_take_sensor_and_metric_from_the_topic() {
        let topic = Implied {
            sensor: Some("s1"),
            metric: Some("temp"),
        };
        let r = decode_payload(b" 21.5 ", topic, &ctx()).expect("a bare number");
        assert_eq!(
            (
                r[0].sensor.as_str(),
                r[0].metric.as_str(),
                r[0].ts,
                r[0].value
            ),
            ("s1", "temp", NOW, 21.5)
        );
        let r = decode_payload(
            br#"[{"value":1,"ts":1381961258000},{"value":2}]"#,
            topic,
            &ctx(),
        )
        .expect("objects");
        assert_eq!(r.len(), 2);
        let sensor_only = Implied {
            sensor: Some("s1"),
            metric: None,
        };
        let r =
            decode_payload(br#"{"metric":"rpm","value":3}"#, sensor_only, &ctx()).expect("object");
        assert_eq!(r[0].metric.as_str(), "rpm");
        let r = decode_payload(b"-4", sensor_only, &ctx()).expect("number");
        assert_eq!(r[0].metric.as_str(), "value");
    }

    #[test]
    fn payloads_may_not_contradict_their_topic() {
        let topic = Implied {
            sensor: Some("s1"),
            metric: Some("temp"),
        };
        for bad in [
            r#"{"sensor":"s2","value":1}"#,
            r#"{"metric":"rpm","value":1}"#,
        ] {
            assert!(
                matches!(
                    decode_payload(bad.as_bytes(), topic, &ctx()),
                    Err(DecodeError::Invalid { .. })
                ),
                "{bad}"
            );
        }
        for bad in ["1e400", "NaN", "12abc", "-", ""] {
            assert!(
                decode_payload(bad.as_bytes(), topic, &ctx()).is_err(),
                "{bad:?}"
            );
        }
        assert!(
            decode_payload(br#"{"sensor":"s1","value":1}"#, topic, &ctx()).is_ok(),
            "repeating is fine"
        );
    }

    use proptest::prelude::*;

    proptest! {
        /// Whatever the bytes: no panic, and anything accepted obeys the rules.
        #[test]
        fn arbitrary_bodies_never_panic_and_accepted_readings_obey_the_rules(
            body in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..200),
                "[{\"sensor\":\"[a-z$.]{0,5}\",\"value\":-?[0-9e.]{1,6}(,\"ts\":-?[0-9]{1,16})?}]"
                    .prop_map(String::into_bytes),
            ]
        ) {
            if let Ok(readings) = decode_readings(&body, &ctx()) {
                for r in readings {
                    prop_assert!(r.value.is_finite());
                    prop_assert!(SensorId::parse(r.sensor.as_str()).is_ok());
                    prop_assert!(r.ts <= NOW + 300 && r.ts >= NOW - 30 * 86_400);
                }
            }
            let topic = Implied { sensor: Some("s"), metric: None };
            let _ = decode_payload(&body, topic, &ctx());
        }

        /// Valid readings survive encoding and decoding exactly.
        #[test]
        fn valid_readings_round_trip(
            items in prop::collection::vec(
                ("[A-Za-z0-9_.:-]{1,128}", proptest::option::of("[A-Za-z0-9_-]{1,64}"),
                 -300i64..30 * 86_400, any::<f64>().prop_filter("finite", |v| v.is_finite()), any::<bool>()),
                1..10,
            )
        ) {
            let json: Vec<serde_json::Value> = items
                .iter()
                .map(|(sensor, metric, age, value, as_text)| {
                    let ts = (NOW - age) * 1000;
                    let ts = if *as_text {
                        serde_json::json!(crate::domain::format_secs(ts / 1000).expect("in range"))
                    } else {
                        serde_json::json!(ts)
                    };
                    let mut o = serde_json::json!({ "sensor": sensor, "value": value, "ts": ts });
                    if let Some(m) = metric { o["metric"] = serde_json::json!(m); }
                    o
                })
                .collect();
            let body = serde_json::to_vec(&json).expect("encodes");
            let got = decode_readings(&body, &DecodeContext { max_readings: 100, ..ctx() }).expect("valid");
            prop_assert_eq!(got.len(), items.len());
            for (r, (sensor, metric, age, value, _)) in got.iter().zip(&items) {
                prop_assert_eq!(r.sensor.as_str(), sensor.as_str());
                prop_assert_eq!(r.metric.as_str(), metric.as_deref().unwrap_or("value"));
                prop_assert_eq!(r.ts, NOW - age);
                prop_assert_eq!(r.value, *value);
            }
        }
    }

    #[test]
    fn an_empty_array_is_zero_readings() {
        assert_eq!(decode_readings(b"[]", &ctx()), Ok(vec![]));
    }
}

//! One JSON reading's fields as sent, and their check into a [`Reading`]:
//! what both JSON decoders (serde's and the plain one) share.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::outcome::DecodeContext;
use crate::domain::{
    InvalidReading, MetricName, Reading, SensorId, parse_timestamp_ms, parse_timestamp_str,
};

/// A timestamp as sent: RFC 3339 text or integer epoch milliseconds.
pub(super) struct Ts(pub(super) Result<i64, InvalidReading>);

impl<'de> Deserialize<'de> for Ts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TsVisitor;
        impl Visitor<'_> for TsVisitor {
            type Value = Ts;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RFC 3339 string or integer epoch milliseconds")
            }
            fn visit_i64<E: de::Error>(self, ms: i64) -> Result<Ts, E> {
                Ok(Ts(Ok(parse_timestamp_ms(ms))))
            }
            fn visit_u64<E: de::Error>(self, ms: u64) -> Result<Ts, E> {
                Ok(Ts(i64::try_from(ms)
                    .map(parse_timestamp_ms)
                    .map_err(|_| InvalidReading::TimestampFormat)))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Ts, E> {
                Ok(Ts(Err(InvalidReading::TimestampFormat)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Ts, E> {
                Ok(Ts(parse_timestamp_str(s)))
            }
        }
        d.deserialize_any(TsVisitor)
    }
}

/// A string borrowed from the body unless it holds escapes. serde borrows a
/// bare `Cow<str>` field but not one inside an `Option`: without this, every
/// reading would allocate its sensor and metric names.
pub(super) struct Text<'a>(pub(super) Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(TextVisitor)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReading<'a> {
    #[serde(borrow, default)]
    pub(super) sensor: Option<Text<'a>>,
    #[serde(borrow, default)]
    pub(super) metric: Option<Text<'a>>,
    #[serde(default)]
    pub(super) ts: Option<Ts>,
    pub(super) value: f64,
}

/// serde_json appends " at line L column C"; inside one array element that
/// position misleads more than it helps.
pub(super) fn reason(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

/// The parts of a reading that its channel supplies, such as an MQTT topic.
/// A payload may repeat them but not contradict them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Implied<'a> {
    pub sensor: Option<&'a str>,
    pub metric: Option<&'a str>,
}

pub(super) fn pick<'a>(
    given: Option<Cow<'a, str>>,
    implied: Option<&'a str>,
    what: &'static str,
) -> Result<Option<Cow<'a, str>>, InvalidReading> {
    match (given, implied) {
        (Some(g), Some(i)) if g != i => Err(InvalidReading::TopicMismatch(what)),
        (_, Some(i)) => Ok(Some(Cow::Borrowed(i))),
        (given, None) => Ok(given),
    }
}

pub(super) fn validate<'a>(
    raw: RawReading<'a>,
    implied: Implied<'a>,
    ctx: &DecodeContext,
) -> Result<Reading<'a>, InvalidReading> {
    let sensor = pick(raw.sensor.map(|t| t.0), implied.sensor, "sensor")?
        .ok_or(InvalidReading::MissingSensor)
        .and_then(SensorId::parse)?;
    let metric = match pick(raw.metric.map(|t| t.0), implied.metric, "metric")? {
        Some(m) => MetricName::parse(m)?,
        None => MetricName::default_metric(),
    };
    let value = Reading::check_value(raw.value)?;
    let ts = match raw.ts {
        Some(Ts(ts)) => ctx.window.check(ts?, ctx.now)?,
        None => ctx.now,
    };
    Ok(Reading {
        sensor,
        metric,
        ts,
        value,
    })
}

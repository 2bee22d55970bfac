use std::borrow::Cow;
use std::fmt;

pub const SENSOR_MAX_LEN: usize = 128;
pub const METRIC_MAX_LEN: usize = 64;
pub const DEFAULT_METRIC: &str = "value";

/// Why a reading (or one of its parts) was refused. The text is shown to clients.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidReading {
    #[error("sensor must be 1 to {SENSOR_MAX_LEN} characters of A-Z a-z 0-9 _ . : -")]
    Sensor,
    #[error("metric must be 1 to {METRIC_MAX_LEN} characters of A-Z a-z 0-9 _ -")]
    Metric,
    #[error("sensor is required")]
    MissingSensor,
    #[error("the payload's {0} differs from the topic's")]
    TopicMismatch(&'static str),
    #[error("value must be a finite number")]
    Value,
    #[error("ts must be an RFC 3339 string or integer epoch milliseconds")]
    TimestampFormat,
    #[error("ts is more than {0} in the future")]
    TooNew(String),
    #[error("ts is more than {0} in the past")]
    TooOld(String),
}

/// Bytes of a metric name (`METRIC`) and of a sensor id (`METRIC | SENSOR`).
const METRIC: u8 = 1;
const SENSOR: u8 = 2;
const NAME_BYTES: [u8; 256] = {
    let mut table = [0; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' {
            METRIC | SENSOR
        } else if c == b'.' || c == b':' {
            SENSOR
        } else {
            0
        };
        b += 1;
    }
    table
};

/// `s` is 1 to `max` bytes, each allowed by `kind` (one table lookup a
/// byte: every reading's names pass here).
fn valid_name(s: &str, max: usize, kind: u8) -> bool {
    // Byte-wise on purpose: every allowed character is ASCII, so any multi-byte
    // UTF-8 sequence (homoglyphs, NUL look-alikes) fails here.
    !s.is_empty() && s.len() <= max && s.bytes().all(|b| NAME_BYTES[usize::from(b)] & kind != 0)
}

/// A sensor id: 1–128 characters of `[A-Za-z0-9_.:-]`.
///
/// Borrows from the request body where it can; only a bucket that is new to the
/// batcher takes an owned copy (`into_owned`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SensorId<'a>(Cow<'a, str>);

impl<'a> SensorId<'a> {
    pub fn parse(s: impl Into<Cow<'a, str>>) -> Result<Self, InvalidReading> {
        let s = s.into();
        if valid_name(&s, SENSOR_MAX_LEN, SENSOR) {
            Ok(Self(s))
        } else {
            Err(InvalidReading::Sensor)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_owned(self) -> SensorId<'static> {
        SensorId(Cow::Owned(self.0.into_owned()))
    }

    /// A name validated before (by this process, a moment ago): not checked again.
    pub fn trusted(s: &'a str) -> Self {
        debug_assert!(valid_name(s, SENSOR_MAX_LEN, SENSOR), "{s:?}");
        Self(Cow::Borrowed(s))
    }
}

/// A metric name: 1–64 characters of `[A-Za-z0-9_-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MetricName<'a>(Cow<'a, str>);

impl<'a> MetricName<'a> {
    pub fn parse(s: impl Into<Cow<'a, str>>) -> Result<Self, InvalidReading> {
        let s = s.into();
        if valid_name(&s, METRIC_MAX_LEN, METRIC) {
            Ok(Self(s))
        } else {
            Err(InvalidReading::Metric)
        }
    }

    pub fn default_metric() -> MetricName<'static> {
        MetricName(Cow::Borrowed(DEFAULT_METRIC))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_owned(self) -> MetricName<'static> {
        MetricName(Cow::Owned(self.0.into_owned()))
    }

    /// A name validated before (by this process, a moment ago): not checked again.
    pub fn trusted(s: &'a str) -> Self {
        debug_assert!(valid_name(s, METRIC_MAX_LEN, METRIC), "{s:?}");
        Self(Cow::Borrowed(s))
    }
}

impl fmt::Display for SensorId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for MetricName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated reading. `ts` is whole seconds since the Unix epoch (UTC).
#[derive(Debug, Clone, PartialEq)]
pub struct Reading<'a> {
    pub sensor: SensorId<'a>,
    pub metric: MetricName<'a>,
    pub ts: i64,
    pub value: f64,
}

impl Reading<'_> {
    /// A copy that borrows nothing.
    pub fn into_owned(self) -> Reading<'static> {
        Reading {
            sensor: self.sensor.into_owned(),
            metric: self.metric.into_owned(),
            ts: self.ts,
            value: self.value,
        }
    }

    /// Whether `other` is of the same sensor and metric.
    pub fn same_series(&self, other: &Reading<'_>) -> bool {
        self.shares_names(other)
            || (self.sensor.as_str() == other.sensor.as_str()
                && self.metric.as_str() == other.metric.as_str())
    }

    /// Whether `other`'s sensor and metric are the very same text as this
    /// one's (one address): a decoder hands a series' readings shared names,
    /// so this tells its runs apart without reading the text.
    pub fn shares_names(&self, other: &Reading<'_>) -> bool {
        std::ptr::eq(self.sensor.as_str(), other.sensor.as_str())
            && std::ptr::eq(self.metric.as_str(), other.metric.as_str())
    }

    pub fn check_value(value: f64) -> Result<f64, InvalidReading> {
        if value.is_finite() {
            Ok(value)
        } else {
            Err(InvalidReading::Value)
        }
    }
}

/// Parses an RFC 3339 timestamp to whole epoch seconds, rounding down.
pub fn parse_timestamp_str(s: &str) -> Result<i64, InvalidReading> {
    super::rfc3339_secs(s).ok_or(InvalidReading::TimestampFormat)
}

/// Epoch milliseconds to whole epoch seconds, rounding down (also before 1970).
pub fn parse_timestamp_ms(ms: i64) -> i64 {
    ms.div_euclid(1000)
}

/// The accepted window for reading timestamps, relative to the time of receipt.
#[derive(Debug, Clone, Copy)]
pub struct TimeWindow {
    pub max_age: std::time::Duration,
    pub max_future: std::time::Duration,
}

impl TimeWindow {
    /// Checks `ts` (epoch seconds) against the window around `now` (epoch seconds).
    pub fn check(&self, ts: i64, now: i64) -> Result<i64, InvalidReading> {
        let future = i64::try_from(self.max_future.as_secs()).unwrap_or(i64::MAX);
        let age = i64::try_from(self.max_age.as_secs()).unwrap_or(i64::MAX);
        if ts > now.saturating_add(future) {
            Err(InvalidReading::TooNew(
                humantime::format_duration(self.max_future).to_string(),
            ))
        } else if ts < now.saturating_sub(age) {
            Err(InvalidReading::TooOld(
                humantime::format_duration(self.max_age).to_string(),
            ))
        } else {
            Ok(ts)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sensor_ids_accept_the_documented_charset_and_length() {
        assert!(SensorId::parse("I80_mile23").is_ok());
        assert!(SensorId::parse("plant-1.line:3").is_ok());
        assert!(SensorId::parse("a".repeat(SENSOR_MAX_LEN)).is_ok());
    }

    #[test]
    fn sensor_ids_refuse_anything_that_could_be_an_operator_or_path() {
        for bad in [
            "",
            "$gt",
            "a b",
            "a/b",
            "a\0b",
            "ä",
            "a\u{200b}",
            "{",
            "a$",
            "тест",
        ] {
            assert_eq!(SensorId::parse(bad), Err(InvalidReading::Sensor), "{bad:?}");
        }
        assert!(SensorId::parse("a".repeat(SENSOR_MAX_LEN + 1)).is_err());
    }

    #[test]
    fn each_byte_is_allowed_exactly_by_the_documented_charsets() {
        for b in 0..=255_u8 {
            let metric = b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
            let sensor = metric || b == b'.' || b == b':';
            let s = [b'a', b, b'z'];
            let text = std::str::from_utf8(&s);
            assert_eq!(
                text.is_ok_and(|t| SensorId::parse(t).is_ok()),
                sensor,
                "{b:#x}"
            );
            assert_eq!(
                text.is_ok_and(|t| MetricName::parse(t).is_ok()),
                metric,
                "{b:#x}"
            );
        }
    }

    #[test]
    fn metric_names_refuse_dots_and_colons() {
        assert!(MetricName::parse("speed_kmh-1").is_ok());
        for bad in [
            "",
            "a.b",
            "a:b",
            "$inc",
            "m".repeat(METRIC_MAX_LEN + 1).as_str(),
        ] {
            assert_eq!(
                MetricName::parse(bad),
                Err(InvalidReading::Metric),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn timestamps_round_down_to_the_second() {
        assert_eq!(parse_timestamp_str("1970-01-01T00:00:01.999Z"), Ok(1));
        assert_eq!(
            parse_timestamp_str("2013-10-16T22:07:38+02:00"),
            Ok(1381954058)
        );
        assert_eq!(parse_timestamp_ms(1999), 1);
        assert_eq!(parse_timestamp_ms(-1), -1);
        assert!(parse_timestamp_str("2013-10-16 22:07:38").is_err());
        assert!(parse_timestamp_str("yesterday").is_err());
    }

    #[test]
    fn the_time_window_is_inclusive_at_both_ends() {
        let w = TimeWindow {
            max_age: Duration::from_secs(100),
            max_future: Duration::from_secs(10),
        };
        assert!(w.check(1010, 1000).is_ok());
        assert!(w.check(900, 1000).is_ok());
        assert!(matches!(
            w.check(1011, 1000),
            Err(InvalidReading::TooNew(_))
        ));
        assert!(matches!(w.check(899, 1000), Err(InvalidReading::TooOld(_))));
    }

    #[test]
    fn values_must_be_finite() {
        assert!(Reading::check_value(1e308).is_ok());
        assert!(Reading::check_value(f64::NAN).is_err());
        assert!(Reading::check_value(f64::INFINITY).is_err());
    }
}

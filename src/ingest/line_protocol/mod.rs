//! InfluxDB line protocol → validated [`Reading`]s and sensor labels.
//!
//! The mapping: the sensor is the value of the first tag named in
//! `line_protocol.sensor_tags` that a line has; its other tags are the
//! sensor's labels. Each numeric field is a reading of metric `<measurement>`
//! when the field key is `value`, else `<measurement>_<field>`; integers are
//! numbers, booleans 1 and 0, string fields are skipped (and counted).
//!
//! Unlike JSON, a body is taken line by line: a line that cannot be parsed or
//! validated is refused with its number and reason, and the others are kept
//! (InfluxDB's partial write, which Telegraf expects).

mod decoded;
mod labels;
pub mod parse;
mod settings;

use bumpalo::Bump;
use hashbrown::HashMap;

use self::decoded::Row;
pub use self::decoded::{Decoded, LineError};
pub use self::labels::LabelSync;
use self::parse::{
    FieldValue, Kind, Line, Lines, ParseError, Text, parse_fields, parse_line, parse_series,
    series_end, value_field,
};
pub use self::settings::Settings;
use super::decode::DecodeContext;
use crate::domain::{InvalidLabels, InvalidReading, MetricName, Reading, SensorId, SensorLabels};

/// The most series a body's series cache is sized for before its first line.
const MAX_PRESIZED_SERIES: usize = 1024;

/// How many refused lines an answer lists at most.
pub const MAX_DETAILS: usize = 100;

/// The unit of the timestamps in a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Nanoseconds,
    Microseconds,
    Milliseconds,
    Seconds,
    Minutes,
    Hours,
}

impl Precision {
    /// InfluxDB 1.x's `precision`: `ns|n|u|µ|ms|s|m|h`.
    pub fn v1(s: &str) -> Option<Self> {
        Some(match s {
            "ns" | "n" => Self::Nanoseconds,
            "u" | "µ" | "us" => Self::Microseconds,
            "ms" => Self::Milliseconds,
            "s" => Self::Seconds,
            "m" => Self::Minutes,
            "h" => Self::Hours,
            _ => return None,
        })
    }

    /// InfluxDB 2.x's `precision`: `ns|us|ms|s`.
    pub fn v2(s: &str) -> Option<Self> {
        Some(match s {
            "ns" => Self::Nanoseconds,
            "us" => Self::Microseconds,
            "ms" => Self::Milliseconds,
            "s" => Self::Seconds,
            _ => return None,
        })
    }

    /// A timestamp in this unit as whole epoch seconds, rounding down.
    pub fn to_seconds(self, ts: i64) -> Option<i64> {
        match self {
            Self::Nanoseconds => Some(ts.div_euclid(1_000_000_000)),
            Self::Microseconds => Some(ts.div_euclid(1_000_000)),
            Self::Milliseconds => Some(ts.div_euclid(1_000)),
            Self::Seconds => Some(ts),
            Self::Minutes => ts.checked_mul(60),
            Self::Hours => ts.checked_mul(3600),
        }
    }
}

/// More readings than a request may hold: nothing is taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("more than {max} readings in one request")]
pub struct TooMany {
    pub max: usize,
}

/// Why a line was refused, beyond the syntax.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum Refusal {
    #[error(transparent)]
    Syntax(#[from] ParseError),
    #[error("no sensor tag: the line needs one of the tags {0}")]
    NoSensor(String),
    #[error("tag {tag:?}: {reason}")]
    Sensor { tag: String, reason: InvalidReading },
    #[error("{0}")]
    Labels(String),
    #[error("field {field:?}: the metric {metric:?}: {reason}")]
    Metric {
        field: String,
        metric: String,
        reason: InvalidReading,
    },
    #[error("field {0:?}: value must be a finite number")]
    Value(String),
    #[error("timestamp: {0}")]
    Timestamp(InvalidReading),
    #[error("the timestamp is out of range for its precision")]
    Range,
}

/// Per body: the metric names and tag sets met so far, so each distinct one
/// is built and checked once.
struct Seen<'a> {
    arena: &'a Bump,
    metrics: HashMap<(&'a str, &'a str), Option<MetricName<'a>>>,
    /// `(sensor, tag section)` → its labels' place in `out.labels` when
    /// valid, else why not.
    tag_sets: HashMap<(&'a str, &'a str), Result<u32, String>>,
    /// Whether each of `out.labels` came with a line that was taken: only
    /// those reach the registry (a refused line contributes nothing).
    labels_taken: Vec<bool>,
    scratch: String,
    /// The sensor tag's value on the last line with a valid one, and its id.
    last_sensor: Option<(&'a str, SensorId<'a>)>,
    /// Series (a line's text up to its first space) whose measurement, sensor
    /// and labels were taken: a line of one of them parses only its fields.
    series: HashMap<&'a str, Series<'a>>,
    /// The number of each sensor and metric met: by name, not by series
    /// text, so differently written tag sets of one sensor share a number
    /// and their readings keep their order.
    groups: HashMap<(SensorId<'a>, MetricName<'a>), u32>,
    /// The series by number.
    table: Vec<(SensorId<'a>, MetricName<'a>)>,
}

/// What a taken series parses to.
#[derive(Clone)]
struct Series<'a> {
    measurement: Text<'a>,
    sensor: SensorId<'a>,
    /// The series number of its field `value` (the common case), if that
    /// metric is valid.
    value: Option<u32>,
    /// Its labels' place in `out.labels`, when it has labels.
    labels: Option<u32>,
}

impl<'a> Seen<'a> {
    /// The group of readings of `sensor` and `metric`.
    fn group(&mut self, sensor: &SensorId<'a>, metric: &MetricName<'a>) -> u32 {
        // Names borrowed from the body clone without allocating.
        let key = (sensor.clone(), metric.clone());
        let next = u32::try_from(self.table.len()).unwrap_or(u32::MAX);
        *self.groups.entry(key).or_insert_with(|| {
            self.table.push((sensor.clone(), metric.clone()));
            next
        })
    }

    /// The metric of field `field` of measurement `measurement` (both raw).
    fn metric(&mut self, measurement: &'a str, field: &'a str) -> Option<MetricName<'a>> {
        if let Some(m) = self.metrics.get(&(measurement, field)) {
            return m.clone();
        }
        let name: &'a str = if field == "value" {
            measurement
        } else {
            self.scratch.clear();
            self.scratch.push_str(measurement);
            self.scratch.push('_');
            self.scratch.push_str(field);
            self.arena.alloc_str(&self.scratch)
        };
        let metric = MetricName::parse(name).ok();
        self.metrics.insert((measurement, field), metric.clone());
        metric
    }
}

/// Decodes a line-protocol body received in `ctx`, with timestamps in
/// `precision`. Names built from two parts live in `arena`.
pub fn decode<'a>(
    body: &'a [u8],
    precision: Precision,
    ctx: &DecodeContext,
    sensor_tags: &[String],
    arena: &'a Bump,
) -> Result<Decoded<'a>, TooMany> {
    let line_count = memchr::memchr_iter(b'\n', body).count() + 1;
    let mut out = Decoded::default();
    let mut line = Line::default();
    let mut seen = Seen {
        arena,
        metrics: HashMap::new(),
        tag_sets: HashMap::new(),
        labels_taken: Vec::new(),
        scratch: String::new(),
        last_sensor: None,
        // A body written in time order carries many series: sized up front
        // rather than rehashed as it grows (bounded, as a body may repeat one).
        series: HashMap::with_capacity(line_count.min(MAX_PRESIZED_SERIES)),
        groups: HashMap::with_capacity(line_count.min(MAX_PRESIZED_SERIES)),
        table: Vec::with_capacity(line_count.min(MAX_PRESIZED_SERIES)),
    };
    // Checked once for the body; a line is checked alone only if it fails.
    let text = std::str::from_utf8(body).ok();
    // About one reading per line: Telegraf writes one field per line unless
    // a plugin gathers several.
    out.rows.reserve(line_count.min(ctx.max_readings));
    let mut lines = Lines::new(body);
    while let Some((number, bytes)) = lines.next() {
        let source = match text.and_then(|t| t.get(lines.start()..lines.start() + bytes.len())) {
            Some(text) => Source::Text(text),
            None => Source::Bytes(bytes),
        };
        let before = out.rows.len();
        let strings = out.strings;
        match decode_line(
            source,
            &mut line,
            precision,
            ctx,
            sensor_tags,
            &mut seen,
            &mut out,
        ) {
            Ok(labels) => {
                out.lines += 1;
                if out.rows.len() > before
                    && let Some(taken) = labels.and_then(|i| seen.labels_taken.get_mut(i as usize))
                {
                    *taken = true;
                }
                if out.rows.len() > ctx.max_readings {
                    return Err(TooMany {
                        max: ctx.max_readings,
                    });
                }
            }
            Err(refusal) => {
                out.rows.truncate(before);
                out.strings = strings;
                out.refused += 1;
                if out.errors.len() < MAX_DETAILS {
                    out.errors.push(LineError {
                        line: number,
                        reason: refusal.to_string(),
                    });
                }
            }
        }
    }
    out.series = seen.table;
    let mut taken = seen.labels_taken.into_iter();
    out.labels.retain(|_| taken.next().unwrap_or(false));
    Ok(out)
}

/// A line's bytes, or its text when the body was UTF-8 as a whole.
enum Source<'a> {
    Text(&'a str),
    Bytes(&'a [u8]),
}

fn decode_line<'a>(
    source: Source<'a>,
    line: &mut Line<'a>,
    precision: Precision,
    ctx: &DecodeContext,
    sensor_tags: &[String],
    seen: &mut Seen<'a>,
    out: &mut Decoded<'a>,
) -> Result<Option<u32>, Refusal> {
    // Long: one line in order: series, each field by its kind, the timestamp.
    let series = match source {
        Source::Text(text) => {
            let end = series_end(text.as_bytes());
            match end.and_then(|end| Some((end, seen.series.get(&text[..end])?))) {
                Some((end, series)) => {
                    // The common line, a known series' `value`: pushed
                    // without the general field loop.
                    if let (Some(group), Some((value, ts))) =
                        (&series.value, value_field(&text.as_bytes()[end..]))
                    {
                        out.rows.push(Row {
                            series: *group,
                            ts: seconds(ts, precision, ctx)?,
                            value,
                        });
                        return Ok(series.labels);
                    }
                    let series = series.clone();
                    parse_fields(text, end, line)?;
                    series
                }
                None => {
                    let at = parse_series(text, line)?;
                    let series = match identify(line, sensor_tags, seen, out) {
                        Ok(series) => series,
                        Err(e) => {
                            // A syntax error is named before any other.
                            parse_fields(text, at, line)?;
                            return Err(e);
                        }
                    };
                    // Its later lines find it by the text up to the first
                    // space, the series when it holds no escape.
                    if end == Some(at) {
                        seen.series.insert(&text[..at], series.clone());
                    }
                    // A new series' first line takes the shortcut too: in a
                    // body of a few lines per series, it is an eighth.
                    if let (Some(group), Some((value, ts))) =
                        (series.value, value_field(&text.as_bytes()[at..]))
                    {
                        out.rows.push(Row {
                            series: group,
                            ts: seconds(ts, precision, ctx)?,
                            value,
                        });
                        return Ok(series.labels);
                    }
                    parse_fields(text, at, line)?;
                    series
                }
            }
        }
        Source::Bytes(bytes) => {
            parse_line(bytes, line)?;
            identify(line, sensor_tags, seen, out)?
        }
    };
    let ts = seconds(line.timestamp, precision, ctx)?;
    let measurement = series.measurement.raw();
    for &(key, field) in &line.fields {
        let value = match field {
            FieldValue::Float(v) => v,
            FieldValue::Integer(v) => v as f64,
            FieldValue::Unsigned(v) => v as f64,
            FieldValue::Boolean(v) => f64::from(u8::from(v)),
            FieldValue::String(_) => {
                out.strings += 1;
                continue;
            }
        };
        let group = if key.raw() == "value" {
            series.value
        } else {
            seen.metric(measurement, key.raw())
                .map(|m| seen.group(&series.sensor, &m))
        };
        let group = group.ok_or_else(|| {
            let measurement = series.measurement.unescape(Kind::Measurement);
            let name = if key.raw() == "value" {
                measurement.into_owned()
            } else {
                format!("{measurement}_{}", key.unescape(Kind::Key))
            };
            Refusal::Metric {
                field: key.unescape(Kind::Key).into_owned(),
                metric: name,
                reason: InvalidReading::Metric,
            }
        })?;
        let value = Reading::check_value(value)
            .map_err(|_| Refusal::Value(key.unescape(Kind::Key).into_owned()))?;
        out.rows.push(Row {
            series: group,
            ts,
            value,
        });
    }
    Ok(series.labels)
}

/// A line's timestamp in `precision` as epoch seconds inside the window
/// (the time received if it has none).
fn seconds(ts: Option<i64>, precision: Precision, ctx: &DecodeContext) -> Result<i64, Refusal> {
    match ts {
        Some(ts) => {
            let ts = precision.to_seconds(ts).ok_or(Refusal::Range)?;
            ctx.window.check(ts, ctx.now).map_err(Refusal::Timestamp)
        }
        None => Ok(ctx.now),
    }
}

/// The sensor of a parsed line, its labels checked (and each distinct tag
/// set recorded once).
fn identify<'a>(
    line: &Line<'a>,
    sensor_tags: &[String],
    seen: &mut Seen<'a>,
    out: &mut Decoded<'a>,
) -> Result<Series<'a>, Refusal> {
    let Some(position) = sensor_tags
        .iter()
        .find_map(|name| line.tags.iter().position(|(k, _)| k.raw() == name))
    else {
        return Err(Refusal::NoSensor(sensor_tags.join(", ")));
    };
    let (key, value) = line.tags[position];
    // Lines of one sensor tend to come together: its id is checked once.
    let sensor = match &seen.last_sensor {
        Some((raw, id)) if *raw == value.raw() => id.clone(),
        _ => {
            let id =
                SensorId::parse(value.unescape(Kind::Key)).map_err(|reason| Refusal::Sensor {
                    tag: key.raw().to_owned(),
                    reason,
                })?;
            seen.last_sensor = Some((value.raw(), id.clone()));
            id
        }
    };
    let mut labels = None;
    if line.tags.len() > 1 {
        // A valid sensor id has no escapes: the raw value is the id.
        let set = (value.raw(), line.tag_section);
        let verdict = match seen.tag_sets.get(&set) {
            Some(v) => v.clone(),
            None => {
                let verdict = line_labels(line, position, &sensor).map(|set| {
                    out.labels.push(set);
                    seen.labels_taken.push(false);
                    u32::try_from(out.labels.len() - 1).unwrap_or(u32::MAX)
                });
                seen.tag_sets.insert(set, verdict.clone());
                verdict
            }
        };
        labels = Some(verdict.map_err(Refusal::Labels)?);
    }
    let measurement = line.measurement.unwrap_or_default();
    let value = seen
        .metric(measurement.raw(), "value")
        .map(|m| seen.group(&sensor, &m));
    Ok(Series {
        measurement,
        sensor,
        value,
        labels,
    })
}

/// The tags other than the sensor's, as its labels: Prometheus-style names,
/// bounded ([`SensorLabels::new`]).
fn line_labels<'a>(
    line: &Line<'a>,
    position: usize,
    sensor: &SensorId<'a>,
) -> Result<SensorLabels<'a>, String> {
    let pairs = line
        .tags
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != position)
        .map(|(_, (k, v))| (k.unescape(Kind::Key), v.unescape(Kind::Key)))
        .collect();
    SensorLabels::new(sensor.clone(), pairs).map_err(|e| match e {
        InvalidLabels::TooMany => format!("{e} (tags besides the sensor's)"),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::domain::TimeWindow;

    const NOW: i64 = 1_700_000_000;

    fn ctx(max_readings: usize) -> DecodeContext {
        DecodeContext {
            now: NOW,
            window: TimeWindow {
                max_age: Duration::from_secs(30 * 86400),
                max_future: Duration::from_secs(300),
            },
            max_readings,
        }
    }

    fn tags() -> Vec<String> {
        Settings::default().sensor_tags
    }

    fn run(body: &str, precision: Precision) -> Vec<(String, String, i64, f64)> {
        let arena = Bump::new();
        let d = decode(body.as_bytes(), precision, &ctx(100), &tags(), &arena).expect("in bounds");
        assert_eq!(d.errors, [], "{body}");
        d.readings()
            .iter()
            .map(|r| (r.sensor.to_string(), r.metric.to_string(), r.ts, r.value))
            .collect()
    }

    fn row(sensor: &str, metric: &str, ts: i64, value: f64) -> (String, String, i64, f64) {
        (sensor.into(), metric.into(), ts, value)
    }

    #[test]
    fn the_documented_mapping_holds() {
        assert_eq!(
            run(
                "temperature,sensor=x value=21.5 1700000000000000000",
                Precision::Nanoseconds
            ),
            [row("x", "temperature", NOW, 21.5)]
        );
        let body = "cpu,cpu=cpu0,host=h1 usage_idle=98.5,usage_user=2i,up=true,busy=F,note=\"hi\",n=7u 1699999999\n";
        assert_eq!(
            run(body, Precision::Seconds),
            [
                row("h1", "cpu_usage_idle", NOW - 1, 98.5),
                row("h1", "cpu_usage_user", NOW - 1, 2.0),
                row("h1", "cpu_up", NOW - 1, 1.0),
                row("h1", "cpu_busy", NOW - 1, 0.0),
                row("h1", "cpu_n", NOW - 1, 7.0),
            ]
        );
        let arena = Bump::new();
        let d = decode(
            body.as_bytes(),
            Precision::Seconds,
            &ctx(100),
            &tags(),
            &arena,
        )
        .expect("ok");
        assert_eq!(d.strings, 1);
        assert_eq!(d.labels, [labelled("h1", &[("cpu", "cpu0")])]);
        // The first sensor tag in the configured order wins; the others are labels.
        assert_eq!(
            run("m,host=h,device=d,sensor=s value=1", Precision::Seconds),
            [row("s", "m", NOW, 1.0)]
        );
        assert_eq!(
            run("m,host=h,device=d value=1", Precision::Seconds)[0].0,
            "d"
        );
    }

    #[test]
    fn every_precision_gives_whole_seconds() {
        for (precision, ts) in [
            (Precision::Nanoseconds, 1_699_999_999_999_999_999_i64),
            (Precision::Microseconds, 1_699_999_999_999_999),
            (Precision::Milliseconds, 1_699_999_999_999),
            (Precision::Seconds, 1_699_999_999),
        ] {
            assert_eq!(
                run(&format!("m,sensor=s value=1 {ts}"), precision)[0].2,
                NOW - 1,
                "{precision:?}"
            );
        }
        assert_eq!(
            run("m,sensor=s value=1 28333333", Precision::Minutes)[0].2,
            28_333_333 * 60
        );
        assert_eq!(
            run("m,sensor=s value=1 472222", Precision::Hours)[0].2,
            472_222 * 3600
        );
        assert_eq!(run("m,sensor=s value=1", Precision::Nanoseconds)[0].2, NOW);
        for (v1, want) in [
            ("n", Precision::Nanoseconds),
            ("u", Precision::Microseconds),
            ("µ", Precision::Microseconds),
            ("h", Precision::Hours),
        ] {
            assert_eq!(Precision::v1(v1), Some(want));
        }
        assert_eq!(Precision::v2("m"), None);
        assert_eq!(Precision::v2("us"), Some(Precision::Microseconds));
        assert_eq!(Precision::Hours.to_seconds(i64::MAX), None);
    }

    #[test]
    fn refused_lines_are_named_and_the_others_kept() {
        let body = "m,sensor=a value=1\nm value=2\nm,sensor=b v=abc\n\nm,sensor=c value=3 1\nm,sensor=b%x value=4\nm,sensor=d,bad-tag=1 value=5\nm,sensor=e value=6,x=1e999\nm,sensor=f value=7\nm.x,sensor=g v=1\n";
        let arena = Bump::new();
        let d = decode(
            body.as_bytes(),
            Precision::Seconds,
            &ctx(100),
            &tags(),
            &arena,
        )
        .expect("ok");
        let readings = d.readings();
        let sensors: Vec<_> = readings.iter().map(|r| r.sensor.as_str()).collect();
        assert_eq!(sensors, ["a", "f"]);
        let lines: Vec<_> = d.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, [2, 3, 5, 6, 7, 8, 10]);
        assert_eq!((d.refused, d.lines), (7, 2));
        let reasons: Vec<_> = d.errors.iter().map(|e| e.reason.as_str()).collect();
        assert!(
            reasons[0]
                .contains("no sensor tag: the line needs one of the tags sensor, device, host"),
            "{reasons:?}"
        );
        assert!(reasons[1].contains("invalid value \"abc\""), "{reasons:?}");
        assert!(reasons[2].contains("in the past"), "{reasons:?}");
        assert!(reasons[3].starts_with("tag \"sensor\""), "{reasons:?}");
        assert!(reasons[4].contains("bad-tag"), "{reasons:?}");
        assert!(reasons[5].contains("finite"), "{reasons:?}");
        assert!(reasons[6].contains("m.x_v"), "{reasons:?}");
        let message = d.partial_write_message();
        assert!(
            message.starts_with("partial write: 7 of 9 lines refused; line 2: "),
            "{message}"
        );
    }

    #[test]
    fn a_request_over_the_reading_limit_is_refused_whole() {
        let arena = Bump::new();
        let body = "m,sensor=a x=1,y=2\nm,sensor=a x=1,y=2\n";
        assert!(
            decode(
                body.as_bytes(),
                Precision::Seconds,
                &ctx(4),
                &tags(),
                &arena
            )
            .is_ok()
        );
        assert_eq!(
            decode(
                body.as_bytes(),
                Precision::Seconds,
                &ctx(3),
                &tags(),
                &arena
            )
            .err(),
            Some(TooMany { max: 3 })
        );
    }

    #[test]
    fn labels_are_validated_and_each_tag_set_reported_once() {
        let body = "m,sensor=a,site=Berlin\\ Mitte value=1\nn,sensor=a,site=Berlin\\ Mitte value=2\nm,sensor=a,site=x,site=y value=3\n";
        let arena = Bump::new();
        let d = decode(
            body.as_bytes(),
            Precision::Seconds,
            &ctx(100),
            &tags(),
            &arena,
        )
        .expect("ok");
        assert_eq!(d.len(), 2);
        assert_eq!(d.labels, [labelled("a", &[("site", "Berlin Mitte")])]);
        assert!(d.errors[0].reason.contains("repeated"));
        let many: String = (0..=crate::domain::MAX_LABELS)
            .map(|i| format!(",l{i}=v"))
            .collect();
        let body = format!("m,sensor=a{many} value=1");
        let d = decode(
            body.as_bytes(),
            Precision::Seconds,
            &ctx(100),
            &tags(),
            &arena,
        )
        .expect("ok");
        assert_eq!(d.refused, 1);
    }

    fn labelled(
        sensor: &'static str,
        pairs: &[(&'static str, &'static str)],
    ) -> SensorLabels<'static> {
        SensorLabels::new(
            SensorId::parse(sensor).expect("a sensor"),
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        )
        .expect("valid labels")
    }

    /// The body: a line refused (here for its timestamp) records
    /// none of its tags, whether its sensor has other lines or not; a line
    /// of only string fields (no reading) records none either.
    #[test]
    fn a_refused_line_or_one_without_readings_contributes_no_labels() {
        let body = "temp,sensor=truck-18,site=hacked value=1 1\ntemp,sensor=not-mine-42,owner=truck17 value=1 1\ntemp,sensor=s,site=ok value=2\ntemp,sensor=s,site=bad value=3 1\nnote,sensor=q,x=y text=\"a\"\n";
        let arena = Bump::new();
        let d = decode(
            body.as_bytes(),
            Precision::Seconds,
            &ctx(100),
            &tags(),
            &arena,
        )
        .expect("ok");
        assert_eq!(d.refused, 3);
        assert_eq!(d.len(), 1);
        assert_eq!(d.labels, [labelled("s", &[("site", "ok")])]);
        // Refused first, taken later (by the series cache's shortcut): the
        // taken line's tags count.
        let body = "temp,sensor=s,site=ok value=3 1\ntemp,sensor=s,site=ok value=2\n";
        let d = decode(
            body.as_bytes(),
            Precision::Seconds,
            &ctx(100),
            &tags(),
            &arena,
        )
        .expect("ok");
        assert_eq!(d.labels, [labelled("s", &[("site", "ok")])]);
    }

    // --- The parser against InfluxData's crate, on generated lines. ---

    /// Characters that need escaping, and a few that do not. No backslash:
    /// `a\\,b` reads differently in InfluxDB's Go parser (which this one
    /// follows: a backslash escapes the next byte) and in the crate.
    fn ident(first: &'static str) -> impl Strategy<Value = String> {
        (
            proptest::sample::select(first.chars().collect::<Vec<_>>()),
            proptest::collection::vec(
                proptest::sample::select("ab9_-.:,= \"é".chars().collect::<Vec<_>>()),
                0..6,
            ),
        )
            .prop_map(|(c, rest)| std::iter::once(c).chain(rest).collect())
    }

    fn escape(s: &str, chars: &[char]) -> String {
        let mut out = String::new();
        for c in s.chars() {
            if chars.contains(&c) {
                out.push('\\');
            }
            out.push(c);
        }
        out
    }

    #[derive(Debug, Clone)]
    enum Gen {
        Float(f64),
        Int(i64),
        UInt(u64),
        Bool(bool),
        Str(String),
    }

    fn value() -> impl Strategy<Value = Gen> {
        prop_oneof![
            (-1e12f64..1e12).prop_map(Gen::Float),
            any::<i64>().prop_map(Gen::Int),
            any::<u64>().prop_map(Gen::UInt),
            any::<bool>().prop_map(Gen::Bool),
            "[a-z \"\\\\,=\n]{0,8}".prop_map(Gen::Str),
        ]
    }

    type GenLine = (
        String,
        Vec<(String, String)>,
        Vec<(String, Gen)>,
        Option<i64>,
    );

    fn line() -> impl Strategy<Value = GenLine> {
        (
            ident("mx"),
            proptest::collection::vec((ident("tk"), ident("vw")), 0..4),
            proptest::collection::vec((ident("fg"), value()), 1..4),
            proptest::option::of(any::<i64>()),
        )
    }

    fn render((m, tags, fields, ts): &GenLine) -> String {
        let mut s = escape(m, &[',', ' ']);
        for (k, v) in tags {
            s.push(',');
            s.push_str(&escape(k, &[',', '=', ' ']));
            s.push('=');
            s.push_str(&escape(v, &[',', '=', ' ']));
        }
        s.push(' ');
        for (i, (k, v)) in fields.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&escape(k, &[',', '=', ' ']));
            s.push('=');
            match v {
                Gen::Float(x) => s.push_str(&format!("{x:?}")),
                Gen::Int(x) => s.push_str(&format!("{x}i")),
                Gen::UInt(x) => s.push_str(&format!("{x}u")),
                Gen::Bool(x) => s.push_str(&x.to_string()),
                Gen::Str(x) => s.push_str(&format!("\"{}\"", escape(x, &['"', '\\']))),
            }
        }
        if let Some(ts) = ts {
            s.push_str(&format!(" {ts}"));
        }
        s
    }

    /// Series a body repeats, valid or not, escaped or not.
    const SERIES: [&str; 9] = [
        "temperature,sensor=s1",
        "temperature,sensor=s2,site=roof",
        // The series above written otherwise: one sensor and metric.
        "temperature,site=roof,sensor=s2",
        "hum\\ idity,sensor=s1",
        "temperature,site=roof",
        "temperature,sensor=bad\\ id",
        "temperature,sensor=s3,bad-label=x",
        "temperature,sensor=s3,site=a\\,b",
        "9lives,sensor=s1",
    ];
    /// Field sets and timestamps, valid or not.
    /// The first ones are the shape decoded without the general field loop
    /// and shapes at its edges, which the general loop takes.
    const REST: [&str; 20] = [
        "value=21.5 1700000000",
        "value=-0.0 1700000000",
        "value=7",
        "value=9007199254740993 1700000000",
        "value=1234567890.1234567891 1700000000",
        "value=0.0000000000000000000001 1700000000",
        "value=12. 1700000000",
        "value=.5 1700000000",
        "value=5  1700000000",
        "value=5 1700000000 ",
        "value=5 +1700000000",
        "value=5 -1700000000",
        "value=5 99999999999999999999",
        "value=3i,max=4u",
        "value=1,note=\"a b\" 1699999990",
        "value=abc 1700000000",
        "value=1 12x",
        "a\\ b=2 1700000001",
        "value=-0.25,  1700000000",
        "value=1e3 1700000002",
    ];

    /// Whether `got` is `input` reordered so that the items of each group
    /// are together and in their order.
    fn is_stable_grouping<T: PartialEq, G: PartialEq>(
        got: &[T],
        input: &[T],
        group: impl Fn(&T) -> G,
    ) -> bool {
        let of = |items: &[T], g: &G| -> Vec<usize> {
            (0..items.len())
                .filter(|&i| group(&items[i]) == *g)
                .collect()
        };
        got.len() == input.len()
            && input.iter().all(|x| {
                let g = group(x);
                let (mine, theirs) = (of(got, &g), of(input, &g));
                mine.len() == theirs.len()
                    && mine.windows(2).all(|w| w[1] == w[0] + 1)
                    && mine.iter().zip(&theirs).all(|(&a, &b)| got[a] == input[b])
            })
    }

    proptest! {
        #[test]
        fn a_body_decodes_as_its_lines_do_one_by_one(
            picks in proptest::collection::vec((0..SERIES.len(), 0..REST.len()), 1..40),
        ) {
            let lines: Vec<String> = picks.iter().map(|&(s, r)| format!("{} {}", SERIES[s], REST[r])).collect();
            let body = lines.join("\n");
            let arena = Bump::new();
            let whole = decode(body.as_bytes(), Precision::Seconds, &ctx(1000), &tags(), &arena).expect("in bounds");
            let mut readings = Vec::new();
            let mut reasons = Vec::new();
            for (i, line) in lines.iter().enumerate() {
                let alone = decode(line.as_bytes(), Precision::Seconds, &ctx(1000), &tags(), &arena).expect("in bounds");
                readings.extend(alone.readings().iter().map(|r| (r.sensor.to_string(), r.metric.to_string(), r.ts, r.value.to_bits())));
                reasons.extend(alone.errors.into_iter().map(|e| (i + 1, e.reason)));
            }
            let got: Vec<_> = whole.readings().iter().map(|r| (r.sensor.to_string(), r.metric.to_string(), r.ts, r.value.to_bits())).collect();
            prop_assert_eq!(&got, &readings);
            let got: Vec<_> = whole.errors.iter().map(|e| (e.line, e.reason.clone())).collect();
            prop_assert_eq!(got, reasons);
            // Grouped: each sensor and metric's readings together, in order.
            let mut grouped = whole;
            let got: Vec<_> = grouped.take_grouped().iter().map(|r| (r.sensor.to_string(), r.metric.to_string(), r.ts, r.value.to_bits())).collect();
            prop_assert!(is_stable_grouping(&got, &readings, |r| (r.0.clone(), r.1.clone())), "{:?}", got);
        }

        /// Any interleaving of series, with refused lines among them,
        /// comes out grouped and in order.
        #[test]
        fn grouping_keeps_each_series_order_and_puts_it_together(
            lines in proptest::collection::vec((0..4usize, 0..3usize, proptest::bool::weighted(0.1)), 0..60),
        ) {
            let body: String = lines
                .iter()
                .enumerate()
                .map(|(i, &(s, m, bad))| {
                    let value = if bad { "\"text\"i".to_owned() } else { i.to_string() };
                    format!("m{m},sensor=s{s} value={value},other={i} {}\n", 1_700_000_000 + i)
                })
                .collect();
            let arena = Bump::new();
            let mut d = decode(body.as_bytes(), Precision::Seconds, &ctx(1000), &tags(), &arena).expect("in bounds");
            let key = |r: &Reading<'_>| (r.sensor.to_string(), r.metric.to_string(), r.ts, r.value.to_bits());
            let input: Vec<_> = d.readings().iter().map(key).collect();
            prop_assert_eq!(input.len(), 2 * lines.iter().filter(|l| !l.2).count());
            let got: Vec<_> = d.take_grouped().iter().map(key).collect();
            prop_assert!(is_stable_grouping(&got, &input, |r| (r.0.clone(), r.1.clone())), "{:?}", got);
            prop_assert!(d.is_empty());
        }

        #[test]
        fn the_parser_reads_what_influxdatas_parser_reads(lines in proptest::collection::vec(line(), 1..5)) {
            use influxdb_line_protocol as oracle;
            let body: String = lines.iter().map(|l| render(l) + "\n").collect();
            let theirs: Vec<_> = oracle::parse_lines(&body).collect::<Result<_, _>>()
                .map_err(|e| TestCaseError::reject(format!("oracle refused: {e}")))?;
            let mut line = Line::default();
            let mut n = 0;
            for ((_, bytes), expected) in Lines::new(body.as_bytes()).zip(&theirs) {
                n += 1;
                parse_line(bytes, &mut line).map_err(|e| TestCaseError::fail(format!("{e}: {body:?}")))?;
                let measurement = line.measurement.map(|m| m.unescape(Kind::Measurement).into_owned());
                prop_assert_eq!(measurement.as_deref(), Some(expected.series.measurement.as_str()));
                let tags: Vec<_> = line.tags.iter().map(|(k, v)| (k.unescape(Kind::Key).into_owned(), v.unescape(Kind::Key).into_owned())).collect();
                let want: Vec<_> = expected.series.tag_set.iter().flatten().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                prop_assert_eq!(tags, want);
                prop_assert_eq!(line.fields.len(), expected.field_set.len());
                for ((k, v), (ek, ev)) in line.fields.iter().zip(&expected.field_set) {
                    let key = k.unescape(Kind::Key).into_owned();
                    prop_assert_eq!(key.as_str(), ek.as_str());
                    let same = match (v, ev) {
                        (FieldValue::Float(a), oracle::FieldValue::F64(b)) => a == b,
                        (FieldValue::Integer(a), oracle::FieldValue::I64(b)) => a == b,
                        (FieldValue::Unsigned(a), oracle::FieldValue::U64(b)) => a == b,
                        (FieldValue::Boolean(a), oracle::FieldValue::Boolean(b)) => a == b,
                        (FieldValue::String(a), oracle::FieldValue::String(b)) => a.unescape(Kind::String) == b.as_str(),
                        _ => false,
                    };
                    prop_assert!(same, "{:?} vs {:?} in {:?}", v, ev, body);
                }
                prop_assert_eq!(line.timestamp, expected.timestamp);
            }
            prop_assert_eq!(n, theirs.len());
        }
    }
}

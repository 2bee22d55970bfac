//! One line of an import file at a time: turned into what a batch sends,
//! or refused with the reason.
//!
//! Lines are sent as they are: the service decodes them anyway, and a copy
//! is all the client does per line. Only what the service cannot tell is
//! checked here (a line-protocol line's timestamp; that an NDJSON line is
//! an object), and a line's readings are counted. Once the service refuses
//! a batch, [`Checker`] asks the service's own decoder which lines and why.
//! - NDJSON goes to `POST /api/v1/readings` as `application/x-ndjson`.
//! - Line protocol goes to `/api/v2/write` in the file's precision.
//! - CSV rows go as `text/csv` after a header naming the fields where the
//!   file has them (`--column` and `--ignore` settled by position), with
//!   `ts_unit`. A row the `csv` crate read (the file's quoting needed it)
//!   is written again as one CSV line.
//!
//! Every reading must carry its timestamp: one stamped on receipt would be
//! a new reading at each import, and importing twice must change nothing.

use bumpalo::Bump;

use crate::ingest::decode::csv::{self as csv_body, CsvColumns, TsUnit, trim};
use crate::ingest::decode::{DecodeContext, decode_timestamped};
use crate::ingest::line_protocol::parse::{FieldValue, Line, parse_line};
use crate::ingest::line_protocol::{Precision, decode as decode_line_protocol};

/// What an import file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Comma-separated, with a header row (see `--column`).
    Csv,
    /// One JSON reading per line, as `POST /api/v1/readings` and the export take them.
    Ndjson,
    /// InfluxDB line protocol.
    #[value(name = "lp")]
    LineProtocol,
}

impl Format {
    /// From the file name: `.csv`, `.ndjson`/`.jsonl`/`.json`, `.lp`/`.txt`
    /// (with `.gz` after it or not).
    pub fn of_path(path: &std::path::Path) -> Option<Self> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let name = name.strip_suffix(".gz").unwrap_or(&name);
        let ext = name.rsplit_once('.')?.1;
        Some(match ext {
            "csv" => Format::Csv,
            "ndjson" | "jsonl" | "json" => Format::Ndjson,
            "lp" | "txt" | "line" => Format::LineProtocol,
            _ => return None,
        })
    }
}

thread_local! {
    /// A line's parsed tags and fields, kept from line to line: parsing each
    /// into new vectors allocated twice a line.
    static SCRATCH: std::cell::RefCell<Line<'static>> = std::cell::RefCell::new(Line::default());
}

/// An empty vector of another lifetime's elements, in `v`'s allocation
/// (collecting in place keeps it: the layouts are the same).
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// Turns lines into what a batch sends.
pub struct Converter {
    format: Format,
}

impl Converter {
    pub fn new(format: Format) -> Self {
        Self { format }
    }

    /// Appends line `text` to `out` as the batch sends it, answering how
    /// many readings it holds; or why it is refused (`out` unchanged).
    /// CSV: the row the `csv` crate read of a line that needs quoting rules.
    pub fn line(
        &self,
        text: &str,
        record: Option<&csv::ByteRecord>,
        out: &mut Vec<u8>,
    ) -> Result<usize, String> {
        match self.format {
            Format::Csv => {
                // Sent as one CSV line, which the service reads back as the
                // same row: the service checks rows, as `Checker` does here
                // once it has refused a batch.
                let Some(record) = record else {
                    return Err("no row".to_owned());
                };
                csv_body::write_row(record, out);
                Ok(1)
            }
            Format::Ndjson => {
                // Sent as it is, in the service's NDJSON body, whose decoder
                // checks it; `Checker` asks the same decoder here once the
                // service has refused a batch, to find which lines and why.
                let line = trim(text);
                if !(line.starts_with('{') && line.ends_with('}')) {
                    return Err("a line must hold one reading object".to_owned());
                }
                out.extend_from_slice(line.as_bytes());
                Ok(1)
            }
            Format::LineProtocol => {
                // Sent as it is, like NDJSON: the service decodes it, and
                // `Checker` asks the same decoder here once the service has
                // refused a batch. Only what the service cannot tell is
                // checked: that the line carries its timestamp. Its readings
                // (the fields that are not strings) are counted for the batch.
                let text = text.trim_end();
                if let Some(readings) = plain_line_readings(text.as_bytes()) {
                    out.extend_from_slice(text.as_bytes());
                    return Ok(readings);
                }
                let readings = SCRATCH.with_borrow_mut(|scratch| {
                    let mut line = Line {
                        tags: recycle(std::mem::take(&mut scratch.tags)),
                        fields: recycle(std::mem::take(&mut scratch.fields)),
                        ..Line::default()
                    };
                    let parsed = parse_line(text.as_bytes(), &mut line);
                    let readings = line
                        .fields
                        .iter()
                        .filter(|(_, v)| !matches!(v, FieldValue::String(_)))
                        .count();
                    let stamped = line.timestamp.is_some();
                    scratch.tags = recycle(line.tags);
                    scratch.fields = recycle(line.fields);
                    parsed.map(|()| (readings, stamped))
                });
                let (readings, stamped) = readings.map_err(|e| e.to_string())?;
                if !stamped {
                    return Err(NO_TIMESTAMP.to_owned());
                }
                if readings == 0 {
                    return Err(NO_NUMERIC_FIELD.to_owned());
                }
                out.extend_from_slice(text.as_bytes());
                Ok(readings)
            }
        }
    }
}

const NO_TIMESTAMP: &str = "the timestamp is required in an import";
const NO_NUMERIC_FIELD: &str = "the line holds no numeric field";

/// The service's own decoder, asked why it refused lines that were sent as
/// they are (NDJSON, line protocol) once it has refused their batch, so the
/// bad lines are found without round trips. The clock is read at each
/// check, as the service reads it at each request: a long import's lines
/// are judged against the window the service applied, not the one of the
/// import's start.
#[derive(Debug, Clone)]
pub struct Checker {
    format: Format,
    ctx: DecodeContext,
    precision: Precision,
    sensor_tags: Vec<String>,
    /// CSV: the columns of the header the batches send, and the unit of
    /// their timestamps.
    csv: Option<(CsvColumns, TsUnit)>,
}

impl Checker {
    pub fn new(
        format: Format,
        ctx: DecodeContext,
        precision: Precision,
        sensor_tags: Vec<String>,
        csv: Option<(CsvColumns, TsUnit)>,
    ) -> Self {
        Self {
            format,
            ctx,
            precision,
            sensor_tags,
            csv,
        }
    }

    /// Why the service refuses `line`, if it does.
    pub fn check(&self, line: &[u8]) -> Result<(), String> {
        let ctx = DecodeContext {
            now: jiff::Timestamp::now().as_second(),
            ..self.ctx
        };
        self.check_at(line, &ctx)
    }

    fn check_at(&self, line: &[u8], ctx: &DecodeContext) -> Result<(), String> {
        if let Some((columns, unit)) = &self.csv {
            return csv_body::check_row(line, columns, *unit, ctx);
        }
        let line = &String::from_utf8_lossy(line);
        match self.format {
            Format::Ndjson => decode_timestamped(line, ctx).map(|_| ()),
            Format::LineProtocol => {
                // Its timestamp was checked when it was taken into a batch.
                let arena = Bump::new();
                let decoded = decode_line_protocol(
                    line.as_bytes(),
                    self.precision,
                    ctx,
                    &self.sensor_tags,
                    &arena,
                )
                .map_err(|e| e.to_string())?;
                if let Some(e) = decoded.errors.first() {
                    return Err(e.reason.clone());
                }
                if decoded.is_empty() {
                    return Err(NO_NUMERIC_FIELD.to_owned());
                }
                Ok(())
            }
            Format::Csv => Err("no header row".to_owned()),
        }
    }
}

/// The readings of a line-protocol line (trimmed at its end) that has a
/// timestamp and holds neither an escape nor a quote, counted without
/// parsing it: such a line is `<series> <fields> <timestamp>`, split at
/// spaces, and each of its fields, split at commas, is numeric or boolean.
/// `None` sends the line to the whole parse, which finds what is wrong or
/// counts what this does not read (escapes, strings). A line that is
/// wrong in another way is sent, and the service's refusal of its batch
/// finds it, as it does for every mistake that only the service sees.
/// Parsing each line was 40% of a line-protocol import's own CPU.
fn plain_line_readings(line: &[u8]) -> Option<usize> {
    if memchr::memchr2(b'\\', b'"', line).is_some() {
        return None;
    }
    let series_end = memchr::memchr(b' ', line)?;
    let rest = &line[series_end..];
    let start = rest.iter().position(|&c| c != b' ')?;
    let rest = &rest[start..];
    // The line's end is trimmed: a space after the fields comes before
    // the timestamp.
    debug_assert_eq!(line.trim_ascii_end().len(), line.len());
    let fields = &rest[..memchr::memchr(b' ', rest)?];
    let readings = memchr::memchr_iter(b',', fields).count() + 1;
    // Each field has its `=`: a key alone is left to the parse to explain.
    (memchr::memchr_iter(b'=', fields).count() == readings).then_some(readings)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ingest::decode::{DecodeError, decode_ndjson};
    use std::time::Duration;

    #[test]
    fn a_recycled_vector_keeps_its_allocation() {
        let mut v: Vec<(&str, f64)> = Vec::with_capacity(64);
        v.push(("a", 1.0));
        let w: Vec<(&'static str, f64)> = recycle(v);
        assert!(w.is_empty());
        assert!(w.capacity() >= 64, "capacity {}", w.capacity());
    }

    pub(in crate::transfer::import) fn ctx() -> DecodeContext {
        DecodeContext {
            now: 1_764_000_000,
            window: crate::domain::TimeWindow {
                max_age: Duration::from_secs(86400),
                max_future: Duration::from_secs(300),
            },
            max_readings: 10,
        }
    }

    pub(in crate::transfer::import) fn converter(format: Format) -> Converter {
        Converter::new(format)
    }

    fn checker(format: Format) -> Checker {
        let tags = crate::ingest::line_protocol::Settings::default().sensor_tags;
        Checker::new(format, ctx(), Precision::Nanoseconds, tags, None)
    }

    #[test]
    fn ndjson_lines_are_sent_as_they_are_and_checked_by_the_services_decoder() {
        let c = converter(Format::Ndjson);
        let k = checker(Format::Ndjson);
        let mut out = Vec::new();
        let good = r#"{"sensor":"s1","metric":"temp","ts":"2025-11-24T16:00:00Z","value":1}"#;
        assert_eq!(c.line(&format!(" {good}\r"), None, &mut out), Ok(1));
        assert_eq!(out, good.as_bytes());
        assert_eq!(k.check_at(good.as_bytes(), &ctx()), Ok(()));
        // What the service refuses, the checker says why; what is no object at
        // all is refused before it is sent.
        for (bad, why) in [
            (r#"{"sensor":"s1","value":1}"#, "ts is required"),
            (r#"{"sensor":"s1","ts":null,"value":1}"#, "ts"),
            (
                r#"{"sensor":"s1","ts":"2025-11-24T16:00:00Z","value":"x"}"#,
                "expected f64",
            ),
            (
                r#"{"sensor":"s1","ts":"2025-11-24T16:00:00Z","value":1,"extra":2}"#,
                "extra",
            ),
        ] {
            let reason = k.check_at(bad.as_bytes(), &ctx()).expect_err(bad);
            assert!(reason.contains(why), "{bad}: {reason}");
            let body = format!("{good}\n{bad}\n");
            match decode_ndjson(body.as_bytes(), &ctx()) {
                Err(DecodeError::Invalid { details, .. }) => {
                    assert_eq!(details.len(), 1);
                    assert_eq!((details[0].index, &details[0].reason), (1, &reason));
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        // Blank lines are not readings; past the limit, nothing is taken.
        let lines = |n: usize| format!("{good}\n\n").repeat(n);
        assert_eq!(
            decode_ndjson(lines(10).as_bytes(), &ctx()).map(|r| r.len()),
            Ok(10)
        );
        assert_eq!(
            decode_ndjson(lines(11).as_bytes(), &ctx()).map(|r| r.len()),
            Err(DecodeError::TooMany { count: 11, max: 10 })
        );
        for bad in [
            r#"[{"sensor":"s1","ts":"2025-11-24T16:00:00Z","value":1}]"#,
            "not json",
        ] {
            let before = out.len();
            assert!(c.line(bad, None, &mut out).is_err(), "{bad}");
            assert_eq!(out.len(), before);
        }
    }

    /// Line-protocol lines without escapes or quotes: well formed or not,
    /// with and without a timestamp, spaces doubled, ends trimmed or not.
    fn plain_lines() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let value = prop_oneof![
            Just("1.5"),
            Just("-3"),
            Just("2i"),
            Just("7u"),
            Just("t"),
            Just("false"),
            Just("1e3"),
            Just(""),
            Just("x"),
            Just("1,"),
        ];
        let field = ("[a-z]{0,3}", prop::bool::weighted(0.9), value)
            .prop_map(|(k, eq, v)| format!("{k}{}{v}", if eq { "=" } else { "" }));
        let well_formed = (
            "[a-z]{1,4}",
            prop::collection::vec("[a-z]{1,3}=[a-z0-9-]{1,4}", 0..3),
            " {1,2}",
            prop::collection::vec(field, 0..4),
            prop::option::of(("  ?", "-?[0-9]{1,12}")),
            " {0,2}",
        )
            .prop_map(|(m, tags, gap, fields, ts, tail)| {
                let mut line = m;
                for t in tags {
                    line.push(',');
                    line.push_str(&t);
                }
                line.push_str(&gap);
                line.push_str(&fields.join(","));
                if let Some((gap, ts)) = ts {
                    line.push_str(&format!("{gap} {ts}"));
                }
                line + &tail
            });
        prop_oneof![4 => well_formed, 1 => "[a-z0-9=, .i-]{0,30}"]
    }

    proptest::proptest! {
        /// The count without a parse answers only what the parse answers:
        /// a stamped line's readings where the parse takes the line, and
        /// it counts every such line (or the shortcut would never run).
        #[test]
        fn a_plain_line_is_counted_as_the_parse_counts_it(text in plain_lines()) {
            let text = text.trim_end();
            let mut line = Line::default();
            let parsed = parse_line(text.as_bytes(), &mut line)
                .ok()
                .map(|()| (line.fields.len(), line.timestamp.is_some()));
            let counted = plain_line_readings(text.as_bytes());
            match parsed {
                Some((fields, true)) if fields > 0 => {
                    proptest::prop_assert_eq!(counted, Some(fields), "{:?}", text);
                }
                // Taken by the parse but without a timestamp or a field: the
                // count leaves it to the parse, which refuses it here.
                Some(_) => proptest::prop_assert_eq!(counted, None, "{:?}", text),
                // Refused by the parse: sent or not, the service refuses it.
                None => {}
            }
        }

    }

    #[test]
    fn line_protocol_lines_are_sent_as_they_are_and_checked_by_the_services_decoder() {
        let c = converter(Format::LineProtocol);
        let k = checker(Format::LineProtocol);
        let mut out = Vec::new();
        let good = "weather,sensor=s1 temp=1.5,note=\"x\",on=true,n=3i 1764000000000000000";
        // Its readings are its fields that are not strings, as the service counts them.
        assert_eq!(c.line(good, None, &mut out), Ok(3));
        assert_eq!(out, good.as_bytes());
        assert_eq!(k.check_at(good.as_bytes(), &ctx()), Ok(()));
        let arena = Bump::new();
        let decoded = decode_line_protocol(
            good.as_bytes(),
            Precision::Nanoseconds,
            &ctx(),
            &k.sensor_tags,
            &arena,
        )
        .expect("a line");
        assert_eq!(decoded.len(), 3);
        // Refused before sending: what the service would take but an import
        // may not (no timestamp), and what is not line protocol at all.
        for bad in [
            "weather,sensor=s1 temp=1.5",
            "weather,sensor=s1 1764000000000000000",
            "weather,sensor=s1 note=\"x\" 1764000000000000000",
        ] {
            let before = out.len();
            assert!(c.line(bad, None, &mut out).is_err(), "{bad}");
            assert_eq!(out.len(), before);
        }
        // Sent, and refused by the service: the checker gives the service's reason.
        for bad in [
            "weather,sensor=s1 temp=1.5 1000000000000000000",
            "weather,site=s1 temp=1.5 1764000000000000000",
            "weather,sensor=s1 temp=1.5,n=99999999999999999999u 1764000000000000000",
        ] {
            let sent = c.line(bad, None, &mut out);
            let reason = k.check_at(bad.as_bytes(), &ctx()).expect_err(bad);
            let body = format!("{good}\n{bad}\n");
            let decoded = decode_line_protocol(
                body.as_bytes(),
                Precision::Nanoseconds,
                &ctx(),
                &k.sensor_tags,
                &arena,
            )
            .expect("lines");
            assert_eq!(decoded.errors.len(), 1, "{bad}");
            match sent {
                Ok(_) => assert_eq!(
                    (decoded.errors[0].line, &decoded.errors[0].reason),
                    (2, &reason)
                ),
                // A syntax error is found before sending, with the same reason.
                Err(e) => assert_eq!(e, reason),
            }
        }
        // The checker reads the clock when it checks, as the service does
        // when it decodes: a line of now is refused only by the import's
        // start clock of long ago.
        let now = jiff::Timestamp::now().as_second();
        let fresh = format!("weather,sensor=s1 temp=1.5 {}", now * 1_000_000_000);
        assert_eq!(k.check(fresh.as_bytes()), Ok(()));
        assert!(k.check_at(fresh.as_bytes(), &ctx()).is_err());
    }

    #[test]
    fn formats_follow_the_file_name() {
        let f = |p: &str| Format::of_path(std::path::Path::new(p));
        assert_eq!(f("a.csv.gz"), Some(Format::Csv));
        assert_eq!(f("dir/a.NDJSON"), Some(Format::Ndjson));
        assert_eq!(f("a.lp"), Some(Format::LineProtocol));
        assert_eq!(f("a.parquet"), None);
        assert_eq!(f("noext"), None);
    }
}

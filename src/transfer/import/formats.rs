//! One line of an import file at a time: turned into what a batch sends,
//! or refused with the reason.
//!
//! - NDJSON and line-protocol lines are sent as they are: the service
//!   decodes them anyway, and a copy is all the client does per line. Only
//!   what the service cannot tell is checked here (a line-protocol line's
//!   timestamp; that an NDJSON line is an object), and a line's readings
//!   are counted. Once the service refuses a batch, [`Checker`] asks the
//!   service's own decoder which lines and why.
//! - A CSV row is checked with the service's rules and becomes the line
//!   `<metric>,<sensor tag>=<sensor> value=<value> <epoch seconds>`, the
//!   first of `line_protocol.sensor_tags` naming the sensor, which the
//!   service reads back as the same reading: sensor ids and metric names
//!   hold nothing line protocol escapes, and a line with no other tag
//!   leaves the sensor's labels as they are.
//!
//! Every reading must carry its timestamp: one stamped on receipt would be
//! a new reading at each import, and importing twice must change nothing.

use bumpalo::Bump;

use crate::domain::{MetricName, Reading, SensorId};
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

/// How integer timestamps in a CSV file count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TsUnit {
    /// RFC 3339 text, or integer epoch milliseconds (as the JSON API).
    Auto,
    #[value(name = "s")]
    Seconds,
    #[value(name = "ms")]
    Milliseconds,
    #[value(name = "us")]
    Microseconds,
    #[value(name = "ns")]
    Nanoseconds,
}

/// The fields of a reading a CSV column can hold.
const FIELDS: [&str; 4] = ["sensor", "metric", "ts", "value"];

/// Where each field of a reading is in a CSV row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvColumns {
    sensor: usize,
    /// Absent: the default metric.
    metric: Option<usize>,
    ts: usize,
    value: usize,
    width: usize,
}

impl CsvColumns {
    /// From the header row: each field in the column of its own name, or
    /// of the one `mapping` names (`field=column`); a column that is none of
    /// them and not in `ignore` stops the import before anything is stored.
    pub fn from_header(
        header: &csv::StringRecord,
        mapping: &[(String, String)],
        ignore: &[String],
    ) -> Result<Self, String> {
        for (field, _) in mapping {
            if !FIELDS.contains(&field.as_str()) {
                return Err(format!(
                    "--column {field}=…: {field:?} is not one of sensor, metric, ts, value"
                ));
            }
        }
        fn column_of<'a>(mapping: &'a [(String, String)], field: &'a str) -> &'a str {
            mapping
                .iter()
                .find(|(f, _)| f == field)
                .map_or(field, |(_, c)| c.as_str())
        }
        let find = |field: &str| {
            header
                .iter()
                .position(|h| h.trim() == column_of(mapping, field))
        };
        let required = |field: &str| {
            find(field).ok_or_else(|| {
                format!(
                    "the header has no column {:?} for the {field} of a reading; name it with --column {field}=<column>",
                    column_of(mapping, field)
                )
            })
        };
        let columns = CsvColumns {
            sensor: required("sensor")?,
            metric: find("metric"),
            ts: required("ts")?,
            value: required("value")?,
            width: header.len(),
        };
        let used = [
            Some(columns.sensor),
            columns.metric,
            Some(columns.ts),
            Some(columns.value),
        ];
        for (i, h) in header.iter().enumerate() {
            if !used.contains(&Some(i)) && !ignore.iter().any(|x| x == h.trim()) {
                return Err(format!(
                    "column {:?} is not sensor, metric, ts or value; map it (--column value={0}) or leave it out (--ignore {0})",
                    h.trim()
                ));
            }
        }
        Ok(columns)
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

/// A CSV row's fields, as byte ranges of its text.
trait Row {
    fn width(&self) -> usize;
    fn whole(&self) -> &[u8];
    /// `whole`, if known to be UTF-8.
    fn utf8(&self) -> Option<&str> {
        None
    }
    fn range(&self, i: usize) -> Option<std::ops::Range<usize>>;
}

impl Row for csv::ByteRecord {
    fn width(&self) -> usize {
        self.len()
    }
    fn whole(&self) -> &[u8] {
        self.as_slice()
    }
    fn range(&self, i: usize) -> Option<std::ops::Range<usize>> {
        csv::ByteRecord::range(self, i)
    }
}

/// A line without quotes: its fields end at its commas and at its end.
struct PlainRow<'a> {
    text: &'a [u8],
    utf8: Option<&'a str>,
    commas: &'a [usize],
}

impl Row for PlainRow<'_> {
    fn width(&self) -> usize {
        self.commas.len() + 1
    }
    fn whole(&self) -> &[u8] {
        self.text
    }
    fn utf8(&self) -> Option<&str> {
        self.utf8
    }
    fn range(&self, i: usize) -> Option<std::ops::Range<usize>> {
        let start = match i {
            0 => 0,
            _ => self.commas.get(i - 1)? + 1,
        };
        let end = self.commas.get(i).copied().unwrap_or(self.text.len());
        (i <= self.commas.len()).then_some(start..end)
    }
}

/// Turns lines into what a batch sends.
pub struct Converter {
    format: Format,
    ctx: DecodeContext,
    ts_unit: TsUnit,
    sensor_tags: Vec<String>,
    columns: Option<CsvColumns>,
}

impl Converter {
    pub fn new(
        format: Format,
        ctx: DecodeContext,
        ts_unit: TsUnit,
        sensor_tags: Vec<String>,
    ) -> Self {
        Self {
            format,
            ctx,
            ts_unit,
            sensor_tags,
            columns: None,
        }
    }

    pub fn set_columns(&mut self, columns: CsvColumns) {
        self.columns = Some(columns);
    }

    /// Appends line `text` to `out` as the batch sends it, answering how
    /// many readings it holds; or why it is refused (`out` unchanged).
    pub fn line(
        &self,
        text: &str,
        record: Option<&csv::ByteRecord>,
        out: &mut Vec<u8>,
    ) -> Result<usize, String> {
        match self.format {
            Format::Csv => {
                let (Some(columns), Some(record)) = (&self.columns, record) else {
                    return Err("no header row".to_owned());
                };
                self.csv(columns, record, out).map(|()| 1)
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

    /// A CSV line without quotes (`text`, its line ending cut off), whose
    /// fields end at `commas` and at its end: as [`Self::line`] takes a row
    /// of the `csv` crate, which reads such a line into the same fields.
    /// `utf8`: the same line, known to be UTF-8.
    pub fn plain_csv_row(
        &self,
        text: &[u8],
        utf8: Option<&str>,
        commas: &[usize],
        out: &mut Vec<u8>,
    ) -> Result<usize, String> {
        let Some(columns) = &self.columns else {
            return Err("no header row".to_owned());
        };
        let row = PlainRow { text, utf8, commas };
        self.csv(columns, &row, out).map(|()| 1)
    }

    fn csv(&self, c: &CsvColumns, record: &impl Row, out: &mut Vec<u8>) -> Result<(), String> {
        if record.width() != c.width {
            return Err(format!(
                "{} fields where the header has {}",
                record.width(),
                c.width
            ));
        }
        // One UTF-8 check for the whole row, not one per field; a field is
        // then a slice of it (`get` refuses a slice that splits a character,
        // which two bad fields could make look valid together).
        let whole = record.whole();
        let row = record.utf8().or_else(|| std::str::from_utf8(whole).ok());
        let field = |i: usize, name: &str| {
            let range = record.range(i);
            row.zip(range.clone())
                .and_then(|(row, range)| row.get(range))
                .or_else(|| {
                    std::str::from_utf8(range.and_then(|r| whole.get(r)).unwrap_or_default()).ok()
                })
                .map(trim)
                .ok_or_else(|| format!("{name} is not UTF-8"))
        };
        let sensor = SensorId::parse(field(c.sensor, "sensor")?).map_err(|e| e.to_string())?;
        let metric = match c.metric.map(|i| field(i, "metric")).transpose()? {
            Some(m) if !m.is_empty() => MetricName::parse(m).map_err(|e| e.to_string())?,
            _ => MetricName::default_metric(),
        };
        let value_text = field(c.value, "value")?;
        // A plain decimal is finite and line protocol reads its text with
        // the same parse: not parsed here, nor printed again.
        let value = if is_plain_decimal(value_text) {
            None
        } else {
            let v = value_text
                .parse::<f64>()
                .map_err(|_| format!("value {value_text:?} is not a number"))?;
            Some(Reading::check_value(v).map_err(|e| e.to_string())?)
        };
        // Whole seconds, as the service keeps them.
        let ts = self.ts_ms(field(c.ts, "ts")?)?.div_euclid(1000);
        self.ctx
            .window
            .check(ts, self.ctx.now)
            .map_err(|e| e.to_string())?;
        if let Some(value) = value {
            self.write_line(out, &sensor, &metric, value, ts);
        } else {
            self.write_line_with(
                out,
                &sensor,
                &metric,
                |out| out.extend_from_slice(value_text.as_bytes()),
                ts,
            );
        }
        Ok(())
    }

    /// A checked reading as a line-protocol line (precision `s`).
    fn write_line(
        &self,
        out: &mut Vec<u8>,
        sensor: &SensorId<'_>,
        metric: &MetricName<'_>,
        value: f64,
        ts: i64,
    ) {
        // Shortest text that reads back as the same f64 (`1e300`, `-0.0`).
        self.write_line_with(
            out,
            sensor,
            metric,
            |out| {
                let _ = serde_json::to_writer(&mut *out, &value);
            },
            ts,
        );
    }

    fn write_line_with(
        &self,
        out: &mut Vec<u8>,
        sensor: &SensorId<'_>,
        metric: &MetricName<'_>,
        value: impl FnOnce(&mut Vec<u8>),
        ts: i64,
    ) {
        let tag = self.sensor_tags.first().map_or("sensor", String::as_str);
        out.extend_from_slice(metric.as_str().as_bytes());
        out.push(b',');
        out.extend_from_slice(tag.as_bytes());
        out.push(b'=');
        out.extend_from_slice(sensor.as_str().as_bytes());
        out.extend_from_slice(b" value=");
        value(out);
        out.push(b' ');
        let _ = serde_json::to_writer(&mut *out, &ts);
    }

    /// A CSV timestamp in epoch milliseconds.
    fn ts_ms(&self, text: &str) -> Result<i64, String> {
        let bad = || format!("ts {text:?} is not a timestamp ({})", self.ts_unit_name());
        if text.is_empty() {
            return Err("ts is required in an import".to_owned());
        }
        let int = || text.parse::<i64>().map_err(|_| bad());
        match self.ts_unit {
            TsUnit::Auto => match text.parse::<i64>() {
                Ok(ms) => Ok(ms),
                Err(_) => time::OffsetDateTime::parse(
                    text,
                    &time::format_description::well_known::Rfc3339,
                )
                .ok()
                .and_then(|t| i64::try_from(t.unix_timestamp_nanos().div_euclid(1_000_000)).ok())
                .ok_or_else(bad),
            },
            TsUnit::Seconds => int()?.checked_mul(1000).ok_or_else(bad),
            TsUnit::Milliseconds => int(),
            TsUnit::Microseconds => Ok(int()?.div_euclid(1000)),
            TsUnit::Nanoseconds => Ok(int()?.div_euclid(1_000_000)),
        }
    }

    fn ts_unit_name(&self) -> &'static str {
        match self.ts_unit {
            TsUnit::Auto => "RFC 3339 or epoch milliseconds",
            TsUnit::Seconds => "epoch seconds",
            TsUnit::Milliseconds => "epoch milliseconds",
            TsUnit::Microseconds => "epoch microseconds",
            TsUnit::Nanoseconds => "epoch nanoseconds",
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
}

impl Checker {
    /// `None` for CSV: its rows are checked whole as they are converted.
    pub fn new(
        format: Format,
        ctx: DecodeContext,
        precision: Precision,
        sensor_tags: Vec<String>,
    ) -> Option<Self> {
        (format != Format::Csv).then_some(Self {
            format,
            ctx,
            precision,
            sensor_tags,
        })
    }

    /// Why the service refuses `line`, if it does.
    pub fn check(&self, line: &str) -> Result<(), String> {
        let ctx = DecodeContext {
            now: time::OffsetDateTime::now_utc().unix_timestamp(),
            ..self.ctx
        };
        self.check_at(line, &ctx)
    }

    fn check_at(&self, line: &str, ctx: &DecodeContext) -> Result<(), String> {
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
                if decoded.readings.is_empty() {
                    return Err(NO_NUMERIC_FIELD.to_owned());
                }
                Ok(())
            }
            Format::Csv => Ok(()),
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

/// `str::trim`, without its Unicode tables for the usual field that starts
/// and ends with a visible ASCII character (nothing to trim).
fn trim(s: &str) -> &str {
    match s.as_bytes() {
        [first, .., last] if first.is_ascii_graphic() && last.is_ascii_graphic() => s,
        [only] if only.is_ascii_graphic() => s,
        _ => s.trim(),
    }
}

/// `-?digits(.digits)?` with at most 300 digits before the point: text
/// that is a finite `f64` and that line protocol reads with the same parse
/// that would check it here (no exponent, `inf` or `NaN`).
fn is_plain_decimal(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text).as_bytes();
    let int = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    if int == 0 || int > 300 {
        return false;
    }
    match &digits[int..] {
        [] => true,
        [b'.', frac @ ..] => !frac.is_empty() && frac.iter().all(u8::is_ascii_digit),
        _ => false,
    }
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

    fn ctx() -> DecodeContext {
        DecodeContext {
            now: 1_764_000_000,
            window: crate::domain::TimeWindow {
                max_age: Duration::from_secs(86400),
                max_future: Duration::from_secs(300),
            },
            max_readings: 10,
        }
    }

    pub(in crate::transfer::import) fn converter(format: Format, unit: TsUnit) -> Converter {
        let tags = crate::ingest::line_protocol::Settings::default().sensor_tags;
        Converter::new(format, ctx(), unit, tags)
    }

    fn checker(format: Format) -> Checker {
        let tags = crate::ingest::line_protocol::Settings::default().sensor_tags;
        Checker::new(format, ctx(), Precision::Nanoseconds, tags).expect("sent as they are")
    }

    fn header(cols: &[&str]) -> csv::StringRecord {
        csv::StringRecord::from(cols.to_vec())
    }

    fn row(cols: &[&str]) -> csv::ByteRecord {
        csv::ByteRecord::from(cols.to_vec())
    }

    #[test]
    fn csv_columns_map_by_name_and_unknown_columns_stop_the_import() {
        let h = header(&["time", "device", "reading", "note"]);
        let map = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect()
        };
        let m = map(&[("ts", "time"), ("sensor", "device"), ("value", "reading")]);
        let err = CsvColumns::from_header(&h, &m, &[]).expect_err("note is unknown");
        assert!(err.contains("\"note\""), "{err}");
        let c = CsvColumns::from_header(&h, &m, &["note".to_owned()]).expect("mapped");
        assert_eq!((c.ts, c.sensor, c.value, c.metric), (0, 1, 2, None));
        let err = CsvColumns::from_header(&h, &map(&[("ts", "time")]), &[]).expect_err("no sensor");
        assert!(err.contains("--column sensor="), "{err}");
        let err = CsvColumns::from_header(&h, &map(&[("temp", "x")]), &[]).expect_err("bad field");
        assert!(err.contains("\"temp\""), "{err}");
    }

    #[test]
    fn csv_rows_become_line_protocol_in_epoch_seconds() {
        let mut c = converter(Format::Csv, TsUnit::Seconds);
        c.set_columns(
            CsvColumns::from_header(&header(&["sensor", "metric", "ts", "value"]), &[], &[])
                .expect("plain"),
        );
        let mut out = Vec::new();
        let good = row(&["s1", "temp", "1764000000", "21.5"]);
        assert_eq!(c.line("", Some(&good), &mut out), Ok(1));
        assert_eq!(
            String::from_utf8(out.clone()).expect("UTF-8"),
            "temp,sensor=s1 value=21.5 1764000000"
        );
        for (bad, why) in [
            (["s 1", "temp", "1764000000", "1"], "sensor"),
            (["s1", "a.b", "1764000000", "1"], "metric"),
            (["s1", "temp", "yesterday", "1"], "ts"),
            (["s1", "temp", "1764000000", "NaN"], "finite"),
            (["s1", "temp", "1764000000", "x"], "number"),
            (["s1", "temp", "1000000000", "1"], "old"),
            (["s1", "temp", "", "1"], "required"),
        ] {
            let before = out.len();
            let err = c.line("", Some(&row(&bad)), &mut out).expect_err(why);
            assert_eq!(out.len(), before, "a refused line adds nothing");
            assert!(!err.is_empty());
        }
        let huge = "9".repeat(400);
        let err = c
            .line(
                "",
                Some(&row(&["s1", "temp", "1764000000", &huge])),
                &mut out,
            )
            .expect_err("past f64's range");
        assert!(err.contains("finite"), "{err}");
        // Two halves of one character in two fields: the row is valid UTF-8
        // as a whole, its fields are not.
        let split = csv::ByteRecord::from(vec![
            &b"s\xc3"[..],
            &b"\xa9t"[..],
            &b"1764000000"[..],
            &b"1"[..],
        ]);
        assert!(std::str::from_utf8(split.as_slice()).is_ok());
        let err = c
            .line("", Some(&split), &mut out)
            .expect_err("split character");
        assert!(err.contains("sensor is not UTF-8"), "{err}");
        let err = c
            .line("", Some(&row(&["s1", "temp", "1764000000"])), &mut out)
            .expect_err("short row");
        assert!(err.contains("3 fields"), "{err}");
    }

    #[test]
    fn csv_timestamps_read_in_every_unit() {
        let c = converter(Format::Csv, TsUnit::Auto);
        assert_eq!(c.ts_ms("1764000000123"), Ok(1_764_000_000_123));
        assert_eq!(c.ts_ms("2025-11-24T16:00:00.5Z"), Ok(1_764_000_000_500));
        for (unit, text, ms) in [
            (TsUnit::Seconds, "1764000000", 1_764_000_000_000),
            (TsUnit::Microseconds, "1764000000123456", 1_764_000_000_123),
            (
                TsUnit::Nanoseconds,
                "1764000000123456789",
                1_764_000_000_123,
            ),
        ] {
            assert_eq!(converter(Format::Csv, unit).ts_ms(text), Ok(ms));
        }
    }

    #[test]
    fn ndjson_lines_are_sent_as_they_are_and_checked_by_the_services_decoder() {
        let c = converter(Format::Ndjson, TsUnit::Auto);
        let k = checker(Format::Ndjson);
        let mut out = Vec::new();
        let good = r#"{"sensor":"s1","metric":"temp","ts":"2025-11-24T16:00:00Z","value":1}"#;
        assert_eq!(c.line(&format!(" {good}\r"), None, &mut out), Ok(1));
        assert_eq!(out, good.as_bytes());
        assert_eq!(k.check_at(good, &ctx()), Ok(()));
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
            let reason = k.check_at(bad, &ctx()).expect_err(bad);
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

        #[test]
        fn a_field_is_trimmed_as_str_trim_does(s in "[ \t\u{a0}\u{3000}a-z0-9.é]{0,6}") {
            proptest::prop_assert_eq!(trim(&s), s.trim());
        }

        /// What a batch sends for a CSV row is, read by the service's
        /// line-protocol decoder, the reading its JSON decoder reads from
        /// the same fields: the same sensor, metric, second and value to
        /// the bit. (NDJSON lines are sent as they are.)
        #[test]
        fn a_converted_reading_reads_back_as_the_same_reading(
            sensor in "[A-Za-z0-9_.:-]{1,40}",
            metric in "[A-Za-z0-9_-]{1,30}",
            value in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL
                | proptest::num::f64::ZERO,
            ms in (1_764_000_000_000i64 - 86_000_000)..1_764_000_200_000,
        ) {
            let json = format!(
                r#"{{"sensor":"{sensor}","metric":"{metric}","ts":{ms},"value":{}}}"#,
                serde_json::to_string(&value).expect("finite")
            );
            let tags = crate::ingest::line_protocol::Settings::default().sensor_tags;
            let from_json = decode_timestamped(&json, &ctx()).expect("valid");
            let mut c = converter(Format::Csv, TsUnit::Milliseconds);
            c.set_columns(
                CsvColumns::from_header(&header(&["sensor", "metric", "ts", "value"]), &[], &[])
                    .expect("plain"),
            );
            // CSV values as plain decimals (sent as they are) and with exponents.
            let csv = |v: String| Some(row(&[&sensor, &metric, &ms.to_string(), &v]));
            for (format, record) in [
                (Format::Csv, csv(value.to_string())),
                (Format::Csv, csv(format!("{value:e}"))),
            ] {
                c.format = format;
                let mut out = Vec::new();
                proptest::prop_assert_eq!(c.line(&json, record.as_ref(), &mut out), Ok(1));
                let arena = Bump::new();
                let decoded =
                    decode_line_protocol(&out, Precision::Seconds, &ctx(), &tags, &arena)
                        .expect("a line");
                proptest::prop_assert!(decoded.errors.is_empty(), "{:?}", decoded.errors);
                proptest::prop_assert!(decoded.labels.is_empty(), "no labels to change");
                proptest::prop_assert_eq!(decoded.readings.len(), 1);
                let r = &decoded.readings[0];
                proptest::prop_assert_eq!(r.sensor.as_str(), from_json.sensor.as_str());
                proptest::prop_assert_eq!(r.metric.as_str(), from_json.metric.as_str());
                proptest::prop_assert_eq!(r.ts, from_json.ts);
                proptest::prop_assert_eq!(r.value.to_bits(), from_json.value.to_bits());
            }
        }
    }

    #[test]
    fn only_plain_decimals_are_sent_as_written() {
        for t in ["0", "-0", "12.5", "-3.25", "007", "1.000000000000000000001"] {
            assert!(is_plain_decimal(t), "{t}");
        }
        for t in [
            "", "-", ".5", "5.", "1e5", "+1", "inf", "NaN", "1.5i", "1,5", "1 5", "1.2.3",
        ] {
            assert!(!is_plain_decimal(t), "{t}");
        }
        // Up to 300 digits before the point a decimal is finite; longer
        // ones are parsed, and past f64's range refused.
        let long = "9".repeat(300);
        assert!(is_plain_decimal(&long) && long.parse::<f64>().is_ok_and(f64::is_finite));
        assert!(!is_plain_decimal(&"9".repeat(301)));
    }

    #[test]
    fn line_protocol_lines_are_sent_as_they_are_and_checked_by_the_services_decoder() {
        let c = converter(Format::LineProtocol, TsUnit::Auto);
        let k = checker(Format::LineProtocol);
        let mut out = Vec::new();
        let good = "weather,sensor=s1 temp=1.5,note=\"x\",on=true,n=3i 1764000000000000000";
        // Its readings are its fields that are not strings, as the service counts them.
        assert_eq!(c.line(good, None, &mut out), Ok(3));
        assert_eq!(out, good.as_bytes());
        assert_eq!(k.check_at(good, &ctx()), Ok(()));
        let arena = Bump::new();
        let decoded = decode_line_protocol(
            good.as_bytes(),
            Precision::Nanoseconds,
            &ctx(),
            &k.sensor_tags,
            &arena,
        )
        .expect("a line");
        assert_eq!(decoded.readings.len(), 3);
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
            let reason = k.check_at(bad, &ctx()).expect_err(bad);
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
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let fresh = format!("weather,sensor=s1 temp=1.5 {}", now * 1_000_000_000);
        assert_eq!(k.check(&fresh), Ok(()));
        assert!(k.check_at(&fresh, &ctx()).is_err());
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

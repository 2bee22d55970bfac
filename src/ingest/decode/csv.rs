//! CSV readings: a header row naming the columns, then a reading per row.
//!
//! The body of `POST /api/v1/readings` with `Content-Type: text/csv`, and
//! what `hourglass import` sends of a CSV file: the client cuts the file
//! into batches of whole rows and the service reads each row once, here.
//!
//! - A column holds the field of its own name (`sensor`, `metric`, `ts`,
//!   `value`) or the one a mapping names (`column.<field>=<column>`). A
//!   column with an empty name (a spreadsheet's or pandas' row index) or
//!   listed to ignore is left out; any other column refuses the body.
//! - `metric` is optional: absent or empty, the default metric.
//! - `ts` is required, in [`TsUnit`]; it is kept in whole seconds.
//! - Rows are read as the `csv` crate reads them (quotes, doubled quotes,
//!   line breaks inside quotes, CRLF; blank lines are no rows). A line
//!   without a quote is split at its commas by hand: the crate's
//!   byte-at-a-time parse was a quarter of an import's CPU. From the first
//!   line that needs quoting rules, the rest goes to the crate.

use serde::Deserialize;

use super::outcome::{Collector, DecodeContext, DecodeError};
use crate::domain::{MetricName, Reading, SensorId};

/// How integer timestamps count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Deserialize)]
pub enum TsUnit {
    /// RFC 3339 text, or integer epoch milliseconds (as the JSON API).
    #[default]
    #[serde(rename = "auto")]
    Auto,
    #[value(name = "s")]
    #[serde(rename = "s")]
    Seconds,
    #[value(name = "ms")]
    #[serde(rename = "ms")]
    Milliseconds,
    #[value(name = "us")]
    #[serde(rename = "us")]
    Microseconds,
    #[value(name = "ns")]
    #[serde(rename = "ns")]
    Nanoseconds,
}

impl TsUnit {
    /// As `ts_unit=` and `--ts-unit` name it.
    pub fn as_str(self) -> &'static str {
        match self {
            TsUnit::Auto => "auto",
            TsUnit::Seconds => "s",
            TsUnit::Milliseconds => "ms",
            TsUnit::Microseconds => "us",
            TsUnit::Nanoseconds => "ns",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            TsUnit::Auto => "RFC 3339 or epoch milliseconds",
            TsUnit::Seconds => "epoch seconds",
            TsUnit::Milliseconds => "epoch milliseconds",
            TsUnit::Microseconds => "epoch microseconds",
            TsUnit::Nanoseconds => "epoch nanoseconds",
        }
    }

    /// A timestamp's text in epoch milliseconds.
    pub fn ts_ms(self, text: &str) -> Result<i64, String> {
        let bad = || format!("ts {text:?} is not a timestamp ({})", self.describe());
        if text.is_empty() {
            return Err("ts is required".to_owned());
        }
        let int = || text.parse::<i64>().map_err(|_| bad());
        match self {
            TsUnit::Auto => match text.parse::<i64>() {
                Ok(ms) => Ok(ms),
                Err(_) => crate::domain::rfc3339_ms(text).ok_or_else(bad),
            },
            TsUnit::Seconds => int()?.checked_mul(1000).ok_or_else(bad),
            TsUnit::Milliseconds => int(),
            TsUnit::Microseconds => Ok(int()?.div_euclid(1000)),
            TsUnit::Nanoseconds => Ok(int()?.div_euclid(1_000_000)),
        }
    }
}

/// How a CSV body's columns are read: the request's parameters.
#[derive(Debug, Clone, Default)]
pub struct CsvFormat {
    /// `field=column`: the column holding a field not in its own name's.
    pub mapping: Vec<(String, String)>,
    /// Columns left out.
    pub ignore: Vec<String>,
    pub ts_unit: TsUnit,
}

/// The fields of a reading a CSV column can hold.
const FIELDS: [&str; 4] = ["sensor", "metric", "ts", "value"];

/// Where each field of a reading is in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvColumns {
    pub sensor: usize,
    /// Absent: the default metric.
    pub metric: Option<usize>,
    pub ts: usize,
    pub value: usize,
    pub width: usize,
}

impl CsvColumns {
    /// From the header row (`names`): each field in the column of its own
    /// name, or of the one `mapping` names (`field=column`); a column that
    /// is none of them, not in `ignore` and not unnamed is refused.
    pub fn from_header<'h>(
        names: impl IntoIterator<Item = &'h str>,
        mapping: &[(String, String)],
        ignore: &[String],
    ) -> Result<Self, String> {
        for (field, _) in mapping {
            if !FIELDS.contains(&field.as_str()) {
                return Err(format!(
                    "column mapping {field}=…: {field:?} is not one of sensor, metric, ts, value"
                ));
            }
        }
        // A spreadsheet's UTF-8 byte order mark is not part of the first name.
        let names: Vec<&str> = names
            .into_iter()
            .map(|n| n.trim_start_matches('\u{feff}').trim())
            .collect();
        let column_of = |field: &'static str| -> &str {
            mapping
                .iter()
                .find(|(f, _)| f == field)
                .map_or(field, |(_, c)| c.as_str())
        };
        let find = |field: &'static str| names.iter().position(|h| *h == column_of(field));
        let required = |field: &'static str| {
            find(field).ok_or_else(|| {
                format!(
                    "the header has no column {:?} for the {field} of a reading; name it with --column {field}=<column> (column.{field}=<column> in a request)",
                    column_of(field)
                )
            })
        };
        let columns = CsvColumns {
            sensor: required("sensor")?,
            metric: find("metric"),
            ts: required("ts")?,
            value: required("value")?,
            width: names.len(),
        };
        let used = [
            Some(columns.sensor),
            columns.metric,
            Some(columns.ts),
            Some(columns.value),
        ];
        // A set: a wide header against a long ignore list stays linear.
        let ignore: std::collections::HashSet<&str> = ignore.iter().map(|x| x.trim()).collect();
        for (i, h) in names.iter().enumerate() {
            if !h.is_empty() && !used.contains(&Some(i)) && !ignore.contains(h) {
                return Err(format!(
                    "column {h:?} is not sensor, metric, ts or value; map it (--column value={h}) or leave it out (--ignore {h}; ignore={h} in a request)"
                ));
            }
        }
        Ok(columns)
    }

    /// A header row naming the fields where they are and no other column
    /// (left out, as the columns this was read from: mapped and ignored
    /// ones are known by position, whatever their names hold).
    pub fn canonical_header(&self) -> String {
        let mut names = vec![""; self.width];
        names[self.sensor] = "sensor";
        if let Some(m) = self.metric {
            names[m] = "metric";
        }
        names[self.ts] = "ts";
        names[self.value] = "value";
        names.join(",")
    }

    /// A row as a reading, borrowing from the row's text where it can.
    pub fn reading<'a>(
        &self,
        row: &impl Row<'a>,
        unit: TsUnit,
        ctx: &DecodeContext,
    ) -> Result<Reading<'a>, String> {
        if row.width() != self.width {
            return Err(format!(
                "{} fields where the header has {}",
                row.width(),
                self.width
            ));
        }
        // One UTF-8 check for the whole row, not one per field; a field is
        // then a slice of it (`get` refuses a slice that splits a character,
        // which two bad fields could make look valid together).
        let whole = row.whole();
        let text = row.utf8().or_else(|| std::str::from_utf8(whole).ok());
        let field = |i: usize, name: &str| {
            let range = row.range(i);
            text.zip(range.clone())
                .and_then(|(text, range)| text.get(range))
                .or_else(|| {
                    std::str::from_utf8(range.and_then(|r| whole.get(r)).unwrap_or_default()).ok()
                })
                .map(trim)
                .ok_or_else(|| format!("{name} is not UTF-8"))
        };
        let sensor = SensorId::parse(field(self.sensor, "sensor")?).map_err(|e| e.to_string())?;
        let metric = match self.metric.map(|i| field(i, "metric")).transpose()? {
            Some(m) if !m.is_empty() => MetricName::parse(m).map_err(|e| e.to_string())?,
            _ => MetricName::default_metric(),
        };
        let value_text = field(self.value, "value")?;
        let value = value_text
            .parse::<f64>()
            .map_err(|_| format!("value {value_text:?} is not a number"))?;
        let value = Reading::check_value(value).map_err(|e| e.to_string())?;
        // Whole seconds, as the service keeps them.
        let ts = unit.ts_ms(field(self.ts, "ts")?)?.div_euclid(1000);
        ctx.window.check(ts, ctx.now).map_err(|e| e.to_string())?;
        Ok(Reading {
            sensor,
            metric,
            ts,
            value,
        })
    }
}

/// A row's fields, as byte ranges of its text, which lives for `'a`.
pub trait Row<'a> {
    fn width(&self) -> usize;
    fn whole(&self) -> &'a [u8];
    /// `whole`, if known to be UTF-8.
    fn utf8(&self) -> Option<&'a str> {
        None
    }
    fn range(&self, i: usize) -> Option<std::ops::Range<usize>>;
}

impl<'a> Row<'a> for &'a csv::ByteRecord {
    fn width(&self) -> usize {
        self.len()
    }
    fn whole(&self) -> &'a [u8] {
        self.as_slice()
    }
    fn range(&self, i: usize) -> Option<std::ops::Range<usize>> {
        csv::ByteRecord::range(self, i)
    }
}

/// A line without quotes: its fields end at its commas and at its end.
pub struct PlainRow<'a, 'c> {
    pub text: &'a [u8],
    pub utf8: Option<&'a str>,
    pub commas: &'c [usize],
}

impl<'a> Row<'a> for PlainRow<'a, '_> {
    fn width(&self) -> usize {
        self.commas.len() + 1
    }
    fn whole(&self) -> &'a [u8] {
        self.text
    }
    fn utf8(&self) -> Option<&'a str> {
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

/// A line's text without its line ending, when it needs no quoting rules:
/// no quote, and no carriage return but the one before its newline.
pub fn plain_line(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    memchr::memchr2(b'"', b'\r', line).is_none().then_some(line)
}

/// One row's text (as `hourglass import` sends it) as a reading: why the
/// service refuses it, if it does.
pub fn check_row(
    line: &[u8],
    columns: &CsvColumns,
    unit: TsUnit,
    ctx: &DecodeContext,
) -> Result<(), String> {
    if let Some(text) = plain_line(line) {
        let commas: Vec<usize> = memchr::memchr_iter(b',', text).collect();
        let row = PlainRow {
            text,
            utf8: None,
            commas: &commas,
        };
        return columns.reading(&row, unit, ctx).map(|_| ());
    }
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(line);
    let mut record = csv::ByteRecord::new();
    match csv.read_byte_record(&mut record) {
        Ok(true) => columns.reading(&&record, unit, ctx).map(|_| ()),
        Ok(false) => Err("the line holds no row".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// Writes a row the `csv` crate read as one CSV line: fields quoted where
/// they hold a quote, a comma or a line break.
pub fn write_row(record: &csv::ByteRecord, out: &mut Vec<u8>) {
    if record.len() == 1 && record[0].is_empty() {
        // One empty field, which an empty line would not be.
        out.extend_from_slice(b"\"\"");
        return;
    }
    for (i, field) in record.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if memchr::memchr3(b'"', b',', b'\n', field).is_some() || field.contains(&b'\r') {
            out.push(b'"');
            for &b in field {
                if b == b'"' {
                    out.push(b'"');
                }
                out.push(b);
            }
            out.push(b'"');
        } else {
            out.extend_from_slice(field);
        }
    }
}

/// Decodes a CSV body. All or nothing, as an array: a detail's `index` is
/// its row's line (from 0, the header's being the first).
pub fn decode_csv<'a>(
    body: &'a [u8],
    format: &CsvFormat,
    ctx: &DecodeContext,
) -> Result<Vec<Reading<'a>>, DecodeError> {
    // Long: the header, then each row against it, in one pass.
    let mut columns: Option<CsvColumns> = None;
    let header = |names: &mut dyn Iterator<Item = &str>| {
        CsvColumns::from_header(names, &format.mapping, &format.ignore).map_err(DecodeError::Csv)
    };
    // A reading line takes some 40 bytes: a guess that spares most regrowth.
    let mut out = Collector::new((body.len() / 40).min(ctx.max_readings));
    let mut rows = 0usize;
    let mut commas = Vec::new();
    // Checked as UTF-8 whole: a row's text then needs no check of its own.
    let utf8 = std::str::from_utf8(body).ok();
    let mut start = 0;
    let mut index = 0;
    while start < body.len() {
        // The line's end and its commas in one look at each byte; a quote
        // or a carriage return sends the line to `plain_line` to decide.
        commas.clear();
        let mut special = false;
        let mut end = start;
        while let Some(&b) = body.get(end) {
            match b {
                b'\n' => break,
                b',' => commas.push(end - start),
                b'"' | b'\r' => special = true,
                _ => {}
            }
            end += 1;
        }
        let line = &body[start..(end + 1).min(body.len())];
        let text = if special {
            match plain_line(line) {
                Some(text) => text,
                None => break,
            }
        } else {
            &line[..end - start]
        };
        if !text.is_empty() {
            match &columns {
                None => {
                    let names = std::str::from_utf8(text)
                        .map_err(|_| DecodeError::Csv("the header row is not UTF-8".to_owned()))?;
                    columns = Some(header(&mut names.split(','))?);
                }
                Some(c) => {
                    rows += 1;
                    if rows <= ctx.max_readings {
                        let row = PlainRow {
                            text,
                            utf8: utf8.and_then(|u| u.get(start..start + text.len())),
                            commas: &commas,
                        };
                        out.push(index, c.reading(&row, format.ts_unit, ctx));
                    }
                }
            }
        }
        index += 1;
        start = end + 1;
    }
    if start < body.len() {
        // From this line on, quoting rules: the `csv` crate.
        let mut csv = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(&body[start..]);
        let mut record = csv::ByteRecord::new();
        loop {
            let line = index + csv.position().line() as usize - 1;
            match csv.read_byte_record(&mut record) {
                Ok(false) => break,
                Ok(true) => {}
                Err(e) => {
                    out.push(line, Err(e.to_string()));
                    continue;
                }
            }
            let line = record
                .position()
                .map_or(line, |p| index + p.line() as usize - 1);
            match &columns {
                None => {
                    let names = record.iter().map(std::str::from_utf8);
                    let names: Vec<&str> = names
                        .collect::<Result<_, _>>()
                        .map_err(|_| DecodeError::Csv("the header row is not UTF-8".to_owned()))?;
                    columns = Some(header(&mut names.into_iter())?);
                }
                Some(c) => {
                    rows += 1;
                    if rows <= ctx.max_readings {
                        let reading = c.reading(&&record, format.ts_unit, ctx);
                        out.push(line, reading.map(Reading::into_owned));
                    }
                }
            }
        }
    }
    if columns.is_none() {
        return Err(DecodeError::Csv(
            "the body is empty; a CSV body starts with its header row".to_owned(),
        ));
    }
    if rows > ctx.max_readings {
        return Err(DecodeError::TooMany {
            count: rows,
            max: ctx.max_readings,
        });
    }
    out.finish()
}

/// `str::trim`, without its Unicode tables for the usual field that starts
/// and ends with a visible ASCII character (nothing to trim).
pub fn trim(s: &str) -> &str {
    match s.as_bytes() {
        [first, .., last] if first.is_ascii_graphic() && last.is_ascii_graphic() => s,
        [only] if only.is_ascii_graphic() => s,
        _ => s.trim(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::decode::tests::{NOW, ctx};
    use proptest::prelude::*;

    fn format(unit: TsUnit) -> CsvFormat {
        CsvFormat {
            ts_unit: unit,
            ..CsvFormat::default()
        }
    }

    fn columns(names: &[&str]) -> CsvColumns {
        CsvColumns::from_header(names.iter().copied(), &[], &[]).expect("plain header")
    }

    fn row(cols: &[&str]) -> csv::ByteRecord {
        csv::ByteRecord::from(cols.to_vec())
    }

    #[test]
    fn columns_map_by_name_and_unknown_columns_are_refused() {
        let h = ["\u{feff}time", "device", "reading", "note", " "];
        let map = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect()
        };
        let m = map(&[("ts", "time"), ("sensor", "device"), ("value", "reading")]);
        let err = CsvColumns::from_header(h, &m, &[]).expect_err("note is unknown");
        assert!(err.contains("\"note\""), "{err}");
        let c = CsvColumns::from_header(h, &m, &["note".to_owned()]).expect("mapped");
        assert_eq!((c.ts, c.sensor, c.value, c.metric), (0, 1, 2, None));
        assert_eq!(c.canonical_header(), "ts,sensor,value,,");
        let again = CsvColumns::from_header(c.canonical_header().split(','), &[], &[]);
        assert_eq!(
            again,
            Ok(c),
            "the canonical header reads as the same columns"
        );
        let err = CsvColumns::from_header(h, &map(&[("ts", "time")]), &[]).expect_err("no sensor");
        assert!(err.contains("--column sensor="), "{err}");
        let err = CsvColumns::from_header(h, &map(&[("temp", "x")]), &[]).expect_err("bad field");
        assert!(err.contains("\"temp\""), "{err}");
    }

    #[test]
    fn a_row_is_checked_with_the_services_rules() {
        let c = columns(&["sensor", "metric", "ts", "value"]);
        let ctx = ctx();
        let now = NOW.to_string();
        let good = row(&["s1", "temp", &now, "21.5"]);
        let r = c
            .reading(&&good, TsUnit::Seconds, &ctx)
            .expect("a good row");
        assert_eq!(
            (r.sensor.as_str(), r.metric.as_str(), r.ts, r.value),
            ("s1", "temp", NOW, 21.5)
        );
        let huge = "9".repeat(400);
        for (bad, why) in [
            (["s 1", "temp", &now, "1"], "sensor"),
            (["s1", "a.b", &now, "1"], "metric"),
            (["s1", "temp", "yesterday", "1"], "timestamp"),
            (["s1", "temp", &now, "NaN"], "finite"),
            (["s1", "temp", &now, "x"], "number"),
            (["s1", "temp", &now, &huge], "finite"),
            (["s1", "temp", "1000000000", "1"], "past"),
            (["s1", "temp", "", "1"], "required"),
        ] {
            let err = c
                .reading(&&row(&bad), TsUnit::Seconds, &ctx)
                .expect_err(why);
            assert!(err.contains(why), "{why}: {err}");
        }
        // Two halves of one character in two fields: the row is valid UTF-8
        // as a whole, its fields are not.
        let split = csv::ByteRecord::from(vec![
            &b"s\xc3"[..],
            &b"\xa9t"[..],
            now.as_bytes(),
            &b"1"[..],
        ]);
        assert!(std::str::from_utf8(split.as_slice()).is_ok());
        let err = c
            .reading(&&split, TsUnit::Seconds, &ctx)
            .expect_err("split character");
        assert!(err.contains("sensor is not UTF-8"), "{err}");
        let err = c
            .reading(&&row(&["s1", "temp", &now]), TsUnit::Seconds, &ctx)
            .expect_err("short row");
        assert!(err.contains("3 fields"), "{err}");
    }

    #[test]
    fn timestamps_read_in_every_unit() {
        assert_eq!(TsUnit::Auto.ts_ms("1764000000123"), Ok(1_764_000_000_123));
        assert_eq!(
            TsUnit::Auto.ts_ms("2025-11-24T16:00:00.5Z"),
            Ok(1_764_000_000_500)
        );
        for (unit, text, ms) in [
            (TsUnit::Seconds, "1764000000", 1_764_000_000_000),
            (TsUnit::Microseconds, "1764000000123456", 1_764_000_000_123),
            (
                TsUnit::Nanoseconds,
                "1764000000123456789",
                1_764_000_000_123,
            ),
        ] {
            assert_eq!(unit.ts_ms(text), Ok(ms));
        }
        assert!(TsUnit::Seconds.ts_ms("99999999999999999").is_err());
    }

    #[test]
    fn a_body_is_all_or_nothing_and_names_its_bad_lines() {
        let body = format!("sensor,ts,value\n\ns1,{NOW},1\ns2,{NOW},x\r\ns3,{NOW},3\n");
        let err =
            decode_csv(body.as_bytes(), &format(TsUnit::Seconds), &ctx()).expect_err("a bad row");
        let DecodeError::Invalid {
            invalid,
            total,
            details,
        } = err
        else {
            panic!("{err:?}");
        };
        assert_eq!((invalid, total), (1, 3));
        assert_eq!(details[0].index, 3, "the line, from 0");
        let fixed = body.replace(",x", ",2");
        let readings =
            decode_csv(fixed.as_bytes(), &format(TsUnit::Seconds), &ctx()).expect("all good");
        let values: Vec<_> = readings
            .iter()
            .map(|r| (r.sensor.as_str(), r.value))
            .collect();
        assert_eq!(values, [("s1", 1.0), ("s2", 2.0), ("s3", 3.0)]);
        for (body, why) in [
            ("", "empty"),
            ("\n\n", "empty"),
            ("sensor,ts,value,extra\n", "\"extra\""),
            ("sensor,value\n", "\"ts\""),
        ] {
            let err = decode_csv(body.as_bytes(), &format(TsUnit::Seconds), &ctx()).expect_err(why);
            assert!(
                matches!(&err, DecodeError::Csv(m) if m.contains(why)),
                "{err:?}"
            );
        }
        let many = format!("sensor,ts,value\n{}", format!("s,{NOW},1\n").repeat(11));
        let err = decode_csv(many.as_bytes(), &format(TsUnit::Seconds), &ctx())
            .expect_err("over the limit");
        assert_eq!(err, DecodeError::TooMany { count: 11, max: 10 });
    }

    #[test]
    fn an_unnamed_column_is_left_out_and_quoted_rows_read_as_csv() {
        let body =
            format!(",sensor,ts,value\n0,s1,{NOW},1\n1,\"s2\",{NOW},\"2\"\n2,s3,\"{NOW}\",3\n");
        let readings =
            decode_csv(body.as_bytes(), &format(TsUnit::Seconds), &ctx()).expect("all good");
        let values: Vec<_> = readings
            .iter()
            .map(|r| (r.sensor.as_str(), r.value))
            .collect();
        assert_eq!(values, [("s1", 1.0), ("s2", 2.0), ("s3", 3.0)]);
        let bad = body.replace("\"2\"", "\"x\"");
        let err = decode_csv(bad.as_bytes(), &format(TsUnit::Seconds), &ctx()).expect_err("x");
        let DecodeError::Invalid { details, .. } = err else {
            panic!("{err:?}");
        };
        assert_eq!(details[0].index, 2, "the line, from 0, after the switch");
    }

    /// A CSV field: plain, or with what needs quoting.
    fn field() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-z0-9.]{0,5}",
            1 => "[a-z\",\n\r ]{0,4}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A CSV row is the reading the JSON decoder reads from the same
        /// fields: the same sensor, metric, second and value to the bit,
        /// values written plainly or with exponents.
        #[test]
        fn a_csv_row_reads_as_the_json_reading_of_the_same_fields(
            sensor in "[A-Za-z0-9_.:-]{1,40}",
            metric in "[A-Za-z0-9_-]{1,30}",
            value in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL
                | proptest::num::f64::ZERO,
            ms in (NOW * 1000 - 86_000_000)..(NOW * 1000 + 200_000),
        ) {
            let json = format!(
                r#"{{"sensor":"{sensor}","metric":"{metric}","ts":{ms},"value":{}}}"#,
                serde_json::to_string(&value).expect("finite")
            );
            let from_json = super::super::decode_timestamped(&json, &ctx()).expect("valid");
            for text in [value.to_string(), format!("{value:e}")] {
                let body = format!("sensor,metric,ts,value\n{sensor},{metric},{ms},{text}\n");
                let read = decode_csv(body.as_bytes(), &format(TsUnit::Milliseconds), &ctx())
                    .expect("valid");
                prop_assert_eq!(read.len(), 1);
                let r = &read[0];
                prop_assert_eq!(r.sensor.as_str(), from_json.sensor.as_str());
                prop_assert_eq!(r.metric.as_str(), from_json.metric.as_str());
                prop_assert_eq!(r.ts, from_json.ts);
                prop_assert_eq!(r.value.to_bits(), from_json.value.to_bits());
            }
        }

        #[test]
        fn a_field_is_trimmed_as_str_trim_does(s in "[ \t\u{a0}\u{3000}a-z0-9.é]{0,6}") {
            prop_assert_eq!(trim(&s), s.trim());
        }

        /// The hand split and the `csv` crate agree on every body, and a
        /// row written by `write_row` reads back as the same row.
        #[test]
        fn a_body_decodes_as_the_csv_crate_reads_it(
            rows in proptest::collection::vec(
                (field(), prop_oneof![Just(NOW.to_string()), field()], field()),
                0..10,
            ),
            crlf in any::<bool>(),
        ) {
            let mut body = Vec::new();
            let mut model = Vec::new();
            body.extend_from_slice(b"sensor,ts,value\n");
            for (s, t, v) in &rows {
                let record = csv::ByteRecord::from(vec![s.as_str(), t.as_str(), v.as_str()]);
                write_row(&record, &mut body);
                body.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
                model.push(record);
            }
            // The model: the crate reads the rows back, then each is checked.
            let mut csv = csv::ReaderBuilder::new().has_headers(true).flexible(true)
                .from_reader(&body[..]);
            let read: Vec<csv::ByteRecord> = csv.byte_records().collect::<Result<_, _>>()
                .expect("readable");
            let written: Vec<csv::ByteRecord> =
                model.into_iter().filter(|r| !(r.len() == 1 && r[0].is_empty())).collect();
            prop_assert_eq!(&read, &written);
            let c = columns(&["sensor", "ts", "value"]);
            let expected: Vec<Result<(String, i64, u64), ()>> = read.iter()
                .map(|r| c.reading(&r, TsUnit::Seconds, &ctx())
                    .map(|r| (r.sensor.as_str().to_owned(), r.ts, r.value.to_bits()))
                    .map_err(|_| ()))
                .collect();
            match decode_csv(&body, &format(TsUnit::Seconds), &ctx()) {
                Ok(readings) => {
                    let got: Vec<Result<(String, i64, u64), ()>> = readings.iter()
                        .map(|r| Ok((r.sensor.as_str().to_owned(), r.ts, r.value.to_bits())))
                        .collect();
                    prop_assert_eq!(got, expected);
                }
                Err(DecodeError::Invalid { invalid, total, .. }) => {
                    prop_assert_eq!(total, expected.len());
                    prop_assert_eq!(invalid, expected.iter().filter(|r| r.is_err()).count());
                }
                Err(e) => prop_assert!(false, "{e:?}"),
            }
        }
    }
}

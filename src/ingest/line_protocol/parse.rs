//! InfluxDB line protocol, parsed without allocating.
//!
//! `measurement[,tag=value…] field=value[,field=value…] [timestamp]`, with the
//! escaping rules of InfluxData's reference: `\,` and `\ ` in measurements;
//! `\,`, `\=` and `\ ` in tag keys, tag values and field keys; `\"` and `\\`
//! in string field values, which may also hold newlines. Lines starting with
//! `#` are comments.
//!
//! Written by hand: InfluxData's `influxdb-line-protocol` crate (nom-based)
//! takes about 1.6 µs per line here, three times VictoriaMetrics' whole
//! ingest cost per point; this parser borrows every part from the input and
//! reuses the caller's vectors, so a line costs no allocation. That crate is
//! kept as the oracle of this one's tests.

use std::borrow::Cow;

/// A name or tag value as written, escapes included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Text<'a> {
    raw: &'a str,
    escaped: bool,
}

/// Which escapes a [`Text`] may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `\,` and `\ `.
    Measurement,
    /// `\,`, `\=` and `\ `: tag keys, tag values, field keys.
    Key,
    /// `\"` and `\\`.
    String,
}

impl<'a> Text<'a> {
    pub fn raw(&self) -> &'a str {
        self.raw
    }

    /// The text with its escapes resolved; borrowed unless it had any.
    pub fn unescape(&self, kind: Kind) -> Cow<'a, str> {
        if !self.escaped {
            return Cow::Borrowed(self.raw);
        }
        let escapable: &[char] = match kind {
            Kind::Measurement => &[',', ' '],
            Kind::Key => &[',', '=', ' '],
            Kind::String => &['"', '\\'],
        };
        let mut out = String::with_capacity(self.raw.len());
        let mut chars = self.raw.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\\'
                && let Some(&next) = chars.peek()
                && escapable.contains(&next)
            {
                out.push(next);
                chars.next();
            } else {
                out.push(c);
            }
        }
        Cow::Owned(out)
    }
}

/// A field's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldValue<'a> {
    Float(f64),
    Integer(i64),
    Unsigned(u64),
    Boolean(bool),
    /// The text between the quotes, escapes included.
    String(Text<'a>),
}

/// One parsed line. Reused from line to line so its vectors allocate once.
#[derive(Debug, Default)]
pub struct Line<'a> {
    pub measurement: Option<Text<'a>>,
    /// Everything between the measurement's comma and the first space, for
    /// telling cheaply whether two lines carry the same tags.
    pub tag_section: &'a str,
    pub tags: Vec<(Text<'a>, Text<'a>)>,
    pub fields: Vec<(Text<'a>, FieldValue<'a>)>,
    pub timestamp: Option<i64>,
}

/// Why a line is not line protocol. The text is shown to clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("the measurement is empty")]
    NoMeasurement,
    #[error("the line has no fields")]
    NoFields,
    #[error("a tag has no '=' or an empty key or value")]
    BadTag,
    #[error("a field has no '=' or an empty key")]
    BadFieldKey,
    #[error("field {0:?} has no value")]
    NoValue(String),
    #[error("field {field:?} has an invalid value {value:?}")]
    BadValue { field: String, value: String },
    #[error("field {0:?} has an unterminated string")]
    Unterminated(String),
    #[error("the timestamp {0:?} is not an integer")]
    BadTimestamp(String),
    #[error("unexpected text after the timestamp")]
    Trailing,
    #[error("the line is not UTF-8")]
    NotUtf8,
}

/// Splits a body into lines, numbered from 1, skipping blank lines and
/// comments. A line is cut at a newline outside a quoted string field.
pub struct Lines<'a> {
    rest: &'a [u8],
    number: usize,
    len: usize,
    start: usize,
}

impl<'a> Lines<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        Self {
            rest: body,
            number: 0,
            len: body.len(),
            start: 0,
        }
    }

    /// Where the line last returned starts in the body, in bytes.
    pub fn start(&self) -> usize {
        self.start
    }
}

impl<'a> Iterator for Lines<'a> {
    /// The line's number (where it starts) and its bytes, trimmed.
    type Item = (usize, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        while !self.rest.is_empty() {
            let bytes = self.rest;
            let newline = memchr::memchr(b'\n', bytes).unwrap_or(bytes.len());
            // Only a quote can hide a newline inside a line.
            let number = self.number + 1;
            let end = if memchr::memchr(b'"', &bytes[..newline]).is_some() {
                let end = quoted_end(bytes);
                self.number += memchr::memchr_iter(b'\n', &bytes[..end]).count();
                end
            } else {
                newline
            };
            self.number += 1;
            let line = &bytes[..end];
            self.rest = bytes.get(end + 1..).unwrap_or_default();
            let start = line
                .iter()
                .position(|&b| b != b' ' && b != b'\t')
                .unwrap_or(line.len());
            let line = &line[start..];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() || line[0] == b'#' {
                continue;
            }
            self.start = self.len - bytes.len() + start;
            return Some((number, line));
        }
        None
    }
}

/// Where a line containing a quote ends: the first newline that is not
/// inside a string field value.
fn quoted_end(b: &[u8]) -> usize {
    let (mut in_fields, mut quoted, mut after_equals) = (false, false, false);
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'\\' => {
                i += 2;
                after_equals = false;
                continue;
            }
            b'\n' if !quoted => return i,
            b' ' if !quoted => in_fields = true,
            b'"' if quoted => quoted = false,
            b'"' if in_fields && after_equals => quoted = true,
            _ => {}
        }
        after_equals = c == b'=' && in_fields && !quoted;
        i += 1;
    }
    b.len()
}

/// A set of bytes, as a table: one lookup per byte in the scanning loops.
struct Stops([bool; 256]);

impl Stops {
    const fn of(bytes: &[u8]) -> Self {
        let mut table = [false; 256];
        let mut i = 0;
        while i < bytes.len() {
            table[bytes[i] as usize] = true;
            i += 1;
        }
        Self(table)
    }
}

const MEASUREMENT_END: Stops = Stops::of(b", ");
const KEY_END: Stops = Stops::of(b"=, ");
const VALUE_END: Stops = Stops::of(b", ");
const STRING_END: Stops = Stops::of(b"\"");

/// Scans from `i` to the first unescaped byte in `stops` (or the end):
/// answers where it stopped and whether it passed an escape.
#[inline]
fn scan(b: &[u8], mut i: usize, stops: &Stops) -> (usize, bool) {
    let mut escaped = false;
    while i < b.len() {
        let c = b[i];
        if c == b'\\' {
            escaped = true;
            i = (i + 2).min(b.len());
            continue;
        }
        if stops.0[c as usize] {
            break;
        }
        i += 1;
    }
    (i, escaped)
}

fn text(s: &str, from: usize, to: usize, escaped: bool) -> Text<'_> {
    Text {
        raw: &s[from..to],
        escaped,
    }
}

/// Parses one line (from [`Lines`]) into `out`, replacing what it held.
pub fn parse_line<'a>(line: &'a [u8], out: &mut Line<'a>) -> Result<(), ParseError> {
    parse_text(
        std::str::from_utf8(line).map_err(|_| ParseError::NotUtf8)?,
        out,
    )
}

/// [`parse_line`] of a line already known to be UTF-8 (checked once for a
/// whole body, which is cheaper than line by line).
pub fn parse_text<'a>(s: &'a str, out: &mut Line<'a>) -> Result<(), ParseError> {
    let end = parse_series(s, out)?;
    parse_fields(s, end, out)
}

/// The first part of [`parse_text`]: the measurement and tags, into `out`
/// (its fields and timestamp cleared). Answers where the series ends.
pub fn parse_series<'a>(s: &'a str, out: &mut Line<'a>) -> Result<usize, ParseError> {
    let b = s.as_bytes();
    out.measurement = None;
    out.tag_section = "";
    out.tags.clear();
    out.fields.clear();
    out.timestamp = None;

    let (end, escaped) = scan(b, 0, &MEASUREMENT_END);
    if end == 0 {
        return Err(ParseError::NoMeasurement);
    }
    out.measurement = Some(text(s, 0, end, escaped));
    let mut i = end;
    if b.get(i) == Some(&b',') {
        let section = i + 1;
        loop {
            let start = i + 1;
            let (eq, key_escaped) = scan(b, start, &KEY_END);
            if eq == start || b.get(eq) != Some(&b'=') {
                return Err(ParseError::BadTag);
            }
            let (stop, value_escaped) = scan(b, eq + 1, &VALUE_END);
            if stop == eq + 1 {
                return Err(ParseError::BadTag);
            }
            out.tags.push((
                text(s, start, eq, key_escaped),
                text(s, eq + 1, stop, value_escaped),
            ));
            i = stop;
            if b.get(i) != Some(&b',') {
                break;
            }
        }
        out.tag_section = &s[section..i];
    }
    Ok(i)
}

/// Where a line's series (its measurement and tags) ends, at its first
/// space, if the series holds no escapes: lines with equal series parse to
/// the same measurement and tags, so a body parses each distinct one once.
pub fn series_end(line: &[u8]) -> Option<usize> {
    match memchr::memchr2(b' ', b'\\', line) {
        Some(i) if line[i] == b' ' => Some(i),
        _ => None,
    }
}

/// The rest of [`parse_text`]: the fields and timestamp after the series,
/// which ends at `i`. Replaces `out`'s fields and timestamp only.
pub fn parse_fields<'a>(s: &'a str, mut i: usize, out: &mut Line<'a>) -> Result<(), ParseError> {
    let b = s.as_bytes();
    out.fields.clear();
    out.timestamp = None;
    // Fields, after one or more spaces.
    while b.get(i) == Some(&b' ') {
        i += 1;
    }
    if i >= b.len() {
        return Err(ParseError::NoFields);
    }
    loop {
        let start = i;
        let (eq, key_escaped) = scan(b, start, &KEY_END);
        if eq == start || b.get(eq) != Some(&b'=') {
            return Err(ParseError::BadFieldKey);
        }
        let key = text(s, start, eq, key_escaped);
        let (value, next) = field_value(s, eq + 1, key)?;
        out.fields.push((key, value));
        i = next;
        match b.get(i) {
            Some(b',') => i += 1,
            _ => break,
        }
    }
    // The timestamp, if any, then nothing but spaces.
    while b.get(i) == Some(&b' ') {
        i += 1;
    }
    if i < b.len() {
        let end = b[i..]
            .iter()
            .position(|&c| c == b' ')
            .map_or(b.len(), |p| i + p);
        let token = &s[i..end];
        out.timestamp = Some(
            parse_int(token.as_bytes())
                .ok_or_else(|| ParseError::BadTimestamp(token.to_owned()))?,
        );
        if b[end..].iter().any(|&c| c != b' ') {
            return Err(ParseError::Trailing);
        }
    }
    Ok(())
}

/// The rest of a line after its series when it is the common shape, one
/// field `value` holding a plain decimal and an optional timestamp
/// (` value=21.5 1700000000`): its value and timestamp, as
/// [`parse_fields`] would parse them. Anything else answers `None` and is
/// left to [`parse_fields`], errors included. A third of a line's cost was
/// the general field loop and `str::parse::<f64>`.
pub fn value_field(rest: &[u8]) -> Option<(f64, Option<i64>)> {
    let rest = rest.strip_prefix(b" value=")?;
    let (value, rest) = plain_decimal(rest)?;
    match rest {
        [] => Some((value, None)),
        [b' ', ts @ ..] if ts.first().is_some_and(u8::is_ascii_digit) => {
            // Digits to the end: `parse_int` refuses anything else.
            Some((value, Some(parse_int(ts)?)))
        }
        _ => None,
    }
}

/// `-?[0-9]+(.[0-9]+)?` at the start of `b`, ending at its end or a space,
/// when it converts exactly: at most 19 digits whose integer fits in 53
/// bits, and at most 22 after the point. Then the digits and the power of
/// ten are both exact as `f64` and one division rounds correctly (Clinger's
/// fast path, which `str::parse` also takes for these), so the answer is
/// `str::parse`'s to the bit.
fn plain_decimal(b: &[u8]) -> Option<(f64, &[u8])> {
    const POWERS: [f64; 23] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
    ];
    let (negative, digits) = match b {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, b),
    };
    let mut mantissa: u64 = 0;
    let mut count = 0usize;
    let mut i = 0;
    while let Some(&c) = digits.get(i).filter(|c| c.is_ascii_digit()) {
        mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
        i += 1;
    }
    if i == 0 {
        return None;
    }
    count += i;
    let mut fraction = 0;
    if digits.get(i) == Some(&b'.') {
        i += 1;
        let from = i;
        while let Some(&c) = digits.get(i).filter(|c| c.is_ascii_digit()) {
            mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
            i += 1;
        }
        fraction = i - from;
        if fraction == 0 {
            return None;
        }
        count += fraction;
    }
    let rest = &digits[i..];
    if count > 19 || mantissa > 1 << 53 || !matches!(rest.first(), None | Some(b' ')) {
        return None;
    }
    let value = mantissa as f64 / *POWERS.get(fraction)?;
    Some((if negative { -value } else { value }, rest))
}

/// Parses the value starting at `i`; answers it and where it ended.
fn field_value<'a>(
    s: &'a str,
    i: usize,
    key: Text<'a>,
) -> Result<(FieldValue<'a>, usize), ParseError> {
    let b = s.as_bytes();
    let name = || key.unescape(Kind::Key).into_owned();
    if b.get(i) == Some(&b'"') {
        let (close, escaped) = scan(b, i + 1, &STRING_END);
        if close >= b.len() {
            return Err(ParseError::Unterminated(name()));
        }
        return Ok((
            FieldValue::String(text(s, i + 1, close, escaped)),
            close + 1,
        ));
    }
    let end = b[i..]
        .iter()
        .position(|&c| c == b',' || c == b' ')
        .map_or(b.len(), |p| i + p);
    let token = &s[i..end];
    let bad = || ParseError::BadValue {
        field: name(),
        value: token.to_owned(),
    };
    let value = match token.as_bytes() {
        [] => return Err(ParseError::NoValue(name())),
        [num @ .., b'i'] => FieldValue::Integer(parse_int(num).ok_or_else(bad)?),
        [num @ .., b'u'] => FieldValue::Unsigned(
            std::str::from_utf8(num)
                .ok()
                .filter(|n| n.bytes().all(|c| c.is_ascii_digit()))
                .and_then(|n| n.parse().ok())
                .ok_or_else(bad)?,
        ),
        b"t" | b"T" | b"true" | b"True" | b"TRUE" => FieldValue::Boolean(true),
        b"f" | b"F" | b"false" | b"False" | b"FALSE" => FieldValue::Boolean(false),
        bytes if let Some((v, [])) = plain_decimal(bytes) => FieldValue::Float(v),
        bytes => {
            // A digit or a point after the sign: `parse` would also take
            // "inf" and "NaN", which line protocol does not have, and past
            // that first byte it takes nothing but a decimal number.
            let first = match bytes {
                [b'-' | b'+', c, ..] | [c, ..] => *c,
                [] => b' ',
            };
            if !first.is_ascii_digit() && first != b'.' {
                return Err(bad());
            }
            FieldValue::Float(token.parse().map_err(|_| bad())?)
        }
    };
    Ok((value, end))
}

/// `-?[0-9]+` as an i64, refusing overflow.
fn parse_int(num: &[u8]) -> Option<i64> {
    let (negative, digits) = match num.strip_prefix(b"-") {
        Some(d) => (true, d),
        None => (false, num),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulated negatively, so i64::MIN fits.
    let mut n: i64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub(i64::from(c - b'0'))?;
    }
    if negative { Some(n) } else { n.checked_neg() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The shortcut answers only what the general field loop reads, and
        /// takes every plain decimal of up to 15 digits.
        #[test]
        fn the_value_field_shortcut_reads_what_parse_fields_reads(
            noise in "( value=| value=-| vaLue=|  value=)[0-9.e+ i-]{0,30}",
            number in "-?[0-9]{1,10}(\\.[0-9]{1,10})?",
            ts in proptest::option::of("[0-9]{1,19}"),
        ) {
            let plain = format!(" value={number}{}", ts.as_ref().map(|t| format!(" {t}")).unwrap_or_default());
            let short = number.bytes().filter(u8::is_ascii_digit).count() <= 15;
            for rest in [noise, plain.clone()] {
                let text = format!("m{rest}");
                let mut line = Line::default();
                let general = parse_fields(&text, 1, &mut line).map(|()| line);
                let Some((value, ts)) = value_field(rest.as_bytes()) else {
                    prop_assert!(rest != plain || !short || general.is_err(), "{:?} not taken", text);
                    continue;
                };
                let line = general.map_err(|e| TestCaseError::fail(format!("{e} for {text:?}")))?;
                prop_assert_eq!(line.fields.len(), 1);
                prop_assert_eq!(line.fields[0].0.raw(), "value");
                let FieldValue::Float(v) = line.fields[0].1 else {
                    return Err(TestCaseError::fail(format!("not a float: {text:?}")));
                };
                prop_assert_eq!(v.to_bits(), value.to_bits(), "{:?}", text);
                if rest == plain {
                    let std: f64 = number.parse().expect("a decimal");
                    prop_assert_eq!(value.to_bits(), std.to_bits(), "{:?}", text);
                }
                prop_assert_eq!(line.timestamp, ts);
            }
        }

        /// Decimals as `str::parse` reads them, to the bit.
        #[test]
        fn plain_decimals_are_std_s_to_the_bit(s in "-?[0-9]{1,22}(\\.[0-9]{1,25})?") {
            if let Some((v, rest)) = plain_decimal(s.as_bytes()) {
                prop_assert!(rest.is_empty());
                let std: f64 = s.parse().expect("a decimal");
                prop_assert_eq!(v.to_bits(), std.to_bits(), "{}", s);
            }
        }
    }

    fn parse(line: &str) -> Result<Line<'_>, ParseError> {
        let mut out = Line::default();
        parse_line(line.as_bytes(), &mut out).map(|()| out)
    }

    #[test]
    fn lines_know_where_they_start() {
        let body = "# c\n  a v=1\r\n\nb s=\"x\ny\" 5\n";
        let mut lines = Lines::new(body.as_bytes());
        let mut starts = Vec::new();
        while let Some((_, line)) = lines.next() {
            starts.push(lines.start());
            assert_eq!(&body.as_bytes()[lines.start()..][..line.len()], line);
        }
        assert_eq!(starts, [6, 14]);
    }

    fn lines(body: &str) -> Vec<(usize, &str)> {
        Lines::new(body.as_bytes())
            .map(|(n, l)| (n, std::str::from_utf8(l).expect("utf-8")))
            .collect()
    }

    #[test]
    fn the_reference_example_parses() {
        let l = parse(
            r#"myMeasurement,tag1=value1,tag2=value2 fieldKey="fieldValue" 1556813561098000000"#,
        )
        .expect("valid");
        assert_eq!(l.measurement.map(|m| m.raw()), Some("myMeasurement"));
        assert_eq!(l.tag_section, "tag1=value1,tag2=value2");
        let tags: Vec<_> = l.tags.iter().map(|(k, v)| (k.raw(), v.raw())).collect();
        assert_eq!(tags, [("tag1", "value1"), ("tag2", "value2")]);
        assert_eq!(l.fields.len(), 1);
        assert!(matches!(l.fields[0].1, FieldValue::String(t) if t.raw() == "fieldValue"));
        assert_eq!(l.timestamp, Some(1_556_813_561_098_000_000));
    }

    #[test]
    fn every_field_type_parses() {
        let l =
            parse("m a=1,b=-1.5e3,c=7i,d=-7i,e=9u,f=t,g=FALSE,h=\"x\",k=1.,l=.5").expect("valid");
        let v: Vec<_> = l.fields.iter().map(|(k, v)| (k.raw(), *v)).collect();
        assert_eq!(v[0], ("a", FieldValue::Float(1.0)));
        assert_eq!(v[1], ("b", FieldValue::Float(-1500.0)));
        assert_eq!(v[2], ("c", FieldValue::Integer(7)));
        assert_eq!(v[3], ("d", FieldValue::Integer(-7)));
        assert_eq!(v[4], ("e", FieldValue::Unsigned(9)));
        assert_eq!(v[5], ("f", FieldValue::Boolean(true)));
        assert_eq!(v[6], ("g", FieldValue::Boolean(false)));
        assert_eq!(v[8], ("k", FieldValue::Float(1.0)));
        assert_eq!(v[9], ("l", FieldValue::Float(0.5)));
        assert_eq!(l.timestamp, None);
    }

    #[test]
    fn escapes_follow_the_reference() {
        // The reference's examples: commas, spaces and equals signs.
        let l = parse(r#"wea\,ther\ now,loc\ ation=us\,mid\=west temp\=rature=82,s="too \"hot\" \\ here" 1465839830100400200"#)
            .expect("valid");
        let m = l.measurement.expect("measurement");
        assert_eq!(m.unescape(Kind::Measurement), "wea,ther now");
        let (k, v) = l.tags[0];
        assert_eq!(
            (k.unescape(Kind::Key), v.unescape(Kind::Key)),
            ("loc ation".into(), "us,mid=west".into())
        );
        assert_eq!(l.fields[0].0.unescape(Kind::Key), "temp=rature");
        match l.fields[1].1 {
            FieldValue::String(t) => assert_eq!(t.unescape(Kind::String), r#"too "hot" \ here"#),
            other => panic!("{other:?}"),
        }
        // A backslash before anything else is itself.
        let l = parse(r"m\x,t=a\b v=1").expect("valid");
        assert_eq!(
            l.measurement.expect("m").unescape(Kind::Measurement),
            r"m\x"
        );
        assert_eq!(l.tags[0].1.unescape(Kind::Key), r"a\b");
    }

    #[test]
    fn bad_lines_say_why() {
        for (line, want) in [
            ("m", ParseError::NoFields),
            ("m,t=1", ParseError::NoFields),
            (",t=1 v=1", ParseError::NoMeasurement),
            ("m,t v=1", ParseError::BadTag),
            ("m,=x v=1", ParseError::BadTag),
            ("m,t= v=1", ParseError::BadTag),
            ("m v", ParseError::BadFieldKey),
            ("m =1", ParseError::BadFieldKey),
            ("m v=", ParseError::NoValue("v".into())),
            ("m v=1 12x", ParseError::BadTimestamp("12x".into())),
            ("m v=1 1 2", ParseError::Trailing),
            ("m v=\"abc", ParseError::Unterminated("v".into())),
        ] {
            assert_eq!(parse(line).err(), Some(want), "{line}");
        }
        for bad in [
            "m v=abc", "m v=1x", "m v=inf", "m v=NaN", "m v=1.2i", "m v=-1u", "m v=--", "m v=1e",
        ] {
            assert!(
                matches!(parse(bad), Err(ParseError::BadValue { .. })),
                "{bad}"
            );
        }
        let mut out = Line::default();
        assert_eq!(parse_line(b"m v=\xff", &mut out), Err(ParseError::NotUtf8));
    }

    #[test]
    fn lines_skip_blanks_and_comments_and_keep_quoted_newlines() {
        let body = "# a comment\n\nm v=1 1\r\n  m v=\"two\nlines\" 2\n\t\nm,t=\"q v=3\nlast v=4";
        assert_eq!(
            lines(body),
            [
                (3, "m v=1 1"),
                (4, "m v=\"two\nlines\" 2"),
                (7, "m,t=\"q v=3"),
                (8, "last v=4"),
            ]
        );
        assert!(lines("").is_empty());
        assert_eq!(lines("m v=1"), [(1, "m v=1")]);
    }

    #[test]
    fn timestamps_may_be_negative_and_spaces_may_repeat() {
        let l = parse("m,t=1  v=1   -5  ").expect("valid");
        assert_eq!(l.timestamp, Some(-5));
        assert!(parse("m v=1 99999999999999999999").is_err());
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        for bad in [&b"9223372036854775808"[..], b"-", b"", b"1-", b"+1", b"--1"] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
    }
}

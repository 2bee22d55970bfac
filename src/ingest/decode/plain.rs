//! The plain shape almost every client sends, decoded without serde: an
//! array of flat reading objects whose strings hold no escapes. JSON decoding
//! was a quarter of the service's CPU per reading, and serde's generic
//! visitors (serde_json and sonic-rs alike, measured) spend most of it on
//! matching field names and dispatching. No library decodes one fixed
//! shape, so this does, and gives up on the first thing it does not expect:
//! the serde decoder then decodes the body, and explains any error. So this
//! answers exactly what that decoder answers, or nothing (a property test
//! holds it to that).

use std::borrow::Cow;

use super::fields::{Implied, RawReading, Text, Ts, validate};
use super::outcome::DecodeContext;
use crate::domain::{Reading, parse_timestamp_ms, parse_timestamp_str};

/// Every reading of `text` (a JSON array), if they are all plain and valid.
pub(super) fn readings<'a>(
    text: &'a str,
    implied: Implied<'a>,
    ctx: &DecodeContext,
) -> Option<Vec<Reading<'a>>> {
    let mut p = Parser { text, at: 0 };
    let mut out = Vec::with_capacity((text.len() / 64).min(ctx.max_readings));
    p.skip_ws();
    p.eat(b'[')?;
    p.skip_ws();
    if p.peek() == Some(b']') {
        p.at += 1;
    } else {
        loop {
            p.skip_ws();
            let raw = p.object()?;
            if out.len() == ctx.max_readings {
                return None;
            }
            out.push(validate(raw, implied, ctx).ok()?);
            p.skip_ws();
            match p.next()? {
                b',' => {}
                b']' => break,
                _ => return None,
            }
        }
    }
    p.skip_ws();
    (p.at == text.len()).then_some(out)
}

/// Every line of an NDJSON body (one reading object per line, each with
/// its `ts`; blank lines skipped), if they are all plain and valid: one
/// pass over the body, as for an array.
pub(super) fn ndjson<'a>(text: &'a str, ctx: &DecodeContext) -> Option<Vec<Reading<'a>>> {
    let mut p = Parser { text, at: 0 };
    let mut out = Vec::with_capacity((text.len() / 64).min(ctx.max_readings));
    loop {
        // Blank lines are whitespace, newlines included.
        p.skip_ws();
        if p.at == text.len() {
            return Some(out);
        }
        let start = p.at;
        let raw = p.object()?;
        // One object per line: one that spans lines is two bad lines.
        if p.bytes()[start..p.at].contains(&b'\n') {
            return None;
        }
        raw.ts.as_ref()?;
        if out.len() == ctx.max_readings {
            return None;
        }
        out.push(validate(raw, Implied::default(), ctx).ok()?);
        // The rest of its line: blanks, then a newline or the end.
        while matches!(p.peek(), Some(b' ' | b'\t' | b'\r')) {
            p.at += 1;
        }
        match p.next() {
            None => return Some(out),
            Some(b'\n') => {}
            Some(_) => return None,
        }
    }
}

/// One reading object alone (an import's NDJSON line), if it is plain.
pub(super) fn object(text: &str) -> Option<RawReading<'_>> {
    let mut p = Parser { text, at: 0 };
    p.skip_ws();
    let raw = p.object()?;
    p.skip_ws();
    (p.at == text.len()).then_some(raw)
}

enum Field {
    Sensor,
    Metric,
    Ts,
    Value,
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn eat(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
    }

    /// A string without escapes or control characters, borrowed. Names are
    /// short: a plain loop beats memchr's setup on them.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let rest = &self.bytes()[self.at..];
        let end = rest
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if rest[end] != b'"' {
            return None;
        }
        // Both ends are ASCII quotes: char boundaries of valid UTF-8.
        let s = &self.text[self.at..self.at + end];
        self.at += end + 1;
        Some(s)
    }

    /// The field an object's key names, if it is one of a reading's.
    fn key(&mut self) -> Option<Field> {
        let rest = &self.bytes()[self.at..];
        let (field, len) = if rest.starts_with(b"\"sensor\"") {
            (Field::Sensor, 8)
        } else if rest.starts_with(b"\"metric\"") {
            (Field::Metric, 8)
        } else if rest.starts_with(b"\"ts\"") {
            (Field::Ts, 4)
        } else if rest.starts_with(b"\"value\"") {
            (Field::Value, 7)
        } else {
            return None;
        };
        self.at += len;
        Some(field)
    }

    /// A JSON number's text (its grammar checked), and whether it is an
    /// integer (no fraction, no exponent).
    fn number(&mut self) -> Option<(&'a str, bool)> {
        let start = self.at;
        let b = self.bytes();
        let digits = |at: &mut usize| {
            let from = *at;
            while b.get(*at).is_some_and(u8::is_ascii_digit) {
                *at += 1;
            }
            *at > from
        };
        let mut at = self.at;
        if b.get(at) == Some(&b'-') {
            at += 1;
        }
        match b.get(at) {
            Some(b'0') => at += 1,
            Some(b'1'..=b'9') => {
                digits(&mut at);
            }
            _ => return None,
        }
        let mut integer = true;
        if b.get(at) == Some(&b'.') {
            at += 1;
            integer = false;
            if !digits(&mut at) {
                return None;
            }
        }
        if matches!(b.get(at), Some(b'e' | b'E')) {
            at += 1;
            integer = false;
            if matches!(b.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            if !digits(&mut at) {
                return None;
            }
        }
        self.at = at;
        Some((&self.text[start..at], integer))
    }

    /// One flat reading object, each field at most once and `value` given.
    fn object(&mut self) -> Option<RawReading<'a>> {
        self.eat(b'{')?;
        let (mut sensor, mut metric, mut ts, mut value) = (None, None, None, None);
        loop {
            self.skip_ws();
            let key = self.key()?;
            self.skip_ws();
            self.eat(b':')?;
            self.skip_ws();
            match key {
                Field::Sensor if sensor.is_none() => sensor = Some(self.string()?),
                Field::Metric if metric.is_none() => metric = Some(self.string()?),
                Field::Ts if ts.is_none() => ts = Some(self.ts()?),
                Field::Value if value.is_none() => value = Some(self.value()?),
                _ => return None,
            }
            self.skip_ws();
            match self.next()? {
                b',' => {}
                b'}' => break,
                _ => return None,
            }
        }
        Some(RawReading {
            sensor: sensor.map(|s| Text(Cow::Borrowed(s))),
            metric: metric.map(|s| Text(Cow::Borrowed(s))),
            ts,
            value: value?,
        })
    }

    /// Integer epoch milliseconds or an RFC 3339 string.
    fn ts(&mut self) -> Option<Ts> {
        if self.peek() == Some(b'"') {
            return Some(Ts(parse_timestamp_str(self.string()?)));
        }
        let (text, integer) = self.number()?;
        // Up to 18 digits always fit an i64; longer ones the serde decoder
        // judges. `-0` is a float to serde_json, which refuses it here.
        if !integer || digit_count(text) > 18 || text == "-0" {
            return None;
        }
        Some(Ts(Ok(parse_timestamp_ms(text.parse().ok()?))))
    }

    /// As serde_json reads a number into an `f64`: integers through `i64`
    /// or `u64` (`-0` is `-0.0`), the rest correctly rounded.
    fn value(&mut self) -> Option<f64> {
        let (text, integer) = self.number()?;
        if !integer {
            return text.parse().ok();
        }
        if digit_count(text) > 18 {
            return None;
        }
        let n: i64 = text.parse().ok()?;
        Some(if text == "-0" { -0.0 } else { n as f64 })
    }
}

/// An integer's digits, its sign left out: up to 18 always fit an `i64`.
fn digit_count(integer: &str) -> usize {
    integer.strip_prefix('-').unwrap_or(integer).len()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{NOW, ctx};
    use super::super::{DecodeError, serde_array, serde_timestamped};
    use super::*;
    use proptest::prelude::*;

    fn same(a: &[Reading<'_>], b: &[Reading<'_>]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                x.sensor == y.sensor
                    && x.metric == y.metric
                    && x.ts == y.ts
                    && x.value.to_bits() == y.value.to_bits()
            })
    }

    /// A field as clients write it, or slightly off: numbers of every JSON
    /// form and some that are not JSON, names with escapes, nulls.
    fn field() -> impl Strategy<Value = String> {
        let name = prop_oneof![
            "[a-z0-9.:_-]{0,6}",
            Just("a\\u0062".to_owned()),
            Just("tab\t".to_owned()),
            Just("é".to_owned()),
        ];
        let number = prop_oneof![
            "-?(0|[1-9][0-9]{0,20})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?",
            "-?0[0-9]{1,3}|\\.5|-|1\\.|1e|\\+1|NaN|-0|-0\\.0|0e0",
            any::<f64>().prop_map(|v| v.to_string()),
            ((NOW - 40 * 86_400) * 1000..(NOW + 600) * 1000).prop_map(|ms| ms.to_string()),
        ];
        let ts_text = prop_oneof![
            Just("\"2013-10-16T20:00:00Z\"".to_owned()),
            Just("\"2013-10-16T20:00:00.999+02:00\"".to_owned()),
            Just("\"yesterday\"".to_owned()),
        ];
        prop_oneof![
            name.clone().prop_map(|n| format!("\"sensor\":\"{n}\"")),
            name.prop_map(|n| format!("\"metric\":\"{n}\"")),
            number.clone().prop_map(|n| format!("\"ts\":{n}")),
            ts_text.prop_map(|t| format!("\"ts\":{t}")),
            number.prop_map(|n| format!("\"value\":{n}")),
            Just("\"sensor\":null".to_owned()),
            Just("\"metric\":null".to_owned()),
            Just("\"ts\":null".to_owned()),
            Just("\"other\":1".to_owned()),
            Just("\"value\":\"1\"".to_owned()),
        ]
    }

    fn ws() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just(""),
            Just(" "),
            Just("\n\t"),
            Just("\r\n "),
            Just("\u{a0}")
        ]
    }

    /// A reading object: odd, or valid and plain with fields in any order.
    fn object() -> impl Strategy<Value = String> {
        let odd = prop::collection::vec((field(), ws()), 0..6).prop_map(|fs| {
            let inner: Vec<String> = fs.into_iter().map(|(f, w)| format!("{w}{f}{w}")).collect();
            format!("{{{}}}", inner.join(","))
        });
        // Valid and plain, fields in any order: the shape that must decode.
        let valid = (
            "[a-z0-9.:_-]{1,8}",
            "[a-z0-9_-]{1,8}",
            // Sometimes none: stamped on receipt, or refused in an import.
            proptest::option::weighted(0.9, (NOW - 86_400) * 1000..NOW * 1000),
            prop_oneof![
                any::<f64>()
                    .prop_filter("finite", |v| v.is_finite())
                    .prop_map(|v| format!("{v:?}")),
                "-?(0|[1-9][0-9]{0,17})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?",
                Just("-0".to_owned()),
                Just("-0.0".to_owned()),
            ],
            ws(),
        )
            .prop_flat_map(|(sensor, metric, ts, value, w)| {
                let mut fields = vec![
                    format!("\"sensor\":\"{sensor}\""),
                    format!("\"metric\":{w}\"{metric}\""),
                    format!("\"value\":{value}"),
                ];
                fields.extend(ts.map(|ts| format!("\"ts\":{ts}")));
                Just(fields).prop_shuffle()
            })
            .prop_map(|fields| format!("{{{}}}", fields.join(",")));
        prop_oneof![odd, valid]
    }

    fn body() -> impl Strategy<Value = String> {
        (
            prop::collection::vec((object(), ws()), 0..13),
            ws(),
            prop_oneof![Just(""), Just(","), Just("]"), Just("x")],
        )
            .prop_map(|(objects, w, tail)| {
                let inner: Vec<String> = objects
                    .into_iter()
                    .map(|(o, w)| format!("{w}{o}{w}"))
                    .collect();
                format!("{w}[{}]{w}{tail}", inner.join(","))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        /// The plain decoder answers what the serde decoder answers, or
        /// nothing; and it answers every body that is plain and valid.
        #[test]
        fn plain_bodies_decode_as_serde_decodes_them(body in body(), sensor in proptest::option::of(Just("topic"))) {
            let implied = Implied { sensor, metric: None };
            let reference = serde_array(&body, implied, &ctx());
            match readings(&body, implied, &ctx()) {
                Some(got) => {
                    let Ok(want) = &reference else {
                        return Err(TestCaseError::fail(format!("{body}: plain {got:?}, serde {reference:?}")));
                    };
                    prop_assert!(same(&got, want), "{}: plain {:?}, serde {:?}", body, got, want);
                }
                None => {
                    // What it leaves to serde although serde takes it:
                    // escapes, nulls and integers of more than 18 digits.
                    let long = body.split(|c: char| !c.is_ascii_digit()).any(|d| d.len() > 18);
                    prop_assert!(
                        reference.is_err() || body.contains('\\') || body.contains("null") || long,
                        "{}: serde {:?}, plain nothing", body, reference
                    );
                }
            }
            if let Err(DecodeError::TooMany { .. }) = reference {
                prop_assert!(readings(&body, implied, &ctx()).is_none());
            }
        }
    }

    fn ndjson_body() -> impl Strategy<Value = String> {
        let line_end = prop_oneof![
            Just("\n"),
            Just("\r\n"),
            Just("\n\n"),
            Just(" \n"),
            Just(" ")
        ];
        (
            prop::collection::vec((object(), line_end), 0..13),
            prop_oneof![Just(""), Just("\n"), Just("x")],
        )
            .prop_map(|(lines, tail)| {
                let mut body: String = lines
                    .into_iter()
                    .map(|(o, end)| format!("{o}{end}"))
                    .collect();
                body.push_str(tail);
                body
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// An NDJSON body decodes in one pass as line by line, or goes
        /// line by line.
        #[test]
        fn plain_ndjson_bodies_decode_as_their_lines_decode(body in ndjson_body()) {
            let ctx = ctx();
            let reference = super::super::ndjson_lines(&body, &ctx);
            if let Some(got) = ndjson(&body, &ctx) {
                let Ok(want) = &reference else {
                    return Err(TestCaseError::fail(format!("{body:?}: plain {got:?}, lines {reference:?}")));
                };
                prop_assert!(same(&got, want), "{:?}: plain {:?}, lines {:?}", body, got, want);
            } else {
                let long = body.split(|c: char| !c.is_ascii_digit()).any(|d| d.len() > 18);
                prop_assert!(
                    reference.is_err() || body.contains('\\') || body.contains("null") || long,
                    "{:?}: lines {:?}, plain nothing", body, reference
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// An import's line decodes through the plain path as through serde,
        /// or goes to serde.
        #[test]
        fn plain_lines_decode_as_serde_decodes_them(object in object(), w in ws()) {
            let ctx = ctx();
            let line = format!("{w}{object}{w}");
            let reference = serde_timestamped(&line, &ctx);
            let got = super::super::decode_timestamped(&line, &ctx);
            match (&got, &reference) {
                (Ok(g), Ok(w)) => prop_assert!(same(std::slice::from_ref(g), std::slice::from_ref(w)), "{}", line),
                (Err(g), Err(w)) => prop_assert_eq!(g, w),
                _ => prop_assert!(false, "{}: {:?}, serde {:?}", line, got, reference),
            }
        }
    }

    #[test]
    fn a_plain_body_takes_the_plain_path() {
        let body = r#"[{"sensor":"s-1","metric":"t","ts":1381961000000,"value":1.5},
            {"value":-2,"sensor":"s-2","ts":"2013-10-16T22:00:00Z"}]"#;
        let got = readings(body, Implied::default(), &ctx()).expect("plain");
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[1].metric.as_str(), got[1].ts, got[1].value),
            ("value", 1_381_960_800, -2.0)
        );
        // Borrowed from the body, not copied.
        assert!(std::ptr::eq(
            got[0].sensor.as_str().as_ptr(),
            body[12..].as_ptr()
        ));
    }

    #[test]
    fn integers_of_eighteen_digits_take_the_plain_path_whatever_their_sign() {
        // Found by the property test: the sign was counted as a digit.
        for value in ["-118408015903930314", "118408015903930314"] {
            let body =
                format!(r#"[{{"sensor":"0","metric":"_","ts":1381961000000,"value":{value}}}]"#);
            let got = readings(&body, Implied::default(), &ctx()).expect("plain");
            let want = serde_array(&body, Implied::default(), &ctx()).expect("serde");
            assert!(same(&got, &want), "{body}");
        }
        let long = r#"[{"sensor":"0","metric":"_","value":-1184080159039303140}]"#;
        assert!(readings(long, Implied::default(), &ctx()).is_none());
    }
}

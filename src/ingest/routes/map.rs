//! One message through its route: the readings it holds, nothing (a topic
//! or a value the route ignores by design), or why it holds none.

use bumpalo::Bump;
use serde_json::Value;

use super::route::{Part, Route, Source};
use super::settings::{Payload, TsFormat};
use crate::domain::{MetricName, Reading, SensorId};
use crate::ingest::decode::DecodeContext;

/// What a message gave.
#[derive(Debug, PartialEq)]
pub enum Mapped<'a> {
    Readings(Vec<Reading<'a>>),
    /// Nothing to store, by design (an ignored topic, a `skip_values` word,
    /// fields all left out).
    Nothing,
}

/// Maps `payload` of a topic `route` took, with its captures `caps`, in
/// `ctx` (receipt time, time window, at most `ctx.max_readings`); names are
/// copied into `arena`. `Err` is the reason, for the dead letter.
pub fn map<'a>(
    route: &Route,
    caps: &[(&str, &str)],
    payload: &[u8],
    ctx: &DecodeContext,
    arena: &'a Bump,
) -> Result<Mapped<'a>, String> {
    let text = std::str::from_utf8(payload).map_err(|_| "the payload is not UTF-8".to_owned())?;
    let trimmed = text.trim();
    let json = match route.payload {
        Payload::Json => true,
        // `{` or `[`, written so that no brace is left open in the source.
        Payload::Auto => trimmed.starts_with(['\u{7b}', '\u{5b}']),
        Payload::Number | Payload::State => false,
    };
    if !json {
        let Some(value) = scalar(route, trimmed)? else {
            return Ok(Mapped::Nothing);
        };
        let sensor = name(route, &route.sensor, caps, None, None)?;
        let metric = name(route, &route.metric, caps, None, Some("value"))?;
        let reading = reading(arena, &sensor, &metric, ctx.now, value, ctx)?;
        return Ok(Mapped::Readings(vec![reading]));
    }
    let root: Value =
        serde_json::from_str(trimmed).map_err(|e| format!("the payload is not JSON: {e}"))?;
    let at = root
        .pointer(&route.pointer)
        .ok_or_else(|| format!("the pointer {:?} finds nothing", route.pointer))?;
    let sensor = name(route, &route.sensor, caps, Some(&root), None)?;
    let ts = timestamp(route, &root, ctx)?;
    let mut leaves = Vec::new();
    let mut first_unusable = None;
    match at {
        Value::Object(_) | Value::Array(_) => flatten(
            route,
            at,
            &mut String::new(),
            &mut leaves,
            &mut first_unusable,
            ctx.max_readings,
        )?,
        scalar_value => {
            let field = route
                .pointer
                .rsplit('/')
                .next()
                .filter(|f| !f.is_empty())
                .unwrap_or("value");
            match leaf_value(route, scalar_value) {
                Some(v) => leaves.push((field.to_owned(), v)),
                None => first_unusable = Some(field.to_owned()),
            }
        }
    }
    if leaves.is_empty() {
        return match first_unusable {
            Some(field) => Err(format!(
                "no field holds a number: {field:?} is neither a number nor a state word"
            )),
            None => Ok(Mapped::Nothing),
        };
    }
    let mut readings = Vec::with_capacity(leaves.len());
    for (field, value) in leaves {
        let metric = name(route, &route.metric, caps, Some(&root), Some(&field))?;
        readings.push(reading(arena, &sensor, &metric, ts, value, ctx)?);
    }
    Ok(Mapped::Readings(readings))
}

/// The value of a payload that is not JSON; `None` for a word to skip.
fn scalar(route: &Route, trimmed: &str) -> Result<Option<f64>, String> {
    // A JSON string ("on"), as some publish their states.
    let word = trimmed
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(trimmed);
    let lower = word.to_lowercase();
    if route.skip_values.contains(&lower) {
        return Ok(None);
    }
    if route.payload != Payload::Number
        && let Some(&v) = route.states.get(&lower)
    {
        return Ok(Some(v));
    }
    match word.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(Some(v)),
        _ => Err(format!(
            "the payload {:?} is neither a number nor a state word",
            shorten(word)
        )),
    }
}

/// The number a JSON leaf stands for, if any.
fn leaf_value(route: &Route, v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64().filter(|x| x.is_finite()),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Value::String(s) => {
            let lower = s.trim().to_lowercase();
            route
                .states
                .get(&lower)
                .copied()
                .or_else(|| s.trim().parse::<f64>().ok().filter(|x| x.is_finite()))
        }
        _ => None,
    }
}

/// The leaves of `v` under `prefix`, names joined by the separator,
/// filtered by `include`/`exclude`; at most `max` of them.
fn flatten(
    route: &Route,
    v: &Value,
    prefix: &mut String,
    out: &mut Vec<(String, f64)>,
    first_unusable: &mut Option<String>,
    max: usize,
) -> Result<(), String> {
    let mut visit = |key: &str,
                     child: &Value,
                     out: &mut Vec<(String, f64)>,
                     first: &mut Option<String>|
     -> Result<(), String> {
        let len = prefix.len();
        if !prefix.is_empty() {
            prefix.push_str(&route.separator);
        }
        prefix.push_str(key);
        let result = match child {
            Value::Object(_) | Value::Array(_) => flatten(route, child, prefix, out, first, max),
            Value::Null => Ok(()),
            leaf => {
                if wanted(route, prefix) {
                    match leaf_value(route, leaf) {
                        Some(x) => {
                            if out.len() == max {
                                return Err(format!("the message holds more than {max} readings"));
                            }
                            out.push((prefix.clone(), x));
                        }
                        None => {
                            if first.is_none() {
                                *first = Some(prefix.clone());
                            }
                        }
                    }
                }
                Ok(())
            }
        };
        prefix.truncate(len);
        result
    };
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                visit(k, child, out, first_unusable)?;
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                visit(&i.to_string(), child, out, first_unusable)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn wanted(route: &Route, field: &str) -> bool {
    (route.include.is_empty() || route.include.iter().any(|g| g.matches(field)))
        && !route.exclude.iter().any(|g| g.matches(field))
}

/// A sensor or metric name from `source`; `field` fills `{field}`.
fn name(
    route: &Route,
    source: &Source,
    caps: &[(&str, &str)],
    root: Option<&Value>,
    field: Option<&str>,
) -> Result<String, String> {
    match source {
        Source::Field(pointer) => {
            let found = root
                .and_then(|r| r.pointer(pointer))
                .ok_or_else(|| format!("the pointer {pointer:?} finds nothing"))?;
            match found {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                _ => Err(format!("the pointer {pointer:?} finds no text")),
            }
        }
        Source::Template(parts) => {
            let mut out = String::new();
            for part in parts {
                match part {
                    Part::Text(t) => out.push_str(t),
                    Part::Capture(c)
                        if c == "field" && !caps.iter().any(|(n, _)| *n == "field") =>
                    {
                        out.push_str(field.unwrap_or("value"));
                    }
                    Part::Capture(c) => {
                        let (_, text) = caps
                            .iter()
                            .find(|(n, _)| n == c)
                            .ok_or_else(|| format!("route {:?}: no capture {c:?}", route.name))?;
                        out.push_str(text);
                    }
                }
            }
            Ok(out)
        }
    }
}

/// A reading, its names made valid (characters outside the allowed set
/// replaced: `/` by `.` in a sensor id, the rest by `_`).
fn reading<'a>(
    arena: &'a Bump,
    sensor: &str,
    metric: &str,
    ts: i64,
    value: f64,
    ctx: &DecodeContext,
) -> Result<Reading<'a>, String> {
    let sensor = arena.alloc_str(&clean(sensor, true));
    let metric = arena.alloc_str(&clean(metric, false));
    let sensor = SensorId::parse(&*sensor).map_err(|e| format!("sensor {sensor:?}: {e}"))?;
    let metric = MetricName::parse(&*metric).map_err(|e| format!("metric {metric:?}: {e}"))?;
    let ts = ctx.window.check(ts, ctx.now).map_err(|e| e.to_string())?;
    Ok(Reading {
        sensor,
        metric,
        ts,
        value,
    })
}

fn clean(name: &str, sensor: bool) -> String {
    name.chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '_' | '-' => c,
            '.' | ':' if sensor => c,
            '/' if sensor => '.',
            _ => '_',
        })
        .collect()
}

/// The reading's time (epoch seconds): the route's field, or receipt.
fn timestamp(route: &Route, root: &Value, ctx: &DecodeContext) -> Result<i64, String> {
    let Some(pointer) = &route.ts else {
        return Ok(ctx.now);
    };
    let Some(found) = root.pointer(pointer) else {
        return Ok(ctx.now);
    };
    let bad = || {
        format!(
            "the time {found} at {pointer:?} is not one of {:?}",
            route.ts_format
        )
    };
    match found {
        Value::Number(n) => {
            let x = n.as_f64().ok_or_else(bad)?;
            epoch(route.ts_format, x).ok_or_else(bad)
        }
        Value::String(s) => text_time(route, s.trim()).ok_or_else(bad),
        _ => Err(bad()),
    }
}

fn epoch(format: TsFormat, x: f64) -> Option<i64> {
    let per_second = match format {
        TsFormat::EpochS => 1.0,
        TsFormat::EpochMs => 1e3,
        TsFormat::EpochUs => 1e6,
        TsFormat::Auto => match x.abs() {
            a if a < 1e11 => 1.0,
            a if a < 1e14 => 1e3,
            a if a < 1e17 => 1e6,
            _ => 1e9,
        },
        TsFormat::Rfc3339 | TsFormat::Local => return None,
    };
    let s = (x / per_second).floor();
    (s.is_finite() && s.abs() < 1e15).then_some(s as i64)
}

fn text_time(route: &Route, s: &str) -> Option<i64> {
    let zoned = |s: &str| -> Option<i64> {
        let tz = route.timezone.clone()?;
        let civil: jiff::civil::DateTime = s.parse().ok()?;
        Some(civil.to_zoned(tz).ok()?.timestamp().as_second())
    };
    match route.ts_format {
        TsFormat::Rfc3339 => s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second()),
        TsFormat::Local => zoned(s),
        TsFormat::Auto => s
            .parse::<jiff::Timestamp>()
            .ok()
            .map(|t| t.as_second())
            .or_else(|| zoned(s))
            .or_else(|| epoch(TsFormat::Auto, s.parse().ok()?)),
        format => epoch(format, s.parse().ok()?),
    }
}

fn shorten(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    use super::*;
    use crate::domain::TimeWindow;
    use crate::ingest::routes::{RouteSettings, compile};

    fn route(separator: &str) -> Route {
        let s = RouteSettings {
            topic: Some("d/{sensor}".into()),
            payload: Some(Payload::Json),
            separator: Some(separator.into()),
            ..RouteSettings::default()
        };
        compile(&[s]).expect("valid").remove(0)
    }

    fn ctx() -> DecodeContext {
        DecodeContext {
            now: 1_800_000_000,
            window: TimeWindow {
                max_age: std::time::Duration::from_secs(3600 * 24 * 365),
                max_future: std::time::Duration::from_secs(3600),
            },
            max_readings: 10_000,
        }
    }

    /// The brute-force walk: every leaf, depth first, its names joined.
    fn walk(v: &Value, name: &str, sep: &str, out: &mut Vec<(String, f64)>) {
        let join = |k: &str| {
            if name.is_empty() {
                k.to_owned()
            } else {
                format!("{name}{sep}{k}")
            }
        };
        match v {
            Value::Object(m) => m.iter().for_each(|(k, c)| walk(c, &join(k), sep, out)),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .for_each(|(i, c)| walk(c, &join(&i.to_string()), sep, out)),
            Value::Number(n) => out.push((name.to_owned(), n.as_f64().expect("finite"))),
            Value::Bool(b) => out.push((name.to_owned(), f64::from(u8::from(*b)))),
            Value::String(s) => match s.as_str() {
                "ON" | "open" => out.push((name.to_owned(), 1.0)),
                "OFF" | "closed" => out.push((name.to_owned(), 0.0)),
                t => {
                    if let Ok(x) = t.parse::<f64>() {
                        out.push((name.to_owned(), x));
                    }
                }
            },
            Value::Null => {}
        }
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            (-1e6f64..1e6).prop_map(|x| json!(x)),
            any::<i32>().prop_map(|x| json!(x)),
            any::<bool>().prop_map(|b| json!(b)),
            prop::sample::select(vec!["ON", "OFF", "open", "closed", "eco", "12.5", ""])
                .prop_map(|s| json!(s)),
            Just(Value::Null),
        ]
    }

    fn object() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 40, 5, |inner| {
            prop_oneof![
                prop::collection::btree_map("[a-z]{1,3}", inner.clone(), 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
                prop::collection::vec(inner, 0..3).prop_map(Value::Array),
            ]
        })
    }

    proptest! {
        #[test]
        fn a_route_maps_an_object_to_the_readings_a_brute_force_walk_finds(
            fields in prop::collection::btree_map("[a-z]{1,3}", object(), 0..6),
            sep in prop::sample::select(vec!["_", ".", "-"]),
        ) {
            let root = Value::Object(fields.into_iter().collect());
            let route = route(sep);
            let text = root.to_string();
            let arena = Bump::new();
            let mut expected = Vec::new();
            walk(&root, "", sep, &mut expected);
            let got = map(&route, &[("sensor", "s1")], text.as_bytes(), &ctx(), &arena);
            // A metric name keeps `_` and `-`; `.` becomes `_`.
            let clean = |n: &str| n.replace('.', "_");
            match got {
                Ok(Mapped::Readings(readings)) => {
                    let got: Vec<(String, f64)> = readings
                        .iter()
                        .map(|r| (r.metric.as_str().to_owned(), r.value))
                        .collect();
                    let want: Vec<(String, f64)> =
                        expected.iter().map(|(n, v)| (clean(n), *v)).collect();
                    prop_assert_eq!(got, want);
                    prop_assert!(readings.iter().all(|r| r.sensor.as_str() == "s1" && r.ts == ctx().now));
                }
                Ok(Mapped::Nothing) => prop_assert!(expected.is_empty()),
                Err(reason) => {
                    prop_assert!(expected.is_empty(), "{reason}");
                    prop_assert!(reason.contains("no field holds a number"), "{reason}");
                }
            }
        }
    }

    #[test]
    fn words_and_times_map_as_the_route_says() {
        let mut s = RouteSettings {
            topic: Some("t/{sensor}".into()),
            ts: Some("field:/Time".into()),
            ts_format: Some(TsFormat::Local),
            timezone: Some("Europe/Berlin".into()),
            ..RouteSettings::default()
        };
        let route = compile(std::slice::from_ref(&s)).expect("valid").remove(0);
        let arena = Bump::new();
        let ctx = DecodeContext {
            now: 1_765_003_660,
            ..ctx()
        };
        // 2025-12-06T06:46:40Z is 07:46:40 in Berlin (CET).
        let payload = br#"{"Time":"2025-12-06T07:46:40","v":1}"#;
        let Ok(Mapped::Readings(r)) = map(&route, &[("sensor", "a")], payload, &ctx, &arena) else {
            panic!("readings")
        };
        assert_eq!((r[0].ts, r[0].value), (1_765_003_600, 1.0));
        s.ts = None;
        s.payload = Some(Payload::Auto);
        let route = compile(&[s]).expect("valid").remove(0);
        for (payload, want) in [
            ("on", Some(1.0)),
            ("\"OFF\"", Some(0.0)),
            ("21.5", Some(21.5)),
        ] {
            let Ok(Mapped::Readings(r)) =
                map(&route, &[("sensor", "a")], payload.as_bytes(), &ctx, &arena)
            else {
                panic!("{payload}")
            };
            assert_eq!(Some(r[0].value), want, "{payload}");
        }
        assert_eq!(
            map(&route, &[("sensor", "a")], b"unavailable", &ctx, &arena),
            Ok(Mapped::Nothing)
        );
        assert!(map(&route, &[("sensor", "a")], b"nan", &ctx, &arena).is_err());
        assert!(map(&route, &[("sensor", "a")], b"eco", &ctx, &arena).is_err());
    }
}

//! One message through its route: the readings it holds, nothing (a topic
//! or a value the route ignores by design), or why it holds none.

use bumpalo::Bump;
use serde_json::Value;

use super::route::{Part, Route, Source};
use super::settings::{Payload, TsFormat};
use crate::domain::{MetricName, Reading, SensorId, valid_label_value};
use crate::ingest::decode::DecodeContext;

/// The longest field name a route joins (a metric is at most 64 bytes):
/// past it the message is refused before any name is copied.
const MAX_FIELD_NAME: usize = 64;

/// The most of a message's own text a reason quotes.
const QUOTED: usize = 64;

/// What a message gave.
#[derive(Debug, PartialEq)]
pub enum Mapped<'a> {
    /// The readings (all of one sensor) and that sensor's labels.
    Readings(Vec<Reading<'a>>, Vec<(String, String)>),
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
        let reading = reading(arena, route, &sensor, &metric, ctx.now, value, ctx)?;
        return Ok(Mapped::Readings(vec![reading], labels(route, caps, None)));
    }
    json_readings(route, caps, trimmed, ctx, arena)
}

/// The readings of a JSON payload (see [`map`]).
fn json_readings<'a>(
    route: &Route,
    caps: &[(&str, &str)],
    trimmed: &str,
    ctx: &DecodeContext,
    arena: &'a Bump,
) -> Result<Mapped<'a>, String> {
    let root: Value =
        serde_json::from_str(trimmed).map_err(|e| format!("the payload is not JSON: {e}"))?;
    let at = root
        .pointer(&route.pointer)
        .ok_or_else(|| format!("the pointer {:?} finds nothing", route.pointer))?;
    let sensor = name(route, &route.sensor, caps, Some(&root), None)?;
    let ts = timestamp(route, &root, ctx)?;
    let mut walk = Walk {
        route,
        name: String::new(),
        leaves: Vec::new(),
        first_unusable: None,
        // Every node visited counts, kept or not: the walk's work is
        // bounded by the readings a message may hold, whatever its shape.
        budget: ctx.max_readings,
    };
    match at {
        Value::Object(_) | Value::Array(_) => walk.node(at)?,
        scalar_value => {
            let field = route
                .pointer
                .rsplit('/')
                .next()
                .filter(|f| !f.is_empty())
                .unwrap_or("value");
            match leaf_value(route, scalar_value) {
                Some(v) => walk.leaves.push((field.to_owned(), v)),
                None => walk.first_unusable = Some(field.to_owned()),
            }
        }
    }
    let Walk {
        leaves,
        first_unusable,
        ..
    } = walk;
    if leaves.is_empty() {
        return match first_unusable {
            Some(field) => Err(format!(
                "no field holds a number: {:?} is neither a number nor a state word",
                quote(&field)
            )),
            None => Ok(Mapped::Nothing),
        };
    }
    let mut readings = Vec::with_capacity(leaves.len());
    let mut seen = std::collections::HashMap::with_capacity(leaves.len());
    for (field, value) in leaves {
        let metric = name(route, &route.metric, caps, Some(&root), Some(&field))?;
        let r = reading(arena, route, &sensor, &metric, ts, value, ctx)?;
        // Two readings of one second and metric: one would silently replace
        // the other.
        if let Some(other) = seen.insert(r.metric.as_str().to_owned(), field.clone()) {
            return Err(format!(
                "fields {:?} and {:?} both give metric {:?}",
                quote(&other),
                quote(&field),
                quote(r.metric.as_str())
            ));
        }
        readings.push(r);
    }
    Ok(Mapped::Readings(readings, labels(route, caps, Some(&root))))
}

/// The route's labels for this message; one whose field is absent, not a
/// string, number or boolean, or not a valid value is left out.
fn labels(route: &Route, caps: &[(&str, &str)], root: Option<&Value>) -> Vec<(String, String)> {
    route
        .labels
        .iter()
        .filter_map(|(label, source)| {
            let value = match source {
                Source::Field(pointer) => match root?.pointer(pointer)? {
                    Value::String(s) => s.clone(),
                    v @ (Value::Number(_) | Value::Bool(_)) => v.to_string(),
                    _ => return None,
                },
                template => name(route, template, caps, None, None).ok()?,
            };
            valid_label_value(&value).then(|| (label.clone(), value))
        })
        .collect()
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
            quote(word)
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

/// A walk over a JSON value's leaves: their joined names and numbers,
/// filtered by `include`/`exclude`, within a budget of nodes.
struct Walk<'r> {
    route: &'r Route,
    /// The joined name of the node being visited.
    name: String,
    leaves: Vec<(String, f64)>,
    first_unusable: Option<String>,
    budget: usize,
}

impl Walk<'_> {
    fn node(&mut self, v: &Value) -> Result<(), String> {
        match v {
            Value::Object(map) => map.iter().try_for_each(|(k, child)| self.child(k, child)),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .try_for_each(|(i, child)| self.child(&i.to_string(), child)),
            _ => Ok(()),
        }
    }

    fn child(&mut self, key: &str, child: &Value) -> Result<(), String> {
        if self.budget == 0 {
            return Err(
                "the message holds more fields than a message may hold readings".to_owned(),
            );
        }
        self.budget -= 1;
        let len = self.name.len();
        let separator = if len == 0 {
            ""
        } else {
            self.route.separator.as_str()
        };
        if len + separator.len() + key.len() > MAX_FIELD_NAME {
            return Err(format!(
                "a field name is longer than {MAX_FIELD_NAME} bytes: {:?}",
                quote(&format!("{}{separator}{}", self.name, quote(key)))
            ));
        }
        self.name.push_str(separator);
        self.name.push_str(key);
        let result = match child {
            Value::Object(_) | Value::Array(_) => self.node(child),
            Value::Null => Ok(()),
            leaf => {
                if wanted(self.route, &self.name) {
                    match leaf_value(self.route, leaf) {
                        Some(x) => self.leaves.push((self.name.clone(), x)),
                        None if self.first_unusable.is_none() => {
                            self.first_unusable = Some(self.name.clone());
                        }
                        None => {}
                    }
                }
                Ok(())
            }
        };
        self.name.truncate(len);
        result
    }
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
    route: &Route,
    sensor: &str,
    metric: &str,
    ts: i64,
    value: f64,
    ctx: &DecodeContext,
) -> Result<Reading<'a>, String> {
    let sensor = arena.alloc_str(&sensor_id(sensor, route.sensor_levels)?);
    let metric = arena.alloc_str(&clean_metric(metric));
    let sensor =
        SensorId::parse(&*sensor).map_err(|e| format!("sensor {:?}: {e}", quote(sensor)))?;
    let metric =
        MetricName::parse(&*metric).map_err(|e| format!("metric {:?}: {e}", quote(metric)))?;
    let ts = ctx.window.check(ts, ctx.now).map_err(|e| e.to_string())?;
    Ok(Reading {
        sensor,
        metric,
        ts,
        value,
    })
}

/// A sensor id from its text, one to one: with a multi-level capture
/// (`levels`), its levels joined by `.`, and a `.` or an empty level
/// refused (so no two topics give one id); any other character outside the
/// id's set is refused, never replaced (two devices would share an id).
fn sensor_id(text: &str, levels: bool) -> Result<String, String> {
    if levels
        && text
            .split('/')
            .any(|level| level.is_empty() || level.contains('.'))
    {
        return Err(format!(
            "sensor {:?}: a topic level that is empty or holds `.` cannot name a sensor",
            quote(text)
        ));
    }
    Ok(text.replace('/', "."))
}

/// A metric name: characters outside its set (`switch:0`) become `_`; the
/// names are the device's own, within its sensor.
fn clean_metric(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '_' | '-' => c,
            _ => '_',
        })
        .collect()
}

/// At most [`QUOTED`] characters of text taken from a message.
fn quote(s: &str) -> &str {
    match s.char_indices().nth(QUOTED) {
        Some((i, _)) => &s[..i],
        None => s,
    }
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
        let shown = found.to_string();
        format!(
            "the time {:?} at {pointer:?} is not {:?}",
            quote(&shown),
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
        // An offset, when the text has one, is the text's own.
        TsFormat::Local => s
            .parse::<jiff::Timestamp>()
            .ok()
            .map(|t| t.as_second())
            .or_else(|| zoned(s)),
        TsFormat::Auto => s
            .parse::<jiff::Timestamp>()
            .ok()
            .map(|t| t.as_second())
            .or_else(|| zoned(s))
            .or_else(|| epoch(TsFormat::Auto, s.parse().ok()?)),
        format => epoch(format, s.parse().ok()?),
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
                Ok(Mapped::Readings(readings, _)) => {
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
        let Ok(Mapped::Readings(r, _)) = map(&route, &[("sensor", "a")], payload, &ctx, &arena)
        else {
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
            let Ok(Mapped::Readings(r, _)) =
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

#[cfg(test)]
mod bounds {
    use super::*;
    use crate::domain::TimeWindow;
    use crate::ingest::routes::{RouteSettings, compile};

    fn route(topic: &str, metric: Option<&str>) -> Route {
        let s = RouteSettings {
            topic: Some(topic.into()),
            metric: metric.map(str::to_owned),
            payload: Some(Payload::Json),
            ..RouteSettings::default()
        };
        compile(&[s]).expect("valid").remove(0)
    }

    fn ctx() -> DecodeContext {
        DecodeContext {
            now: 1_800_000_000,
            window: TimeWindow {
                max_age: std::time::Duration::from_secs(86_400),
                max_future: std::time::Duration::from_secs(60),
            },
            max_readings: 100,
        }
    }

    fn reason(route: &Route, caps: &[(&str, &str)], payload: &str) -> String {
        let arena = Bump::new();
        map(route, caps, payload.as_bytes(), &ctx(), &arena).expect_err("refused")
    }

    #[test]
    fn a_long_field_name_is_refused_before_any_name_is_copied_and_quoted_short() {
        let r = route("d/{sensor}", None);
        let key = "k".repeat(100_000);
        let payload = format!(r#"{{"{key}": [{}]}}"#, vec!["1"; 1000].join(","));
        let why = reason(&r, &[("sensor", "s")], &payload);
        assert!(why.contains("longer than 64 bytes"), "{why}");
        assert!(why.len() < 200, "{} bytes", why.len());
    }

    #[test]
    fn every_node_counts_against_the_readings_a_message_may_hold() {
        let r = route("d/{sensor}", None);
        let payload = format!(r#"{{"a": [{}]}}"#, vec!["\"x\""; 500].join(","));
        assert!(reason(&r, &[("sensor", "s")], &payload).contains("more fields"));
    }

    #[test]
    fn two_fields_giving_one_metric_are_refused() {
        let r = route("d/{sensor}", None);
        let why = reason(&r, &[("sensor", "s")], r#"{"a_b":1,"a":{"b":2}}"#);
        assert!(why.contains("both give metric"), "{why}");
        let fixed = route("d/{sensor}", Some("value"));
        assert!(reason(&fixed, &[("sensor", "s")], r#"{"a":1,"b":2}"#).contains("both give"));
    }

    #[test]
    fn no_two_topics_give_one_sensor() {
        let r = route("z/{sensor#}", None);
        let arena = Bump::new();
        let ok = map(&r, &[("sensor", "a/b")], br#"{"v":1}"#, &ctx(), &arena).expect("taken");
        let Mapped::Readings(readings, _) = ok else {
            panic!("readings")
        };
        assert_eq!(readings[0].sensor.as_str(), "a.b");
        for clash in ["a.b", "a//b", "a/b.c"] {
            assert!(
                reason(&r, &[("sensor", clash)], r#"{"v":1}"#).contains("cannot name"),
                "{clash}"
            );
        }
        let one = route("z/{sensor}", None);
        assert!(reason(&one, &[("sensor", "Кухня")], r#"{"v":1}"#).contains("sensor"));
    }
}

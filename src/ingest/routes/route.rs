//! A route checked and ready: its pattern, templates and mapping rules,
//! built from `[[mqtt.routes]]` (presets expanded) with each fault naming
//! its key.

use std::collections::HashMap;

use wildmatch::WildMatch;

use super::pattern::Pattern;
use super::presets;
use super::settings::{Payload, RouteSettings, TsFormat};

/// A startup fault of `mqtt.routes[i]`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("mqtt.routes[{index}].{key}: {reason}")]
pub struct RouteError {
    pub index: usize,
    pub key: &'static str,
    pub reason: String,
}

/// Where a name comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Text and `{capture}`s (`{field}`: the JSON field's name).
    Template(Vec<Part>),
    /// A JSON pointer into the payload.
    Field(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Capture(String),
}

#[derive(Debug)]
pub struct Route {
    /// Which `[[mqtt.routes]]` it comes from.
    pub index: usize,
    pub name: String,
    pub pattern: Pattern,
    pub ignore: Vec<Pattern>,
    pub payload: Payload,
    pub sensor: Source,
    /// The sensor takes a multi-level capture: its levels are joined by
    /// `.`, so no level may hold one (one id per topic).
    pub sensor_levels: bool,
    pub metric: Source,
    pub pointer: String,
    pub separator: String,
    pub include: Vec<WildMatch>,
    pub exclude: Vec<WildMatch>,
    /// Lower-case words.
    pub states: HashMap<String, f64>,
    /// Lower-case words.
    pub skip_values: Vec<String>,
    pub ts: Option<String>,
    pub ts_format: TsFormat,
    pub timezone: Option<jiff::tz::TimeZone>,
    /// The sensor's labels, by name.
    pub labels: Vec<(String, Source)>,
}

const DEFAULT_STATES: &[(&str, f64)] = &[
    ("on", 1.0),
    ("off", 0.0),
    ("true", 1.0),
    ("false", 0.0),
    ("open", 1.0),
    ("closed", 0.0),
    ("yes", 1.0),
    ("no", 0.0),
];

const DEFAULT_SKIP: &[&str] = &["unavailable", "unknown", "none", "null", ""];

/// The routes of `settings`, presets expanded, in order.
pub fn compile(settings: &[RouteSettings]) -> Result<Vec<Route>, RouteError> {
    let mut routes = Vec::new();
    for (index, given) in settings.iter().enumerate() {
        let expanded = match &given.preset {
            Some(name) => presets::preset(name).ok_or_else(|| RouteError {
                index,
                key: "preset",
                reason: format!("{name:?} is not one of {}", presets::NAMES.join(", ")),
            })?,
            None => vec![RouteSettings::default()],
        };
        let several = expanded.len() > 1;
        for (k, base) in expanded.iter().enumerate() {
            let mut merged = given.over(base);
            if several && given.name.is_some() {
                merged.name = Some(format!("{}-{}", given.name.as_deref().unwrap_or(""), k + 1));
            } else if several {
                merged.name.clone_from(&base.name);
            }
            routes.push(one(index, &merged)?);
        }
    }
    let mut names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(RouteError {
            index: 0,
            key: "name",
            reason: format!("two routes are named {:?}", w[0]),
        });
    }
    Ok(routes)
}

fn one(index: usize, s: &RouteSettings) -> Result<Route, RouteError> {
    // Long: one check per key, in the order of the settings, each naming it.
    let fault = |key: &'static str, reason: String| RouteError { index, key, reason };
    let topic = s
        .topic
        .as_deref()
        .ok_or_else(|| fault("topic", "is required (or a preset)".to_owned()))?;
    let pattern = Pattern::parse(topic).map_err(|r| fault("topic", format!("{topic:?} {r}")))?;
    // What the broker must take as a filter: not a `$` topic (`$share/`
    // is `mqtt.shared_group`'s), no NUL, within MQTT's length.
    let filter = pattern.filter();
    if topic.starts_with('$')
        || !rumqttc::valid_filter(&filter)
        || filter.contains('\0')
        || filter.len() > 65_535
    {
        return Err(fault(
            "topic",
            format!(
                "{topic:?} is not a filter the broker takes (a `$` topic, a NUL, or too long); shared subscriptions are mqtt.shared_group's"
            ),
        ));
    }
    let captures: Vec<&str> = pattern.captures().collect();
    let ignore = s
        .ignore
        .iter()
        .flatten()
        .map(|p| Pattern::parse(p).map_err(|r| fault("ignore", format!("{p:?} {r}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let payload = s.payload.unwrap_or_default();
    let source =
        |key: &'static str, text: &str, field_allowed: bool| -> Result<Source, RouteError> {
            if let Some(pointer) = text.strip_prefix("field:") {
                check_pointer(pointer).map_err(|r| fault(key, r))?;
                return Ok(Source::Field(pointer.to_owned()));
            }
            let parts = template(text).map_err(|r| fault(key, format!("{text:?} {r}")))?;
            for part in &parts {
                if let Part::Capture(name) = part
                    && !captures.contains(&name.as_str())
                    && !(field_allowed && name == "field")
                {
                    return Err(fault(
                        key,
                        format!("names {{{name}}}, which the topic does not capture"),
                    ));
                }
            }
            Ok(Source::Template(parts))
        };
    let sensor_text = s.sensor.clone().unwrap_or_else(|| "{sensor}".to_owned());
    let sensor = source("sensor", &sensor_text, false)?;
    let sensor_levels = matches!(&sensor, Source::Template(parts) if parts.iter().any(
        |p| matches!(p, Part::Capture(c) if pattern.is_multi_level(c))
    ));
    let json_objects = matches!(payload, Payload::Json | Payload::Auto);
    let default_metric = if captures.contains(&"metric") {
        "{metric}"
    } else if json_objects {
        "{field}"
    } else {
        "value"
    };
    let metric_text = s
        .metric
        .clone()
        .unwrap_or_else(|| default_metric.to_owned());
    let metric = source("metric", &metric_text, json_objects)?;
    let pointer = s.pointer.clone().unwrap_or_default();
    check_pointer(&pointer).map_err(|r| fault("pointer", r))?;
    let globs =
        |key: &'static str, xs: &Option<Vec<String>>| -> Result<Vec<WildMatch>, RouteError> {
            xs.iter()
                .flatten()
                .map(|x| {
                    if x.is_empty() {
                        Err(fault(key, "holds an empty name".to_owned()))
                    } else {
                        Ok(WildMatch::new(x))
                    }
                })
                .collect()
        };
    let mut states: HashMap<String, f64> = DEFAULT_STATES
        .iter()
        .map(|&(w, v)| (w.to_owned(), v))
        .collect();
    for (word, value) in s.states.iter().flatten() {
        if !value.is_finite() {
            return Err(fault("states", format!("{word:?} is not a finite number")));
        }
        states.insert(word.to_lowercase(), *value);
    }
    let ts_format = s.ts_format.unwrap_or_default();
    let timezone = match &s.timezone {
        Some(name) => Some(
            jiff::tz::TimeZone::get(name)
                .map_err(|e| fault("timezone", format!("{name:?}: {e}")))?,
        ),
        None if ts_format == TsFormat::Local => {
            return Err(fault(
                "timezone",
                "is required with ts_format = \"local\"".to_owned(),
            ));
        }
        None => None,
    };
    let ts = match &s.ts {
        Some(t) => {
            let pointer = t
                .strip_prefix("field:")
                .ok_or_else(|| fault("ts", format!("{t:?} is not field:<JSON pointer>")))?;
            check_pointer(pointer).map_err(|r| fault("ts", r))?;
            Some(pointer.to_owned())
        }
        None => None,
    };
    let labels = route_labels(s, &source).map_err(|r| fault("labels", r))?;
    let name = s.name.clone().unwrap_or_else(|| format!("route {index}"));
    if name.is_empty() || name.len() > 64 {
        return Err(fault("name", "must be 1 to 64 characters".to_owned()));
    }
    Ok(Route {
        index,
        name,
        pattern,
        ignore,
        payload,
        sensor,
        sensor_levels,
        metric,
        pointer,
        separator: s.separator.clone().unwrap_or_else(|| "_".to_owned()),
        include: globs("include", &s.include)?,
        exclude: globs("exclude", &s.exclude)?,
        states,
        skip_values: s
            .skip_values
            .clone()
            .unwrap_or_else(|| DEFAULT_SKIP.iter().map(|&w| w.to_owned()).collect())
            .iter()
            .map(|w| w.to_lowercase())
            .collect(),
        ts,
        ts_format,
        timezone,
        labels,
    })
}

/// The route's labels: valid names, templates of its captures, pointers.
fn route_labels(
    s: &RouteSettings,
    source: &dyn Fn(&'static str, &str, bool) -> Result<Source, RouteError>,
) -> Result<Vec<(String, Source)>, String> {
    use crate::domain::{MAX_LABELS, valid_label_name, valid_label_value};
    let given = s.labels.iter().flatten();
    if given.clone().count() > MAX_LABELS {
        return Err(format!("at most {MAX_LABELS} labels"));
    }
    let mut labels = Vec::new();
    for (name, text) in given {
        if !valid_label_name(name) {
            return Err(format!(
                "{name:?} is not a label name (A-Z a-z 0-9 _, not starting with a digit or __, not \"sensor\")"
            ));
        }
        let compiled =
            source("labels", text, false).map_err(|e| format!("{name}: {}", e.reason))?;
        if let Source::Template(parts) = &compiled
            && parts.iter().all(|p| matches!(p, Part::Text(_)))
            && !valid_label_value(text)
        {
            return Err(format!(
                "{name}: {text:?} is not a label value (1 to 128 bytes, no control characters)"
            ));
        }
        labels.push((name.clone(), compiled));
    }
    Ok(labels)
}

/// A JSON pointer: empty, or `/`-separated tokens.
fn check_pointer(p: &str) -> Result<(), String> {
    if p.is_empty() || p.starts_with('/') {
        Ok(())
    } else {
        Err(format!(
            "{p:?} is not a JSON pointer (empty, or starting with `/`)"
        ))
    }
}

/// `text` as literal parts and `{capture}`s.
fn template(text: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Part::Text(rest[..open].to_owned()));
        }
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| "has a `{` without its `}`".to_owned())?;
        let name = &rest[open + 1..open + close];
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("has a placeholder {{{name}}} that is not a name"));
        }
        parts.push(Part::Capture(name.to_owned()));
        rest = &rest[open + close + 1..];
    }
    if rest.contains('}') {
        return Err("has a `}` without its `{`".to_owned());
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest.to_owned()));
    }
    if parts.is_empty() {
        return Err("is empty".to_owned());
    }
    Ok(parts)
}

impl Route {
    /// Whether this route takes `topic`; `Some(false)` if it ignores it.
    pub fn takes<'p, 't>(
        &'p self,
        topic: &'t str,
        caps: &mut Vec<(&'p str, &'t str)>,
    ) -> Option<bool> {
        if !self.pattern.matches(topic, caps) {
            return None;
        }
        let mut scratch = Vec::new();
        let ignored = self.ignore.iter().any(|p| p.matches(topic, &mut scratch));
        Some(!ignored)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(toml_text: &str) -> Result<Vec<Route>, RouteError> {
        let s: RouteSettings = figment::Figment::from(figment::providers::Serialized::defaults(
            RouteSettings::default(),
        ))
        .merge(<figment::providers::Toml as figment::providers::Format>::string(toml_text))
        .extract()
        .expect("parses");
        compile(&[s])
    }

    #[test]
    fn every_preset_compiles() {
        for name in presets::NAMES {
            let s = RouteSettings {
                preset: Some((*name).to_owned()),
                ..RouteSettings::default()
            };
            let routes = compile(&[s]).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!routes.is_empty());
        }
    }

    #[test]
    fn faults_name_the_key() {
        let fault = |t: &str| route(t).expect_err("refused").to_string();
        assert!(fault("topic = \"a/#/b\"").contains("mqtt.routes[0].topic"));
        assert!(fault("topic = \"a/{x}\"\nsensor = \"{y}\"").contains("mqtt.routes[0].sensor"));
        assert!(
            fault("topic = \"a/{sensor}\"\npointer = \"x\"").contains("mqtt.routes[0].pointer")
        );
        assert!(
            fault("topic = \"a/{sensor}\"\nts_format = \"local\"")
                .contains("mqtt.routes[0].timezone")
        );
        assert!(
            fault("topic = \"a/{sensor}\"\ntimezone = \"Mars/Base\"")
                .contains("mqtt.routes[0].timezone")
        );
        assert!(fault("preset = \"nope\"").contains("mqtt.routes[0].preset"));
        assert!(fault("sensor = \"x\"").contains("mqtt.routes[0].topic"));
        assert!(fault("topic = \"a/{sensor}\"\nts = \"Time\"").contains("mqtt.routes[0].ts"));
        assert!(
            fault("topic = \"a/{sensor}\"\npayload = \"number\"\nmetric = \"{field}\"")
                .contains("metric")
        );
    }

    #[test]
    fn templates_are_text_and_captures() {
        assert_eq!(
            template("{domain}.{entity}").expect("valid"),
            vec![
                Part::Capture("domain".into()),
                Part::Text(".".into()),
                Part::Capture("entity".into())
            ]
        );
        for bad in ["", "{", "}", "{a", "a}", "{}", "{a b}"] {
            assert!(template(bad).is_err(), "{bad}");
        }
    }
}

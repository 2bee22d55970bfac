//! `[[mqtt.routes]]`: how a topic and its payload become readings. Every
//! key is optional so that a route may be a preset with a few keys changed;
//! `route` checks what results.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouteSettings {
    /// Shown in logs, metrics and dead letters; the preset's name, or
    /// `route <n>`, by default.
    pub name: Option<String>,
    /// A route written in the book (`zigbee2mqtt`, `tasmota`, `shelly-gen2`,
    /// `esphome`, `home-assistant-statestream`, `the-things-stack`); the
    /// keys given here change it.
    pub preset: Option<String>,
    /// The topic pattern: an MQTT filter whose levels may be `{name}` (one
    /// level, captured) or `{name#}` (one level or more).
    pub topic: Option<String>,
    /// Topics the pattern matches that hold no readings (availability,
    /// commands): taken and dropped, not dead-lettered.
    pub ignore: Option<Vec<String>>,
    /// `auto` (JSON if it starts with `{` or `[`, else a number or a state
    /// word), `number`, `state` or `json`.
    pub payload: Option<Payload>,
    /// The sensor: a template of captures (`{sensor}`, `{a}-{b}`), a fixed
    /// id, or `field:<JSON pointer>`.
    pub sensor: Option<String>,
    /// The metric: like `sensor`; for a JSON object, `{field}` is each
    /// field's name (nested names joined by `separator`), the default.
    pub metric: Option<String>,
    /// Where in a JSON payload the readings are (a JSON pointer; the whole
    /// payload by default).
    pub pointer: Option<String>,
    /// Joins the names of nested objects' fields (and array indexes).
    pub separator: Option<String>,
    /// Only these fields (names after joining; `*` and `?` match).
    pub include: Option<Vec<String>>,
    /// Not these fields (as `include`).
    pub exclude: Option<Vec<String>>,
    /// State words and their values, added to the defaults (`on`/`off`,
    /// `true`/`false`, `open`/`closed`, `yes`/`no` as 1/0); case is ignored.
    pub states: Option<BTreeMap<String, f64>>,
    /// Payload words that carry no reading (`unavailable`, `unknown`,
    /// `none`, `null` by default): taken and dropped.
    pub skip_values: Option<Vec<String>>,
    /// The reading's time: `field:<JSON pointer>`, or the time of receipt
    /// when absent (or when the field is).
    pub ts: Option<String>,
    /// How that field counts: `auto` (RFC 3339, or epoch seconds, ms, µs or
    /// ns by size), `rfc3339`, `epoch_s`, `epoch_ms`, `epoch_us`, `local`.
    pub ts_format: Option<TsFormat>,
    /// The zone of a `local` time (an IANA name, e.g. `Europe/Berlin`).
    pub timezone: Option<String>,
    /// The sensor's labels: each a template of captures (`{site}`), a fixed
    /// value, or `field:<JSON pointer>` (a string, number or boolean; a
    /// label whose field is absent or not a valid value is left out).
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Payload {
    #[default]
    Auto,
    Number,
    State,
    Json,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TsFormat {
    #[default]
    Auto,
    Rfc3339,
    EpochS,
    EpochMs,
    EpochUs,
    Local,
}

impl RouteSettings {
    /// `self` over `base`: each key given here wins.
    pub fn over(&self, base: &RouteSettings) -> RouteSettings {
        macro_rules! pick {
            ($($k:ident),*) => { RouteSettings { $($k: self.$k.clone().or_else(|| base.$k.clone()),)* } };
        }
        pick!(
            name,
            preset,
            topic,
            ignore,
            payload,
            sensor,
            metric,
            pointer,
            separator,
            include,
            exclude,
            states,
            skip_values,
            ts,
            ts_format,
            timezone,
            labels
        )
    }
}

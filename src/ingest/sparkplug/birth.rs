//! Birth certificates: what an NBIRTH or DBIRTH defines (names, aliases,
//! datatypes, labels), kept across restarts, and how a message's metrics
//! resolve through it into readings.

use std::collections::HashMap;
use std::sync::Arc;

use srad_types::payload::{Metric, Payload};

use super::payload::{Number, Topic, metric_name, number};
use crate::domain::TimeWindow;

/// One stored reading, owned (the message's payload is gone by then).
#[derive(Debug, Clone, PartialEq)]
pub struct Out {
    /// Shared by the readings of one message (and the metric by a birth's).
    pub sensor: Arc<str>,
    pub metric: Arc<str>,
    /// Epoch seconds.
    pub ts: i64,
    pub value: f64,
}

/// Metrics not stored, by why.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Skipped {
    /// Strings, bytes, data sets, templates, files, arrays.
    pub not_numeric: u64,
    pub null: u64,
    pub transient: u64,
    /// `Node Control/*`, `bdSeq` and `Properties/*`: the protocol's own.
    pub control: u64,
    /// 64-bit integers beyond 2^53, stored rounded.
    pub rounded: u64,
}

/// A birth certificate: enough to resolve aliases after a restart.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Birth {
    pub group: String,
    pub node: String,
    pub device: Option<String>,
    pub bd_seq: Option<u64>,
    /// `(alias, Sparkplug name, datatype)`.
    pub metrics: Vec<(Option<u64>, String, u32)>,
}

/// A metric a birth defined, with its Hourglass name mapped once.
#[derive(Debug)]
pub(super) struct Def {
    pub(super) name: String,
    pub(super) datatype: u32,
    /// `None` when the name does not map to a metric name.
    pub(super) metric: Option<Arc<str>>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Table {
    pub(super) by_alias: HashMap<u64, Arc<Def>>,
    pub(super) by_name: HashMap<String, Arc<Def>>,
}

impl Table {
    pub(super) fn of(metrics: &[(Option<u64>, String, u32)]) -> Self {
        let mut t = Table::default();
        for (alias, name, datatype) in metrics {
            let def = Arc::new(Def {
                name: name.clone(),
                datatype: *datatype,
                metric: metric_name(name).map(Arc::from),
            });
            if let Some(a) = alias {
                t.by_alias.insert(*a, def.clone());
            }
            t.by_name.insert(name.clone(), def);
        }
        t
    }
}

/// Names that are Sparkplug's bookkeeping, not process data.
pub(super) fn is_control(name: &str) -> bool {
    name == "bdSeq" || name.starts_with("Node Control/") || name.starts_with("Properties/")
}

pub(super) fn bd_seq_of(payload: &Payload) -> Option<u64> {
    payload
        .metrics
        .iter()
        .find(|m| m.name.as_deref() == Some("bdSeq"))
        .and_then(|m| match m.value {
            Some(srad_types::payload::metric::Value::LongValue(v)) => Some(v),
            Some(srad_types::payload::metric::Value::IntValue(v)) => Some(u64::from(v)),
            _ => None,
        })
}

impl Birth {
    /// Where it is kept: `sparkplug/<group>/<edge node>[/<device>]`.
    pub fn id(&self) -> String {
        match &self.device {
            Some(d) => format!("{}{}/{}/{d}", BIRTH_PREFIX, self.group, self.node),
            None => format!("{}{}/{}", BIRTH_PREFIX, self.group, self.node),
        }
    }
}

/// The prefix of stored births' ids.
pub const BIRTH_PREFIX: &str = "sparkplug/";

/// The registry labels of a birth: the Sparkplug ids, and with
/// `properties` the birth's `Properties/<name>` strings as `<name>` labels.
pub(super) fn labels(
    topic: &Topic<'_>,
    payload: &Payload,
    properties: bool,
) -> Vec<(String, String)> {
    use crate::domain::{valid_label_name, valid_label_value};
    let mut l = vec![
        ("group".to_owned(), topic.group.to_owned()),
        ("edge_node".to_owned(), topic.node.to_owned()),
    ];
    if let Some(d) = topic.device {
        l.push(("device".to_owned(), d.to_owned()));
    }
    if properties {
        for m in &payload.metrics {
            let (Some(name), Some(srad_types::payload::metric::Value::StringValue(v))) =
                (&m.name, &m.value)
            else {
                continue;
            };
            let Some(key) = name.strip_prefix("Properties/") else {
                continue;
            };
            let key: String = key
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            if l.len() < crate::domain::MAX_LABELS
                && valid_label_name(&key)
                && valid_label_value(v)
                && !l.iter().any(|(k, _)| *k == key)
            {
                l.push((key, v.clone()));
            }
        }
    }
    l
}

pub(super) fn definitions(payload: &Payload) -> Vec<(Option<u64>, String, u32)> {
    payload
        .metrics
        .iter()
        .filter_map(|m| Some((m.alias, m.name.clone()?, m.datatype.unwrap_or(0))))
        .collect()
}

pub(super) enum Refusal {
    UnknownAlias(String),
    Invalid(String),
}

pub(super) fn readings(
    table: &Table,
    sensor: &str,
    payload: &Payload,
    now_ms: u64,
    window: &TimeWindow,
    skipped: &mut Skipped,
) -> Result<Vec<Out>, Refusal> {
    let now_s = (now_ms / 1000) as i64;
    let sensor: Arc<str> = Arc::from(sensor);
    let mut out = Vec::with_capacity(payload.metrics.len());
    for (i, m) in payload.metrics.iter().enumerate() {
        let def = resolve(table, m).ok_or_else(|| {
            Refusal::UnknownAlias(format!(
                "metric {i}: {} is not in the birth certificate",
                match (&m.name, m.alias) {
                    (Some(n), _) => format!("name {n:?}"),
                    (None, Some(a)) => format!("alias {a}"),
                    (None, None) => "a metric without name or alias".to_owned(),
                }
            ))
        })?;
        let name = def.name.as_str();
        if is_control(name) {
            skipped.control += 1;
            continue;
        }
        if m.is_null == Some(true) {
            skipped.null += 1;
            continue;
        }
        if m.is_transient == Some(true) {
            skipped.transient += 1;
            continue;
        }
        let datatype = m.datatype.unwrap_or(def.datatype);
        let value = match number(datatype, m.value.as_ref()) {
            Number::Exact(v) => v,
            Number::Rounded(v) => {
                skipped.rounded += 1;
                v
            }
            Number::NotNumeric => {
                skipped.not_numeric += 1;
                continue;
            }
            Number::Mismatch => {
                return Err(Refusal::Invalid(format!(
                    "metric {i} ({name}): the value does not match datatype {datatype}"
                )));
            }
        };
        let metric = def.metric.clone().ok_or_else(|| {
            Refusal::Invalid(format!(
                "metric {i}: {name:?} does not map to a metric name of at most 64 characters"
            ))
        })?;
        let ms = m.timestamp.or(payload.timestamp).unwrap_or(now_ms);
        let ts = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
        window
            .check(ts, now_s)
            .map_err(|e| Refusal::Invalid(format!("metric {i} ({name}): {e}")))?;
        out.push(Out {
            sensor: sensor.clone(),
            metric,
            ts,
            value,
        });
    }
    Ok(out)
}

pub(super) fn resolve<'t>(table: &'t Table, m: &Metric) -> Option<&'t Def> {
    match (&m.name, m.alias) {
        (Some(n), _) if table.by_name.contains_key(n) => table.by_name.get(n).map(|d| &**d),
        (_, Some(a)) => table.by_alias.get(&a).map(|d| &**d),
        _ => None,
    }
}

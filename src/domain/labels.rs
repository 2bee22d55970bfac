//! A sensor's labels: its metadata (`site`, `type`, …), validated so that a
//! name is safe as a document field and as a Prometheus label.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::SensorId;

pub const MAX_LABELS: usize = 32;
pub const LABEL_NAME_MAX_LEN: usize = 64;
pub const LABEL_VALUE_MAX_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLabels {
    #[error("a sensor has at most {MAX_LABELS} labels")]
    TooMany,
    #[error(
        "label name {0:?} must be 1 to {LABEL_NAME_MAX_LEN} characters of A-Z a-z 0-9 _, not start with a digit or __, and not be \"sensor\""
    )]
    Name(String),
    #[error(
        "the value of label {0:?} must be 1 to {LABEL_VALUE_MAX_LEN} bytes without control or invisible formatting characters"
    )]
    Value(String),
    #[error("label {0:?} is repeated")]
    Repeated(String),
}

/// Checks a label name: Prometheus' label syntax, minus the reserved names.
pub fn valid_label_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= LABEL_NAME_MAX_LEN
        && !b[0].is_ascii_digit()
        && !name.starts_with("__")
        && name != "sensor"
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

pub fn valid_label_value(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= LABEL_VALUE_MAX_LEN
        && !value.chars().any(|c| c.is_control() || invisible(c))
}

/// Characters that change how text reads without showing (bidirectional
/// overrides, zero-width spaces, line separators): a label shown in the
/// console or a dashboard must read as what it is.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
}

/// A validated set of labels, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Labels(BTreeMap<String, String>);

impl Labels {
    pub fn parse(labels: BTreeMap<String, String>) -> Result<Self, InvalidLabels> {
        if labels.len() > MAX_LABELS {
            return Err(InvalidLabels::TooMany);
        }
        for (name, value) in &labels {
            if !valid_label_name(name) {
                return Err(InvalidLabels::Name(name.clone()));
            }
            if !valid_label_value(value) {
                return Err(InvalidLabels::Value(name.clone()));
            }
        }
        Ok(Self(labels))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Labels offered for one sensor: the only thing the registry's label
/// merges take, so every path (line-protocol tags over HTTP and MQTT,
/// Sparkplug births and presence) validates them the same way, once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SensorLabels<'a> {
    sensor: SensorId<'a>,
    labels: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

impl<'a> SensorLabels<'a> {
    /// `labels` for `sensor`, if each name and value is valid, no name
    /// repeats and there are at most [`MAX_LABELS`].
    pub fn new(
        sensor: SensorId<'a>,
        labels: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    ) -> Result<Self, InvalidLabels> {
        if labels.len() > MAX_LABELS {
            return Err(InvalidLabels::TooMany);
        }
        for (i, (name, value)) in labels.iter().enumerate() {
            if !valid_label_name(name) {
                return Err(InvalidLabels::Name(name.clone().into_owned()));
            }
            if labels[..i].iter().any(|(other, _)| other == name) {
                return Err(InvalidLabels::Repeated(name.clone().into_owned()));
            }
            if !valid_label_value(value) {
                return Err(InvalidLabels::Value(name.clone().into_owned()));
            }
        }
        Ok(Self { sensor, labels })
    }

    pub fn sensor(&self) -> &SensorId<'a> {
        &self.sensor
    }

    pub fn labels(&self) -> &[(Cow<'a, str>, Cow<'a, str>)] {
        &self.labels
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn into_owned(self) -> SensorLabels<'static> {
        SensorLabels {
            sensor: self.sensor.into_owned(),
            labels: self
                .labels
                .into_iter()
                .map(|(k, v)| (Cow::Owned(k.into_owned()), Cow::Owned(v.into_owned())))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str, value: &str) -> Result<Labels, InvalidLabels> {
        Labels::parse(BTreeMap::from([(name.to_owned(), value.to_owned())]))
    }

    #[test]
    fn label_names_are_prometheus_names_minus_the_reserved_ones() {
        for good in ["site", "_x", "Type2", &"a".repeat(LABEL_NAME_MAX_LEN)] {
            assert!(one(good, "v").is_ok(), "{good}");
        }
        for bad in [
            "",
            "2x",
            "a.b",
            "a-b",
            "$set",
            "__name__",
            "sensor",
            "ü",
            &"a".repeat(LABEL_NAME_MAX_LEN + 1),
        ] {
            assert!(
                matches!(one(bad, "v"), Err(InvalidLabels::Name(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn label_values_are_bounded_printable_text() {
        assert!(one("site", "Berlin Mitte, Halle 2").is_ok());
        assert!(one("site", "x".repeat(LABEL_VALUE_MAX_LEN).as_str()).is_ok());
        assert!(one("site", "Zürich Hallenstadion, 東京").is_ok());
        for bad in [
            "",
            "a\nb",
            &"x".repeat(LABEL_VALUE_MAX_LEN + 1),
            // Reads as "evilexe.png", and an invisible space.
            "evil\u{202E}gnp.exe",
            "a\u{200B}b",
            "a\u{2028}b",
        ] {
            assert!(matches!(one("site", bad), Err(InvalidLabels::Value(_))));
        }
        let many = (0..=MAX_LABELS).map(|i| (format!("l{i}"), "v".to_owned()));
        assert_eq!(Labels::parse(many.collect()), Err(InvalidLabels::TooMany));
    }
}

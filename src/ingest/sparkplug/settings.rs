//! `[mqtt.sparkplug]`: Hourglass as a Sparkplug B host application.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, invalid};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub enabled: bool,
    /// Sparkplug groups to subscribe to; empty means every group.
    pub groups: Vec<String>,
    /// Sensor id of a device's metrics: `{group}`, `{edge_node}`, `{device}`.
    pub device_sensor: String,
    /// Sensor id of an edge node's own metrics: `{group}`, `{edge_node}`.
    pub node_sensor: String,
    /// How long a gap in an edge node's `seq` may stay open (the missing
    /// message may still arrive) before a rebirth is requested.
    #[serde(with = "humantime_serde")]
    pub reorder_timeout: Duration,
    /// At most one rebirth request per edge node within this time.
    #[serde(with = "humantime_serde")]
    pub rebirth_cooldown: Duration,
    /// Act as the Primary Host with this id: publish `spBv1.0/STATE/<id>`.
    pub primary_host_id: Option<String>,
    /// A birth's `Properties/<name>` string metrics become `<name>` labels.
    pub property_labels: bool,
    /// Edge nodes the host keeps state for: a birth from one more is
    /// dead-lettered (a buggy fleet minting node ids cannot grow it).
    pub max_edge_nodes: usize,
    /// Devices per edge node, likewise.
    pub max_devices_per_node: usize,
    /// Bytes of birth certificates (alias tables) the host keeps for all
    /// nodes and devices together: a birth past it is dead-lettered.
    pub max_state_bytes: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enabled: false,
            groups: Vec::new(),
            device_sensor: "{edge_node}.{device}".into(),
            node_sensor: "{edge_node}".into(),
            reorder_timeout: Duration::from_secs(2),
            rebirth_cooldown: Duration::from_secs(30),
            primary_host_id: None,
            property_labels: false,
            max_edge_nodes: 10_000,
            max_devices_per_node: 1_000,
            max_state_bytes: 256 * 1024 * 1024,
        }
    }
}

fn check_template(
    key: &'static str,
    template: &str,
    allowed: &[&str],
    required: &[&str],
) -> Result<(), Invalid> {
    // Long: one check per rule a template follows, each naming its key.
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| invalid(key, format!("{template:?} has an unclosed {{")))?;
        let name = &rest[open..open + close + 1];
        if !allowed.contains(&name) {
            return Err(invalid(
                key,
                format!(
                    "{template:?} uses {name}; it may use {}",
                    allowed.join(", ")
                ),
            ));
        }
        rest = &rest[open + close + 1..];
    }
    for r in required {
        if !template.contains(r) {
            return Err(invalid(key, format!("{template:?} must contain {r}")));
        }
    }
    Ok(())
}

fn topic_level(key: &'static str, s: &str) -> Result<(), Invalid> {
    if s.is_empty() || s.contains(['/', '+', '#']) {
        return Err(invalid(
            key,
            format!("{s:?} must be one topic level, without / + or #"),
        ));
    }
    Ok(())
}

impl Settings {
    pub fn validate(&self) -> Result<(), Invalid> {
        if !self.enabled {
            return Ok(());
        }
        check_template(
            "mqtt.sparkplug.device_sensor",
            &self.device_sensor,
            &["{group}", "{edge_node}", "{device}"],
            &["{edge_node}", "{device}"],
        )?;
        check_template(
            "mqtt.sparkplug.node_sensor",
            &self.node_sensor,
            &["{group}", "{edge_node}"],
            &["{edge_node}"],
        )?;
        for g in &self.groups {
            topic_level("mqtt.sparkplug.groups", g)?;
        }
        if let Some(id) = &self.primary_host_id {
            topic_level("mqtt.sparkplug.primary_host_id", id)?;
        }
        crate::settings::at_least_one(&[
            ("mqtt.sparkplug.max_edge_nodes", self.max_edge_nodes),
            (
                "mqtt.sparkplug.max_devices_per_node",
                self.max_devices_per_node,
            ),
            ("mqtt.sparkplug.max_state_bytes", self.max_state_bytes),
        ])?;
        if self.reorder_timeout.is_zero() {
            return Err(invalid(
                "mqtt.sparkplug.reorder_timeout",
                "must be more than 0",
            ));
        }
        Ok(())
    }

    /// The topic filters to subscribe to.
    pub fn filters(&self) -> Vec<String> {
        if self.groups.is_empty() {
            vec![format!("{}/+/#", super::payload::NAMESPACE)]
        } else {
            self.groups
                .iter()
                .map(|g| format!("{}/{g}/#", super::payload::NAMESPACE))
                .collect()
        }
    }

    /// The primary host's STATE topic, when it is one.
    pub fn state_topic(&self) -> Option<String> {
        self.primary_host_id
            .as_ref()
            .filter(|_| self.enabled)
            .map(|id| format!("{}/STATE/{id}", super::payload::NAMESPACE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_ids_are_checked_naming_the_key() {
        let ok = Settings {
            enabled: true,
            ..Settings::default()
        };
        ok.validate().expect("the defaults are valid");
        for (s, key) in [
            (
                Settings {
                    device_sensor: "{edge_node}".into(),
                    ..ok.clone()
                },
                "mqtt.sparkplug.device_sensor",
            ),
            (
                Settings {
                    node_sensor: "{node}".into(),
                    ..ok.clone()
                },
                "mqtt.sparkplug.node_sensor",
            ),
            (
                Settings {
                    groups: vec!["a/b".into()],
                    ..ok.clone()
                },
                "mqtt.sparkplug.groups",
            ),
            (
                Settings {
                    primary_host_id: Some("#".into()),
                    ..ok.clone()
                },
                "mqtt.sparkplug.primary_host_id",
            ),
        ] {
            let e = s.validate().expect_err("invalid").to_string();
            assert!(e.contains(key), "{e}");
        }
        assert_eq!(ok.filters(), vec!["spBv1.0/+/#"]);
    }
}

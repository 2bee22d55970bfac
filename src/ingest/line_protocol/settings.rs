//! `[line_protocol]`: how InfluxDB line protocol maps onto sensors and metrics.

use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, invalid};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// The sensor id is the value of the first of these tags a line has.
    pub sensor_tags: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            sensor_tags: ["sensor", "device", "host"].map(str::to_owned).to_vec(),
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.sensor_tags.is_empty() {
            return Err(invalid(
                "line_protocol.sensor_tags",
                "must name at least one tag",
            ));
        }
        for (i, tag) in self.sensor_tags.iter().enumerate() {
            if tag.is_empty() || tag.contains([' ', ',', '=', '\\', '"']) {
                return Err(invalid(
                    "line_protocol.sensor_tags",
                    format!("{tag:?} is not a tag key line protocol can carry unescaped"),
                ));
            }
            if self.sensor_tags[..i].contains(tag) {
                return Err(invalid(
                    "line_protocol.sensor_tags",
                    format!("{tag:?} is named twice"),
                ));
            }
        }
        Ok(())
    }
}

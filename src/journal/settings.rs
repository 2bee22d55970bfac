//! `[journal]`: where acknowledged readings wait for their bucket write.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, invalid};

pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Acknowledge once journaled (true) or once stored in MongoDB (false).
    pub enabled: bool,
    pub dir: PathBuf,
    /// Beyond this, input is refused (HTTP 503, MQTT pauses).
    pub max_bytes: u64,
    /// A segment is deleted once all its readings are stored, so smaller
    /// segments give disk space back sooner.
    pub segment_bytes: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enabled: true,
            dir: PathBuf::from("data/journal"),
            max_bytes: DEFAULT_MAX_BYTES,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), Invalid> {
        if !self.enabled {
            return Ok(());
        }
        if self.dir.as_os_str().is_empty() {
            return Err(invalid("journal.dir", "must name a directory"));
        }
        if self.segment_bytes < 4096 {
            return Err(invalid("journal.segment_bytes", "must be at least 4096"));
        }
        if self.max_bytes < self.segment_bytes.saturating_mul(2) {
            return Err(invalid(
                "journal.max_bytes",
                "must be at least twice journal.segment_bytes",
            ));
        }
        Ok(())
    }
}

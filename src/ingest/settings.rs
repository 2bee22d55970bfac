//! `[ingest]`: what any ingestor accepts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::decode::DecodeContext;
use crate::domain::TimeWindow;
use crate::settings::{Invalid, at_least_one};

pub const DEFAULT_MAX_FUTURE: Duration = Duration::from_secs(5 * 60);
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
pub const DEFAULT_MAX_READINGS_PER_REQUEST: usize = 50_000;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    #[serde(with = "humantime_serde")]
    pub max_future: Duration,
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    pub max_readings_per_request: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_future: DEFAULT_MAX_FUTURE,
            max_age: DEFAULT_MAX_AGE,
            max_readings_per_request: DEFAULT_MAX_READINGS_PER_REQUEST,
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), Invalid> {
        at_least_one(&[(
            "ingest.max_readings_per_request",
            self.max_readings_per_request,
        )])
    }

    /// How to decode input received at `now` (epoch seconds).
    pub fn decode_context(&self, now: i64) -> DecodeContext {
        DecodeContext {
            now,
            window: TimeWindow {
                max_age: self.max_age,
                max_future: self.max_future,
            },
            max_readings: self.max_readings_per_request,
        }
    }
}

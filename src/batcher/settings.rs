//! `[batcher]`: when batches close and how much memory they may hold.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::limits::{BatcherLimits, Hold};
use crate::settings::{Invalid, at_least_one, invalid, longer_than_zero};

pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_MAX_PENDING_READINGS: usize = 20_000;
pub const DEFAULT_MAX_BUFFERED_READINGS: usize = 2_000_000;
pub const DEFAULT_MAX_BUCKETS: usize = 100_000;
pub const DEFAULT_MAX_FLUSH_BUCKETS: usize = 10_000;
pub const DEFAULT_HOLD_GRACE: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    pub max_pending_readings: usize,
    pub max_buffered_readings: usize,
    /// Distinct buckets (sensor, metric, minute or hour) held at once.
    pub max_buckets: usize,
    /// Buckets one flush writes at most; more go out in the next flush at once.
    pub max_flush_buckets: usize,
    /// Journaled readings: wait this long after a bucket's window ends.
    #[serde(with = "humantime_serde")]
    pub hold_grace: Duration,
    /// Journaled readings: write a bucket at the latest this long after its
    /// first held reading.
    #[serde(with = "humantime_serde")]
    pub max_hold: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            max_pending_readings: DEFAULT_MAX_PENDING_READINGS,
            max_buffered_readings: DEFAULT_MAX_BUFFERED_READINGS,
            max_buckets: DEFAULT_MAX_BUCKETS,
            max_flush_buckets: DEFAULT_MAX_FLUSH_BUCKETS,
            hold_grace: DEFAULT_HOLD_GRACE,
            max_hold: DEFAULT_MAX_HOLD,
        }
    }
}

impl Settings {
    pub fn limits(&self) -> BatcherLimits {
        BatcherLimits {
            flush_interval: self.flush_interval,
            max_pending_readings: self.max_pending_readings,
            max_buffered_readings: self.max_buffered_readings,
            max_buckets: self.max_buckets,
            max_flush_buckets: self.max_flush_buckets,
            hold: Hold {
                grace: self.hold_grace,
                max_hold: self.max_hold,
            },
        }
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        at_least_one(&[
            ("batcher.max_pending_readings", self.max_pending_readings),
            ("batcher.max_buffered_readings", self.max_buffered_readings),
            ("batcher.max_buckets", self.max_buckets),
            ("batcher.max_flush_buckets", self.max_flush_buckets),
        ])?;
        longer_than_zero(&[
            ("batcher.flush_interval", self.flush_interval),
            ("batcher.max_hold", self.max_hold),
        ])?;
        if self.max_pending_readings > self.max_buffered_readings {
            return Err(invalid(
                "batcher.max_pending_readings",
                "must not exceed batcher.max_buffered_readings",
            ));
        }
        Ok(())
    }
}

//! When a batch closes, how long held readings wait, and how much the
//! batcher may hold.

use std::time::Duration;

/// When a batch closes and how much the batcher may hold.
#[derive(Debug, Clone, Copy)]
pub struct BatcherLimits {
    /// A batch closes this long after its first reading arrived.
    pub flush_interval: Duration,
    /// A batch closes as soon as it holds this many values.
    pub max_pending_readings: usize,
    /// Pending plus in-flight values never exceed this; beyond it input is refused.
    pub max_buffered_readings: usize,
    /// Distinct buckets pending plus in flight never exceed this: a flood of
    /// new sensor ids is refused instead of becoming a flood of documents.
    pub max_buckets: usize,
    /// Buckets one flush takes at most; the rest follow in the next flush, at
    /// once. A batch that grew during an outage goes out in several.
    pub max_flush_buckets: usize,
    /// How long held (journaled) readings wait.
    pub hold: Hold,
}

/// When a bucket of held readings is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// After the bucket's window ends, wait this long for late readings.
    pub grace: Duration,
    /// A bucket is written at the latest this long after its first held reading.
    pub max_hold: Duration,
}

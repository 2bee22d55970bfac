//! What the query planner asks of stored documents, and what comes back:
//! plain data, so the planner depends on the vocabulary and not on storage.

use super::{Agg, Granularity};

/// The length of a rollup document (see `store::rollup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Period {
    Hour,
    Day,
    /// Thirty days aligned to the epoch, not calendar months: a fixed length
    /// keeps every level a plain division of the one above, so the planner
    /// and the recomputation treat all levels alike; calendar months in any
    /// time zone are still exact, from these documents' days.
    Days30,
}

impl Period {
    pub const fn seconds(self) -> i64 {
        match self {
            Period::Hour => 3600,
            Period::Day => 86_400,
            Period::Days30 => 30 * 86_400,
        }
    }

    /// The value of a rollup's `period` field.
    pub const fn name(self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Days30 => "30d",
        }
    }

    /// The length of one sub-period `s.<n>`: minutes of an hour, hours of a
    /// day, days of thirty.
    pub const fn slot_seconds(self) -> i64 {
        match self {
            Period::Hour => 60,
            Period::Day => 3600,
            Period::Days30 => 86_400,
        }
    }

    /// The rollup levels kept for a bucket granularity, finest first.
    pub const fn levels(granularity: Granularity) -> &'static [Period] {
        match granularity {
            Granularity::Minute => &[Period::Hour, Period::Day, Period::Days30],
            Granularity::Hour => &[Period::Day, Period::Days30],
        }
    }
}

/// Which documents a read goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Buckets,
    Rollups(Period),
}

/// Which documents of one series to read, by start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Starts {
    /// Starts (epoch seconds) in `[from, to)`.
    Range(i64, i64),
    /// These starts.
    Only(Vec<i64>),
}

/// One rollup document as read back: which of its sub-periods are complete
/// (bit `k` of `complete`: slot `k` holds every reading of its span, or none
/// if it has no entry) and the slots that hold readings, sorted by start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RollupRead {
    /// Epoch seconds.
    pub start: i64,
    pub complete: u64,
    pub slots: Vec<super::Slot>,
}

impl RollupRead {
    pub fn is_complete(&self, k: u16) -> bool {
        k < 64 && self.complete & (1 << k) != 0
    }

    /// The slot starting at `start`, if it holds readings.
    pub fn slot(&self, start: i64) -> Option<&super::Slot> {
        self.slots
            .binary_search_by_key(&start, |s| s.start)
            .ok()
            .map(|i| &self.slots[i])
    }
}

/// What to read of each bucket's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    None,
    All,
    Minutes(Vec<u16>),
}

/// One bucket as read back: its aggregates and whatever parts were asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BucketRead {
    /// Epoch seconds.
    pub start: i64,
    pub agg: Agg,
    /// `(minute, aggregates)` of an hour bucket when asked for.
    pub slots: Vec<(u16, Agg)>,
    /// `(offset in seconds from start, value)` of a bucket when asked for.
    pub values: Vec<(u16, f64)>,
    /// The bucket's write count (`n`): what rollups computed from it carry.
    pub n: u64,
    /// `(offset in seconds, acknowledgement in epoch ms)` of the values that
    /// still keep a version (see docs/src/internals/last-write-wins.md), sorted;
    /// read when the values are.
    pub versions: Vec<(u16, i64)>,
}

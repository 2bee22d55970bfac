//! What the query planner asks of stored buckets, and what comes back: plain
//! data, so the planner depends on the vocabulary and not on storage.

use super::Agg;

/// Which buckets of one series to read.
#[derive(Debug, Clone)]
pub enum Starts {
    /// Bucket starts (epoch seconds) in `[from, to)`.
    Range(i64, i64),
    /// These bucket starts.
    Only(Vec<i64>),
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
    /// `(minute, aggregates)` for hour buckets when asked for.
    pub minutes: Vec<(u16, Agg)>,
    /// `(offset in seconds from start, value)` when asked for.
    pub values: Vec<(u16, f64)>,
}

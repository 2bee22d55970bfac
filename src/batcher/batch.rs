//! What the core takes and gives: the items and batches it hands to the
//! sink, how each bucket's write settles, what a writer is told, and the
//! values not stored yet that queries lay over storage.

use crate::domain::{BucketKey, BucketUpdate};

/// One series' buckets with readings not stored yet, sorted by start:
/// `(start, values)`.
pub type Unstored = Vec<(i64, Vec<UnstoredValue>)>;

/// `(offset in seconds, value, acknowledgement in epoch ms)`: the
/// acknowledgement decides against a version stored meanwhile by another
/// instance (see docs/src/internals/last-write-wins.md).
pub type UnstoredValue = (u16, f64, i64);

/// Values beside their acknowledgements (0, older than any, where an update
/// carries none).
pub fn with_acks(values: &[(u16, f64)], acks: &[i64]) -> Vec<UnstoredValue> {
    values
        .iter()
        .enumerate()
        .map(|(i, &(o, v))| (o, v, acks.get(i).copied().unwrap_or(0)))
        .collect()
}

/// The batcher is at a bound: the caller must refuse the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the batcher holds {held} {what} and takes at most {limit}")]
pub struct Full {
    /// `"readings"` or `"buckets"`.
    pub what: &'static str,
    pub held: usize,
    pub limit: usize,
}

/// Why readings a writer waited for are not all in their buckets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotStored {
    /// Storage can never apply these buckets' updates; their readings are in
    /// the dead-letter collection. The writer's other readings are stored.
    #[error("storage refused {} bucket(s); their readings are in the dead-letter collection", .0.len())]
    DeadLettered(Vec<BucketKey>),
    #[error("the service stopped before the readings could be stored")]
    Shutdown,
}

/// What a waiting writer is told once every bucket it touched is settled.
pub type FlushResult = Result<(), NotStored>;

/// How the write of one bucket ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Stored,
    /// Written to the dead-letter collection instead.
    DeadLettered,
    /// Neither: the shutdown deadline came first.
    Unstored,
}

/// One bucket's update in a batch, with the writers waiting on it.
#[derive(Debug)]
pub struct Item {
    pub update: BucketUpdate,
    /// Tickets of the writers whose readings are in this update.
    pub tickets: Vec<u64>,
    /// Readings that went into it, overwritten ones included.
    pub readings: usize,
    /// Of those, readings from the journal, per origin (journal segment).
    pub origins: Vec<(u64, u32)>,
}

impl Item {
    /// Readings that are in the journal: safe even if this write never happens.
    pub fn journaled(&self) -> usize {
        self.origins.iter().map(|&(_, n)| n as usize).sum()
    }
}

/// A closed batch, ready to be written.
#[derive(Debug)]
pub struct Batch {
    /// One item per bucket touched since the previous batch.
    pub items: Vec<Item>,
    /// Readings in the batch, overwritten ones included.
    pub readings: usize,
}

/// What the driver needs to know after an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered {
    /// The flush deadline changed or the batch is full: the driver must look again.
    pub wake_driver: bool,
}

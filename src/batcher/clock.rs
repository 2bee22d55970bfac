//! The acknowledgement clock: when this process accepted a reading, in epoch
//! milliseconds. Stored beside each value as its version (see
//! docs/src/internals/last-write-wins.md), so it never runs backwards within a process even if
//! the wall clock does.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::SystemTime;

static LAST: AtomicI64 = AtomicI64::new(0);

/// The wall clock now, in epoch milliseconds.
pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// An acknowledgement time: the wall clock, or the last one handed out if
/// the wall clock went back.
pub fn ack_ms() -> i64 {
    let now = unix_ms();
    let previous = LAST.fetch_max(now, Ordering::AcqRel);
    previous.max(now)
}

/// What this instance knows of acknowledgements still unstored anywhere,
/// which decides whether a stored value keeps its version: one acknowledged
/// before every reading still unstored can never be overwritten by an older
/// one, so it needs none.
#[derive(Debug)]
pub struct Watermarks {
    /// The earliest floor the other instances published (`i64::MIN` until
    /// read: everything keeps its version).
    others: AtomicI64,
    /// The earliest acknowledgement of this instance's journal not yet
    /// handed to the batcher (`i64::MAX`: none).
    backlog: AtomicI64,
}

impl Default for Watermarks {
    fn default() -> Self {
        Self {
            others: AtomicI64::new(i64::MIN),
            backlog: AtomicI64::new(i64::MAX),
        }
    }
}

impl Watermarks {
    /// Values acknowledged at or after this keep their version.
    pub fn keep_from(&self) -> i64 {
        self.others
            .load(Ordering::Acquire)
            .min(self.backlog.load(Ordering::Acquire))
    }

    pub fn set_others(&self, floor: i64) {
        self.others.store(floor, Ordering::Release);
    }

    pub fn others(&self) -> i64 {
        self.others.load(Ordering::Acquire)
    }

    pub fn set_backlog(&self, floor: i64) {
        self.backlog.store(floor, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledgement_times_never_go_back() {
        let mut last = ack_ms();
        for _ in 0..1000 {
            let t = ack_ms();
            assert!(t >= last);
            last = t;
        }
        assert!(last >= unix_ms() - 1000);
    }
}

//! The levels a query reads, coarsest first; what one series asks of one
//! of them, and how it is read: runs of consecutive documents as index
//! ranges, the rest as lists.

use crate::domain::{Granularity, Level, Period, Starts, Values};

/// What one series asks of one level.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    pub level: Level,
    /// Document starts, sorted.
    pub starts: Vec<i64>,
    /// Buckets: which values to read.
    pub values: Values,
    /// Hour buckets: read the minute aggregates `m`.
    pub minutes: bool,
}

/// Consecutive starts, this many or more, are read as an index range.
const MIN_RUN: usize = 4;
/// At most this many ranges a level; the other starts are read as lists.
const MAX_RUNS: usize = 4;
/// Starts in one list.
const MAX_LISTED: usize = 1000;

impl Ask {
    /// The reads of the starts, `len` apart: long runs of consecutive ones
    /// as index ranges, the rest as lists (a server answers a long `$in`
    /// slowly, and a range with gaps reads documents nobody asked for).
    pub fn reads(&self, len: i64) -> Vec<Starts> {
        let len = len.max(1);
        let mut runs: Vec<(i64, i64, usize)> = Vec::new();
        for &s in &self.starts {
            match runs.last_mut() {
                Some((_, end, n)) if s == *end => {
                    *end = s + len;
                    *n += 1;
                }
                _ => runs.push((s, s + len, 1)),
            }
        }
        let mut long: Vec<(i64, i64, usize)> =
            runs.iter().copied().filter(|r| r.2 >= MIN_RUN).collect();
        long.sort_by_key(|r| std::cmp::Reverse(r.2));
        long.truncate(MAX_RUNS);
        long.sort_by_key(|r| r.0);
        let in_long = |s: i64| long.iter().any(|&(a, b, _)| s >= a && s < b);
        let rest: Vec<i64> = self
            .starts
            .iter()
            .copied()
            .filter(|&s| !in_long(s))
            .collect();
        let mut reads: Vec<Starts> = long.iter().map(|&(a, b, _)| Starts::Range(a, b)).collect();
        reads.extend(rest.chunks(MAX_LISTED).map(|c| Starts::Only(c.to_vec())));
        reads
    }
}

/// One level: its documents' length and their slots'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tier {
    pub level: Level,
    pub len: i64,
    /// Rollups: the slot length. Hour buckets: a minute. Minute buckets: 0.
    pub slot: i64,
}

pub(super) fn tiers(granularity: Granularity) -> Vec<Tier> {
    let mut tiers: Vec<Tier> = Period::levels(granularity)
        .iter()
        .rev()
        .map(|&p| Tier {
            level: Level::Rollups(p),
            len: p.seconds(),
            slot: p.slot_seconds(),
        })
        .collect();
    tiers.push(Tier {
        level: Level::Buckets,
        len: granularity.seconds(),
        slot: match granularity {
            Granularity::Minute => 0,
            Granularity::Hour => 60,
        },
    });
    tiers
}

//! A results cache of closed periods, as VictoriaMetrics' rollup result
//! cache and the Thanos query frontend keep one: a dashboard's refresh reads
//! only its open tail and what changed since.
//!
//! **What is kept**: the answer of a grid cell of one series (a count, sum,
//! min and max, or a summary; never the readings themselves), keyed by the
//! series, what was asked and the cell's stored seconds `[from, to)`. Only
//! *closed* cells: they end at least an hour before the current one began,
//! no reading of them is held unstored by this instance and no marker says
//! a write reached them late, and they start after the retention horizon
//! (less a day), so no TTL deletion can change them unseen.
//!
//! **Exact by construction**: every write that reaches a closed period
//! leaves a late marker (`store::rollup::late`), and with it an entry in the shared
//! change log (`store::changes`), as does every delete (which marks its
//! hours) and every rebuild of the rollups. Before a query uses the cache it
//! reads the log's counter and applies every entry since the last one it
//! applied, dropping what each touched, on every instance alike. An entry
//! not readable yet (its counter taken, its document not written) stops
//! the cache for that query; a log that no longer reaches back (its entries
//! expire after a day) empties it. A query keeps what it read only if no
//! change applied since its own look at the log touched it: a write landing
//! between its read and its keeping is dropped before it is kept, not after.
//!
//! A cell of an hour marked late is kept too: it was read from the buckets
//! (the truth, not the stale rollup), and any later write to that hour
//! leaves its own change entry, as every write into an ended hour does.
//!
//! **Bounded**: `query.cache_bytes`; the series used least recently go first.
//! The state is behind one mutex, held only for map operations.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use lru::LruCache;

use super::plan::{Cell, Need};

use crate::store::Change;

/// A series: sensor and metric.
type SeriesKey = (String, String);

/// The cells of one series.
#[derive(Debug, Default)]
struct Cells {
    by_range: BTreeMap<(u8, i64, i64), Cell>,
    bytes: usize,
}

#[derive(Debug)]
struct Inner {
    series: LruCache<SeriesKey, Cells>,
    bytes: usize,
    /// The last change applied (`-1`: none read yet: the cache is not used
    /// before its first sync).
    applied: i64,
    /// Since when (epoch seconds) the next entry has been missing.
    missing_since: Option<i64>,
    /// The last changes applied, consecutive, up to `applied`: what a query
    /// that looked at the log earlier drops from what it keeps.
    recent: VecDeque<Change>,
}

/// Changes remembered for queries that looked at the log before them.
const RECENT: usize = 256;
/// A remembered change naming more series counts as one of every series.
const RECENT_SERIES: usize = 64;

/// Counters for the metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub bytes: usize,
}

pub struct ResultCache {
    inner: Mutex<Inner>,
    max_bytes: usize,
    stats: Mutex<Stats>,
}

fn need_code(need: Need) -> Option<u8> {
    match need {
        Need::Aggregates => Some(0),
        Need::Summaries => Some(1),
        // Readings and sketches are not kept: a cell of them may be large.
        Need::Values | Need::Sketches => None,
    }
}

/// About the bytes a cell takes in the cache.
fn cell_bytes(series: &SeriesKey) -> usize {
    std::mem::size_of::<Cell>()
        + std::mem::size_of::<(u8, i64, i64)>()
        + 48
        + (series.0.len() + series.1.len()) / 8
}

/// The bytes of a series' entry beyond its cells.
const SERIES_BYTES: usize = 160;

/// The first second of the hour before the current one: cells ending at or
/// before it are closed (an hour of margin past the batcher's holds).
pub fn closed_before(now: i64) -> i64 {
    now - now.rem_euclid(3600) - 3600
}

impl ResultCache {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                series: LruCache::unbounded(),
                bytes: 0,
                applied: -1,
                missing_since: None,
                recent: VecDeque::new(),
            }),
            max_bytes,
            stats: Mutex::new(Stats::default()),
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn stats(&self) -> Stats {
        let mut s = *self.stats.lock().unwrap_or_else(|e| e.into_inner());
        s.bytes = self.inner().bytes;
        s
    }

    fn count(&self, hits: u64, misses: u64) {
        let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        s.hits += hits;
        s.misses += misses;
    }

    /// The last change applied; `-1` before the first.
    pub fn applied(&self) -> i64 {
        self.inner().applied
    }

    /// Applies the change log: its counter `now` and the entries after
    /// [`ResultCache::applied`] (`changes`, in any order), read at `at`
    /// (epoch seconds). Answers whether the cache is current (every change
    /// up to `now` applied). An entry whose counter is taken but whose
    /// document is not written yet is waited for; one missing for longer
    /// than [`MISSING_AFTER`] seconds has expired, and so has what it
    /// touched: the cache empties.
    pub fn sync(&self, now: i64, changes: &[Change], at: i64) -> bool {
        let mut inner = self.inner();
        if inner.applied < 0 || now < inner.applied {
            // First use, or a log that was reset: nothing kept is known good.
            reset(&mut inner, now);
            return true;
        }
        let mut sorted: Vec<&Change> = changes.iter().filter(|c| c.seq > inner.applied).collect();
        sorted.sort_by_key(|c| c.seq);
        for c in sorted {
            if c.seq != inner.applied + 1 {
                break;
            }
            invalidate(&mut inner, c);
            inner.applied = c.seq;
            inner.missing_since = None;
            if inner.recent.len() == RECENT {
                inner.recent.pop_front();
            }
            // Remembered in short: a change of many series as one of all.
            inner.recent.push_back(Change {
                seq: c.seq,
                series: c
                    .series
                    .as_ref()
                    .filter(|s| s.len() <= RECENT_SERIES)
                    .cloned(),
                from: c.from,
                to: c.to,
            });
        }
        if inner.applied >= now {
            inner.missing_since = None;
            return true;
        }
        match inner.missing_since {
            None => {
                inner.missing_since = Some(at);
                false
            }
            Some(since) if at - since > MISSING_AFTER => {
                reset(&mut inner, now);
                true
            }
            Some(_) => false,
        }
    }

    /// The cached cells of a series for `ranges` (each a cell's stored
    /// seconds), as far as they are cached from the first: stops at the
    /// first one missing.
    pub fn prefix(
        &self,
        sensor: &str,
        metric: &str,
        need: Need,
        ranges: &[(i64, i64)],
    ) -> Vec<Cell> {
        let Some(code) = need_code(need) else {
            return Vec::new();
        };
        let mut inner = self.inner();
        let key = (sensor.to_owned(), metric.to_owned());
        let mut out = Vec::new();
        if let Some(cells) = inner.series.get(&key) {
            for &(from, to) in ranges {
                match cells.by_range.get(&(code, from, to)) {
                    Some(c) => out.push(c.clone()),
                    None => break,
                }
            }
        }
        drop(inner);
        self.count(
            out.len() as u64,
            ranges.len().saturating_sub(out.len()) as u64,
        );
        out
    }

    /// Keeps `cells` (each with its stored seconds) of a series, read by a
    /// query that had applied the log up to `seen` ([`ResultCache::applied`]
    /// after its sync): cells a change applied since touched are not kept.
    pub fn put(
        &self,
        sensor: &str,
        metric: &str,
        need: Need,
        cells: &[((i64, i64), &Cell)],
        seen: i64,
    ) {
        let Some(code) = need_code(need) else {
            return;
        };
        if cells.is_empty() || self.max_bytes == 0 {
            return;
        }
        let key = (sensor.to_owned(), metric.to_owned());
        let each = cell_bytes(&key);
        let mut inner = self.inner();
        let Some(since) = changes_since(&inner, seen) else {
            return;
        };
        let cells: Vec<&((i64, i64), &Cell)> = cells
            .iter()
            .filter(|((from, to), _)| {
                !since.iter().any(|c| {
                    c.series.as_ref().is_none_or(|s| s.contains(&key))
                        && *from < c.to
                        && *to > c.from
                })
            })
            .collect();
        let mut added = 0;
        if !inner.series.contains(&key) {
            added += SERIES_BYTES;
        }
        {
            let entry = inner.series.get_or_insert_mut(key, || Cells {
                by_range: BTreeMap::new(),
                bytes: SERIES_BYTES,
            });
            for &&((from, to), cell) in &cells {
                let kept = Cell {
                    samples: Vec::new(),
                    ..cell.clone()
                };
                if entry.by_range.insert((code, from, to), kept).is_none() {
                    entry.bytes += each;
                    added += each;
                }
            }
        }
        inner.bytes += added;
        while inner.bytes > self.max_bytes {
            match inner.series.pop_lru() {
                Some((_, c)) => inner.bytes = inner.bytes.saturating_sub(c.bytes),
                None => break,
            }
        }
    }
}

/// The changes applied after `seen`, or `None` when they are not all
/// remembered (or the log was reset since): then nothing may be kept.
fn changes_since(inner: &Inner, seen: i64) -> Option<Vec<Change>> {
    if seen == inner.applied {
        return Some(Vec::new());
    }
    if seen > inner.applied || seen < 0 {
        return None;
    }
    let first = inner.recent.front()?.seq;
    if first > seen + 1 {
        return None;
    }
    Some(
        inner
            .recent
            .iter()
            .filter(|c| c.seq > seen)
            .cloned()
            .collect(),
    )
}

fn clear(inner: &mut Inner) {
    inner.series.clear();
    inner.bytes = 0;
}

fn reset(inner: &mut Inner, applied: i64) {
    clear(inner);
    inner.recent.clear();
    inner.applied = applied;
    inner.missing_since = None;
}

/// Seconds an entry of the change log may be missing (its counter taken,
/// its document not written) before it counts as expired.
pub const MISSING_AFTER: i64 = 60;

/// Drops the cells a change touched.
fn invalidate(inner: &mut Inner, c: &Change) {
    let Some(series) = &c.series else {
        clear(inner);
        return;
    };
    for key in series {
        let mut emptied = false;
        if let Some(cells) = inner.series.peek_mut(key) {
            let before = cells.bytes;
            let each = cell_bytes(key);
            cells
                .by_range
                .retain(|&(_, from, to), _| to <= c.from || from >= c.to);
            cells.bytes = SERIES_BYTES + cells.by_range.len() * each;
            let freed = before.saturating_sub(cells.bytes);
            emptied = cells.by_range.is_empty();
            inner.bytes = inner.bytes.saturating_sub(freed);
        }
        if emptied && let Some(c) = inner.series.pop(key) {
            inner.bytes = inner.bytes.saturating_sub(c.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Agg;

    fn cell(sum: f64) -> Cell {
        Cell {
            agg: Agg {
                count: 1,
                sum,
                min: sum,
                max: sum,
            },
            ..Cell::default()
        }
    }

    fn change(seq: i64, series: Option<&[(&str, &str)]>, from: i64, to: i64) -> Change {
        Change {
            seq,
            series: series.map(|s| {
                s.iter()
                    .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                    .collect()
            }),
            from,
            to,
        }
    }

    fn filled() -> ResultCache {
        let c = ResultCache::new(1 << 20);
        assert!(c.sync(5, &[], 0));
        let cells = [cell(1.0), cell(2.0), cell(3.0)];
        let ranges = [(0, 3600), (3600, 7200), (7200, 10_800)];
        let kept: Vec<((i64, i64), &Cell)> = ranges.iter().copied().zip(cells.iter()).collect();
        c.put("s", "m", Need::Aggregates, &kept, c.applied());
        c
    }

    #[test]
    fn a_prefix_is_answered_up_to_the_first_cell_missing() {
        let c = filled();
        let got = c.prefix(
            "s",
            "m",
            Need::Aggregates,
            &[(0, 3600), (3600, 7200), (9000, 9999)],
        );
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].agg.sum, 2.0);
        assert!(c.prefix("s", "m", Need::Summaries, &[(0, 3600)]).is_empty());
        assert!(
            c.prefix("other", "m", Need::Aggregates, &[(0, 3600)])
                .is_empty()
        );
        assert_eq!(c.stats().hits, 2);
    }

    #[test]
    fn a_change_drops_the_cells_it_touched_and_only_those() {
        let c = filled();
        assert!(c.sync(6, &[change(6, Some(&[("s", "m")]), 3600, 3660)], 0));
        let got = c.prefix("s", "m", Need::Aggregates, &[(0, 3600), (3600, 7200)]);
        assert_eq!(got.len(), 1, "the second hour was touched");
        assert_eq!(
            c.prefix("s", "m", Need::Aggregates, &[(7200, 10_800)])
                .len(),
            1
        );
        assert!(c.sync(7, &[change(7, None, 0, 1)], 0));
        assert!(
            c.prefix("s", "m", Need::Aggregates, &[(0, 3600)])
                .is_empty()
        );
    }

    #[test]
    fn a_change_not_readable_yet_makes_the_cache_not_current() {
        let c = filled();
        // Counter at 8, entry 6 written, 7 not yet.
        let (six, eight) = (change(6, Some(&[("x", "m")]), 0, 1), change(8, None, 0, 1));
        assert!(!c.sync(8, &[six.clone(), eight.clone()], 100));
        assert_eq!(c.applied(), 6);
        assert!(
            !c.sync(8, std::slice::from_ref(&eight), 130),
            "still waited for"
        );
        // 7 arrives: 7 and 8 apply (8 empties everything).
        assert!(c.sync(8, &[change(7, Some(&[("s", "m")]), 0, 1), eight], 140));
        assert!(
            c.prefix("s", "m", Need::Aggregates, &[(3600, 7200)])
                .is_empty()
        );
    }

    #[test]
    fn an_expired_log_empties_the_cache() {
        let c = filled();
        // Entries 6 to 14 expired: 15 cannot apply, and waiting is in vain.
        let fifteen = [change(15, Some(&[("x", "m")]), 0, 1)];
        assert!(!c.sync(20, &fifteen, 1000));
        assert_eq!(
            c.prefix("s", "m", Need::Aggregates, &[(0, 3600)]).len(),
            1,
            "kept while an entry may still be on its way"
        );
        assert!(c.sync(20, &fifteen, 1000 + MISSING_AFTER + 1));
        assert!(
            c.prefix("s", "m", Need::Aggregates, &[(0, 3600)])
                .is_empty()
        );
        assert_eq!(c.applied(), 20);
    }

    #[test]
    fn what_a_query_read_before_a_change_it_did_not_see_is_not_kept() {
        let c = filled();
        let seen = c.applied();
        // Another query applies a change to the second hour of `s` while
        // this one still holds what it read before that write.
        assert!(c.sync(6, &[change(6, Some(&[("s", "m")]), 3600, 3660)], 0));
        let (one, two) = (cell(10.0), cell(20.0));
        let kept = [((10_800, 14_400), &one), ((3600, 7200), &two)];
        c.put("s", "m", Need::Aggregates, &kept, seen);
        assert_eq!(
            c.prefix("s", "m", Need::Aggregates, &[(10_800, 14_400)])[0]
                .agg
                .sum,
            10.0,
            "untouched by the change: kept"
        );
        assert!(
            c.prefix("s", "m", Need::Aggregates, &[(3600, 7200)])
                .is_empty(),
            "touched by a change this query did not see: not kept"
        );
        // A look older than the changes remembered keeps nothing.
        let many: Vec<Change> = (7..7 + RECENT as i64)
            .map(|n| change(n, Some(&[("x", "m")]), 0, 1))
            .collect();
        assert!(c.sync(6 + RECENT as i64, &many, 0));
        c.put("s", "m", Need::Aggregates, &[((0, 60), &one)], seen);
        assert!(c.prefix("s", "m", Need::Aggregates, &[(0, 60)]).is_empty());
        // A change of every series touches every series.
        let now = c.applied();
        assert!(c.sync(now + 1, &[change(now + 1, None, 0, 60)], 0));
        c.put(
            "y",
            "m",
            Need::Aggregates,
            &[((0, 60), &one), ((60, 120), &two)],
            now,
        );
        let got = c.prefix("y", "m", Need::Aggregates, &[(60, 120)]);
        assert_eq!(got.len(), 1);
        assert!(c.prefix("y", "m", Need::Aggregates, &[(0, 60)]).is_empty());
    }

    #[test]
    fn memory_stays_within_its_bound() {
        let c = ResultCache::new(10_000);
        assert!(c.sync(0, &[], 0));
        let one = cell(1.0);
        for s in 0..100 {
            let cells: Vec<((i64, i64), &Cell)> =
                (0..10).map(|i| ((i * 60, i * 60 + 60), &one)).collect();
            c.put(&format!("s{s}"), "m", Need::Aggregates, &cells, 0);
        }
        assert!(c.stats().bytes <= 10_000, "{:?}", c.stats());
        // The series put last are kept.
        assert_eq!(c.prefix("s99", "m", Need::Aggregates, &[(0, 60)]).len(), 1);
        assert!(c.prefix("s0", "m", Need::Aggregates, &[(0, 60)]).is_empty());
    }
}

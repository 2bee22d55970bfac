//! Runs a [`Plan`] for many series at once: level by level, one read per
//! level for a batch of series (their sensors in one `$in`, the union of
//! the documents they ask for), each document folded as the cursor streams
//! it, with the readings acknowledged but not yet stored laid over their
//! buckets. The one read path of every query route, JSON and PromQL alike.

use std::collections::BTreeSet;
use std::time::Duration;

use super::cache::{ResultCache, closed_before};
use super::plan::{Ask, Cell, Need, SeriesPlan};
use super::{Grid, Plan};
use crate::batcher::driver::BatcherHandle;
use crate::batcher::{Unstored, UnstoredValue};
use crate::domain::{BucketRead, Granularity, Level, Values};
use crate::store::{Doc, Fetch, MongoStore, Quiet, SensorInfo, StoreError};

/// One sensor of a query.
#[derive(Debug, Clone, Copy)]
pub struct Series<'a> {
    pub sensor: &'a str,
    /// What the registry's listing of it vouches for: a range starting at
    /// or after its `from` is answered without reading storage, if nothing
    /// is unstored or late in it and this instance registered nothing
    /// since the listing.
    pub quiet: Option<Quiet>,
}

impl<'a> Series<'a> {
    /// A sensor the query was not given a listing of.
    pub fn of(sensor: &'a str) -> Self {
        Self {
            sensor,
            quiet: None,
        }
    }

    /// A sensor as the registry listed it.
    pub fn listed(info: &'a SensorInfo) -> Self {
        Self {
            sensor: &info.sensor,
            quiet: info.quiet(),
        }
    }
}

/// What it cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    pub documents: u64,
    pub round_trips: u64,
}

/// What one query asks: a metric over `[from, to)` (stored seconds).
#[derive(Clone, Copy)]
pub struct Question<'a> {
    pub metric: &'a str,
    pub from: i64,
    pub to: i64,
    pub granularity: Granularity,
    pub need: Need,
    pub max_time: Duration,
    /// The results cache of closed periods, if the query may use it.
    pub cache: Option<CacheUse<'a>>,
}

/// How a query uses the results cache (see `query::cache`).
#[derive(Clone, Copy)]
pub struct CacheUse<'a> {
    pub cache: &'a ResultCache,
    /// Cells that start before this (epoch seconds: the shortest retention's
    /// horizon, less a day) are neither kept nor answered from it.
    pub horizon: i64,
    /// Answer from it, not only fill it (`Cache-Control: no-cache` asks not to).
    pub read: bool,
    /// Now, in epoch seconds.
    pub now: i64,
}

/// How one evaluation uses the cache, once the change log is applied.
#[derive(Clone, Copy)]
struct Cached<'a> {
    cache: &'a ResultCache,
    /// Answer cells from it: asked to, and every change applied.
    read: bool,
    horizon: i64,
    /// Cells ending at or before this are closed.
    closed: i64,
    /// The last change applied when this evaluation looked at the log.
    seen: i64,
}

/// Points held in memory at once, over the series of a batch: bounds a
/// query's memory whatever its series and steps (a batch is at least one
/// series, and at most [`MAX_BATCH`]).
const BATCH_CELLS: usize = 250_000;
/// Sensors in one `$in`.
const MAX_BATCH: usize = 200;
/// Points held at once with [`Need::Sketches`], over the series of a batch.
const BATCH_SKETCHES: usize = 20_000;
/// Documents the series of a batch may ask of one level at once: a range
/// with no rollups falls to its buckets, a start each (43 200 a series for
/// 30 days of minutes), and every series' starts, their union and the
/// answers are held together. Bounds a batch's plan whatever the range.
const BATCH_DOCUMENTS: usize = 250_000;
/// Readings held at once with [`Need::Values`] (a series' whole range is
/// held however long: `query.max_values_range` bounds it).
const BATCH_READINGS: usize = 2_000_000;

/// Answers `q` on `grid` for every series, handing each series' points to
/// `each` (with its index in `series`) as its batch finishes.
pub async fn evaluate(
    store: &MongoStore,
    batcher: &BatcherHandle,
    q: Question<'_>,
    grid: Grid,
    series: &[Series<'_>],
    mut each: impl FnMut(usize, Vec<Cell>),
) -> Result<Cost, StoreError> {
    let plan =
        Plan::new(q.granularity, q.need, q.from, q.to, grid).with_accuracy(store.sketch_accuracy());
    let mut per_batch = (BATCH_CELLS / plan.grid().points().max(1)).clamp(1, MAX_BATCH);
    if q.need == Need::Sketches {
        // A point's sketch holds up to thousands of bins.
        per_batch = per_batch.min((BATCH_SKETCHES / plan.grid().points().max(1)).max(1));
    }
    if q.need == Need::Values {
        // Every reading is held: at most one a second.
        let span = usize::try_from(q.to.saturating_sub(q.from)).unwrap_or(usize::MAX);
        per_batch = per_batch.min((BATCH_READINGS / span.max(1)).max(1));
    }
    // The most documents one series may ask: the bucket level's.
    let documents =
        usize::try_from(q.to.saturating_sub(q.from) / plan.len_of(Level::Buckets).max(1))
            .unwrap_or(usize::MAX)
            .saturating_add(2);
    per_batch = per_batch.min((BATCH_DOCUMENTS / documents).max(1));
    let mut cost = Cost::default();
    let cached = match q.cache {
        Some(c) if !matches!(q.need, Need::Values | Need::Sketches) => {
            let (now, changes, read) = store.changes(c.cache.applied()).await?;
            cost.documents += read.documents;
            cost.round_trips += read.round_trips;
            let current = c.cache.sync(now, &changes, c.now);
            Some(Cached {
                cache: c.cache,
                read: c.read && current,
                horizon: c.horizon,
                closed: closed_before(c.now),
                seen: c.cache.applied(),
            })
        }
        _ => None,
    };
    for (b, batch) in series.chunks(per_batch).enumerate() {
        let done = run_batch(store, batcher, &q, &plan, batch, cached, &mut cost).await?;
        for (i, cells) in done.into_iter().enumerate() {
            each(b * per_batch + i, cells);
        }
    }
    Ok(cost)
}

async fn run_batch(
    store: &MongoStore,
    batcher: &BatcherHandle,
    q: &Question<'_>,
    plan: &Plan,
    batch: &[Series<'_>],
    cached: Option<Cached<'_>>,
    cost: &mut Cost,
) -> Result<Vec<Vec<Cell>>, StoreError> {
    // Long: one batch's plan in order (memory, late marks, the cache, then each level); each step commented.
    let sensors: Vec<&str> = batch.iter().map(|s| s.sensor).collect();
    // Memory first, then storage: a bucket written between the two looks
    // is then in both (the newer values win), never in neither.
    let mut unstored: Vec<Unstored> = batcher.unstored_values_of(&sensors, q.metric, q.from, q.to);
    store.drop_deleted(&sensors, q.metric, &mut unstored).await;
    // The buckets holding readings this instance has not stored: their cells
    // are not kept (a write not stored yet leaves no change entry).
    let held: Vec<Vec<i64>> = unstored
        .iter()
        .map(|u| u.iter().map(|(s, _)| *s).collect())
        .collect();
    // Then the buckets written into hours after they were rolled up, not
    // rolled up again yet: read like buckets with unstored readings (none
    // to lay over them), so no stale slot answers.
    let overlaid: u64 = unstored.iter().map(|u| u.len() as u64).sum();
    // Per series: the cells the cache may hold (closed, after the horizon,
    // nothing unstored in them), from the first, and those of them it
    // answers. A late hour's cell is read from its buckets here, and any
    // write after that read leaves a change entry (see `query::cache`).
    let mut keepable: Vec<Vec<(i64, i64)>> = vec![Vec::new(); batch.len()];
    let mut known: Vec<Vec<Cell>> = vec![Vec::new(); batch.len()];
    if let Some(c) = cached {
        for (i, s) in batch.iter().enumerate() {
            for k in 0..plan.grid().points() {
                match plan.cell_range(k) {
                    Some((a, b))
                        if a >= c.horizon && b <= c.closed && !plan.any_dirty(&held[i], a, b) =>
                    {
                        keepable[i].push((a, b))
                    }
                    _ => break,
                }
            }
            if c.read {
                known[i] = c.cache.prefix(s.sensor, q.metric, q.need, &keepable[i]);
            }
        }
    }
    // The markers of the cells the cache does not answer only: a cell it
    // holds stays exact whatever was marked since (the write that marked
    // it dropped it), so a refresh during a catch-up reads the markers of
    // its open tail, not of its whole range again.
    let marks_from = known
        .iter()
        .filter_map(|k| plan.grid().start(k.len()))
        .min()
        .map(|a| a.max(q.from));
    if let Some(from) = marks_from {
        let late = marked_starts(store, q, from, &sensors, overlaid, cost).await?;
        for (u, starts) in unstored.iter_mut().zip(late) {
            for start in starts {
                if let Err(at) = u.binary_search_by_key(&start, |(s, _)| *s) {
                    u.insert(at, (start, Vec::new()));
                }
            }
        }
    }
    let dirty: Vec<Vec<i64>> = unstored
        .iter()
        .map(|u| u.iter().map(|(s, _)| *s).collect())
        .collect();
    // Series quiet since before the range, with nothing unstored or late in
    // it, hold nothing there: no read (read after the memory above, so a
    // registration since the listing is seen here).
    let registrations = store.registrations();
    let mut plans: Vec<SeriesPlan> = dirty
        .iter()
        .zip(&known)
        .zip(batch)
        .map(|((d, k), s)| {
            let quiet = d.is_empty()
                && s.quiet
                    .is_some_and(|w| w.from <= q.from && w.registrations == registrations);
            plan.start_from(d, if quiet { plan.grid().points() } else { k.len() })
        })
        .collect();
    loop {
        let asks: Vec<Option<Ask>> = plans.iter_mut().map(|s| plan.ask(s)).collect();
        let levels: BTreeSet<Level> = asks.iter().flatten().map(|a| a.level).collect();
        if levels.is_empty() {
            break;
        }
        for level in levels {
            read_level(
                store, q, plan, level, &sensors, &asks, &mut plans, &unstored, cost,
            )
            .await?;
        }
        for (s, ask) in plans.iter_mut().zip(&asks) {
            if ask.is_some() {
                plan.advance(s);
            }
        }
    }
    let mut out = Vec::with_capacity(plans.len());
    for (i, (s, known)) in plans.into_iter().zip(known).enumerate() {
        let mut cells = plan.finish(s);
        let from_cache = known.len();
        for (k, cell) in known.into_iter().enumerate() {
            cells[k] = cell;
        }
        if let Some(c) = cached {
            let fresh: Vec<((i64, i64), &Cell)> = keepable[i]
                .iter()
                .enumerate()
                .skip(from_cache)
                .map(|(k, &range)| (range, &cells[k]))
                .collect();
            c.cache
                .put(batch[i].sensor, q.metric, q.need, &fresh, c.seen);
        }
        out.push(cells);
    }
    Ok(out)
}

/// The starts of the buckets of `sensors` in hours marked late (see
/// `store::rollup::late`) from `from` to the question's end. The upkeep is asked to roll those hours up
/// first; when the step under way holds them all and ends sooner than
/// their buckets would be read, the query waits for it and looks again
/// (once); when reading them and the `unstored` buckets would outlast the
/// query's time, or its turn in the queries' share of a catch-up would, it
/// is refused at once with about when they are rolled up.
async fn marked_starts(
    store: &MongoStore,
    q: &Question<'_>,
    from: i64,
    sensors: &[&str],
    unstored: u64,
    cost: &mut Cost,
) -> Result<Vec<Vec<i64>>, StoreError> {
    let mut may_wait = true;
    let began = std::time::Instant::now();
    loop {
        let (late, read) = store
            .late(sensors, q.metric, from, q.to, q.max_time)
            .await?;
        cost.documents += read.documents;
        cost.round_trips += read.round_trips;
        let marked: usize = late.starts.iter().map(Vec::len).sum();
        // What is left of the query's time after a wait decides the next
        // look, not its whole time again.
        let budget = q.max_time.saturating_sub(began.elapsed());
        let waited = store
            .settle_marked(&late.docs, (marked as u64, unstored), budget, may_wait)
            .await?;
        if !waited {
            return Ok(late.starts);
        }
        may_wait = false;
    }
}

/// Groups of series read together at most: series asking different starts
/// beyond this many groups are read as one, with the union of their starts.
const MAX_GROUPS: usize = 8;

/// The series asking `level`, grouped by the starts they ask: one series
/// with nothing stored above `level` asks all its documents there, and read
/// with the others it would make them read all of theirs too (the engine
/// keeps only what each asked, but the server has read and sent it).
fn groups(level: Level, asks: &[Option<Ask>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(&[i64], Vec<usize>)> = Vec::new();
    for (i, a) in asks.iter().enumerate() {
        let Some(a) = a.as_ref().filter(|a| a.level == level) else {
            continue;
        };
        match groups.iter_mut().find(|g| g.0 == a.starts.as_slice()) {
            Some(g) => g.1.push(i),
            None => groups.push((&a.starts, vec![i])),
        }
    }
    let mut out: Vec<Vec<usize>> = groups.into_iter().map(|g| g.1).collect();
    if out.len() > MAX_GROUPS {
        // Largest first; the smallest share one read.
        out.sort_by_key(|g| std::cmp::Reverse(g.len()));
        let mut rest: Vec<usize> = out.drain(MAX_GROUPS - 1..).flatten().collect();
        rest.sort_unstable();
        out.push(rest);
    }
    out
}

/// One read of `level` for every series of the batch asking it: a read per
/// group of series asking the same starts.
#[allow(clippy::too_many_arguments)]
async fn read_level(
    store: &MongoStore,
    q: &Question<'_>,
    plan: &Plan,
    level: Level,
    sensors: &[&str],
    asks: &[Option<Ask>],
    plans: &mut [SeriesPlan],
    unstored: &[Unstored],
    cost: &mut Cost,
) -> Result<(), StoreError> {
    for asking in groups(level, asks) {
        read_group(
            store, q, plan, level, sensors, &asking, asks, plans, unstored, cost,
        )
        .await?;
    }
    Ok(())
}

/// One read of `level` for the series `asking`, with the union of what
/// they ask.
#[allow(clippy::too_many_arguments)]
async fn read_group(
    store: &MongoStore,
    q: &Question<'_>,
    plan: &Plan,
    level: Level,
    sensors: &[&str],
    asking: &[usize],
    asks: &[Option<Ask>],
    plans: &mut [SeriesPlan],
    unstored: &[Unstored],
    cost: &mut Cost,
) -> Result<(), StoreError> {
    // Long: one read of a level for a group of series: the command built, its documents handed to each series' plan.
    // The union of what they ask: starts, values, minute aggregates.
    let mut union = Ask {
        level,
        starts: Vec::new(),
        values: Values::None,
        minutes: false,
    };
    let mut minutes = BTreeSet::new();
    for &i in asking {
        let Some(a) = &asks[i] else { continue };
        union.starts.extend(&a.starts);
        union.minutes |= a.minutes;
        match (&union.values, &a.values) {
            (Values::All, _) | (_, Values::None) => {}
            (_, Values::All) => union.values = Values::All,
            (_, Values::Minutes(m)) => minutes.extend(m.iter().copied()),
        }
    }
    if union.values != Values::All && !minutes.is_empty() {
        union.values = Values::Minutes(minutes.into_iter().collect());
    }
    union.starts.sort_unstable();
    union.starts.dedup();
    let len = plan.len_of(level);
    let names: Vec<&str> = asking.iter().map(|&i| sensors[i]).collect();
    // The dirty buckets each series reads, to overlay (and to answer when
    // nothing of them is stored).
    let mut overlaid: Vec<Vec<i64>> = vec![Vec::new(); sensors.len()];
    if level == Level::Buckets {
        for &i in asking {
            if let Some(a) = &asks[i] {
                overlaid[i] = plan.dirty_starts(&plans[i], a);
            }
        }
    }
    let fetch = Fetch {
        starts_each: union.starts.len(),
        sensors: &names,
        metric: q.metric,
        level,
        starts: union.reads(len),
        values: union.values.clone(),
        minutes: union.minutes,
        max_time: q.max_time,
        sketches: q.need == Need::Sketches,
    };
    let mut seen: Vec<Vec<i64>> = vec![Vec::new(); sensors.len()];
    let started = std::time::Instant::now();
    let read = store
        .fetch(fetch, |k, doc| {
            let i = asking[k];
            let Some(ask) = &asks[i] else { return };
            match doc {
                Doc::Rollup(r) => {
                    if ask.starts.binary_search(&r.start).is_ok() {
                        plan.answer_rollup(&mut plans[i], &r);
                    }
                }
                Doc::Bucket(mut b) => {
                    if ask.starts.binary_search(&b.start).is_err() {
                        return;
                    }
                    if overlaid[i].binary_search(&b.start).is_ok() {
                        b.values = overlay(&b.values, &b.versions, newer(&unstored[i], b.start));
                        seen[i].push(b.start);
                    }
                    plan.answer_bucket(&mut plans[i], &b);
                }
            }
        })
        .await?;
    tracing::debug!(
        ?level,
        series = names.len(),
        starts = union.starts.len(),
        documents = read.documents,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "Read one level of a query."
    );
    cost.documents += read.documents;
    cost.round_trips += read.round_trips;
    // Buckets with unstored readings and nothing stored yet.
    for &i in asking {
        for &start in &overlaid[i] {
            if !seen[i].contains(&start) {
                let b = BucketRead {
                    start,
                    values: newer(&unstored[i], start)
                        .iter()
                        .map(|&(o, v, _)| (o, v))
                        .collect(),
                    ..BucketRead::default()
                };
                plan.answer_bucket(&mut plans[i], &b);
            }
        }
    }
    Ok(())
}

fn newer(unstored: &Unstored, start: i64) -> &[UnstoredValue] {
    unstored
        .binary_search_by_key(&start, |(s, _)| *s)
        .map(|i| unstored[i].1.as_slice())
        .unwrap_or_default()
}

/// A bucket's values as stored with the unstored ones laid over them: per
/// second the one acknowledged later wins, as it will once written. A stored
/// value without a version is older than anything this instance still holds
/// (it would have kept one otherwise); one with a version wins over an
/// unstored value acknowledged before it, as the guarded statement will.
fn overlay(
    stored: &[(u16, f64)],
    versions: &[(u16, i64)],
    unstored: &[UnstoredValue],
) -> Vec<(u16, f64)> {
    let version = |o: u16| {
        versions
            .binary_search_by_key(&o, |&(k, _)| k)
            .ok()
            .map(|i| versions[i].1)
    };
    let wins = |&(o, _, ack): &UnstoredValue| version(o).is_none_or(|stored| ack >= stored);
    let mut values: Vec<(u16, f64)> = stored
        .iter()
        .copied()
        .filter(|&(o, _)| {
            unstored
                .binary_search_by_key(&o, |&(n, _, _)| n)
                .map_or(true, |i| !wins(&unstored[i]))
        })
        .collect();
    values.extend(unstored.iter().filter(|u| wins(u)).map(|&(o, v, _)| (o, v)));
    values.sort_by_key(|&(o, _)| o);
    values
}

/// The newest reading of a series: the newest stored one, or a newer one
/// not yet stored.
pub async fn latest(
    store: &MongoStore,
    batcher: &BatcherHandle,
    (sensor, metric): (&str, &str),
    since: Option<i64>,
    max_time: Duration,
) -> Result<Option<(i64, f64)>, StoreError> {
    let stored = store.latest(sensor, metric, since, max_time).await?;
    let from = stored.map_or(i64::MIN / 2, |(ts, _, _)| ts);
    let mut unstored = batcher.unstored_values_of(&[sensor], metric, from, i64::MAX / 2);
    store.drop_deleted(&[sensor], metric, &mut unstored).await;
    let unstored = unstored
        .into_iter()
        .flatten()
        .flat_map(|(start, values)| {
            values
                .into_iter()
                .map(move |(o, v, ack)| (start + i64::from(o), v, ack))
        })
        .max_by_key(|&(ts, _, _)| ts);
    // Of one second, the value acknowledged later (see `overlay`).
    Ok(match (stored, unstored) {
        (Some(s), Some(u)) if u.0 > s.0 || (u.0 == s.0 && s.2.is_none_or(|v| u.2 >= v)) => {
            Some((u.0, u.1))
        }
        (Some(s), _) => Some((s.0, s.1)),
        (None, u) => u.map(|(ts, v, _)| (ts, v)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(level: Level, starts: &[i64]) -> Option<Ask> {
        Some(Ask {
            level,
            starts: starts.to_vec(),
            values: Values::None,
            minutes: false,
        })
    }

    #[test]
    fn series_asking_other_starts_are_read_apart() {
        let day = Level::Rollups(crate::domain::Period::Day);
        let asks = [
            ask(day, &[1, 2]),
            None,
            ask(day, &(0..200).collect::<Vec<_>>()),
            ask(day, &[1, 2]),
            ask(Level::Buckets, &[5]),
        ];
        assert_eq!(groups(day, &asks), vec![vec![0, 3], vec![2]]);
        assert_eq!(groups(Level::Buckets, &asks), vec![vec![4]]);
    }

    #[test]
    fn beyond_the_limit_the_smallest_groups_share_one_read() {
        let day = Level::Rollups(crate::domain::Period::Day);
        // Twelve different asks; the first asked by three series.
        let mut asks: Vec<Option<Ask>> = (0..12).map(|k| ask(day, &[k])).collect();
        asks.push(ask(day, &[0]));
        asks.push(ask(day, &[0]));
        let got = groups(day, &asks);
        assert_eq!(got.len(), MAX_GROUPS);
        assert_eq!(got[0], vec![0, 12, 13]);
        let mut all: Vec<usize> = got.concat();
        all.sort_unstable();
        assert_eq!(all, (0..14).collect::<Vec<_>>(), "every series once");
    }

    #[test]
    fn unstored_values_win_per_second() {
        let stored = [(1, 1.0), (2, 2.0), (5, 5.0)];
        assert_eq!(
            overlay(&stored, &[], &[(2, 20.0, 0), (3, 30.0, 0)]),
            vec![(1, 1.0), (2, 20.0), (3, 30.0), (5, 5.0)]
        );
        assert_eq!(overlay(&[], &[], &[(3, 30.0, 0)]), vec![(3, 30.0)]);
    }

    #[test]
    fn a_stored_value_acknowledged_later_wins_over_an_unstored_one() {
        let stored = [(1, 1.0), (2, 2.0), (5, 5.0)];
        // Seconds 2 and 5 keep versions: 2 was acknowledged after this
        // instance's unstored value, 5 before; 1 keeps none (older than any).
        let versions = [(2, 2_000), (5, 500)];
        assert_eq!(
            overlay(
                &stored,
                &versions,
                &[(1, 10.0, 100), (2, 20.0, 1_000), (5, 50.0, 1_000)]
            ),
            vec![(1, 10.0), (2, 2.0), (5, 50.0)]
        );
        // A tie goes to the unstored value: it is written last.
        assert_eq!(
            overlay(&stored, &versions, &[(2, 20.0, 2_000)]),
            vec![(1, 1.0), (2, 20.0), (5, 5.0)]
        );
    }
}
